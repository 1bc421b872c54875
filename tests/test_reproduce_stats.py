"""The tables' statistics (mipu_jax/reproduce/stats.py), hand-computed."""

import math

import pytest

from mipu_jax.reproduce import stats


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
  none = stats.paired_test(claim, {0: .5}, {1: .4})
  assert none.seeds == () and math.isnan(none.p)
  # One pair (the main job's single seed): p = 1/2, no spread to report.
  one = stats.paired_test(claim, {0: .5}, {0: .4})
  assert one.p == 0.5 and math.isnan(one.d_z)
  assert "nan" not in one.line() and "one seed: no interval or d_z" in one.line()
  assert "d_z = +2.00" in r.line() and "95% CI [" in r.line()


def test_claims_are_fixed_and_row_stats():
  assert len(stats.CLAIMS) == 8 and stats.ALPHA == 0.05
  assert len(stats.TABLE_SEEDS) == 10
  r = stats.row_stats("tis", [0.2, 0.4], [True, False], [False, False])
  assert (r.n, r.mean, r.ci) == (2, pytest.approx(30.0), (pytest.approx(20.0), pytest.approx(40.0)))
  assert (r.frac_stable, r.frac_collapsed) == (0.5, 0.0)
  got = stats.claim_results({"mis": {0: .1}, "baseline": {0: .2}})
  assert [c.claim.text for c in got] == ["MIS < baseline"]
