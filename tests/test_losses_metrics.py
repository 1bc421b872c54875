"""docs/method.md §4: mismatch metrics, hand-computed per response then averaged.

Row 0: lp_old = log [.5, .5], lp_mu = log [.25, .5] → δ = [log 2, 0].
Row 1: lp_old = log .5, lp_mu = log 1 (one counted token) → δ = -log 2.
Padding slots hold garbage (±inf, NaN) that must be ignored.
"""

import math

import jax
import numpy as np
import pytest

from mipu_jax import losses

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
