"""docs/method.md §2: PPO clip, aggregation modes, KL and entropy, hand-computed.

Every array is `[B, T] = [2, 3]` and built with numpy: on CPU each new shape
costs fresh XLA compilations, so the loss tests share one.
"""

import math

import jax
import numpy as np
import pytest

from mipu_jax import losses

LN2 = math.log(2.0)
ONES = np.ones((2, 3), np.float32)
ZEROS = np.zeros((2, 3), np.float32)


def _log(x):
  return np.log(np.array(x, np.float32))


# --- per-token clipped loss (ε_low = 0.2, ε_high = 0.28) -------------------


def test_ppo_token_loss_asymmetric_clip():
  # lp_ref = 0, so r = exp(lp) = 2, 0.5, 1.1 on both rows.
  lp = _log([[2.0, 0.5, 1.1]] * 2)
  out = losses.ppo_token_loss(lp, ZEROS, np.array([1.0, -1.0]), ONES)
  # A = +1: max(-r, -clip(r, 0.8, 1.28)) = max(-2, -1.28), max(-.5, -.8),
  #   max(-1.1, -1.1).
  # A = -1: max(r, clip(r)) = max(2, 1.28), max(.5, .8), 1.1.
  np.testing.assert_allclose(out.loss_BT, [[-1.28, -0.5, -1.1],
                                           [2.0, 0.8, 1.1]], rtol=1e-6)
  np.testing.assert_array_equal(out.clipped_BT, [[1, 0, 0], [0, 1, 0]])
  np.testing.assert_array_equal(out.dual_clipped_BT, ZEROS)
  np.testing.assert_allclose(out.ratio_BT, [[2.0, 0.5, 1.1]] * 2, rtol=1e-6)


def test_ppo_token_loss_dual_clip():
  # A = -1, c = 3: r = 4 → min(max(4, 1.28), 3) = 3 (dual binds); r = 2 → 2;
  # r = .5 → min(.8, 3) = .8. A = +1 is never dual-clipped.
  lp = _log([[4.0, 2.0, 0.5], [4.0, 2.0, 0.5]])
  out = losses.ppo_token_loss(lp, ZEROS, np.array([-1.0, 1.0]), ONES,
                              dual_clip=3.0)
  np.testing.assert_allclose(out.loss_BT, [[3.0, 2.0, 0.8],
                                           [-1.28, -1.28, -0.5]], rtol=1e-6)
  np.testing.assert_array_equal(out.dual_clipped_BT, [[1, 0, 0], [0, 0, 0]])


def test_ppo_gradient_is_cut_where_clipped():
  # d ℓ / d lp = -A r where the unclipped branch is active, 0 where clipped.
  # Row 0 (A = 1): r = 2 clipped, r = .5 → -.5, r = 1.1 → -1.1.
  # Row 1 (A = -1): r = 2 → 2, r = .5 clipped, r = 1.1 → 1.1.
  lp = _log([[2.0, 0.5, 1.1]] * 2)
  def total(lp):
    out = losses.ppo_token_loss(lp, ZEROS, np.array([1.0, -1.0]), ONES)
    return out.loss_BT.sum()
  np.testing.assert_allclose(jax.grad(total)(lp),
                             [[0.0, -0.5, -1.1], [2.0, 0.0, 1.1]], rtol=1e-6)


# --- aggregation -----------------------------------------------------------

X = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
M = np.array([[1, 1, 1], [1, 0, 0]], np.float32)


@pytest.mark.parametrize("mode,max_len,expected", [
    ("token_mean", None, (1 + 2 + 3 + 4) / 4),
    ("seq_mean_token_mean", None, (6 / 3 + 4 / 1) / 2),
    ("seq_mean_token_sum", None, (6 + 4) / 2),
    ("seq_mean_token_sum_norm", 4, (6 / 4 + 4 / 4) / 2),
    ("seq_mean_token_sum_norm", None, (6 / 3 + 4 / 3) / 2),  # max_len = T
])
def test_aggregate_modes(mode, max_len, expected):
  np.testing.assert_allclose(
      losses.aggregate(X, M, mode, max_len=max_len), expected, rtol=1e-6)


@pytest.mark.parametrize("mode,expected", [
    ("token_mean", 6 / 3),
    ("seq_mean_token_mean", 6 / 3),
    ("seq_mean_token_sum", 6.0),
    ("seq_mean_token_sum_norm", 6 / 3),
])
def test_aggregate_skips_padding_rows(mode, expected):
  mask = np.array([[1, 1, 1], [0, 0, 0]], np.float32)
  np.testing.assert_allclose(losses.aggregate(X, mask, mode), expected,
                             rtol=1e-6)


# Token (0, 2) and (1, 1) rejected; the original mask has 5 tokens.
KEEP = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
ORIG = np.array([[1, 1, 1], [1, 1, 0]], np.float32)


@pytest.mark.parametrize("mode,stay,leave", [
    ("token_mean", (1 + 2 + 4) / 5, (1 + 2 + 4) / 3),
    ("seq_mean_token_mean", (3 / 3 + 4 / 2) / 2, (3 / 2 + 4 / 1) / 2),
    ("seq_mean_token_sum", (3 + 4) / 2, (3 + 4) / 2),
    ("seq_mean_token_sum_norm", (3 / 3 + 4 / 3) / 2, (3 / 3 + 4 / 3) / 2),
])
def test_aggregate_rejected_in_denominator(mode, stay, leave):
  np.testing.assert_allclose(
      losses.aggregate(X, KEEP, mode, denom_mask_BT=ORIG), stay, rtol=1e-6)
  np.testing.assert_allclose(
      losses.aggregate(X, KEEP, mode, denom_mask_BT=KEEP), leave, rtol=1e-6)


def test_fully_rejected_response_counts_only_when_staying():
  keep = np.array([[1, 1, 1], [0, 0, 0]], np.float32)
  mode = "seq_mean_token_sum"
  np.testing.assert_allclose(
      losses.aggregate(X, keep, mode, denom_mask_BT=ORIG), 6 / 2)
  np.testing.assert_allclose(losses.aggregate(X, keep, mode), 6 / 1)


@pytest.mark.parametrize("mode", losses.AGGREGATIONS)
def test_aggregate_empty_mask_is_zero_with_finite_grad(mode):
  x = np.array([[np.inf, 1.0, np.nan], [1.0, 2.0, 3.0]], np.float32)
  assert losses.aggregate(x, ZEROS, mode) == 0.0
  grad = jax.grad(lambda v: losses.aggregate(v, ZEROS, mode))(x)
  np.testing.assert_array_equal(grad, ZEROS)


def test_aggregate_unknown_mode():
  with pytest.raises(ValueError, match="unknown aggregation"):
    losses.aggregate(X, M, "sum")


# --- KL estimators ---------------------------------------------------------


@pytest.mark.parametrize("estimator,expected", [
    # log ρ = lp_ref - lp = log 2, log 0.5, then a masked token.
    ("k1", [-LN2, LN2, 0.0]),
    ("k2", [0.5 * LN2**2, 0.5 * LN2**2, 0.0]),
    ("k3", [2 - 1 - LN2, 0.5 - 1 + LN2, 0.0]),
])
def test_kl_estimators(estimator, expected):
  lp_ref = np.array([[LN2, -LN2, 5.0]] * 2, np.float32)
  kl = losses.kl_estimate(ZEROS, lp_ref, KEEP, estimator)
  np.testing.assert_allclose(kl[0], expected, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(kl[1], [expected[0], 0.0, 0.0], rtol=1e-6,
                             atol=1e-7)


def test_kl_unknown_estimator():
  with pytest.raises(ValueError, match="unknown KL estimator"):
    losses.kl_estimate(ZEROS, ZEROS, ONES, "k4")


# --- composed policy loss: modes, KL, entropy ------------------------------

# Row 0 counts tokens 0-1, row 1 only token 0; A = [1, 1].
# δ = lp_old - lp_mu = [log 2, 0 | 0]; row 1 is on-policy.
LP_OLD = _log([[0.5, 0.5, 1.0], [0.5, 1.0, 1.0]])
LP_MU = _log([[0.25, 0.5, 1.0], [0.5, 1.0, 1.0]])
MASK = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
ADV = np.array([1.0, 1.0], np.float32)


def _cfg(preset="token_tis", **kw):
  return losses.LossConfig(
      correction=losses.CorrectionConfig.from_preset(preset), **kw)


def test_decoupled_reference_is_lp_old():
  # lp = lp_old → r = 1, ℓ = -1; token TIS w = [2, 1 | 1]: (-2 - 1 - 1)/3.
  loss, metrics = losses.policy_loss(LP_OLD, LP_OLD, LP_MU, ADV, MASK, _cfg())
  np.testing.assert_allclose(loss, -4 / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics["actor/ppo_ratio_mean"], 1.0)
  np.testing.assert_allclose(metrics["actor/ppo_kl"], 0.0, atol=1e-7)
  assert metrics["actor/pg_clipfrac"] == 0.0
  # d/d lp of Σ(-r w)/3 at r = 1: -w/3.
  grad = jax.grad(lambda lp: losses.policy_loss(
      lp, LP_OLD, LP_MU, ADV, MASK, _cfg())[0])(LP_OLD)
  np.testing.assert_allclose(grad, [[-2 / 3, -1 / 3, 0], [-1 / 3, 0, 0]],
                             rtol=1e-6)


def test_bypass_reference_is_lp_mu():
  # lp = lp_old, reference lp_mu: r = [2, 1 | 1] → ℓ = [-1.28, -1 | -1].
  cfg = losses.LossConfig(
      mode="bypass", correction=losses.CorrectionConfig.from_preset("none"))
  loss, metrics = losses.policy_loss(LP_OLD, None, LP_MU, ADV, MASK, cfg)
  np.testing.assert_allclose(loss, (-1.28 - 1 - 1) / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics["actor/pg_clipfrac"], 1 / 3, rtol=1e-6)
  np.testing.assert_allclose(metrics["actor/ppo_ratio_max"], 2.0, rtol=1e-6)
  # lp_old, if given, changes nothing in bypass mode.
  loss2, _ = losses.policy_loss(LP_OLD, LP_OLD, LP_MU, ADV, MASK, cfg)
  np.testing.assert_allclose(loss2, loss)


def test_decoupled_without_correction():
  loss, _ = losses.policy_loss(LP_OLD, LP_OLD, LP_MU, ADV, MASK, _cfg("none"))
  np.testing.assert_allclose(loss, -1.0, rtol=1e-6)


def test_rejected_tokens_in_or_out_of_denominator():
  # token_mis on [0.5, 2] with δ = [log 4, 0 | 0]: token (0, 0) rejected.
  lp_mu = _log([[0.125, 0.5, 1.0], [0.5, 1.0, 1.0]])
  stay, m = losses.policy_loss(LP_OLD, LP_OLD, lp_mu, ADV, MASK,
                               _cfg("token_mis"))
  leave, _ = losses.policy_loss(
      LP_OLD, LP_OLD, lp_mu, ADV, MASK,
      _cfg("token_mis", rejected_in_denominator=False))
  np.testing.assert_allclose(stay, -2 / 3, rtol=1e-6)
  np.testing.assert_allclose(leave, -2 / 2, rtol=1e-6)
  np.testing.assert_allclose(m["rollout_corr/rejected_token_fraction"], 1 / 3,
                             rtol=1e-6)


def test_kl_and_entropy_terms():
  # lp = lp_old (r = 1, pg = -1 without correction); lp_ref_model = lp - log 2
  # → k1 = lp - lp_ref = log 2 per token; entropy [1, 2 | 3] → mean 2.
  cfg = _cfg("none", kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01)
  entropy = np.array([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]], np.float32)
  loss, metrics = losses.policy_loss(
      LP_OLD, LP_OLD, LP_MU, ADV, MASK, cfg, lp_ref_model=LP_OLD - LN2,
      entropy=entropy)
  np.testing.assert_allclose(loss, -1.0 + 0.1 * LN2 - 0.01 * 2.0, rtol=1e-6)
  np.testing.assert_allclose(metrics["actor/kl_loss"], LN2, rtol=1e-6)
  np.testing.assert_allclose(metrics["actor/entropy"], 2.0, rtol=1e-6)
  np.testing.assert_allclose(metrics["actor/pg_loss"], -1.0, rtol=1e-6)


def test_kl_and_entropy_off_by_default():
  _, metrics = losses.policy_loss(LP_OLD, LP_OLD, LP_MU, ADV, MASK, _cfg())
  assert "actor/kl_loss" not in metrics
  assert "actor/entropy" not in metrics


def test_missing_inputs_raise():
  with pytest.raises(ValueError, match="needs lp_old"):
    losses.policy_loss(LP_OLD, None, LP_MU, ADV, MASK, _cfg())
  with pytest.raises(ValueError, match="needs lp_ref_model"):
    losses.policy_loss(LP_OLD, LP_OLD, LP_MU, ADV, MASK, _cfg(kl_coef=0.1))
  with pytest.raises(ValueError, match="needs entropy"):
    losses.policy_loss(LP_OLD, LP_OLD, LP_MU, ADV, MASK,
                       _cfg(entropy_coef=0.1))


def test_only_lp_is_differentiated():
  cfg = _cfg("mis_miles", kl_coef=0.1)
  def f(lp_old, lp_mu, lp_ref_model):
    return losses.policy_loss(LP_OLD + 0.1, lp_old, lp_mu, ADV, MASK, cfg,
                              lp_ref_model=lp_ref_model)[0]
  for g in jax.grad(f, argnums=(0, 1, 2))(LP_OLD, LP_MU, LP_OLD):
    np.testing.assert_array_equal(g, ZEROS)


def test_per_token_advantages_accepted():
  loss_b, _ = losses.policy_loss(LP_OLD, LP_OLD, LP_MU, ADV, MASK, _cfg())
  loss_bt, _ = losses.policy_loss(LP_OLD, LP_OLD, LP_MU, ONES, MASK, _cfg())
  np.testing.assert_allclose(loss_b, loss_bt)
