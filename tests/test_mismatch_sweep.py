"""The mismatch study's reductions: collapse step, per-cell summary, grid table, cells."""

import os

import pytest

from mipu_jax import config as config_lib
from mipu_jax import rl
from studies import mismatch_sweep
from studies.configs import mismatch

TIERS = ("tier1", "tier2")


def _rows(evals, k3=(), entropy=()):
  rows = []
  for step, (avg, kl, ent) in enumerate(zip(evals, k3 or [0.0] * len(evals),
                                            entropy or [0.1] * len(evals))):
    row = {"step": float(step), "rollout_corr/k3_kl": kl, "actor/entropy": ent}
    if avg is not None:
      row.update({"eval/avg": avg, "eval/avg_se": 0.02,
                  **{f"eval/{t}": avg for t in TIERS}})
    rows.append(row)
  return rows


def test_collapse_is_a_fall_of_more_than_15_points_below_the_best_so_far():
  assert mismatch_sweep.collapse_step(_rows([0.2, 0.6, 0.5, 0.44])) == 3
  assert mismatch_sweep.collapse_step(_rows([0.2, 0.6, 0.46, 0.7])) is None
  assert mismatch_sweep.collapse_step(_rows([0.6, None, 0.3])) == 2
  assert mismatch_sweep.collapse_step(_rows([0.6, 0.4]), drop=0.25) is None


def test_cell_summary_reports_mismatch_growth_and_stability():
  rows = _rows([0.2, 0.5, 0.52, 0.3], k3=[1e-3, 1e-3, 4e-3, 8e-3],
               entropy=[0.5, 0.4, 0.3, 0.2])
  r = mismatch_sweep.summarize_cell("c", "precision=fp8", rows, TIERS, 60.0)
  assert (r.final_avg, r.peak_avg, r.peak_step, r.collapse_step) == (0.3, 0.52, 2, 3)
  assert not r.stable and r.eval_se == 0.02
  assert (r.k3_first, r.k3_last) == (1e-3, 8e-3)  # first and last quarter (1 step)
  assert (r.entropy_first, r.entropy_last) == (0.5, 0.2)
  md = mismatch_sweep.grid_markdown([r])
  assert "| c | `precision=fp8` | 30.0 ± 2.0 | 52.0 (2) | ✘ | 3 | 1.00e-03 → 8.00e-03 |" in md


def test_every_grid_cell_is_a_valid_config_that_differs_only_in_its_axes():
  base = config_lib.from_config_dict(mismatch.get_config("precision=fp32"))
  for name, arg in mismatch.GRID.items():
    cfg = config_lib.from_config_dict(mismatch.get_config(arg))
    assert cfg.loss.correction.is_level is None, name  # the uncorrected baseline
    assert cfg.learner == base.learner and cfg.data.group_size == base.data.group_size
  q = config_lib.from_config_dict(mismatch.get_config("precision=int4_all"))
  assert (q.sampling.weight_quant, q.sampling.act_quant, q.sampling.kv_cache_dtype,
          q.sampling.quant_lm_head) == ("int4", "fp8", "fp8", True)
  with pytest.raises(ValueError, match="unknown precision"):
    mismatch.get_config("precision=int3")
  configs = {name: config_lib.from_config_dict(mismatch.get_config(arg))
             for name, arg in mismatch.GRID.items()}
  mismatch_sweep.check_cells_differ_only_in_axes(configs)  # the grid as committed
  other = mismatch.get_config("precision=fp32")
  other.data.prompts_per_step = 8  # not an axis of the study
  configs["smaller_batch"] = config_lib.from_config_dict(other)
  with pytest.raises(ValueError, match="data.prompts_per_step"):
    mismatch_sweep.check_cells_differ_only_in_axes(configs)


def test_seeds_markdown_counts_stable_and_collapsed_seeds():
  def cell(seed, final, stable, collapse):
    return mismatch_sweep.CellResult(
        name=f"c{seed}", arg=f"precision=int4,lr=7e-4,seed={seed}", final_avg=final,
        peak_avg=0.5, peak_step=20, eval_se=0.02, stable=stable,
        collapse_step=collapse, k3_first=0.0, k3_last=0.0, entropy_first=0.0,
        entropy_last=0.0, seconds=1.0, step_minutes=1.0)
  md = mismatch_sweep.seeds_markdown([cell(0, 0.1, False, 40), cell(1, 0.2, False, 60),
                                      cell(2, 0.45, True, None)])
  assert "| `precision=int4,lr=7e-4` | 3 | 1/3 | 2/3 | 10.0 / 20.0 / 45.0 | 25.0 |" in md


def _by_step(path):
  """A run's metrics.jsonl as {step: every metric logged at that step}."""
  rows = {}
  for row in rl.read_jsonl(path):
    rows.setdefault(row["step"], {}).update(row)
  return rows


@pytest.mark.parametrize("row, cell", [("control", "fp32"),
                                       ("baseline", "int4_all")])
def test_committed_table_runs_match_the_study_cells_they_were_chosen_from(row, cell):
  """A check of committed data, not of code: the tables' committed control and
  baseline runs (results/small_cpu) and the study's committed lr 7e-4 / 120-step
  cells (results/mismatch_sweep) hold the same value of every metric both
  logged (timings aside), so the setting the study chose is the one the tables
  ran. A code change cannot fail it; rerunning either directory apart can."""
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                      "results")
  for seed in range(3):
    a = _by_step(os.path.join(root, "small_cpu", "runs", f"{row}_s{seed}",
                              "metrics.jsonl"))
    b = _by_step(os.path.join(root, "mismatch_sweep", "runs",
                              f"{cell}_lr7e-4_tiers45_120s_s{seed}",
                              "metrics.jsonl"))
    assert sorted(a) == sorted(b) and len(a) == 121
    for step in a:
      shared = {k for k in set(a[step]) & set(b[step])
                if not k.startswith("perf/")}
      assert len(shared) > (8 if step == 0 else 60), step
      for k in shared:
        assert a[step][k] == b[step][k], (row, seed, step, k)
