"""The sharded learner step: 1 device == 8 devices, one compilation, on-policy ratio 1."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mipu_jax import config as config_lib
from mipu_jax import losses
from mipu_jax import schedules
from mipu_jax.learner import host_batch
from mipu_jax.learner import Learner
from mipu_jax.models import get_config
from mipu_jax.models import make_mesh
from mipu_jax.models import Qwen3

B, L, V = 16, 23, 20


def _config(mu_dtype="float32"):
  return config_lib.TrainConfig(
      data=config_lib.DataConfig(prompts_per_step=4, group_size=4),
      loss=losses.LossConfig(aggregation="seq_mean_token_mean",
                             correction=losses.CorrectionConfig.from_preset("mis_miles")),
      optim=config_lib.OptimConfig(learning_rate=1e-3, mu_dtype=mu_dtype),
      learner=config_lib.LearnerConfig(num_minibatches=2, num_microbatches=2),
      sampling=config_lib.SamplingConfig(max_new_tokens=16))


def _model():
  return Qwen3(get_config("tiny", vocab_size=V), rngs=nnx.Rngs(0))


def _host_arrays():
  rng = np.random.default_rng(0)
  prompt_B = rng.integers(3, 7, B)
  resp_B = rng.integers(1, 16, B)
  pos = np.arange(L)[None, :]
  input_mask = (pos < (prompt_B + resp_B)[:, None]).astype(np.float32)
  loss_mask = input_mask * (pos >= prompt_B[:, None])
  tokens = rng.integers(3, V, (B, L)) * input_mask.astype(np.int64)
  adv = rng.normal(size=B)
  return tokens, input_mask, loss_mask, adv


def _run(mesh, steps=2, model=None, mu_dtype="float32"):
  """Two learner steps on a fresh state (of `model`, default `_model()`); returns
  (params, metrics list, learner)."""
  cfg, model = _config(mu_dtype), _model() if model is None else model
  learner = Learner.from_config(cfg, model, mesh)
  state = learner.init_state(nnx.to_pure_dict(nnx.state(model, nnx.Param)), seed=0)
  tokens, input_mask, loss_mask, adv = _host_arrays()
  metrics = []
  noise = np.random.default_rng(1).normal(0, 0.3, (B, L))
  for _ in range(steps):
    lp_old = np.asarray(learner.logprobs(state.params, tokens, input_mask)) * loss_mask
    batch = host_batch(tokens, input_mask, loss_mask, (lp_old + noise) * loss_mask, adv,
                       lp_old_BT=lp_old)
    state, m = learner.step(state, batch)
    metrics.append(jax.device_get(m))
  return jax.device_get(state), metrics, learner


@pytest.fixture(scope="module")
def one_device():
  return _run(make_mesh(1, 1, 1, devices=jax.devices()[:1]))


def test_second_call_does_not_recompile(one_device):
  _, metrics, learner = one_device
  assert learner.traces == {"step": 1, "logprobs": 1}
  assert len(metrics) == 2


def test_learner_resolves_the_mlp_recompute_for_its_mesh(one_device):
  _, _, learner = one_device
  platform = learner.mesh.devices.flat[0].platform
  assert learner.spec.recompute_mlp is (platform == "cpu")


def test_on_policy_ratio_is_one_on_the_first_minibatch(one_device):
  _, metrics, _ = one_device
  for m in metrics:
    assert m["actor/first_update_ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert m["actor/first_update_ratio_max"] == pytest.approx(1.0, abs=1e-5)
    # The second mini-batch sees parameters the first one moved.
    assert m["actor/ppo_ratio_max"] > 1.0 + 1e-4
    assert m["actor/num_updates"] == 2


def test_metrics_cover_spec_section_4(one_device):
  _, metrics, _ = one_device
  names = set(metrics[0])
  assert set(losses.MISMATCH_METRIC_NAMES) <= names
  assert set(losses.CORRECTION_METRIC_NAMES) <= names
  for name in ("actor/loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/entropy",
               "actor/lr", "schedule/learning_rate"):
    assert name in names
  assert metrics[0]["actor/lr"] == pytest.approx(1e-3)
  assert metrics[0]["rollout_corr/rollout_rs_masked_fraction"] > 0  # noise 0.3 trips RS
  assert all(np.isfinite(v) for m in metrics for v in m.values())


@pytest.mark.extended
def test_eight_devices_equal_one_device(one_device):
  params_1, metrics_1, _ = one_device
  mesh = make_mesh(2, 2, 2)
  assert mesh.size == 8
  state_8, metrics_8, learner = _run(mesh)
  sharding = learner.state_shardings.params["layers"]["gate"]
  assert isinstance(sharding, NamedSharding) and sharding.spec[1:] == ("fsdp", "tensor")
  # Tolerances are about 3x the measured gaps (max abs difference on CPU). The
  # reduction order across shards (set by `shard_rows`' row constraints) moves
  # gradients in their last bits; Adam turns that, for near-zero gradients,
  # into parameter differences of a few % of one step (lr 1e-3).
  # Parameters: measured 2.1e-5.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=5e-5),
               state_8.params, params_1.params)
  adam_1, adam_8 = params_1.opt_state[1], state_8.opt_state[1]
  assert int(adam_8.count) == int(adam_1.count)
  jax.tree.map(np.testing.assert_array_equal,
               schedules.find_schedule_state(state_8.opt_state),
               schedules.find_schedule_state(params_1.opt_state))
  # First moments (|mu| up to 2.2e-2): measured 3.3e-7.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6),
               adam_8.mu, adam_1.mu)
  # Second moments (|nu| up to 2.4e-5): measured 3.0e-10.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-9),
               adam_8.nu, adam_1.nu)
  # Metrics: measured 3.8e-6 absolute, within 1e-4 relative.
  for m1, m8 in zip(metrics_1, metrics_8):
    for k in m1:
      np.testing.assert_allclose(m8[k], m1[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_adam_moments_follow_parameter_shardings():
  mesh = make_mesh(2, 2, 2)
  learner = Learner.from_config(_config(), _model(), mesh)
  sh = learner.state_shardings
  adam = sh.opt_state[1]
  assert adam.mu["layers"]["q"] == sh.params["layers"]["q"]
  assert adam.nu["embed"] == sh.params["embed"]
  assert adam.count.spec == P() and sh.step.spec == P() and sh.rng.spec == P()


def test_bf16_first_moment(one_device):
  """`optim.mu_dtype="bfloat16"`: the moment is bf16, sharded like its parameter on
  a mesh, and two steps land within bf16's rounding of the fp32-moment run."""
  params_1, _, _ = one_device
  sh = Learner.from_config(_config("bfloat16"), _model(), make_mesh(2, 2, 2)).state_shardings
  assert sh.opt_state[1].mu["layers"]["gate"] == sh.params["layers"]["gate"]
  state, metrics, _ = _run(make_mesh(1, 1, 1, devices=jax.devices()[:1]), mu_dtype="bfloat16")
  adam = state.opt_state[1]
  assert {x.dtype for x in jax.tree.leaves(adam.mu)} == {np.dtype("bfloat16")}
  assert {x.dtype for x in jax.tree.leaves(adam.nu)} == {np.dtype("float32")}
  assert int(adam.count) == int(params_1.opt_state[1].count)
  # Four Adam updates (2 steps x 2 mini-batches) move a parameter by up to
  # about 4e-3; bf16's rounding of the moment moves the result by far less
  # (measured 7.1e-5); a missing bias correction would move it by ~9e-3.
  diffs = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()),
                                       state.params, params_1.params))
  assert 0 < max(diffs) < 2e-4
  assert all(np.isfinite(v).all() for m in metrics for v in m.values())


def test_schedule_counts_rl_steps_and_adam_counts_updates(one_device):
  """Two RL steps of two mini-batches: the LR schedule saw 2 steps (docs/method.md
  §6), Adam's bias correction 4 updates."""
  state, metrics, _ = one_device
  assert int(schedules.find_schedule_state(state.opt_state).count) == 2
  assert int(state.opt_state[1].count) == 4
  assert int(state.step) == 2
  assert all(m["actor/num_updates"] == 2 for m in metrics)
