"""docs/method.md §4: mismatch metrics, hand-computed per response then averaged.

Row 0: lp_old = log [.5, .5], lp_mu = log [.25, .5] → δ = [log 2, 0].
Row 1: lp_old = log .5, lp_mu = log 1 (one counted token) → δ = -log 2.
Padding slots hold garbage (±inf, NaN) that must be ignored.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mipu_jax import losses
from mipu_jax.losses import _masked as losses_masked

LN2 = math.log(2.0)
P = "rollout_corr/"
LP_OLD = np.array([[-LN2, -LN2, 3.0], [-LN2, -np.inf, np.nan]], np.float32)
LP_MU = np.array([[-2 * LN2, -LN2, np.nan], [0.0, -np.inf, 1.0]], np.float32)
MASK = np.array([[1, 1, 0], [1, 0, 0]], np.float32)

# (row 0 value, row 1 value) per response-level metric, worked out in the
# module docstring's notation; the metric is their mean.
PER_RESPONSE = {
    # -mean lp_old: log 2 and log 2.
    "training_log_ppl": (LN2, LN2),
    # -mean lp_mu: 1.5 log 2 and 0.
    "rollout_log_ppl": (1.5 * LN2, 0.0),
    "training_ppl": (2.0, 2.0),
    "rollout_ppl": (2.0**1.5, 1.0),
    # mean lp_mu - mean lp_old: -1.5 log 2 + log 2 and 0 + log 2.
    "log_ppl_diff": (-0.5 * LN2, LN2),
    "log_ppl_abs_diff": (0.5 * LN2, LN2),
    "ppl_ratio": (2.0**-0.5, 2.0),
    # exp(2 Σδ) - 1: 4 - 1 and 1/4 - 1.
    "chi2_seq": (3.0, -0.75),
    "max_abs_logprob_diff": (LN2, LN2),
}
# Token means over the batch's counted tokens δ = [log 2, 0 | -log 2]
# (verl's definitions): (whole batch, row 0 alone).
TOKEN_MEAN = {
    # mean(lp_mu - lp_old) = (-log 2 + 0 + log 2) / 3 and -log 2 / 2.
    "kl": (0.0, -0.5 * LN2),
    # mean(exp δ - δ - 1) = ((1 - log 2) + 0 + (log 2 - .5)) / 3 and
    # (1 - log 2) / 2.
    "k3_kl": (0.5 / 3, (1 - LN2) / 2),
    # mean exp(2δ) - 1 = (4 + 1 + 1/4) / 3 - 1 and (4 + 1) / 2 - 1.
    "chi2_token": (5.25 / 3 - 1, 1.5),
}
# Largest and smallest per-response log_ppl_diff: (whole batch, row 0 alone).
EXTREMES = {
    "log_ppl_diff_max": (LN2, -0.5 * LN2),
    "log_ppl_diff_min": (-0.5 * LN2, -0.5 * LN2),
}


mismatch_metrics = jax.jit(losses.mismatch_metrics)  # must be jit-able


def _expected(row1_counts):
  out = {k: np.mean(v) if row1_counts else v[0] for k, v in PER_RESPONSE.items()}
  for table in (TOKEN_MEAN, EXTREMES):
    out.update({k: v[0] if row1_counts else v[1] for k, v in table.items()})
  return out


@pytest.mark.parametrize("name", sorted(_expected(True)))
def test_mismatch_metric(name):
  metrics = mismatch_metrics(LP_OLD, LP_MU, MASK)
  np.testing.assert_allclose(metrics[P + name], _expected(True)[name],
                             rtol=1e-5, atol=1e-7)


def test_metric_names_are_complete():
  metrics = mismatch_metrics(LP_OLD, LP_MU, MASK)
  assert set(metrics) == set(losses.MISMATCH_METRIC_NAMES)
  assert {k.removeprefix(P) for k in metrics} == set(_expected(True))


def test_rows_without_tokens_are_excluded():
  # Row 1 masked out: every metric is row 0's value alone.
  mask = np.array([[1, 1, 0], [0, 0, 0]], np.float32)
  metrics = mismatch_metrics(LP_OLD, LP_MU, mask)
  for name, value in _expected(False).items():
    np.testing.assert_allclose(metrics[P + name], value, rtol=1e-5, atol=1e-7,
                               err_msg=name)


def test_empty_mask_gives_zeros():
  metrics = mismatch_metrics(LP_OLD, LP_MU, np.zeros((2, 3), np.float32))
  for v in metrics.values():
    assert v == 0.0


def test_exponentials_are_clamped():
  # Σδ = 60 → chi2_seq = exp(2 · 20) - 1; δ = 30 → chi2_token = exp(40) - 1.
  lp_old = np.array([[30.0, 30.0, 0.0]] * 2, np.float32)
  metrics = mismatch_metrics(lp_old, np.zeros((2, 3), np.float32),
                             np.array([[1, 1, 0]] * 2, np.float32))
  np.testing.assert_allclose(metrics[P + "chi2_seq"], math.exp(40) - 1,
                             rtol=1e-5)
  np.testing.assert_allclose(metrics[P + "chi2_token"], math.exp(40) - 1,
                             rtol=1e-5)
  np.testing.assert_allclose(metrics[P + "max_abs_logprob_diff"], 30.0)


# --- verl's and Miles's per-token probability diagnostics ---------------------
# Counted tokens: row 0 p = exp(lp_old) = [1/2, 1/4, 1], q = exp(lp_mu) =
# [1/8, 1/2, 1/2]; row 1 p = q = 1/2. Padding holds garbage.
PROB_LP_OLD = np.log(np.array([[.5, .25, 1., 7.], [.5, 3., 1., 1.]], np.float32))
PROB_LP_MU = np.log(np.array([[.125, .5, .5, 1.], [.5, 2., 1., 1.]], np.float32))
PROB_LP_MU[0, 3], PROB_LP_MU[1, 2] = -np.inf, np.nan
PROB_MASK = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.float32)
PROB_EXPECTED = {
    "training/rollout_probs_diff_valid": 1.0,
    # |p - q| = [3/8, 1/4, 1/2, 0].
    "training/rollout_probs_diff_max": 0.5,
    "training/rollout_probs_diff_mean": 9 / 32,
    # Deviations from 9/32: [3/32, -1/32, 7/32, -9/32]; Σ² = 140/1024, / (4 - 1).
    "training/rollout_probs_diff_std": math.sqrt(140 / 1024 / 3),
    # Centred p = [-1, -5, 7, -1] / 16, centred q = [-9, 3, 3, 3] / 32:
    # Σ p q = 12 / 512, Σ p² = 76 / 256, Σ q² = 108 / 1024.
    "training/rollout_actor_probs_pearson_corr": 12 / math.sqrt(76 * 108),
    # Per response: mean |lp_old - lp_mu| = (2 + 1 + 1) log 2 / 3 and 0; their
    # mean (Miles's per-sample mean), not the token mean log 2.
    "train/train_rollout_logprob_abs_diff": 2 * LN2 / 3,
}


@pytest.mark.parametrize("name", sorted(PROB_EXPECTED))
def test_probability_metric(name):
  metrics = jax.jit(losses.probability_metrics)(PROB_LP_OLD, PROB_LP_MU, PROB_MASK)
  assert set(metrics) == set(losses.PROBABILITY_METRIC_NAMES) == set(PROB_EXPECTED)
  np.testing.assert_allclose(metrics[name], PROB_EXPECTED[name], rtol=1e-5, atol=1e-7)


def test_probability_metrics_of_identical_policies_and_of_no_tokens():
  same = losses.probability_metrics(PROB_LP_OLD, PROB_LP_OLD, PROB_MASK)
  for name in ("max", "mean", "std"):
    assert same[f"training/rollout_probs_diff_{name}"] == 0.0
  assert same["train/train_rollout_logprob_abs_diff"] == 0.0
  np.testing.assert_allclose(same["training/rollout_actor_probs_pearson_corr"], 1.0, rtol=1e-6)
  # verl reports NaN for an empty batch; here 0 everywhere, `_valid` = 0.
  empty = losses.probability_metrics(PROB_LP_OLD, PROB_LP_MU, np.zeros_like(PROB_MASK))
  assert all(float(v) == 0.0 for v in empty.values())


@pytest.mark.parametrize("delta", [1e-7, -1e-7, 3e-5, -2e-4, 0.05, -0.2, 0.49, 0.5, -0.5, 0.51,
                                   1.0, -3.0, 8.0])
def test_k3_does_not_cancel(delta):
  # float64 expm1(δ) - δ is exact to ~1e-9 relative for |δ| >= 1e-7; float32's
  # exp(δ) - δ - 1 is exactly 0 at |δ| = 1e-7 (checked), ours is within 4 ulp.
  ref = np.expm1(np.float64(delta)) - np.float64(delta)
  got = float(losses_masked.k3(jnp.float32(delta)))
  assert got == pytest.approx(ref, rel=5e-7)
  if abs(delta) <= 1e-7:
    naive = jnp.float32(delta)
    assert float(jnp.exp(naive) - naive - 1.0) == 0.0


def test_k3_kl_of_a_tiny_mismatch_is_not_zero():
  lp_mu = jnp.full((2, 3), -1.0, jnp.float32)
  lp_old = lp_mu + jnp.float32(1e-6)
  m = losses.mismatch_metrics(lp_old, lp_mu, jnp.ones((2, 3)))
  delta = float(lp_old[0, 0] - lp_mu[0, 0])  # the float32 difference, about 1e-6
  assert float(m[P + "k3_kl"]) == pytest.approx(delta ** 2 / 2, rel=1e-5)
