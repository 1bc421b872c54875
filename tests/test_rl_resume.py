"""Kill-and-resume of the full RL loop with MIPU Step 2 (docs/method.md §5).

A tiny `rl.train` run with the Step 2 gate, checkpointing every step, is
SIGKILLed (once right after a save starts, so mid-save, and once at a seeded
random time in the resumed attempt), resumed from its latest checkpoint, and
must end with parameters, optimizer state, MIPU counters and the per-step
accept/rollback sequence bitwise equal to an uninterrupted run. The harness is
`mipu_jax.testing.kill_resume`; this file is also its target:
`python tests/test_rl_resume.py WORKDIR`.

Every attempt compiles into the session's persistent XLA compilation cache
(tests/conftest.py), so that the restarts do not recompile (CPU, 2 cores) and
the programs the in-process loop tests compile are compiled once.
"""

import json
import os
import sys

import numpy as np
import pytest

from mipu_jax.testing import kill_resume as harness

_STEPS = 4
_FINAL = "final_state.npz"


def _config():
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax import testing  # pylint: disable=g-import-not-at-top
  return testing.tiny_run_config(
      _STEPS, learner=dict(mesh=config_lib.MeshConfig()), eval=dict(num_samples=4),
      # c = 0: decisions on both sides of the threshold are plausible.
      mipu=dict(step2=True, c=0.0, num_probe_prompts=4))


def _target_main(workdir: str) -> None:
  """Trains `_config()` in `workdir` (resuming), then writes the final state."""
  import jax  # pylint: disable=g-import-not-at-top

  from mipu_jax import checkpoint  # pylint: disable=g-import-not-at-top
  from mipu_jax import rl  # pylint: disable=g-import-not-at-top

  save = checkpoint.Checkpointer.save

  def save_and_report(self, step, *args, **kwargs):
    out = save(self, step, *args, **kwargs)
    print("SAVE_STARTED", step, flush=True)
    return out

  checkpoint.Checkpointer.save = save_and_report
  print("LOOP_STARTED", flush=True)
  result = rl.train(_config(), workdir)
  leaves = jax.tree_util.tree_leaves_with_path(
      jax.device_get((result.state.params, result.state.opt_state)))
  np.savez(os.path.join(workdir, _FINAL),
           **{jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves})
  decisions = [r.get("mipu/accepted") for r in result.rows if r["step"] > 0]
  with open(os.path.join(workdir, "decisions.json"), "w") as f:
    json.dump(decisions, f)


def _final(workdir):
  with np.load(os.path.join(workdir, _FINAL)) as f:
    arrays = {k: f[k] for k in f.files}
  with open(os.path.join(workdir, "decisions.json")) as f:
    return arrays, json.load(f)


@pytest.mark.extended
@pytest.mark.long
def test_rl_loop_killed_anywhere_resumes_bitwise(tmp_path):
  command = lambda d: [sys.executable, os.path.abspath(__file__), d]

  reference_dir = str(tmp_path / "reference")
  reference = harness.run_attempt(
      command(reference_dir), None,
      ckpt_dir=os.path.join(reference_dir, "checkpoints"), timeout_s=600)
  assert reference.saves_started == _STEPS
  expected, expected_decisions = _final(reference_dir)
  assert len(expected_decisions) == _STEPS
  assert all(d in (0.0, 1.0) for d in expected_decisions)

  workdir = str(tmp_path / "killed")
  ckpt_dir = os.path.join(workdir, "checkpoints")
  first = harness.run_attempt(command(workdir), harness.Kill(nth_save=2),
                              ckpt_dir=ckpt_dir, timeout_s=600)
  # The timed kill lands within 0.8 of the first attempt's loop time (start
  # and two steps, the compilation cache warm): the second attempt has the same
  # start, two or more steps and the last step's evaluation to run, so it is
  # still running. Replay a failure with MIPU_KILL_SEED=<printed seed>.
  seed = int(os.environ.get("MIPU_KILL_SEED", np.random.SeedSequence().entropy % 2**32))
  print(f"MIPU_KILL_SEED={seed}")
  delay = float(np.random.default_rng(seed).uniform(0.0, 0.8 * first.loop_seconds))
  attempts = [first] + harness.kill_and_resume(
      command(workdir), [harness.Kill(delay_s=delay)], ckpt_dir=ckpt_dir, timeout_s=600)
  assert [a.killed for a in attempts] == [True, True, False], (seed, delay, attempts)
  got, decisions = _final(workdir)
  assert decisions == expected_decisions, (decisions, attempts)
  assert sorted(got) == sorted(expected)
  for name, value in expected.items():
    assert got[name].tobytes() == value.tobytes(), (name, attempts)


if __name__ == "__main__":
  _target_main(sys.argv[1])
