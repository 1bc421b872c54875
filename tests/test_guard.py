"""The job guard in one process: the stuck-step watchdog, the preemption notice
and its grace time, and the listing of committed steps its messages use.

A guard that ends its process does so with `os._exit`, so those cases run in
a subprocess. The multi-process behaviour is tests/test_multiprocess_faults.py.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from mipu_jax import checkpoint
from mipu_jax.rl import guard


def _run(body: str, timeout_s: float = 60):
  script = textwrap.dedent("""
      import os, signal, time
      from mipu_jax.rl import guard
      """) + textwrap.dedent(body)
  start = time.monotonic()
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=timeout_s, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  return proc, time.monotonic() - start


def test_a_stuck_phase_ends_the_process_saying_where_it_was():
  proc, seconds = _run("""
      limits = guard.JobLimits(peer_timeout_s=2, step_timeout_s=1.5, poll_s=0.2)
      with guard.JobGuard(limits, lambda: "step 7 in /ckpts") as g:
        with g.phase("rollout", 3):
          time.sleep(60)  # a reward call that never returns
      """)
  assert proc.returncode == guard.EXIT_STUCK, proc.stderr
  assert "stuck: rollout of step 3 has lasted" in proc.stderr
  assert "Newest committed checkpoint: step 7 in /ckpts" in proc.stderr
  assert seconds < 30  # 1.5 s plus the interpreter's start


def test_a_preemption_notice_past_its_grace_time_ends_the_process():
  proc, _ = _run("""
      limits = guard.JobLimits(preemption_grace_s=1.0, poll_s=0.2)
      with guard.JobGuard(limits, lambda: "step 2 in /ckpts") as g:
        with g.phase("learner step", 5):
          os.kill(os.getpid(), signal.SIGTERM)
          time.sleep(60)  # never reaches the step boundary
      """)
  assert proc.returncode == guard.EXIT_GRACE_EXCEEDED, proc.stderr
  assert "did not stop within the preemption grace time" in proc.stderr
  assert "last in learner step of step 5" in proc.stderr


def test_a_preemption_notice_stops_at_the_step_boundary():
  before = signal.getsignal(signal.SIGTERM)
  with guard.JobGuard(guard.JobLimits(poll_s=0.2), lambda: "none") as g:
    assert not g.stop_requested(1)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)  # the handler runs between bytecodes
    assert g.notice_received and g.stop_requested(2)
    g.fail(RuntimeError("one process: raised by the caller"))  # a no-op
  assert signal.getsignal(signal.SIGTERM) == before


def test_phases_nest_and_restore_the_outer_one():
  g = guard.JobGuard(guard.JobLimits(), lambda: "none")
  with g.phase("rollout", 4):
    with g.phase("evaluation", 4):
      assert g._where() == "evaluation of step 4"  # pylint: disable=protected-access
    assert g._where() == "rollout of step 4"  # pylint: disable=protected-access
  guard.phase("rollout", 1).__enter__()  # no guard running: nothing happens


@pytest.mark.parametrize("limits", [dict(peer_timeout_s=0), dict(step_timeout_s=-1),
                                    dict(peer_timeout_s=1, poll_s=1)])
def test_bad_limits_are_an_error(limits):
  with pytest.raises(ValueError):
    guard.JobLimits(**limits)


def test_committed_steps_are_the_step_named_directories(tmp_path):
  for name in ("3", "12", "5.orbax-checkpoint-tmp-123", "notes"):
    (tmp_path / name).mkdir()
  (tmp_path / "7").write_text("a file, not a step")
  assert checkpoint.committed_steps(tmp_path) == [3, 12]
  assert checkpoint.committed_steps(tmp_path / "missing") == []


# Signs of life as published: "beat progress step run|wait phase".
_RUN, _WAIT = "9 {} 2 run rollout", "9 {} 2 wait rollout"


@pytest.mark.parametrize("waits,peers,age,expected", [
    # Running its own code past the limit, no one behind: this one is stuck.
    (False, [_WAIT.format(5)], 61, "in its own code"),
    (False, [], 61, "in its own code"),
    # Someone is behind (fewer phases): it is the stuck one, whatever this does.
    (False, [_RUN.format(4)], 61, None),
    (True, [_WAIT.format(4)], 500, None),
    # Waiting inside JAX while a peer in the same phase runs its own code: the
    # peer is the stuck one; defer, for at most another limit.
    (True, [_RUN.format(5)], 61, None),
    (True, [_RUN.format(5)], 120, None),
    (True, [_RUN.format(5)], 121, "past twice the limit"),
    # A peer ahead running its own code has passed what this one waits in.
    (True, [_RUN.format(6)], 61, "those running are ahead of it"),
    # Every process waits inside JAX: a stalled device or collective.
    (True, [_WAIT.format(5), _WAIT.format(5)], 61, "like every other process"),
    (True, [], 61, "a stalled device"),
])
def test_the_stuck_verdict_blames_the_process_that_is_not_waiting(waits, peers, age,
                                                                  expected):
  verdict = guard.stuck_verdict(age, 5, waits, peers, step_timeout_s=60)
  if expected is None:
    assert verdict is None
  else:
    assert expected in verdict


def test_the_loop_waits_inside_jax_or_for_the_others_and_runs_elsewhere(monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top
  assert os.path.dirname(jax.__file__) + os.sep in guard._WAITING_DIRS  # pylint: disable=protected-access
  assert all(os.path.isdir(d) for d in guard._WAITING_DIRS)  # pylint: disable=protected-access
  g = guard.JobGuard(guard.JobLimits(), lambda: "none")
  release = threading.Event()

  def a_call_that_blocks():  # this file's code, blocked in threading.py
    release.wait()

  blocked = threading.Thread(target=a_call_that_blocks)
  blocked.start()
  try:
    g._loop_thread = blocked.ident  # pylint: disable=protected-access
    time.sleep(0.1)
    assert not g.loop_waits()  # its own code (the standard library's frames skipped)
    with g.waiting_for_others():
      assert g.loop_waits()
    assert not g.loop_waits()
    # Classified by the first frame outside the standard library: with this
    # file's directory counted as JAX's, the same thread waits (as orbax's
    # save does, joining its thread through threading.py).
    monkeypatch.setattr(guard, "_WAITING_DIRS", (os.path.dirname(__file__) + os.sep,))
    assert g.loop_waits()
  finally:
    release.set()
    blocked.join()
  assert not g.loop_waits()  # the thread has ended


def test_time_between_phases_is_not_a_stuck_phase():
  """The loop's work between phases (logging, export) is timed from the last
  phase's end, not from the guard's start: a run longer than the limit, made
  of short phases, is not stuck."""
  proc, _ = _run("""
      limits = guard.JobLimits(peer_timeout_s=2, step_timeout_s=1.0, poll_s=0.1)
      with guard.JobGuard(limits, lambda: "none") as g:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
          with g.phase("rollout", 1):
            time.sleep(0.5)
          time.sleep(0.3)  # between phases
      print("FINISHED")
      """)
  assert proc.returncode == 0, proc.stderr
  assert "FINISHED" in proc.stdout
