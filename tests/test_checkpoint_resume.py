"""Kill-and-resume: a checkpointing run SIGKILLed anywhere ends bitwise equal to an unkilled one.

The harness is `mipu_jax.testing.kill_resume` (its docstring has the target
protocol). This file is also the toy target: `python tests/test_checkpoint_resume.py WORKDIR`
trains a small MLP with AdamW (donating its state, splitting a typed PRNG key
every step) and saves every `_SAVE_EVERY` steps. The harness is imported in the
test only: `mipu_jax.testing` loads the config and model modules, which every
target process would load for nothing (0.6 s each).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

_STEPS = 48
_SAVE_EVERY = 4
_CKPT = "checkpoints"
_FINAL = "final_params.npz"


def _target_command(workdir: str) -> list[str]:
  return [sys.executable, os.path.abspath(__file__), workdir]


def _final_params(workdir: str) -> dict[str, np.ndarray]:
  with np.load(os.path.join(workdir, _FINAL)) as f:
    return {k: f[k] for k in f.files}


@pytest.mark.long
def test_kill_anywhere_then_resume_is_bitwise_equal(tmp_path):
  from mipu_jax.testing.kill_resume import Kill  # pylint: disable=g-import-not-at-top
  from mipu_jax.testing.kill_resume import kill_and_resume  # pylint: disable=g-import-not-at-top
  from mipu_jax.testing.kill_resume import run_attempt  # pylint: disable=g-import-not-at-top
  reference_dir = str(tmp_path / "reference")
  reference = run_attempt(_target_command(reference_dir), None,
                          ckpt_dir=os.path.join(reference_dir, _CKPT))
  assert not reference.killed and reference.saves_started == _STEPS // _SAVE_EVERY
  expected = _final_params(reference_dir)
  loop_s = reference.loop_seconds
  assert loop_s > 0

  # Timed kills land in the first half of the remaining loop, so a machine
  # faster now than during the reference run still gets killed.
  rng = np.random.default_rng(0)
  # One run killed three times (a save's, a timed, a save's kill), then resumed to the end.
  trials = [[Kill(nth_save=2), Kill(delay_s=rng.uniform(0.05, 0.5) * loop_s), Kill(nth_save=3)]]
  attempts = []
  for i, kills in enumerate(trials):
    workdir = str(tmp_path / f"trial{i}")
    attempts += kill_and_resume(_target_command(workdir), kills,
                                ckpt_dir=os.path.join(workdir, _CKPT))
    got = _final_params(workdir)
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
      assert got[name].tobytes() == value.tobytes(), (i, name, attempts)
  assert sum(a.killed for a in attempts) >= 3, attempts
  # At least one kill landed while a save was being written.
  assert any(a.partial_saves for a in attempts), attempts


def _target_main(workdir: str) -> None:
  """The toy target: a deterministic jitted MLP training loop with checkpoints."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  from mipu_jax.checkpoint import Checkpointer  # pylint: disable=g-import-not-at-top

  optimizer = optax.adamw(1e-2, weight_decay=0.01)

  def init():
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"w1_5x11": jax.random.normal(k1, (5, 11)) * 0.3,
              "w2_11x3": jax.random.normal(k2, (11, 3)) * 0.3}
    return {"params": params, "opt_state": optimizer.init(params),
            "rng": jax.random.key(1)}

  @jax.jit
  def loss_fn(params, x_B5, y_B3):
    h_B11 = jnp.tanh(x_B5 @ params["w1_5x11"])
    return jnp.mean(jnp.square(h_B11 @ params["w2_11x3"] - y_B3))

  def step_fn(state, step):
    rng, data_key = jax.random.split(state["rng"])
    data_key = jax.random.fold_in(data_key, step)
    x_B5 = jax.random.normal(data_key, (13, 5))
    y_B3 = jnp.sin(x_B5[:, :3]) + 0.1 * jax.random.normal(rng, (13, 3))
    grads = jax.grad(loss_fn)(state["params"], x_B5, y_B3)
    updates, opt_state = optimizer.update(grads, state["opt_state"],
                                          state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"params": params, "opt_state": opt_state, "rng": rng}

  step_fn = jax.jit(step_fn, donate_argnums=0)
  ckpt = Checkpointer(os.path.join(workdir, _CKPT), max_to_keep=2)
  start = 0
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(target=jax.eval_shape(init))
    start = meta["next_step"]
  else:
    state = init()
  print("LOOP_STARTED", start, flush=True)
  for step in range(start, _STEPS):
    state = step_fn(state, step)
    if (step + 1) % _SAVE_EVERY == 0:
      ckpt.save(step + 1, state, {"next_step": step + 1})
      print("SAVE_STARTED", step + 1, flush=True)
  ckpt.close()
  params = jax.device_get(state["params"])
  np.savez(os.path.join(workdir, _FINAL), **params)


if __name__ == "__main__":
  _target_main(sys.argv[1])
