"""The lr x precision study's report (studies/reproduce/lr_study.py), by hand."""

import os

import pytest

from mipu_jax import harness

from studies.reproduce import lr_study


def _run(row, seed, avg, pi=None, stable=True, collapse=None):
  return harness.RunSummary(
      row=row, seed=seed, workdir="", final={"avg": avg}, final_se=0.01, peak_avg=avg + 0.01,
      peak_step=100, peak_se=0.01, stable=stable, rollback_rate=0.0, k3_kl=0.01,
      seconds=1.0, collapse_step=collapse, final_pi=pi, peak_pi=pi)


def _cells():
  # fp32 at 2e-4: 80, 70, 75 (mean 75); int4_all: 70, 60, 72 (differences 10, 10, 3).
  # fp32 at 7e-4: 50, 60, 55 (mean 55); int4_all: 55, 10, 50 (collapsed once).
  return {
      ("fp32", 2e-4): [_run("control", s, v, v) for s, v in enumerate([.80, .70, .75])],
      ("int4_all", 2e-4): [_run("baseline", s, v, v + .02)
                           for s, v in enumerate([.70, .60, .72])],
      ("fp32", 7e-4): [_run("control", s, v) for s, v in enumerate([.50, .60, .55])],
      ("int4_all", 7e-4): [_run("baseline", 0, .55), _run("baseline", 1, .10, stable=False,
                                                             collapse=60),
                           _run("baseline", 2, .50)]}


def test_cells_differences_and_the_stated_answers(tmp_path):
  by_cell = _cells()
  diffs = dict(lr_study.differences(by_cell))
  low, high = diffs[2e-4], diffs[7e-4]
  assert low.mean_diff == pytest.approx(23 / 3) and low.p == pytest.approx(1 / 8)
  assert high.mean_diff == pytest.approx((-5 + 50 + 5) / 3)
  # d = (-5, 50, 5): sums 60, 50 (as observed) and 50 (+5, +50, -5) reach it.
  assert high.p == pytest.approx(3 / 8)
  # Holm across the two lrs: the smaller p doubled, the larger kept.
  assert low.p_holm == pytest.approx(2 / 8) and high.p_holm == pytest.approx(3 / 8)
  cells = [lr_study.cell_stats(p, lr, runs, "x") for (p, lr), runs in by_cell.items()]
  best = lr_study.best_fp32_lr(cells)
  assert (best.lr, best.final.mean) == (2e-4, pytest.approx(75.0))
  worst = [c for c in cells if c.precision == "int4_all" and c.lr == 7e-4][0]
  assert (worst.n_stable, worst.n_collapsed, worst.pi_final_mean) == (2, 1, None)
  mu_pi = [c for c in cells if c.precision == "int4_all" and c.lr == 2e-4][0]
  assert mu_pi.pi_final_mean == pytest.approx(202 / 3 + 2)  # μ 67.3, π two points above
  out = lr_study.report(by_cell, {k: "runs" for k in by_cell}, str(tmp_path), steps=120)
  md = out["markdown"]
  assert "| int4_all | 0.0007 | 3 | 38.3 |" in md
  assert "The lr that is best for fp32 (highest mean final Avg. over 3 seeds): 0.0002, at 75.0" in md
  assert "The cost of mismatch there: lr 0.0002: fp32 > int4_all" in md
  assert "It is the lowest lr of the grid: the best lr for fp32 may lie beyond it." in md
  assert os.path.exists(out["files"]["figure"]) and os.path.exists(out["files"]["summary"])


def test_run_names_and_rows():
  assert lr_study.run_name("control", 2e-4, 3) == "control_lr0.0002_s3"
  assert lr_study.ROWS == ("control", "baseline")
