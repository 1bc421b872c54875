"""The job guard: a lost, stuck or preempted process ends the job in bounded time.

JAX's own heartbeat ends the other processes when one dies, but with an abort
that says nothing of the checkpoints; and a process alive but stuck (a reward
call that never returns, blocked I/O, a stalled device) keeps beating while the
others wait in a collective forever (jax-ml/jax#38503). The guard is a
watchdog thread in every process of `rl.train`:

- **Lost process.** Every `poll_s` each process publishes a sign of life (a
  counter, the step, the phase) in the coordination service's key-value store;
  one whose sign has not changed for `peer_timeout_s` is lost, and the others
  exit with `EXIT_PEER_LOST`, naming it and the newest committed checkpoint
  (process 0, which hosts the store, is the lost one when it is unreachable).
- **Stuck step.** A phase of a step (`phase(name, step)`: rollout, learner
  step, Step 2's probe, evaluation, checkpoint save, step boundary) that has
  lasted `step_timeout_s` ends the process with `EXIT_STUCK` and a message
  naming the phase, unless another process is the stuck one and this one only
  waits for it (`_stuck.stuck_verdict` says which).
- **Preemption notice.** SIGTERM sets a flag; at every step boundary the
  processes exchange their flags (`stop_requested`), so all of them stop
  after the same step, which the loop checkpoints before returning. If the
  job is still running `preemption_grace_s` after the notice, the guard ends
  it with `EXIT_GRACE_EXCEEDED` (the committed steps are intact).
- **An error on one process** (`fail`): in a job of several processes, the
  process prints the error and the newest committed checkpoint and exits at
  once with `EXIT_ERROR`, instead of raising into shutdown handlers that would
  wait for the others (which wait for it in a collective).

Exiting is `os._exit`: no Python cleanup, no orbax barrier, no distributed
shutdown barrier, which would all wait for the lost process. What a rerun
finds is the same as after a SIGKILL (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Callable, Iterator, Optional

import jax

from mipu_jax import distributed
from mipu_jax.rl._stuck import is_collective_error
from mipu_jax.rl._stuck import stuck_verdict

_log = logging.getLogger(__name__)

EXIT_ERROR = 1
EXIT_PEER_LOST = 75
EXIT_STUCK = 76
EXIT_GRACE_EXCEEDED = 77

_ALIVE = "mipu_jax/guard/alive/"
_active: Optional["JobGuard"] = None
_STOP = "mipu_jax/guard/stop/"
_EXITING = "mipu_jax/guard/exiting/"

# Where a thread blocked on other processes or on the device waits: inside
# JAX (a computation's result, a collective, the distributed runtime) or in
# orbax (its barriers, and the saves whose background threads wait in them).
# Anywhere else it runs its own code. Frames of the standard library
# (threading, queue, socket, ...) are skipped: they say how it waits, not for
# whom (orbax joins its save thread through threading.py).
_WAITING_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(jax.__file__)), d) + os.sep
    for d in ("jax", "jaxlib", "orbax"))
_STDLIB_DIR = os.path.dirname(threading.__file__) + os.sep


@dataclasses.dataclass(frozen=True)
class JobLimits:
  """How long the guard waits before it ends the job (seconds).

  Attributes:
    peer_timeout_s: a process without a sign of life for this long is lost.
      Keep it below JAX's heartbeat timeout (`distributed.initialize`), which
      otherwise aborts the survivors first, without naming the checkpoint.
    step_timeout_s: the longest a phase of a step may last (None: no limit).
      It must exceed the slowest legitimate phase, compilation included.
    preemption_grace_s: after a SIGTERM, the time the job has to reach the
      next step boundary, save and exit.
    poll_s: how often the watchdog looks.
  """
  peer_timeout_s: float = 60.0
  step_timeout_s: Optional[float] = None
  preemption_grace_s: float = 120.0
  poll_s: float = 1.0

  def __post_init__(self):
    for name in ("peer_timeout_s", "preemption_grace_s", "poll_s"):
      if not getattr(self, name) > 0:
        raise ValueError(f"JobLimits.{name} must be > 0, got {getattr(self, name)}.")
    if self.step_timeout_s is not None and not self.step_timeout_s > 0:
      raise ValueError(f"JobLimits.step_timeout_s must be > 0 or None, got "
                       f"{self.step_timeout_s}.")
    if self.poll_s * 2 > self.peer_timeout_s:
      raise ValueError("JobLimits.poll_s must be at most half of peer_timeout_s.")


class JobGuard:
  """The watchdog of one process; a context manager around the training loop.

  Args:
    limits: the timeouts.
    newest_checkpoint: describes the newest committed checkpoint for the
      messages; called from the watchdog thread, so it must not block on
      other processes (a directory listing).
  """

  def __init__(self, limits: JobLimits, newest_checkpoint: Callable[[], str]):
    self.limits = limits
    self._newest_checkpoint = newest_checkpoint
    self._pid = jax.process_index()
    self._count = jax.process_count()
    self._client = distributed.kv_client() if self._count > 1 else None
    self._lock = threading.Lock()
    self._phase, self._step, self._progress = "start", 0, 0
    self._waiting = 0  # > 0 inside `waiting_for_others`
    self._loop_thread: Optional[int] = None
    self._last: Optional[tuple[str, int]] = None
    self._exiting = False
    self._lost: set[int] = set()
    self._phase_since = time.monotonic()
    self._notice_at: Optional[float] = None
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self._previous_handler = None

  # -- the loop's side -------------------------------------------------------

  @contextlib.contextmanager
  def phase(self, name: str, step: int) -> Iterator[None]:
    """Marks the loop as in phase `name` of step `step` while inside."""
    with self._lock:
      outer = (self._phase, self._step, self._phase_since)
      self._phase, self._step = name, step
      self._progress += 1
      self._phase_since = time.monotonic()
    try:
      yield
    finally:
      with self._lock:
        self._last = (name, step)
        self._phase, self._step, self._phase_since = outer
        if self._phase == "start":  # between phases: timed from this exit
          self._phase_since = time.monotonic()
        self._progress += 1

  @contextlib.contextmanager
  def waiting_for_others(self) -> Iterator[None]:
    """Marks the loop as waiting for the other processes while inside (a
    blocking call outside JAX, e.g. on the coordination service's store)."""
    with self._lock:
      self._waiting += 1
    try:
      yield
    finally:
      with self._lock:
        self._waiting -= 1

  def loop_waits(self) -> bool:
    """Whether the loop's thread now waits for others or the device rather
    than running its own code: inside `waiting_for_others`, or with its
    innermost Python frame outside the standard library inside JAX or orbax."""
    if self._waiting:
      return True
    frame = self._loop_frame()
    while frame is not None and frame.f_code.co_filename.startswith(_STDLIB_DIR) and \
        "-packages" not in frame.f_code.co_filename:  # site- / dist-packages
      frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(_WAITING_DIRS)

  @property
  def notice_received(self) -> bool:
    """Whether this process has received a preemption notice (SIGTERM)."""
    return self._notice_at is not None

  def stop_requested(self, step: int) -> bool:
    """Whether any process has received a preemption notice, agreed by all.

    Every process must call it once at the end of every step: the processes
    exchange their flags through the coordination service, so they all stop
    after the same step.
    """
    local = self.notice_received
    if self._client is None:
      return local
    with self.phase("step boundary", step), self.waiting_for_others():
      self._client.key_value_set(f"{_STOP}{step}/{self._pid}", "1" if local else "0")
      flags = [self._client.blocking_key_value_get(f"{_STOP}{step}/{p}", 2**31 - 1)
               for p in range(self._count)]
      if step > 1:  # every process has read step - 1's flags by now
        self._client.key_value_delete(f"{_STOP}{step - 1}/{self._pid}")
    return "1" in flags

  def fail(self, error: BaseException) -> None:
    """Ends this process of a multi-process job on `error`, after saying so.

    A no-op with one process (the caller raises as usual). With several, it
    waits briefly for the watchdog to find a lost process (a failed
    collective usually means one), then exits with `EXIT_ERROR`.
    """
    if self._count == 1:
      return
    where = self._where()
    if is_collective_error(error):
      # A failed collective usually means a lost peer: let the watchdog find
      # and name it (it ends the process), with room for a loaded machine.
      time.sleep(2 * self.limits.peer_timeout_s + 5 * self.limits.poll_s)
    detail = "".join(traceback.format_exception(error)).rstrip()
    self._exit(EXIT_ERROR, f"{detail}\n{type(error).__name__} in {where}; "
               "ending this process so the others stop.")

  # -- lifecycle ---------------------------------------------------------------

  def __enter__(self) -> JobGuard:
    global _active
    _active = self
    self._loop_thread = threading.get_ident()
    if threading.current_thread() is threading.main_thread():
      self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
    else:
      _log.warning("Not in the main thread: SIGTERM (a preemption notice) is not "
                   "caught, the job cannot stop at a step boundary on one.")
    self._thread = threading.Thread(target=self._watch, name="mipu_jax-guard",
                                    daemon=True)
    self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    global _active
    _active = None
    self._stop.set()
    self._thread.join()
    if self._previous_handler is not None:  # None: a handler set outside Python
      signal.signal(signal.SIGTERM, self._previous_handler)

  # -- the watchdog ------------------------------------------------------------

  def _on_sigterm(self, signum, frame) -> None:
    del signum, frame
    if self._notice_at is None:
      self._notice_at = time.monotonic()
      _log.warning("Process %d: preemption notice (SIGTERM); stopping at the next "
                   "step boundary after a checkpoint.", self._pid)

  def _watch(self) -> None:
    limits = self.limits
    beat = 0
    seen: dict[int, tuple[str, float]] = {}
    unreachable_since = None
    deferred = -1  # the progress at which this process last deferred
    while not self._stop.wait(limits.poll_s):
      if self._exiting:  # the main thread is ending the process: no more signs of life
        return
      now = time.monotonic()
      if self._notice_at is not None and now - self._notice_at > limits.preemption_grace_s:
        self._exit(EXIT_GRACE_EXCEEDED, (
            f"the job did not stop within the preemption grace time "
            f"({limits.preemption_grace_s:g} s after SIGTERM); last in {self._where()}."))
      peers = {}
      waits = self.loop_waits()
      if self._client is not None:
        beat += 1
        try:
          state = "wait" if waits else "run"
          with self._lock:
            mine = f"{beat} {self._progress} {self._step} {state} {self._phase}"
          self._client.key_value_set(f"{_ALIVE}{self._pid}", mine, allow_overwrite=True)
          for p in range(self._count):
            if p != self._pid:
              peers[p] = self._client.key_value_try_get(f"{_ALIVE}{p}")
          unreachable_since = None
        except Exception as e:  # pylint: disable=broad-except
          # The store lives in process 0: unreachable means process 0 is gone
          # (or a peer has not published yet: NOT_FOUND, fine at the start).
          if "NOT_FOUND" not in str(e):
            unreachable_since = unreachable_since or now
            if now - unreachable_since > limits.peer_timeout_s:
              self._lost.add(0)
              self._exit(EXIT_PEER_LOST, (
                  f"process 0 is lost: the coordination service it hosts has not "
                  f"answered for {now - unreachable_since:.0f} s ({e})."), lost=0)
          continue
        for p in peers:
          ended = self._try_get(f"{_EXITING}{p}")
          if ended is not None:  # a peer that ends says so: no need to wait for it
            code, lost = (int(x) for x in ended.split())
            if lost >= 0 and lost != self._pid:  # it saw another one lost first
              self._lost.update((p, lost))
              self._exit(EXIT_PEER_LOST, (
                  f"process {lost} is lost (process {p} found it so and ended with "
                  f"{code})."), lost=lost)
            self._lost.add(p)
            self._exit(EXIT_PEER_LOST, f"process {p} is lost: it ended with status {code}.",
                       lost=p)
        for p, value in peers.items():
          if seen.get(p, (None,))[0] != value:
            seen[p] = (value, now)
          elif now - seen[p][1] > limits.peer_timeout_s:
            _, _, step, _, phase = value.split(" ", 4)
            self._lost.add(p)
            self._exit(EXIT_PEER_LOST, (
                f"process {p} is lost: no sign of life for {now - seen[p][1]:.0f} s "
                f"(peer_timeout_s={limits.peer_timeout_s:g}); it was last in "
                f"{phase} of step {step}."), lost=p)
      with self._lock:
        age, progress = now - self._phase_since, self._progress
      if limits.step_timeout_s is not None and age > limits.step_timeout_s:
        verdict = stuck_verdict(age, progress, waits,
                                [v for v, _ in seen.values()], limits.step_timeout_s)
        if verdict is None and deferred != progress:
          deferred = progress
          _log.warning("Process %d: %s has lasted %.0f s (step_timeout_s=%g), waiting "
                       "for another process: deferring to its watchdog. %s", self._pid,
                       self._where(), age, limits.step_timeout_s, self._loop_stack(2))
        if verdict is not None:
          self._exit(EXIT_STUCK, f"stuck: {self._where()} has lasted {age:.0f} s "
                     f"(step_timeout_s={limits.step_timeout_s:g}){verdict}",
                     detail=self._loop_stack())

  def _loop_frame(self):
    """The loop thread's innermost Python frame (None once it has ended)."""
    return sys._current_frames().get(self._loop_thread)  # pylint: disable=protected-access

  def _loop_stack(self, depth: int = 8) -> str:
    """The loop thread's innermost `depth` Python frames, for a stuck message."""
    frame = self._loop_frame()
    if frame is None:
      return "(the loop's thread has ended)"
    lines = traceback.format_stack(frame)[-depth:]
    return "The loop's thread is in (innermost last):\n" + "".join(lines).rstrip()

  def _where(self) -> str:
    with self._lock:
      if self._phase == "start" and self._last is not None:
        return f"the loop, after {self._last[0]} of step {self._last[1]}"
      return f"{self._phase} of step {self._step}"

  def _try_get(self, key: str) -> Optional[str]:
    """A key of the store, None when absent or unreachable."""
    try:
      return self._client.key_value_try_get(key)
    except Exception:  # pylint: disable=broad-except
      return None

  def _exit(self, code: int, message: str, lost: Optional[int] = None,
            detail: str = "") -> None:
    """Says why, names the newest committed checkpoint, and ends the process.

    The others learn it from the store (`exiting/<pid>`) at their next poll.
    Process 0 hosts the coordination service, and when it goes, JAX's
    runtime ends every other process from C++ without a word about the
    checkpoints; so process 0 leaves last, once the others have said they
    are ending (at most `peer_timeout_s` plus three polls).
    """
    self._exiting = True
    try:
      newest = self._newest_checkpoint()
    except Exception as e:  # pylint: disable=broad-except
      newest = f"unknown ({e!r})"
    text = (f"[mipu_jax] process {self._pid} of {self._count}: {message} "
            f"Newest committed checkpoint: {newest}. Exiting with {code}; rerun "
            "the same command on every process to resume from it.")
    if detail:
      text += "\n" + detail
    _log.error(text)
    print(text, file=sys.stderr, flush=True)
    sys.stdout.flush()
    if self._client is not None:
      try:
        self._client.key_value_set(f"{_EXITING}{self._pid}",
                                   f"{code} {-1 if lost is None else lost}",
                                   allow_overwrite=True)
      except Exception:  # pylint: disable=broad-except
        pass
      if self._pid == 0:
        deadline = time.monotonic() + self.limits.peer_timeout_s + 3 * self.limits.poll_s
        others = [p for p in range(1, self._count) if p not in self._lost]
        while others and time.monotonic() < deadline:
          others = [p for p in others if self._try_get(f"{_EXITING}{p}") is None]
          time.sleep(self.limits.poll_s / 2)
    os._exit(code)  # pylint: disable=protected-access


@contextlib.contextmanager
def phase(name: str, step: int) -> Iterator[None]:
  """`JobGuard.phase` of the running guard; nothing when none runs (custom loops)."""
  if _active is None:
    yield
  else:
    with _active.phase(name, step):
      yield
