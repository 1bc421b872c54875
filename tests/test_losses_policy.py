"""Micro-batches of the policy objective sum to `losses.policy_loss` exactly (docs/method.md §2–3)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mipu_jax import config as config_lib
from mipu_jax import losses
from mipu_jax import schedules
from mipu_jax.learner import make_optimizer

B, T = 6, 7


def _arrays(seed=0):
  rng = np.random.default_rng(seed)
  lens = np.array([7, 3, 0, 5, 1, 6])  # row 2 has no counted token
  mask = (np.arange(T)[None, :] < lens[:, None]).astype(np.float32)
  lp_old = -rng.uniform(0.1, 3.0, (B, T)).astype(np.float32)
  lp_mu = lp_old + rng.normal(0, 0.4, (B, T)).astype(np.float32)
  lp = lp_old + rng.normal(0, 0.2, (B, T)).astype(np.float32)
  adv = rng.normal(size=B).astype(np.float32)
  ent = rng.uniform(0, 2, (B, T)).astype(np.float32)
  ref = lp_old + rng.normal(0, 0.1, (B, T)).astype(np.float32)
  return tuple(map(jnp.asarray, (lp, lp_old, lp_mu, adv, mask, ent, ref)))


def _split_loss(lp, lp_old, lp_mu, adv, mask, ent, ref, cfg, splits):
  """Σ over row chunks of `micro_loss`, with whole-batch corrections and coefficients."""
  corrected, _ = losses.correct_batch(lp_old, lp_mu, mask, cfg)
  coef = losses.token_coefficients(corrected.keep_BT, corrected.denom_BT, cfg, T)
  lp_ref = lp_old if cfg.mode == "on_policy_recompute" else lp_mu
  total = 0.0
  for rows in np.array_split(np.arange(B), splits):
    loss, _ = losses.micro_loss(
        lp[rows], ent[rows], lp_ref[rows], adv[rows], corrected.weights_BT[rows],
        corrected.keep_BT[rows], coef[rows], mask[rows],
        ref[rows] if cfg.kl_coef > 0 else None, cfg)
    total = total + loss
  return total


@pytest.mark.parametrize("aggregation, preset", (
    [(a, "mis_miles") for a in losses.AGGREGATIONS]  # RS + veto + SNIS
    + [("token_mean", "icepop"), ("seq_mean_token_mean", "seq_tis"),
       ("seq_mean_token_sum", "geo_rs"), ("token_mean", "none")]))
def test_split_objective_equals_policy_loss(aggregation, preset):
  """Three uneven micro-batches sum to the whole-batch loss and gradient."""
  cfg = losses.LossConfig(aggregation=aggregation, dual_clip=3.0, kl_coef=0.1,
                          entropy_coef=0.01, rejected_in_denominator=preset != "icepop",
                          correction=losses.CorrectionConfig.from_preset(preset))
  lp, lp_old, lp_mu, adv, mask, ent, ref = _arrays()

  def reference(lp):
    return losses.policy_loss(lp, lp_old, lp_mu, adv, mask, cfg, lp_ref_model=ref,
                              entropy=ent)[0]

  def ours(lp):
    return _split_loss(lp, lp_old, lp_mu, adv, mask, ent, ref, cfg, 3)

  value, grad = jax.value_and_grad(ours)(lp)
  ref_value, ref_grad = jax.value_and_grad(reference)(lp)
  np.testing.assert_allclose(value, ref_value, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)


def test_bypass_references_lp_mu_and_logs_no_mismatch():
  cfg = losses.LossConfig(mode="bypass",
                          correction=losses.CorrectionConfig.from_preset("none"))
  lp, lp_old, lp_mu, adv, mask, ent, ref = _arrays(1)
  _, metrics = losses.correct_batch(lp_mu, lp_mu, mask, cfg)
  assert not set(losses.MISMATCH_METRIC_NAMES) & set(metrics)
  expected = losses.policy_loss(lp, None, lp_mu, adv, mask, cfg)[0]
  np.testing.assert_allclose(
      _split_loss(lp, lp_mu, lp_mu, adv, mask, ent, ref, cfg, 2), expected, rtol=1e-6)


def test_on_policy_logs_every_mismatch_and_correction_metric():
  lp, lp_old, lp_mu, adv, mask, *_ = _arrays(2)
  _, metrics = losses.correct_batch(lp_old, lp_mu, mask, losses.LossConfig())
  assert set(losses.MISMATCH_METRIC_NAMES) <= set(metrics)
  assert set(losses.CORRECTION_METRIC_NAMES) <= set(metrics)
  assert all(np.isfinite(v) for v in jax.device_get(metrics).values())


def test_optimizer_is_clipped_adamw_with_the_rate_in_its_state():
  cfg = config_lib.OptimConfig(learning_rate=3e-2, weight_decay=0.01, clip_norm=0.5)
  ours = make_optimizer(cfg, num_steps=10)
  ref = optax.chain(optax.clip_by_global_norm(0.5),
                    optax.adamw(3e-2, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=0.01))
  params = {"w": jnp.arange(6.0).reshape(2, 3) / 7, "b": jnp.ones(5)}
  s_ours, s_ref = ours.init(params), ref.init(params)
  p_ours = p_ref = params
  for k in range(3):
    grads = jax.tree.map(lambda x: jnp.sin(x * (k + 1)) * 3.0, p_ours)
    u, s_ours = ours.update(grads, s_ours, p_ours, response_length=5.0)
    p_ours = optax.apply_updates(p_ours, u)
    u, s_ref = ref.update(grads, s_ref, p_ref)
    p_ref = optax.apply_updates(p_ref, u)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), p_ours, p_ref)


def test_length_surge_schedule_receives_the_response_length():
  cfg = config_lib.OptimConfig(
      learning_rate=1.0, schedule="length_surge",
      length_surge=dataclasses.replace(config_lib.LengthSurgeConfig(), mode="fixed",
                                       decay_period=2))
  tx = make_optimizer(cfg, num_steps=10)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  rates = []
  for _ in range(4):
    _, state = tx.update(params, state, params, response_length=jnp.float32(12.0))
    rates.append(float(schedules.current_learning_rate(state)))
  assert rates == [1.0, 0.5, 0.5, 0.25]
