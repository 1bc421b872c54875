"""MIPU Step 2 and random rollback in the RL loop, bitwise (docs/method.md §5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mipu_jax import config as config_lib
from mipu_jax import schedules
from mipu_jax import testing
from mipu_jax.learner import LearnerState
from mipu_jax.rl import build
from mipu_jax.rl import gates
from mipu_jax.rl import step as step_lib


def _bytes(tree) -> list[bytes]:
  """Every leaf's raw bytes (typed PRNG keys as their key data)."""
  def raw(x):
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    return np.atleast_1d(np.asarray(x)).view(np.uint8).tobytes()
  return [raw(x) for x in jax.tree.leaves(tree)]


def tiny_config(**mipu) -> config_lib.TrainConfig:
  """A few-second RL step on CPU (`testing.tiny_run_config`) with the
  length-surge schedule, whose state must survive a rollback."""
  return testing.tiny_run_config(
      3, optim=dict(learning_rate=1e-3, schedule="length_surge",
                    length_surge=config_lib.LengthSurgeConfig(mode="auto")),
      learner=dict(mesh=config_lib.MeshConfig()), mipu=mipu)


@pytest.fixture(scope="module")
def run_and_state():
  cfg = tiny_config(step2=True, num_probe_prompts=4)
  run = build.build_run(cfg, donate=False)
  params = nnx.to_pure_dict(nnx.state(run.model, nnx.Param))
  state = run.learner.init_state(params, cfg.seed)
  run.sampler.update_weights(state.params)
  return run, state


def _gated_step(run, state, c):
  gate = gates.MipuGate(config_lib.MipuConfig(step2=True, c=c,
                                              num_probe_prompts=4))
  run.sampler.update_weights(state.params)
  sampler_before = _bytes(run.sampler.params)
  new, metrics = step_lib.rl_step(run, state, 1, gate)
  return new, metrics, sampler_before, gate


def test_forced_reject_restores_params_opt_state_and_sampler_bitwise(run_and_state):
  run, state = run_and_state
  before = _bytes((state.params, state.opt_state))
  new, metrics, sampler_before, gate = _gated_step(run, state, c=-1e9)
  assert metrics["mipu/accepted"] == 0.0
  assert metrics["mipu/rollback_rate"] == 1.0
  assert np.isfinite(metrics["mipu/gap_post"])
  assert 0.0 <= metrics["mipu/probe_reward"] <= 1.0
  # Parameters and Adam moments return bitwise; the LR schedule's state
  # advances with the rejected step (docs/method.md §6).
  old_schedule = schedules.find_schedule_state(state.opt_state)
  new_schedule = schedules.find_schedule_state(new.opt_state)
  assert int(new_schedule.count) == int(old_schedule.count) + 1
  assert float(new_schedule.length_ema) > 0.0
  restored = schedules.replace_schedule_state(new.opt_state, old_schedule)
  assert _bytes((new.params, restored)) == before
  assert _bytes(run.sampler.params) == sampler_before
  # The update counter and the RNG advance anyway.
  assert int(new.step) == int(state.step) + 1
  assert _bytes(new.rng) != _bytes(state.rng)
  assert gate.state_dict() == {"num_candidates": 1, "num_accepted": 0,
                               "num_rollbacks": 1}


def test_forced_accept_keeps_the_candidate_bitwise(run_and_state):
  run, state = run_and_state
  new, metrics, sampler_before, _ = _gated_step(run, state, c=1e9)
  assert metrics["mipu/accepted"] == 1.0 and metrics["mipu/rollback_rate"] == 0.0
  gated_sampler = _bytes(run.sampler.params)
  assert gated_sampler != sampler_before
  # The ungated step from the same state is the candidate itself.
  run.sampler.update_weights(state.params)
  candidate, _ = step_lib.rl_step(run, state, 1, None)
  assert _bytes(new) == _bytes(candidate)
  assert _bytes(run.sampler.params) == gated_sampler
  assert _bytes((new.params, new.opt_state)) != _bytes(
      (state.params, state.opt_state))


def test_gap_post_decides_with_the_default_margin(run_and_state):
  """c = 1e-4: the decision is `T̂_post ≥ -c`; an fp32 sampler makes ρ ≈ 1."""
  run, state = run_and_state
  new, metrics, _, _ = _gated_step(run, state, c=1e-4)
  assert metrics["mipu/c"] == pytest.approx(1e-4)
  assert metrics["mipu/accepted"] == float(metrics["mipu/gap_post"] >= -1e-4)


def test_noise_scaled_margin_is_k_standard_errors(run_and_state):
  run, state = run_and_state
  gate = gates.MipuGate(config_lib.MipuConfig(
      step2=True, c_noise_multiple=2.0, num_probe_prompts=4))
  run.sampler.update_weights(state.params)
  _, metrics = step_lib.rl_step(run, state, 1, gate)
  assert metrics["mipu/gap_post_se"] >= 0.0
  assert metrics["mipu/c"] == pytest.approx(2.0 * metrics["mipu/gap_post_se"])
  assert metrics["mipu/accepted"] == float(
      metrics["mipu/gap_post"] >= -metrics["mipu/c"])


def test_next_batch_probe_uses_the_next_steps_prompts(run_and_state):
  run, state = run_and_state
  gate = gates.MipuGate(config_lib.MipuConfig(step2=True, probe="next_batch"),
                        seed=run.cfg.seed)
  run.sampler.update_weights(state.params)
  probe = gate.probe(run, 1)
  chosen, everything, _ = step_lib.collect(run, 2)
  assert probe.problems == everything.problems
  np.testing.assert_array_equal(probe.tokens_RT, everything.tokens_RT)


def _toy_states(i):
  prev = LearnerState(params={"w": jnp.full((3,), float(i))}, opt_state=(),
                      step=jnp.int32(i), rng=jax.random.key(i))
  cand = LearnerState(params={"w": jnp.full((3,), float(i) + 0.5)}, opt_state=(),
                      step=jnp.int32(i + 1), rng=jax.random.key(i + 1))
  return prev, cand


def test_random_rollback_rate_is_p():
  p, n = 0.3, 2000
  gate = gates.RandomRollbackGate(p, seed=7)
  prev, cand = _toy_states(0)
  rejected = 0
  for k in range(1, n + 1):
    d = gate(None, cand, prev, k)
    rejected += not d.accepted
    expected = prev.params if not d.accepted else cand.params
    assert d.state.params is expected and d.state.step is cand.step
  assert abs(rejected / n - p) < 4 * np.sqrt(p * (1 - p) / n)
  assert gate.state_dict()["num_rollbacks"] == rejected
  assert d.metrics["mipu/rollback_rate"] == pytest.approx(rejected / n)
  # Same seed, same coins (what makes a resumed run flip the same coins).
  again = gates.RandomRollbackGate(p, seed=7)
  assert [again(None, cand, prev, k).accepted for k in range(1, 50)] == [
      gates.RandomRollbackGate(p, seed=7)(None, cand, prev, k).accepted
      for k in range(1, 50)]


def test_counters_round_trip():
  gate = gates.RandomRollbackGate(0.5)
  prev, cand = _toy_states(0)
  for k in range(5):
    gate(None, cand, prev, k)
  other = gates.RandomRollbackGate(0.5)
  other.load_state_dict(gate.state_dict())
  assert other.state_dict() == gate.state_dict()


def test_mipu_config_validation_and_gate_choice():
  d = config_lib.default_config()
  d.mipu.step2 = True
  assert isinstance(gates.from_config(config_lib.from_config_dict(d)),
                    gates.MipuGate)
  d.mipu.random_rollback_p = 0.2
  with pytest.raises(ValueError, match="mutually exclusive"):
    config_lib.from_config_dict(d)
  d.mipu.step2 = False
  assert isinstance(gates.from_config(config_lib.from_config_dict(d)),
                    gates.RandomRollbackGate)
  assert gates.from_config(config_lib.TrainConfig()) is None
  for bad in (dict(random_rollback_p=1.5), dict(random_rollback_p=-0.1),
              dict(probe="nope"), dict(num_probe_prompts=0),
              dict(c_noise_multiple=0.0),
              dict(c_noise_multiple=2.0, num_probe_prompts=1)):
    with pytest.raises(ValueError):
      config_lib.MipuConfig(**bad)
