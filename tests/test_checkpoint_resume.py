"""Kill-and-resume: a checkpointing run SIGKILLed anywhere ends bitwise equal to an unkilled one.

`kill_and_resume` is the reusable harness (issue 5 points it at the RL loop):
it runs a target command, SIGKILLs it by a plan, restarts it, and finally lets
it finish. A target follows a small protocol:

- it takes its working directory as its last argument, resumes from the latest
  checkpoint there if any, and writes its final result inside it;
- it prints `LOOP_STARTED` once restored and training, and `SAVE_STARTED <step>`
  right after each (asynchronous) save call returns, with the save in flight;
- it exits 0 when done.

This file is also the toy target: `python tests/test_checkpoint_resume.py WORKDIR`
trains a small MLP with AdamW (donating its state, splitting a typed PRNG key
every step) and saves every `_SAVE_EVERY` steps.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STEPS = 48
_SAVE_EVERY = 4
_CKPT = "checkpoints"
_FINAL = "final_params.npz"


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
  """

  killed: bool
  saves_started: int
  partial_saves: int
  seconds: float


def run_attempt(command: Sequence[str], kill: Kill | None, *, ckpt_dir: str,
                timeout_s: float = 120.0) -> Attempt:
  """Runs `command` once, SIGKILLing it as `kill` says (None: to completion).

  Raises:
    RuntimeError: the target exits non-zero, or runs past `timeout_s`.
  """
  start = time.monotonic()
  env = dict(os.environ, PYTHONPATH=_REPO, PYTHONUNBUFFERED="1")
  proc = subprocess.Popen(list(command), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=env, text=True, bufsize=1)
  deadline, saves, log = None, 0, []
  try:
    while True:
      now = time.monotonic()
      if now - start > timeout_s:
        raise RuntimeError(f"Target timed out; output:\n{''.join(log)}")
      if deadline is not None and now >= deadline:
        return _kill(proc, saves, ckpt_dir, start)
      wait = 0.5 if deadline is None else max(deadline - now, 0.0)
      ready, _, _ = select.select([proc.stdout], [], [], min(wait, 0.5))
      if not ready:
        continue
      line = proc.stdout.readline()
      if not line:  # EOF: the target exited.
        rc = proc.wait()
        if rc != 0:
          raise RuntimeError(f"Target exited with {rc}; output:\n{''.join(log)}")
        return Attempt(False, saves, 0, time.monotonic() - start)
      log.append(line)
      if line.startswith("LOOP_STARTED") and kill and kill.delay_s is not None:
        deadline = time.monotonic() + kill.delay_s
      if line.startswith("SAVE_STARTED"):
        saves += 1
        if kill and kill.nth_save == saves:
          return _kill(proc, saves, ckpt_dir, start)
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait()
    proc.stdout.close()


def _kill(proc: subprocess.Popen, saves: int, ckpt_dir: str,
          start: float) -> Attempt:
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  partial = 0
  if os.path.isdir(ckpt_dir):
    partial = sum(".orbax-checkpoint-tmp" in n for n in os.listdir(ckpt_dir))
  return Attempt(True, saves, partial, time.monotonic() - start)


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


def _target_command(workdir: str) -> list[str]:
  return [sys.executable, os.path.abspath(__file__), workdir]


def _final_params(workdir: str) -> dict[str, np.ndarray]:
  with np.load(os.path.join(workdir, _FINAL)) as f:
    return {k: f[k] for k in f.files}


def test_kill_anywhere_then_resume_is_bitwise_equal(tmp_path):
  reference_dir = str(tmp_path / "reference")
  reference = run_attempt(_target_command(reference_dir), None,
                          ckpt_dir=os.path.join(reference_dir, _CKPT))
  assert not reference.killed and reference.saves_started == _STEPS // _SAVE_EVERY
  expected = _final_params(reference_dir)
  loop_s = max(reference.seconds - 3.0, 0.5)  # roughly: minus interpreter start.

  rng = np.random.default_rng(0)
  trials = [
      [Kill(nth_save=2), Kill(delay_s=rng.uniform(0, loop_s))],
      [Kill(delay_s=rng.uniform(0, loop_s)), Kill(nth_save=3)],
  ]
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
