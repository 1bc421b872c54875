"""Kill-and-resume harness: SIGKILL a training command anywhere, resume it, compare.

`kill_and_resume` runs a target command, SIGKILLs it by a plan (a delay after
it starts training, or right after its n-th checkpoint save started, i.e.
with the save in flight), restarts it, and finally lets it finish; the caller
compares the final result with an unkilled run's. A target follows a small
protocol:

- it takes its working directory as its last argument, resumes from the latest
  checkpoint there if any, and writes its final result inside it;
- it prints `LOOP_STARTED` once restored and training, and `SAVE_STARTED <step>`
  right after each (asynchronous) save call returns, with the save in flight;
- it exits 0 when done.

`tests/test_checkpoint_resume.py` (a toy MLP) and `tests/test_rl_resume.py`
(the RL loop with MIPU Step 2) are targets.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import time
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Kill:
  """When to SIGKILL one attempt of the target.

  Attributes:
    delay_s: seconds after the attempt prints `LOOP_STARTED`.
    nth_save: right after the attempt prints its `nth_save`-th `SAVE_STARTED`
      (its save then still in flight: a kill mid-save).
  """

  delay_s: float | None = None
  nth_save: int | None = None


@dataclasses.dataclass(frozen=True)
class Attempt:
  """What happened to one attempt.

  Attributes:
    killed: the attempt was SIGKILLed (False: it exited on its own).
    saves_started: `SAVE_STARTED` lines it printed.
    partial_saves: tmp (uncommitted) step directories left right after the kill.
    seconds: wall time of the attempt.
    loop_seconds: wall time from its `LOOP_STARTED` line to its end (0 if it
      never printed one).
  """

  killed: bool
  saves_started: int
  partial_saves: int
  seconds: float
  loop_seconds: float = 0.0


def run_attempt(command: Sequence[str], kill: Kill | None, *, ckpt_dir: str,
                timeout_s: float = 120.0) -> Attempt:
  """Runs `command` once, SIGKILLing it as `kill` says (None: to completion).

  Raises:
    RuntimeError: the target exits non-zero, or runs past `timeout_s`.
  """
  start = time.monotonic()
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  proc = subprocess.Popen(list(command), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=env, text=True, bufsize=1)
  deadline, saves, log, loop_start = None, 0, [], None
  try:
    while True:
      now = time.monotonic()
      if now - start > timeout_s:
        raise RuntimeError(f"Target timed out; output:\n{''.join(log)}")
      if deadline is not None and now >= deadline:
        return _kill(proc, saves, ckpt_dir, start, loop_start)
      wait = 0.5 if deadline is None else max(deadline - now, 0.0)
      ready, _, _ = select.select([proc.stdout], [], [], min(wait, 0.5))
      if not ready:
        continue
      line = proc.stdout.readline()
      if not line:  # EOF: the target exited.
        rc = proc.wait()
        if rc != 0:
          raise RuntimeError(f"Target exited with {rc}; output:\n{''.join(log)}")
        end = time.monotonic()
        return Attempt(False, saves, 0, end - start,
                       end - loop_start if loop_start is not None else 0.0)
      log.append(line)
      if line.startswith("LOOP_STARTED"):
        loop_start = time.monotonic()
        if kill and kill.delay_s is not None:
          deadline = loop_start + kill.delay_s
      if line.startswith("SAVE_STARTED"):
        saves += 1
        if kill and kill.nth_save == saves:
          return _kill(proc, saves, ckpt_dir, start, loop_start)
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait()
    proc.stdout.close()


def _kill(proc: subprocess.Popen, saves: int, ckpt_dir: str,
          start: float, loop_start: float | None) -> Attempt:
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  partial = 0
  if os.path.isdir(ckpt_dir):
    partial = sum(".orbax-checkpoint-tmp" in n for n in os.listdir(ckpt_dir))
  end = time.monotonic()
  return Attempt(True, saves, partial, end - start,
                 end - loop_start if loop_start is not None else 0.0)


def kill_and_resume(command: Sequence[str], kills: Sequence[Kill], *,
                    ckpt_dir: str, timeout_s: float = 120.0) -> list[Attempt]:
  """Runs `command` once per kill in `kills`, then once more to completion.

  Args:
    command: the target's argv (working directory included).
    kills: one plan per killed attempt; an attempt that finishes before its
      kill ends the sequence early.
    ckpt_dir: the target's checkpoint directory (to spot partial saves).
    timeout_s: per-attempt limit.

  Returns:
    Every attempt, the completed last one included.
  """
  attempts = []
  for kill in kills:
    attempts.append(run_attempt(command, kill, ckpt_dir=ckpt_dir,
                                timeout_s=timeout_s))
    if not attempts[-1].killed:
      return attempts
  attempts.append(run_attempt(command, None, ckpt_dir=ckpt_dir,
                              timeout_s=timeout_s))
  return attempts
