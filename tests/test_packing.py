"""Sequence packing: the plan by hand, and packed == unpacked log-probs, loss,
gradients and metrics (one device and a 4-way data-parallel mesh)."""

import jax
import numpy as np
import pytest
from flax import nnx

from mipu_jax import config as config_lib
from mipu_jax import losses
from mipu_jax.learner import host_batch
from mipu_jax.learner import Learner
from mipu_jax.learner import packing
from mipu_jax.models import get_config
from mipu_jax.models import make_mesh
from mipu_jax.models import Qwen3


def _mask(lengths, width):
  return (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


def test_plan_first_fit_decreasing_by_hand():
  # Lengths 5, 3, 2, 6 into rows of 8: 6 opens row 0, 5 opens row 1, 3 joins
  # row 1 (room 3), 2 joins row 0 (room 2). Within a row, responses keep
  # their batch order.
  plan = packing.plan(_mask([5, 3, 2, 6], 7), pack_length=8, rows_per_micro=2)
  t = 7
  np.testing.assert_array_equal(plan.src_RP, [
      [2 * t + 0, 2 * t + 1, 3 * t + 0, 3 * t + 1, 3 * t + 2, 3 * t + 3, 3 * t + 4, 3 * t + 5],
      [0, 1, 2, 3, 4, t + 0, t + 1, t + 2]])
  np.testing.assert_array_equal(plan.segment_ids_RP, [[1, 1, 2, 2, 2, 2, 2, 2],
                                                      [1, 1, 1, 1, 1, 2, 2, 2]])
  np.testing.assert_array_equal(plan.positions_RP, [[0, 1, 0, 1, 2, 3, 4, 5],
                                                    [0, 1, 2, 3, 4, 0, 1, 2]])


def test_plan_pads_rows_and_skips_empty_responses():
  plan = packing.plan(_mask([4, 0, 4, 4], 4), pack_length=4, rows_per_micro=2)
  # Three full rows → two micro-batches of two rows; the fourth is padding.
  assert plan.src_RP.shape == (4, 4)
  np.testing.assert_array_equal(plan.src_RP[3], -1)
  np.testing.assert_array_equal(plan.segment_ids_RP[3], 0)
  assert sorted(plan.src_RP[plan.src_RP >= 0] // 4) == [0] * 4 + [2] * 4 + [3] * 4


@pytest.mark.parametrize("bins,rows,expected", [
    (1, 1, 1), (3, 1, 4), (5, 2, 8), (8, 2, 8), (9, 4, 16), (0, 4, 4)])
def test_packed_rows_are_few_sizes(bins, rows, expected):
  assert packing.num_packed_rows(bins, rows) == expected


def test_plan_errors():
  with pytest.raises(ValueError, match="does not fit learner.pack_length=4"):
    packing.plan(_mask([5], 6), pack_length=4, rows_per_micro=1)
  gap = np.array([[1, 0, 1]], np.float32)
  with pytest.raises(ValueError, match="row 0 has padding before a real token"):
    packing.plan(gap, pack_length=4, rows_per_micro=1)


def test_config_errors():
  with pytest.raises(ValueError, match="num_minibatches=1"):
    config_lib.LearnerConfig(pack_length=64, num_minibatches=2)
  with pytest.raises(ValueError, match=">= 0"):
    config_lib.LearnerConfig(pack_length=-1)


def test_gather_scatter_round_trip():
  rng = np.random.default_rng(0)
  mask = _mask(rng.integers(0, 9, 6), 9)
  plan = packing.plan(mask, pack_length=12, rows_per_micro=2)
  x = rng.normal(size=mask.shape).astype(np.float32)
  back = packing.scatter(packing.gather(x, plan.src_RP), plan.src_RP, x.shape)
  np.testing.assert_array_equal(np.asarray(back), x * mask)
  rows = packing.gather_rows(np.arange(6, dtype=np.float32), plan.src_RP, 9)
  np.testing.assert_array_equal(np.asarray(rows)[plan.src_RP >= 0],
                                plan.src_RP[plan.src_RP >= 0] // 9)


B, T, V = 16, 23, 20


def _config(pack_length, aggregation, epochs=1):
  learner = (config_lib.LearnerConfig(pack_length=pack_length, ppo_epochs=epochs)
             if pack_length else config_lib.LearnerConfig(ppo_epochs=epochs))
  return config_lib.TrainConfig(
      data=config_lib.DataConfig(prompts_per_step=4, group_size=4),
      loss=losses.LossConfig(aggregation=aggregation, correction=losses.CorrectionConfig
                             .from_preset("geo_rs_seq_tis")),
      # eps = 1: Adam's first update lr · g / (|g| + eps) is then ≈ lr · g, so
      # the parameters compare the gradients themselves (with a small eps, an
      # entry with g ≈ 0 would amplify float noise to ±lr).
      optim=config_lib.OptimConfig(learning_rate=1.0, eps=1.0),
      learner=learner, sampling=config_lib.SamplingConfig(max_new_tokens=16))


def _arrays():
  rng = np.random.default_rng(0)
  prompt_B = rng.integers(3, 7, B)
  resp_B = rng.integers(1, 16, B)
  pos = np.arange(T)[None, :]
  input_mask = (pos < (prompt_B + resp_B)[:, None]).astype(np.float32)
  loss_mask = input_mask * (pos >= prompt_B[:, None])
  tokens = rng.integers(3, V, (B, T)) * input_mask.astype(np.int64)
  return tokens, input_mask, loss_mask, rng.normal(size=B), rng.normal(0, 0.02, (B, T))


def _step(pack_length, mesh, aggregation, epochs=1):
  # One layer: packing changes only how attention sees a row (segments, positions),
  # which one layer exercises as fully as two.
  model = Qwen3(get_config("tiny", vocab_size=V, num_layers=1, dtype="float32"),
                rngs=nnx.Rngs(0))
  learner = Learner.from_config(_config(pack_length, aggregation, epochs), model, mesh)
  state = learner.init_state(nnx.to_pure_dict(nnx.state(model, nnx.Param)), seed=0)
  tokens, input_mask, loss_mask, adv, noise = _arrays()
  lp_old = np.asarray(learner.logprobs(state.params, tokens, input_mask))
  batch = host_batch(tokens, input_mask, loss_mask, (lp_old + noise) * loss_mask, adv,
                     lp_old_BT=lp_old * loss_mask)
  state, metrics = learner.step(state, batch)
  return lp_old, jax.device_get(state.params), jax.device_get(metrics), learner


@pytest.mark.long
def test_packed_equals_unpacked():
  # A per-response aggregation, two PPO epochs, rows split over 4 devices.
  aggregation, epochs = "seq_mean_token_mean", 2
  mesh = make_mesh(4, 1, 1, devices=jax.devices()[:4])
  lp_ref, params_ref, m_ref, _ = _step(0, mesh, aggregation, epochs)
  # Rows of 32 tokens hold two or three responses each.
  lp, params, m, learner = _step(32, mesh, aggregation, epochs)
  plan = learner.pack_plan(_arrays()[1])
  assert plan.src_RP.shape[0] < B  # the packing did pack
  _, input_mask, _, _, _ = _arrays()
  np.testing.assert_allclose(lp * input_mask, lp_ref * input_mask, atol=2e-5)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params_ref), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6)
  assert set(m) == set(m_ref)
  for k in m_ref:
    np.testing.assert_allclose(m[k], m_ref[k], rtol=1e-4, atol=1e-6, err_msg=k)
  assert learner.traces["step"] == 1
