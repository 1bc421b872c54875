"""docs/method.md §3: mismatch corrections, hand-computed.

lp_mu is 0 throughout, so δ = lp_old and ρ_token = exp(lp_old):
  row 0: ρ = [4, 0.25, 1.5], all counted → sequence ρ = 1.5, geometric 1.5^(1/3)
  row 1: ρ = [2, 2, ·], last token padding → sequence ρ = 4, geometric 2
"""

import dataclasses
import math

import jax
import numpy as np
import pytest

from mipu_jax import losses

P = "rollout_corr/"
LN2 = math.log(2.0)
# 7.0 is garbage in the padding slot: it must be ignored.
LP_OLD = np.log(np.array([[4.0, 0.25, 1.5], [2.0, 2.0, math.exp(7.0)]],
                         np.float32))
LP_MU = np.zeros((2, 3), np.float32)
MASK = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
ZEROS = np.zeros((2, 3), np.float32)
G = 1.5 ** (1 / 3)  # geometric ρ of row 0


def _run(**kw):
  return losses.correction_weights(LP_OLD, LP_MU, MASK, **kw)


_TABLE = [
    # level, mode, kwargs, expected weights, expected mask
    ("token", "truncate", {}, [[2, .25, 1.5], [2, 2, 0]], MASK),
    ("token", "clip", {}, [[2, .5, 1.5], [2, 2, 0]], MASK),
    ("token", "mask", {}, [[0, 0, 1.5], [2, 2, 0]], [[0, 0, 1], [1, 1, 0]]),
    ("token", "icepop", {"is_lower": .5, "is_upper": 5.},
     [[4, 0, 1.5], [2, 2, 0]], MASK),
    ("sequence", "truncate", {}, [[1.5] * 3, [2, 2, 0]], MASK),
    ("sequence", "clip", {}, [[1.5] * 3, [2, 2, 0]], MASK),
    ("sequence", "mask", {}, [[1.5] * 3, [0, 0, 0]], [[1, 1, 1], [0, 0, 0]]),
    ("geometric", "truncate", {}, [[G] * 3, [2, 2, 0]], MASK),
    ("geometric", "clip", {"is_upper": 1.5}, [[G] * 3, [1.5, 1.5, 0]], MASK),
    # ρ = 2 sits on the upper bound: bounds are inclusive.
    ("geometric", "mask", {}, [[G] * 3, [2, 2, 0]], MASK),
    ("geometric", "mask", {"is_upper": 1.5}, [[G] * 3, [0, 0, 0]],
     [[1, 1, 1], [0, 0, 0]]),
]


@pytest.mark.parametrize("level,mode,kw,weights,mask", _TABLE)
def test_is_level_by_mode(level, mode, kw, weights, mask):
  w, m, _ = _run(is_level=level, is_mode=mode, **kw)
  np.testing.assert_allclose(w, weights, rtol=1e-6)
  np.testing.assert_array_equal(m, mask)


def test_is_off_gives_unit_weights():
  w, m, metrics = _run(is_level=None)
  np.testing.assert_array_equal(w, MASK)
  np.testing.assert_array_equal(m, MASK)
  assert metrics[P + "rollout_is_mean"] == 1.0
  assert metrics[P + "rollout_is_std"] == 0.0
  assert metrics[P + "rollout_is_eff_sample_size"] == 1.0


def test_truncate_metrics():
  # Counted weights [2, .25, 1.5, 2, 2]: mean 7.75/5 = 1.55,
  # E[w²] = (4 + .0625 + 2.25 + 4 + 4)/5 = 2.8625, var = 2.8625 - 1.55².
  _, _, m = _run()
  np.testing.assert_allclose(m[P + "rollout_is_mean"], 1.55, rtol=1e-6)
  np.testing.assert_allclose(m[P + "rollout_is_std"],
                             math.sqrt(2.8625 - 1.55**2), rtol=1e-5)
  np.testing.assert_allclose(m[P + "rollout_is_min"], 0.25, rtol=1e-6)
  np.testing.assert_allclose(m[P + "rollout_is_max"], 2.0, rtol=1e-6)
  np.testing.assert_allclose(m[P + "rollout_is_eff_sample_size"],
                             1.55**2 / 2.8625, rtol=1e-5)
  # Only ρ = 4 exceeds U = 2: 1 of 5 counted tokens.
  np.testing.assert_allclose(m[P + "rollout_is_truncated_fraction"], 0.2)
  assert m[P + "rejected_token_fraction"] == 0.0
  assert set(m) == set(losses.CORRECTION_METRIC_NAMES)


def test_clip_and_mask_fractions():
  _, _, m = _run(is_mode="clip")
  np.testing.assert_allclose(m[P + "rollout_is_clipped_low_fraction"], 0.2)
  np.testing.assert_allclose(m[P + "rollout_is_clipped_high_fraction"], 0.2)
  _, _, m = _run(is_mode="mask")
  np.testing.assert_allclose(m[P + "rollout_is_masked_fraction"], 0.4)
  np.testing.assert_allclose(m[P + "rejected_token_fraction"], 0.4)
  # Sequence-level decisions count once per token: row 1 (2 tokens) of 5.
  _, _, m = _run(is_level="sequence", is_mode="mask")
  np.testing.assert_allclose(m[P + "rollout_is_masked_fraction"], 0.4)


def test_unset_lower_bound_is_reciprocal_of_upper():
  # clip with U = 4 → L = 1/4: ρ = .25 sits on L, nothing is clipped.
  w, _, m = _run(is_mode="clip", is_upper=4.0)
  np.testing.assert_allclose(w, [[4, .25, 1.5], [2, 2, 0]], rtol=1e-6)
  assert m[P + "rollout_is_clipped_low_fraction"] == 0.0


def test_icepop_defaults():
  # is_upper=None → icepop's [0.5, 5]; the signature default U = 2 applies
  # otherwise, with L still 0.5.
  w, m, metrics = _run(is_mode="icepop", is_upper=None)
  np.testing.assert_allclose(w, [[4, 0, 1.5], [2, 2, 0]], rtol=1e-6)
  np.testing.assert_array_equal(m, MASK)  # icepop zeroes, never masks
  np.testing.assert_allclose(metrics[P + "rollout_is_masked_fraction"], 0.2)
  w, _, _ = _run(is_mode="icepop")
  np.testing.assert_allclose(w, [[0, 0, 1.5], [2, 2, 0]], rtol=1e-6)


@pytest.mark.parametrize("rs_kw,mask", [
    ({"rs_level": "token", "rs_upper": 2.0}, [[0, 0, 1], [1, 1, 0]]),
    ({"rs_level": "token"}, [[0, 0, 1], [1, 1, 0]]),  # bounds from IS: [.5, 2]
    ({"rs_level": "sequence", "rs_upper": 2.0}, [[1, 1, 1], [0, 0, 0]]),
    ({"rs_level": "geometric", "rs_upper": 1.2}, [[1, 1, 1], [0, 0, 0]]),
    ({"rs_level": "geometric", "rs_lower": 1.2, "rs_upper": 3.0},
     [[0, 0, 0], [1, 1, 0]]),
])
def test_rejection_sampling(rs_kw, mask):
  w, m, metrics = _run(is_level=None, **rs_kw)
  np.testing.assert_array_equal(m, mask)
  np.testing.assert_array_equal(w, mask)
  rejected = 1 - np.sum(mask) / 5
  np.testing.assert_allclose(metrics[P + "rollout_rs_masked_fraction"],
                             rejected, rtol=1e-6)


def test_rs_mask_combines_with_is_weights():
  # Token TIS weights; sequence RS (ρ_seq = 1.5 keep, 4 reject).
  w, m, _ = _run(rs_level="sequence", rs_upper=2.0)
  np.testing.assert_allclose(w, [[2, .25, 1.5], [0, 0, 0]], rtol=1e-6)
  np.testing.assert_array_equal(m, [[1, 1, 1], [0, 0, 0]])


def test_veto():
  # log 0.3 ≈ -1.20 > log 0.25: row 0 has a catastrophic token.
  w, m, metrics = _run(veto_threshold=0.3)
  np.testing.assert_array_equal(m, [[0, 0, 0], [1, 1, 0]])
  np.testing.assert_allclose(w, [[0, 0, 0], [2, 2, 0]], rtol=1e-6)
  np.testing.assert_allclose(metrics[P + "rollout_is_veto_fraction"], 0.5)
  _, m, metrics = _run(veto_threshold=1e-4)
  np.testing.assert_array_equal(m, MASK)
  assert metrics[P + "rollout_is_veto_fraction"] == 0.0


def test_veto_ignores_padding_tokens():
  lp_old = LP_OLD.copy()
  lp_old[1, 2] = math.log(1e-6)
  _, m, _ = losses.correction_weights(lp_old, LP_MU, MASK, veto_threshold=1e-4)
  np.testing.assert_array_equal(m, MASK)


def test_self_normalize_token():
  # Truncated weights [2, .25, 1.5, 2, 2] have mean 1.55.
  w, _, m = _run(self_normalize=True)
  np.testing.assert_allclose(w, np.array([[2, .25, 1.5], [2, 2, 0]]) / 1.55,
                             rtol=1e-6)
  np.testing.assert_allclose(m[P + "rollout_is_batch_norm_factor"], 1.55,
                             rtol=1e-6)
  # verl reports the weights' statistics before normalisation.
  np.testing.assert_allclose(m[P + "rollout_is_mean"], 1.55, rtol=1e-6)


def test_self_normalize_over_final_mask():
  # MIS keeps ρ = 1.5, 2, 2 → mean 5.5/3 over the final mask only.
  w, _, _ = _run(is_mode="mask", self_normalize=True)
  np.testing.assert_allclose(
      w, np.array([[0, 0, 1.5], [2, 2, 0]]) / (5.5 / 3), rtol=1e-6)


def test_self_normalize_sequence_is_per_response():
  # Sequence TIS weights 1.5 (3 tokens) and 2 (2 tokens): the mean is over
  # responses, (1.5 + 2)/2 = 1.75, not over tokens (8.5/5 = 1.7).
  w, _, m = _run(is_level="sequence", self_normalize=True)
  np.testing.assert_allclose(
      w, np.array([[1.5] * 3, [2, 2, 0]]) / 1.75, rtol=1e-6)
  np.testing.assert_allclose(m[P + "rollout_is_batch_norm_factor"], 1.75,
                             rtol=1e-6)
  # Sequence-level extremes are verl's: exp of the per-response log-ratio,
  # before normalisation (Σδ = log 1.5 and log 4).
  np.testing.assert_allclose(m[P + "rollout_is_min"], 1.5, rtol=1e-6)
  np.testing.assert_allclose(m[P + "rollout_is_max"], 4.0, rtol=1e-6)


def test_self_normalize_skipped_when_mean_is_zero():
  lp_old = np.full((2, 3), math.log(10.0), np.float32)  # icepop: all ρ = 10
  w, _, m = losses.correction_weights(lp_old, LP_MU, MASK, is_mode="icepop",
                                      is_upper=5.0, self_normalize=True)
  np.testing.assert_array_equal(w, ZEROS)
  assert m[P + "rollout_is_batch_norm_factor"] == 1.0
  assert all(np.isfinite(v) for v in m.values())


def test_mis_miles_preset_order():
  # Token TIS [.5, 2] → token RS [.5, 2] keeps ρ = 1.5, 2, 2 (truncated
  # weights 1.5, 2, 2) → veto 1e-4 drops nothing → SNIS by mean 5.5/3.
  cfg = losses.CorrectionConfig.from_preset("mis_miles")
  w, m, _ = _run(**dataclasses.asdict(cfg))
  np.testing.assert_array_equal(m, [[0, 0, 1], [1, 1, 0]])
  np.testing.assert_allclose(
      w, np.array([[0, 0, 1.5], [2, 2, 0]]) / (5.5 / 3), rtol=1e-6)


@pytest.mark.parametrize("level", losses.IS_LEVELS)
def test_empty_response_contributes_nothing(level):
  mask = np.array([[1, 1, 1], [0, 0, 0]], np.float32)
  lp_old = LP_OLD.copy()
  lp_old[1] = [np.inf, -np.inf, np.nan]
  w, m, metrics = losses.correction_weights(
      lp_old, LP_MU, mask, is_level=level, rs_level=level, rs_upper=100.0,
      veto_threshold=1e-4, self_normalize=True)
  np.testing.assert_array_equal(w[1], np.zeros(3))
  np.testing.assert_array_equal(m[1], np.zeros(3))
  assert np.all(np.isfinite(w))
  assert all(np.isfinite(v) for v in metrics.values())


def test_all_masked_batch_is_finite():
  w, m, metrics = losses.correction_weights(
      LP_OLD, LP_MU, ZEROS, is_level="sequence", self_normalize=True,
      veto_threshold=1e-4, rs_level="token")
  np.testing.assert_array_equal(w, ZEROS)
  np.testing.assert_array_equal(m, ZEROS)
  for v in metrics.values():
    assert v == 0.0 or v == 1.0


def test_log_ratios_are_clamped():
  # δ = 100 is clamped to 20 before exp; sequence Σδ = 300 also → 20.
  lp_old = np.full((2, 3), 100.0, np.float32)
  w, _, _ = losses.correction_weights(lp_old, LP_MU, np.ones((2, 3)),
                                      is_mode="icepop", is_upper=1e10)
  np.testing.assert_allclose(w, np.full((2, 3), math.exp(20)), rtol=1e-5)
  w, _, _ = losses.correction_weights(lp_old, LP_MU, np.ones((2, 3)),
                                      is_level="sequence", is_mode="mask",
                                      is_lower=0.0, is_upper=1e10)
  np.testing.assert_allclose(w, np.full((2, 3), math.exp(20)), rtol=1e-5)


def test_outputs_are_stop_gradient():
  def f(lp_old):
    w, m, _ = losses.correction_weights(lp_old, LP_MU, MASK, is_mode="clip",
                                        self_normalize=True)
    return (w * m).sum()
  np.testing.assert_array_equal(jax.grad(f)(LP_OLD), ZEROS)


@pytest.mark.parametrize("kw,match", [
    ({"is_level": "tok"}, "unknown is_level"),
    ({"rs_level": "seq"}, "unknown rs_level"),
    ({"is_mode": "tis"}, "unknown is_mode"),
    ({"is_lower": -0.1}, "is_lower must be finite and >= 0"),
    ({"rs_upper": -1.0}, "rs_upper must be finite and >= 0"),
    ({"is_upper": 0.0}, "upper bounds must be > 0"),
    ({"is_mode": "clip", "is_lower": 3.0}, "lower bound 3.0 > upper"),
    ({"is_upper": 0.5}, "lower bound 2.0 > upper"),
    ({"rs_level": "token", "rs_lower": 2.0, "rs_upper": 1.5}, "RS lower"),
    ({"veto_threshold": 0.0}, "veto_threshold"),
    ({"veto_threshold": 2.0}, "veto_threshold"),
    ({"self_normalize": 1}, "self_normalize must be a bool"),
])
def test_invalid_arguments_raise(kw, match):
  with pytest.raises(ValueError, match=match):
    _run(**kw)


# --- trust-region criteria, hand-computed (docs/method.md §4) ---------------
# Row 0: δ = [log 2, 0] (2 counted tokens); row 1: δ = [-0.1, -0.1, -0.1].
# Per token: k1 = -δ, k2 = δ²/2, k3 = exp δ - 1 - δ:
#   row 0: k1 = [-0.693, 0], k2 = [0.240, 0], k3 = [0.307, 0];
#   row 1: k1 = 0.1, k2 = 0.005, k3 = 0.00484 (each token).
_TR_LP_MU = np.array([[-LN2, -1.0, 0.0], [-1.0, -1.0, -1.0]], np.float32)
_TR_LP_OLD = _TR_LP_MU + np.array([[LN2, 0.0, 0.0], [-0.1, -0.1, -0.1]],
                                  np.float32)
_TR_MASK = np.array([[1, 1, 0], [1, 1, 1]], np.float32)
_DROP_TOKEN0 = [[0, 1, 0], [1, 1, 1]]
_DROP_ROW0 = [[0, 0, 0], [1, 1, 1]]
_DROP_ROW1 = [[1, 1, 0], [0, 0, 0]]
TRUST_REGION_CASES = [
    # token k1 in [log .8, log 1.25] = ±0.223: token 0 of row 0 (-0.693) out.
    ("token_k1", "0.8_1.25", _DROP_TOKEN0),
    ("token_k2", "0.1", _DROP_TOKEN0),  # 0.240 > 0.1
    ("token_k3", "0.1", _DROP_TOKEN0),  # 0.307 > 0.1
    # Σ k1: row 0 -0.693 < log .6 = -0.511; row 1 0.3 <= log 2.
    ("seq_sum_k1", "0.6_2.0", _DROP_ROW0),
    # Σ k1 in [log .4, log 1.2] = [-0.916, 0.182]: row 1's 0.3 is out.
    ("seq_sum_k1", "0.4_1.2", _DROP_ROW1),
    ("seq_sum_k2", "0.02", _DROP_ROW0),  # 0.240 and 0.015
    ("seq_sum_k3", "0.02", _DROP_ROW0),  # 0.307 and 0.0145
    # mean k1: row 0 -0.347 < log .75 = -0.288.
    ("seq_mean_k1", "0.75_1.2", _DROP_ROW0),
    # mean k1: row 1 0.1 > log 1.05 = 0.049; row 0 -0.347 >= log .6.
    ("seq_mean_k1", "0.6_1.05", _DROP_ROW1),
    ("seq_mean_k2", "0.1", _DROP_ROW0),  # 0.120 and 0.005
    ("seq_mean_k3", "0.1", _DROP_ROW0),  # 0.153 and 0.0048
    ("seq_max_k2", "0.2", _DROP_ROW0),  # 0.240 and 0.005
    ("seq_max_k3", "0.2", _DROP_ROW0),  # 0.307 and 0.0048
    # One upper bound U for k1 means [1/U, U]: token k1 within ±log 1.5.
    ("token_k1", "1.5", _DROP_TOKEN0),
    # Two criteria AND-ed: the union of what each rejects.
    ("token_k2,seq_sum_k1", "0.1,0.4_1.2", [[0, 1, 0], [0, 0, 0]]),
]


@pytest.mark.parametrize("criteria,thresholds,keep", TRUST_REGION_CASES)
def test_trust_region_criteria(criteria, thresholds, keep):
  w, m, metrics = losses.correction_weights(
      _TR_LP_OLD, _TR_LP_MU, _TR_MASK, is_level=None, rs_criteria=criteria,
      rs_thresholds=thresholds)
  np.testing.assert_array_equal(m, keep)
  np.testing.assert_array_equal(w, keep)  # no IS: weight 1 where kept
  rejected = 1 - np.sum(keep) / np.sum(_TR_MASK)
  np.testing.assert_allclose(metrics[P + "rollout_rs_masked_fraction"], rejected,
                             rtol=1e-6)
  rows = np.mean([np.any((np.array(keep) == 0) & (_TR_MASK > 0), axis=-1)])
  np.testing.assert_allclose(metrics[P + "rollout_rs_seq_masked_fraction"], rows)


def test_trust_region_criterion_statistics():
  # seq_mean_k3: per-response means 0.1534 and 0.00484; token mean over the
  # five counted tokens (0.307 + 0 + 3 · 0.00484) / 5.
  _, _, metrics = losses.correction_weights(
      _TR_LP_OLD, _TR_LP_MU, _TR_MASK, is_level=None, rs_criteria="seq_mean_k3",
      rs_thresholds="0.1")
  k3_row0 = (2 - 1 - LN2) / 2
  k3_row1 = math.exp(-0.1) - 1 + 0.1
  name = P + "rollout_rs_seq_mean_k3_"
  np.testing.assert_allclose(metrics[name + "max"], k3_row0, rtol=1e-5)
  np.testing.assert_allclose(metrics[name + "min"], k3_row1, rtol=1e-4)
  np.testing.assert_allclose(metrics[name + "mean"],
                             (2 * k3_row0 + 3 * k3_row1) / 5, rtol=1e-5)
  np.testing.assert_allclose(metrics[name + "fraction_high"], 0.5)
  np.testing.assert_allclose(metrics[name + "masked_fraction"], 2 / 5, rtol=1e-6)


def test_trust_region_with_is_and_veto_order():
  # Token TIS weights survive only where the criterion keeps; the veto then
  # drops row 1 entirely (δ = -0.1 < log 0.95), leaving row 0's token 1.
  w, m, _ = losses.correction_weights(
      _TR_LP_OLD, _TR_LP_MU, _TR_MASK, is_level="token", is_upper=1.5,
      rs_criteria="token_k2", rs_thresholds="0.1", veto_threshold=0.95)
  np.testing.assert_array_equal(m, [[0, 1, 0], [0, 0, 0]])
  np.testing.assert_allclose(w, [[0, 1, 0], [0, 0, 0]], atol=1e-7)
