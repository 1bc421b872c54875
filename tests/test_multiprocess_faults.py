"""Several JAX processes, one fault: the job ends in bounded time and the rerun resumes bitwise.

Real processes on localhost (`mipu_jax.testing.multiprocess`), each running
`rl.train` on the tiny config with MIPU Step 2 over one 8-device mesh (8 / n
CPU devices per process); JAX's distributed runtime is not replaced. Faults:
SIGKILL of one process at a seeded random point (rollout, learner step, Step
2's probe, evaluation, a checkpoint save in flight), SIGTERM (a preemption
notice), a process stuck in a phase, a full disk on one process, a corrupt
shard of the newest checkpoint read by one process. After each, the same
command on every process must finish the run bitwise as an uninterrupted one.

A job takes one to two minutes on 2 cores and the default suite must stay
under 10 minutes, so every test here is marked `multiprocess`
(docs/reliability.md has the command), as is `tests/test_multihost.py`.

This file is also the target:
`python tests/test_multiprocess_faults.py WORKDIR PID NPROC PORT`, with a fault
to inject in `MIPU_TEST_FAULT` (`hang:<pid>:<step>:<phase>`,
`enospc:<pid>:<step>`).
"""

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import sys
import threading
import time

import numpy as np
import pytest

from mipu_jax import checkpoint
from mipu_jax.testing import multiprocess

_STEPS = 2
_PEER_TIMEOUT_S = 6.0
_HEARTBEAT_TIMEOUT_S = 30
# From the fault to the last survivor's exit: the guard's timeout, its poll,
# and the slack of two busy cores.
_BOUND_S = _PEER_TIMEOUT_S + 1.0 + 20.0
_JOB_TIMEOUT_S = 400
_PHASES = ("rollout", "learner step", "Step 2 probe", "evaluation", "checkpoint save")


def _config():
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax import testing  # pylint: disable=g-import-not-at-top
  return testing.tiny_run_config(
      _STEPS, learner=dict(mesh=config_lib.MeshConfig(data=1, fsdp=-1, tensor=1)),
      eval=dict(num_samples=2, every=2), checkpoint=dict(every=1, keep=5),
      mipu=dict(step2=True, c=0.0, num_probe_prompts=4))


def _target(workdir: str, pid: int, nproc: int, port: int) -> None:
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={8 // nproc}"
  from mipu_jax import distributed  # pylint: disable=g-import-not-at-top
  distributed.initialize("on", coordinator_address=f"127.0.0.1:{port}",
                         num_processes=nproc, process_id=pid,
                         heartbeat_timeout_s=_HEARTBEAT_TIMEOUT_S, shutdown_timeout_s=10)
  import jax  # pylint: disable=g-import-not-at-top
  from mipu_jax import rl  # pylint: disable=g-import-not-at-top
  from mipu_jax.rl import guard  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  kind, *fault = os.environ.get("MIPU_TEST_FAULT", "none").split(":")
  phase = guard.JobGuard.phase

  @contextlib.contextmanager
  def traced_phase(self, name, step):
    print("PHASE", step, name, flush=True)
    with phase(self, name, step):
      if kind == "hang" and (pid, step, name) == (int(fault[0]), int(fault[1]), fault[2]):
        print("HANGING", flush=True)
        threading.Event().wait()  # a call inside the phase that never returns
      yield

  guard.JobGuard.phase = traced_phase
  manager_save = ocp.CheckpointManager.save

  def save(self, step, *args, **kwargs):
    if kind == "enospc" and (pid, step) == (int(fault[0]), int(fault[1])):
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.directory))
    out = manager_save(self, step, *args, **kwargs)
    print("SAVE_STARTED", step, flush=True)
    return out

  ocp.CheckpointManager.save = save
  limits = guard.JobLimits(peer_timeout_s=_PEER_TIMEOUT_S, poll_s=0.5,
                           step_timeout_s=float(os.environ.get("MIPU_TEST_STEP_TIMEOUT", 0))
                           or None, preemption_grace_s=120.0)
  result = rl.train(_config(), workdir, limits=limits)
  params = distributed.to_host((result.state.params, result.state.opt_state))
  leaves = jax.tree_util.tree_leaves_with_path(params)
  np.savez(os.path.join(workdir, f"final_{pid}.npz"),
           **{jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves})
  with open(os.path.join(workdir, f"result_{pid}.json"), "w") as f:
    json.dump({"stopped_at": result.stopped_at,
               "steps": [int(r["step"]) for r in result.rows],
               "decisions": [r.get("mipu/accepted") for r in result.rows]}, f)
  print("DONE", result.stopped_at, flush=True)


def _job(workdir, nproc, **env):
  os.makedirs(workdir, exist_ok=True)
  argv = lambda pid, port: [sys.executable, os.path.abspath(__file__), workdir,
                            str(pid), str(nproc), str(port)]
  return multiprocess.Job(argv, nproc, env=env)


def _run_to_end(workdir, nproc, **env):
  job = _job(workdir, nproc, **env)
  ended = job.wait(_JOB_TIMEOUT_S)
  assert all(e.returncode == 0 for e in ended), job.describe()
  return _results(workdir, nproc)


def _results(workdir, nproc):
  return multiprocess.read_results(workdir, nproc, "final", "arrays")


def _assert_bitwise(got, expected):
  """Final parameters and Adam moments bitwise, and the MIPU decision of every
  step the process logged (process 0 logs them all; the others only the
  steps they ran)."""
  decisions = dict(zip(expected["steps"], expected["decisions"]))
  assert got["steps"] and got["steps"][-1] == expected["steps"][-1]
  assert [decisions[k] for k in got["steps"]] == got["decisions"]
  assert sorted(got["arrays"]) == sorted(expected["arrays"])
  for name, value in expected["arrays"].items():
    assert got["arrays"][name].tobytes() == value.tobytes(), name


def _ckpts(workdir):
  return os.path.join(workdir, "checkpoints")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted 2-process run: process 0's result, and its workdir."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  p0, p1 = _run_to_end(workdir, 2)
  _assert_bitwise(p1, p0)
  return dict(p0, workdir=workdir)


def _assert_job_ended_on_lost_process(ended, lost, since, workdir):
  """Every process but `lost` exited non-zero within the bound, naming `lost`
  and the newest committed step; the directory lists only committed steps."""
  newest = checkpoint.committed_steps(_ckpts(workdir))
  for p, e in enumerate(ended):
    if p == lost:
      continue
    assert e.returncode not in (0, None), e.output[-3000:]
    assert e.at - since < _BOUND_S, (e.at - since, e.output[-3000:])
    if lost == 0 and "JAX distributed service detected fatal errors" in e.output:
      # Process 0 hosts the coordination service: when it dies, JAX's runtime
      # ends the others from C++ at once (abort), before the guard can speak.
      # The guarantee left is a bounded, non-zero end (docs/reliability.md).
      assert e.returncode == -signal.SIGABRT, e.output[-3000:]
      continue
    match = re.search(r"process (\d+) is lost.*Newest committed checkpoint: "
                      r"(step (\d+)|none yet)", e.output)
    assert match and int(match.group(1)) == lost, e.output[-3000:]
    assert (int(match.group(3)) if match.group(3) else None) == (
        newest[-1] if newest else None), (match.group(0), newest)
  # Committed steps are complete (they restore in the rerun); a save cut short
  # is a tmp directory, never a step.
  for name in os.listdir(_ckpts(workdir)):
    assert name.isdigit() or ".orbax-checkpoint-tmp" in name, name


def _kill_and_resume(tmp_path, reference, seed, nproc=2):
  """SIGKILLs one process at a seeded random point, then (with a `reference`)
  reruns the job and compares."""
  rng = np.random.default_rng(seed)
  victim = int(rng.integers(nproc))
  where = _PHASES[int(rng.integers(len(_PHASES)))]
  # Evaluation runs at the last step; a save of the last step is the end.
  step = _STEPS if where == "evaluation" else int(rng.integers(1, _STEPS))
  delay = float(rng.uniform(0.0, 0.5))
  workdir = str(tmp_path / f"killed_{seed}")
  job = _job(workdir, nproc)
  marker = (f"SAVE_STARTED {step}" if where == "checkpoint save"
            else f"PHASE {step} {where}")
  job.wait_for(lambda p, line: p == victim and line.startswith(marker), _JOB_TIMEOUT_S)
  if where != "checkpoint save":  # a save is killed while in flight
    time.sleep(delay)
  since = job.signal(victim, signal.SIGKILL)
  ended = job.wait(_JOB_TIMEOUT_S)
  _assert_job_ended_on_lost_process(ended, victim, since, workdir)
  if reference is not None:
    for got in _run_to_end(workdir, nproc):
      _assert_bitwise(got, reference)


@pytest.mark.multiprocess
def test_a_killed_process_ends_the_job_in_bounded_time(tmp_path):
  """One job, one process killed, no rerun (the tests below rerun it)."""
  _kill_and_resume(tmp_path, None, seed=0)


@pytest.mark.multiprocess
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_a_process_killed_at_a_seeded_point_and_the_rerun_resumes_bitwise(
    tmp_path, reference, seed):
  _kill_and_resume(tmp_path, reference, seed=seed)


@pytest.mark.multiprocess
@pytest.mark.parametrize("seed", [0, 1])
def test_four_processes_one_killed_and_the_rerun_resumes_bitwise(
    tmp_path_factory, tmp_path, seed):
  workdir = str(tmp_path_factory.mktemp("reference4"))
  reference4 = _run_to_end(workdir, 4)
  for got in reference4[1:]:
    _assert_bitwise(got, reference4[0])
  _kill_and_resume(tmp_path, reference4[0], seed=seed, nproc=4)


@pytest.mark.multiprocess
def test_preemption_notice_stops_every_process_at_one_step_and_resumes(tmp_path, reference):
  workdir = str(tmp_path / "preempted")
  job = _job(workdir, 2)
  job.wait_for(lambda p, line: p == 1 and line.startswith("PHASE 1 rollout"), _JOB_TIMEOUT_S)
  job.signal(1, signal.SIGTERM)
  ended = job.wait(_JOB_TIMEOUT_S)
  assert all(e.returncode == 0 for e in ended), job.describe()
  stopped = [r["stopped_at"] for r in _results(workdir, 2)]
  assert stopped[0] == stopped[1] and 1 <= stopped[0] < _STEPS, stopped
  assert checkpoint.committed_steps(_ckpts(workdir))[-1] == stopped[0]
  resumed = _run_to_end(workdir, 2)
  for got in resumed:
    _assert_bitwise(got, reference)
  # No step ran twice or was skipped: the log has every step once.
  from mipu_jax import rl  # pylint: disable=g-import-not-at-top
  logged = [int(r["step"]) for r in rl.read_jsonl(os.path.join(workdir, "metrics.jsonl"))]
  assert logged == list(range(_STEPS + 1))


@pytest.mark.multiprocess
def test_a_stuck_process_is_ended_by_its_watchdog_and_the_job_stops(tmp_path, reference):
  workdir = str(tmp_path / "stuck")
  job = _job(workdir, 2, MIPU_TEST_FAULT=f"hang:1:{_STEPS}:rollout", MIPU_TEST_STEP_TIMEOUT="60")
  job.wait_for(lambda p, line: p == 1 and line.startswith("HANGING"), _JOB_TIMEOUT_S)
  since = time.monotonic()
  ended = job.wait(_JOB_TIMEOUT_S)
  assert ended[1].returncode == 76, ended[1].output[-3000:]
  assert f"stuck: rollout of step {_STEPS} has lasted" in ended[1].output
  assert "in its own code, not waiting for another process" in ended[1].output
  assert "in traced_phase" in ended[1].output  # the loop's stack: where it hangs
  assert ended[1].at - since < 60 + _BOUND_S
  _assert_job_ended_on_lost_process(ended, 1, ended[1].at, workdir)
  for got in _run_to_end(workdir, 2):
    _assert_bitwise(got, reference)


@pytest.mark.multiprocess
def test_a_full_disk_on_one_process_stops_the_job_and_keeps_the_committed_steps(
    tmp_path, reference):
  workdir = str(tmp_path / "full")
  job = _job(workdir, 2, MIPU_TEST_FAULT=f"enospc:1:{_STEPS}")
  ended = job.wait(_JOB_TIMEOUT_S)
  assert ended[1].returncode == 1, ended[1].output[-3000:]
  assert "no space left on the device" in ended[1].output
  assert "newest intact checkpoint is step 1" in ended[1].output
  _assert_job_ended_on_lost_process(ended, 1, ended[1].at, workdir)
  assert checkpoint.committed_steps(_ckpts(workdir)) == [1]
  for got in _run_to_end(workdir, 2):
    _assert_bitwise(got, reference)


def _process_shards(step_dir, pid):
  """The array-data files of `pid`'s own OCDBT database in a saved step."""
  root = os.path.join(step_dir, "state", f"ocdbt.process_{pid}", "d")
  return [os.path.join(root, n) for n in sorted(os.listdir(root))]


@pytest.mark.multiprocess
@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupt_shard_on_one_process_never_splits_the_resume(tmp_path, reference, damage):
  workdir = str(tmp_path / damage)
  # The reference's run, with process 1's shards of its last step damaged.
  shutil.copytree(reference["workdir"], workdir,
                  ignore=shutil.ignore_patterns("final_*", "result_*"))
  for path in _process_shards(os.path.join(_ckpts(workdir), str(_STEPS)), 1):
    data = bytearray(open(path, "rb").read())
    if damage == "flip":
      middle = len(data) // 2
      data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    else:
      data = data[: len(data) // 2]
    with open(path, "wb") as f:
      f.write(data)
  job = _job(workdir, 2)
  ended = job.wait(_JOB_TIMEOUT_S)
  if damage == "truncate":  # read by process 1 alone: it stops the job
    assert ended[1].returncode == 1, job.describe()
    assert "cannot be read by process 1" in ended[1].output
    _assert_job_ended_on_lost_process(ended, 1, ended[1].at, workdir)
  else:  # the global fingerprint differs on both: they fall back together
    assert all(e.returncode == 0 for e in ended), job.describe()
  assert [n.split("-")[0] for n in os.listdir(_ckpts(workdir) + ".unreadable")] == [str(_STEPS)]
  if damage == "truncate":
    _run_to_end(workdir, 2)
  for got in _results(workdir, 2):
    _assert_bitwise(got, reference)
  assert sorted(checkpoint.committed_steps(_ckpts(workdir))) == [1, _STEPS]


if __name__ == "__main__":
  _target(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
