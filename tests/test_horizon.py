"""The long-horizon study's measures and claims, by hand (studies/reproduce/horizon.py)."""

import json
import math
import os

import numpy as np
import pytest

from mipu_jax.harness import stats
from studies.reproduce import horizon


def _rows(avgs, *, every=20, se=0.02, k3=1e-3, pi=None):
  """Logged rows: a training row per step (k3_kl), an evaluation every `every` steps."""
  rows = []
  for i, a in enumerate(avgs):
    step = i * every
    if step:
      rows += [{"step": s, "rollout_corr/k3_kl": k3 * s} for s in range(step - every + 1, step)]
    r = {"step": step, "eval/avg": a, "eval/avg_se": se}
    if step:
      r["rollout_corr/k3_kl"] = k3 * step
    if pi is not None:
      r["eval_pi/avg"] = a + pi
    rows.append(r)
  return rows


def test_measures_by_hand():
  avgs = [0.1, 0.3, 0.5, 0.7, 0.4, 0.4, 0.4]  # evaluations at steps 0, 20, ..., 120
  r = horizon.long_run("int4_all", 3, "/x", _rows(avgs, pi=0.05), steps=120)
  # 3-evaluation means after step 0's: (0.3+0.5+0.7)/3 = 0.5 (ends at 60),
  # 0.5333 (80), 0.5 (100), 0.4 (120).
  assert r.peak3 == pytest.approx(1.6 / 3) and r.peak3_step == 80
  assert r.final3 == pytest.approx(0.4) and r.late_drop == pytest.approx(1.6 / 3 - 0.4)
  assert r.sigma_d == pytest.approx(math.sqrt(2 / 3) * 0.02)
  assert r.degraded and not r.stable  # 0.133 > 3 * 0.0163
  assert not r.collapsed  # 0.133 < 0.15
  assert r.dip_step == 80  # 0.4 is more than 0.15 below the best so far (0.7)
  assert (r.final, r.at120, r.peak, r.peak_step) == (0.4, 0.4, 0.7, 60)
  assert r.k3[100] == pytest.approx(np.mean([1e-3 * s for s in range(81, 101)]))
  assert set(r.k3) == {100}  # steps 300 and 600 are past the run
  assert r.final_pi == pytest.approx(0.45) and r.dip_step_pi == 80


def test_collapse_rules():
  # A fall of 0.3 that stays: collapsed, and the dip begins at the first evaluation
  # more than 0.15 below the best so far.
  r = horizon.long_run("s", 0, "/x", _rows([0.5, 0.7, 0.7, 0.7, 0.5, 0.4, 0.4, 0.4]))
  assert r.collapsed and r.degraded and r.dip_step == 80
  # The same fall, recovered by the end: a dip, neither collapsed nor degraded.
  r = horizon.long_run("s", 0, "/x", _rows([0.5, 0.7, 0.7, 0.7, 0.4, 0.7, 0.7, 0.7]))
  assert r.dip_step == 80 and not r.collapsed and not r.degraded and r.stable
  # π's falls are dated on π's evaluations: here π falls at step 40, μ never.
  rows = _rows([0.5, 0.7, 0.7, 0.7, 0.7], pi=0.0)
  next(r for r in rows if r["step"] == 40 and "eval_pi/avg" in r)["eval_pi/avg"] = 0.5
  r = horizon.long_run("s", 0, "/x", rows)
  assert r.dip_step is None and r.dip_step_pi == 40
  # A flat run: a drop of one SE at the end is noise.
  flat = [0.5] * 29 + [0.48]
  r = horizon.long_run("s", 0, "/x", _rows(flat))
  assert r.late_drop == pytest.approx(0.02 / 3) and r.stable and not r.degraded
  # A non-finite value is not Stable.
  rows = _rows([0.5] * 5)
  rows[3]["actor/grad_norm"] = math.nan
  assert not horizon.long_run("s", 0, "/x", rows).stable
  with pytest.raises(ValueError, match="evaluations"):
    horizon.long_run("s", 0, "/x", _rows([0.5, 0.5, 0.5]))


def _run(name, seed, final, at120, drop):
  return horizon.LongRun(name=name, seed=seed, workdir="", steps=(), avg=(), final=final,
                         at120=at120, peak=0, peak_step=0, peak3=0, peak3_step=0, final3=0,
                         late_drop=drop, sigma_d=0, degraded=False, collapsed=False,
                         dip_step=None, stable=True, k3={}, final_pi=None)


def test_claims_by_hand():
  runs = []
  for s in range(10):
    runs.append(_run("fp32", s, 0.80, 0.78, 0.01))
    runs.append(_run("int4_all", s, 0.70 - 0.001 * s, 0.74, 0.06 + 0.001 * s))
    runs.append(_run(horizon.STRONG, s, 0.78, 0.76, 0.01 + 0.001 * (-1) ** s))
  results = {r.claim.text: r for r in stats.claim_results(horizon.values(runs),
                                                          horizon.HORIZON_CLAIMS)}
  assert len(results) == 6
  late = results[f"int4_all degrades late more than fp32 (D = peak3 − final3)"]
  assert late.mean_diff == pytest.approx(5.45) and late.p == pytest.approx(2 ** -10)
  grows = [r for t, r in results.items() if "grows" in t and "int4_all" in t][0]
  # (80 − 70 + 0.1 s) − (78 − 74) points = 6 + 0.1 s, mean 6.45.
  assert grows.mean_diff == pytest.approx(6.45)
  assert grows.verdict == "supported"
  assert horizon.degraded_setting(list(results.values())) == "int4_all"
  assert horizon.remedies_decision(list(results.values())).startswith(
      "**Remedies run at int4_all**")
  strong = [r for t, r in results.items() if "degrades" in t and horizon.STRONG in t][0]
  assert strong.verdict != "supported"


def test_choices():
  assert horizon.choose_lr({1e-4: [0.7, 0.72], 2e-4: [0.78, 0.79]}) == 2e-4
  assert horizon.choose_lr({1e-4: [0.8], 2e-4: [0.78]}) == 1e-4
  with pytest.raises(ValueError, match="every lr"):
    horizon.choose_lr({2e-4: [0.78]})
  best, ratio = horizon.choose_strong({"int4_all": [1e-3, 3e-3], "int4_e5m2_all": [8e-3]})
  assert best == "int4_e5m2_all" and ratio == pytest.approx(4.0)


def test_report_writes_table_and_figure(tmp_path):
  runs = []
  for name, shape in (("fp32", [0.5, 0.6, 0.7, 0.7, 0.7]), ("int4_all", [0.5, 0.6, 0.7, 0.5, 0.4])):
    for seed in (0, 1):
      d = tmp_path / "runs" / f"{name}_s{seed}"
      os.makedirs(d)
      with open(d / "metrics.jsonl", "w") as f:
        for r in _rows([a + 0.01 * seed for a in shape]):
          f.write(json.dumps(r) + "\n")
      (d / "summary.json").write_text("{}")
      runs.append(horizon.read_run(name, seed, str(d), steps=80))
  assert horizon.read_run("x", 0, str(tmp_path)) is None  # no summary.json: unfinished
  out = horizon.report(runs, ["fp32", "int4_all", horizon.STRONG], str(tmp_path))
  text = open(out["files"]["table"]).read()
  assert "| fp32 | 2 |" in text and f"| {horizon.STRONG} | 0 | not run yet |" in text
  assert os.path.exists(out["files"]["curves"])
  assert json.load(open(out["files"]["summary"]))["degraded_setting"] is None  # 2 seeds
  assert ("μ: int4_all seed 0 at 60, int4_all seed 1 at 60; π: none." in text)
  assert "**Remedies not run**" in text and "int4_all: undecidable with 2 seeds, t [" in text


def test_candidates_are_samplers_of_the_study():
  from studies.configs import mismatch  # pylint: disable=g-import-not-at-top
  assert set(horizon.SETTINGS) | set(horizon.STRONG_CANDIDATES) <= set(mismatch.PRECISIONS)
  a, b = mismatch.PRECISIONS["int4_all"], mismatch.PRECISIONS[horizon.STRONG]
  assert {k for k in a if a[k] != b[k]} == {"weight_quant"}


def test_prefix_difference():
  short = _rows([0.5, 0.6, 0.7])
  long = _rows([0.5, 0.6, 0.7, 0.8, 0.8])
  assert horizon.prefix_difference(long, short) == 0.0
  long[5]["perf/step_seconds"] = 3.0  # timings differ between any two runs
  short[5]["perf/step_seconds"] = 2.0
  assert horizon.prefix_difference(long, short) == 0.0
  long[5]["rollout_corr/k3_kl"] += 1e-9
  assert horizon.prefix_difference(long, short) == pytest.approx(1e-9)
