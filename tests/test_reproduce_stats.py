"""The statistics over seeds (mipu_jax/harness/stats.py) and the tables' claims, hand-computed."""

import math

import pytest

from mipu_jax.harness import stats
from studies.reproduce import spec


def test_sign_flip_p_enumerates_every_sign_pattern():
  # d = [1, 2, 3]: the 8 sign patterns have sums 6, 4, 2, 0, 0, -2, -4, -6.
  assert stats.sign_flip_p([1, 2, 3], "greater") == 1 / 8
  assert stats.sign_flip_p([1, 2, 3], "two-sided") == 2 / 8
  assert stats.sign_flip_p([1, 2, 3], "less") == 1.0
  # d = [3, -1]: sums 2 (observed), 4, -4, -2.
  assert stats.sign_flip_p([3, -1], "greater") == 2 / 4
  assert stats.sign_flip_p([3, -1], "less") == 3 / 4
  assert stats.sign_flip_p([3, -1], "two-sided") == 1.0
  with pytest.raises(ValueError):
    stats.sign_flip_p([1.0], "bigger")


def test_bootstrap_ci_of_two_values_and_of_a_constant():
  # Means of 2 resampled values are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4:
  # the 2.5% and 97.5% percentiles are 0 and 1.
  assert stats.bootstrap_ci([0.0, 1.0]) == (0.0, 1.0)
  assert stats.bootstrap_ci([5.0, 5.0, 5.0]) == (5.0, 5.0)


def test_paired_test_effect_size_p_and_verdicts():
  claim = stats.Claim("mipu", "baseline", "greater", "MIPU > baseline")
  # d = [10, 20, 30] points: mean 20, sd 10, d_z 2; p = 1/8, which 3 seeds
  # can never push below 0.05.
  r = stats.paired_test(claim, {0: .5, 1: .6, 2: .7, 5: .9}, {0: .4, 1: .4, 2: .4})
  assert r.seeds == (0, 1, 2)
  assert r.mean_diff == pytest.approx(20.0)
  assert r.d_z == pytest.approx(2.0)
  assert r.p == 1 / 8
  assert r.verdict.startswith("undecidable with 3 seeds")
  # Ten seeds, all better: p = 2^-10.
  ten = stats.paired_test(claim, {s: 0.5 + s / 100 for s in range(10)},
                          {s: 0.4 for s in range(10)})
  assert ten.p == 1 / 1024 and ten.verdict == "supported"
  # Ten seeds, all worse: the claim is contradicted.
  worse = stats.paired_test(claim, {s: 0.3 - s / 100 for s in range(10)},
                            {s: 0.4 for s in range(10)})
  assert worse.p == 1.0 and worse.p_opposite == 1 / 1024
  assert worse.verdict.startswith("contradicted")
  # Half better, half worse by the same amount: mean 0, nothing shown.
  even = stats.paired_test(claim, {s: 0.4 + (0.1 if s % 2 else -0.1) for s in range(10)},
                           {s: 0.4 for s in range(10)})
  assert even.mean_diff == pytest.approx(0.0, abs=1e-9)
  assert even.verdict.startswith("not shown")
  assert "p = " in even.line() and "not shown" in even.line()
  assert "Holm-adjusted" in even.line() and "t [" in even.line()
  none = stats.paired_test(claim, {0: .5}, {1: .4})
  assert none.seeds == () and math.isnan(none.p)
  # One pair (the main job's single seed): p = 1/2, no spread to report.
  one = stats.paired_test(claim, {0: .5}, {0: .4})
  assert one.p == 0.5 and math.isnan(one.d_z)
  assert "nan" not in one.line() and "one seed: no interval or d_z" in one.line()
  # t interval by hand: 20 ± t_{.975,2} · 10/√3 = 20 ± 4.303 · 5.774 = 20 ± 24.84.
  assert "d_z = +2.00" in r.line()
  assert "95% CI bootstrap [+10.00, +30.00], t [-4.84, +44.84]" in r.line()


def test_claims_are_fixed_and_row_stats():
  assert len(spec.CLAIMS) == 8 and stats.ALPHA == 0.05
  assert len(spec.TABLE_SEEDS) == 10
  r = stats.row_stats("tis", [0.2, 0.4], [True, False], [False, False])
  assert (r.n, r.mean, r.ci) == (2, pytest.approx(30.0), (pytest.approx(20.0), pytest.approx(40.0)))
  # t interval: 30 ± t_{.975,1} · sd/√2 = 30 ± 12.706 · 14.142 / 1.414.
  assert r.t_ci == (pytest.approx(30 - 127.062, abs=1e-2), pytest.approx(30 + 127.062, abs=1e-2))
  assert (r.frac_stable, r.frac_collapsed) == (0.5, 0.0)
  got = stats.claim_results({"mis": {0: .1}, "baseline": {0: .2}}, spec.CLAIMS)
  assert [c.claim.text for c in got] == ["MIS < baseline"]


def test_holm_on_a_known_vector():
  # Sorted p: .01, .02, .03, .04 with m = 4: 4×.01 = .04, 3×.02 = .06,
  # 2×.03 = .06 (max with .06), 1×.04 = .04 -> .06 (step-down is monotone).
  assert stats.holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
  # Capped at 1; NaN (a claim not tested) stays NaN and does not count in m.
  got = stats.holm([0.5, math.nan, 0.2])
  assert got[0] == pytest.approx(0.5) and math.isnan(got[1]) and got[2] == pytest.approx(0.4)
  assert stats.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])
  assert stats.holm([]) == []
  # Holm's first step is Bonferroni: the smallest p times m.
  assert stats.holm([1 / 1024] * 8)[0] == pytest.approx(8 / 1024)


def test_t_interval_against_scipy_and_by_hand():
  scipy_stats = pytest.importorskip("scipy.stats")
  x = [46.2, 47.0, 43.6, 45.3, 47.5, 56.7, 50.3, 48.4, 44.1, 33.9]
  lo, hi = stats.t_ci(x)
  m, sem = float(sum(x) / 10), float(scipy_stats.sem(x))
  assert (lo, hi) == pytest.approx(scipy_stats.t.interval(0.95, 9, loc=m, scale=sem))
  # By hand: t_{.975, 9} = 2.2622 (printed tables), sd of x from its definition.
  sd = math.sqrt(sum((v - m) ** 2 for v in x) / 9)
  assert hi - m == pytest.approx(2.2622 * sd / math.sqrt(10), rel=1e-4)
  # At n = 10 the percentile bootstrap is narrower than the t interval.
  b_lo, b_hi = stats.bootstrap_ci(x)
  assert b_hi - b_lo < hi - lo
  assert all(math.isnan(v) for v in stats.t_ci([3.0]))


def test_claim_verdicts_use_holm_across_the_table():
  # MIPU wins by 1 point in nine seeds and loses by 1 in one: raw one-sided
  # p = 11/1024 (the patterns with at most one minus sign: 1 + 10), supported
  # alone. Every other row equals the baseline, so the other seven claims have
  # d = 0 and p = 1; Holm multiplies the smallest p by m = 8: 88/1024 = 0.086,
  # not shown.
  base = {s: 0.4 for s in range(10)}
  mipu = {s: 0.41 if s else 0.39 for s in range(10)}
  claim = spec.CLAIMS[0]
  assert claim.text == "MIPU > baseline"
  alone = stats.paired_test(claim, mipu, base)
  assert alone.p == pytest.approx(11 / 1024) and alone.p_holm == alone.p
  assert alone.verdict == "supported"
  finals = {row: dict(base) for row in ("baseline", "tis", "mis", "lr_decay",
                                        "random_rollback", "step1", "step2")}
  finals["mipu"] = mipu
  got = {c.claim.text: c for c in stats.claim_results(finals, spec.CLAIMS)}
  assert len(got) == 8
  r = got["MIPU > baseline"]
  assert r.p == pytest.approx(11 / 1024)
  assert r.p_holm == pytest.approx(88 / 1024)
  assert r.verdict.startswith("not shown (Holm-adjusted p")
  assert "p = 0.0107, Holm-adjusted 0.0859" in r.line()
  # MIPU > TIS has the same differences; Holm's step-down is monotone, so
  # it is adjusted to the same value.
  assert got["MIPU > TIS"].p_holm == pytest.approx(88 / 1024)
  assert got["MIS < baseline"].p_holm == 1.0
  # The opposite p's are a family of their own: MIPU < baseline has raw
  # p = 1 - 1/1024 (every pattern but the all-plus one), not contradicted.
  assert r.p_opposite_holm == pytest.approx(1.0)


def test_difference_of_differences_claim_by_hand():
  """LR-decay's gain with mismatch against its gain without, paired by seed."""
  claim = spec.ISOLATE_CLAIMS[1]
  assert claim.rows == ("lr_decay", "baseline", "control_lr_decay", "control")
  finals = {"lr_decay": {0: .70, 1: .60, 2: .65}, "baseline": {0: .40, 1: .50, 2: .45},
            "control_lr_decay": {0: .60, 1: .62, 2: .58, 3: .5}, "control": {0: .55, 1: .60, 2: .60}}
  got = {c.claim.text: c for c in stats.claim_results(finals, spec.ISOLATE_CLAIMS)}
  r = got[claim.text]
  # (70-40)-(60-55) = 25, (60-50)-(62-60) = 8, (65-45)-(58-60) = 22; seed 3 is unpaired.
  assert r.seeds == (0, 1, 2) and r.mean_diff == pytest.approx((25 + 8 + 22) / 3)
  assert r.p == pytest.approx(1 / 8)  # all positive: only the identity pattern is as large
  assert "lr_decay − baseline − (control_lr_decay − control)" in r.line()
  # The mean-rate claim needs its row: alone in the family, Holm changes nothing.
  assert len(got) == 1 and r.p_holm == r.p
  with pytest.raises(ValueError, match="exactly when it has `minus`"):
    stats.paired_test(claim, finals["lr_decay"], finals["baseline"])


def test_bootstrap_ratio_ci_pairs_units_across_keys():
  # Two prompts; model b's K3 per token is exactly twice a's on each prompt, so
  # every resample keeps the ratio at 2: a degenerate interval (pairing kept).
  num = {"a": [1.0, 6.0], "b": [2.0, 12.0]}
  den = {"a": [10.0, 20.0], "b": [10.0, 20.0]}
  value, lo, hi = stats.bootstrap_ratio_ci(num, den, lambda r: r["b"] / r["a"])
  assert (value, lo, hi) == pytest.approx((2.0, 2.0, 2.0))
  # The point value is the ratio of sums (7 / 30), not the mean of per-unit ratios;
  # the interval lies within the per-unit ratios 0.1 and 0.3.
  value, lo, hi = stats.bootstrap_ratio_ci(num, den, lambda r: r["a"], n_boot=2000)
  assert value == pytest.approx(7 / 30) and 0.1 <= lo < value < hi <= 0.3
  with pytest.raises(ValueError, match="same nonzero number of units"):
    stats.bootstrap_ratio_ci({"a": [1.0]}, {"a": [1.0, 2.0]}, lambda r: r["a"])
