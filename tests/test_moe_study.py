"""The MoE study's rules, fixed before its runs (studies/reproduce/moe.py), by hand."""

import json
import os
import subprocess
import sys

import pytest

from mipu_jax import rl
from studies.configs import moe as moe_config
from studies.reproduce import moe


@pytest.mark.parametrize("row", moe_config.ROWS)
@pytest.mark.parametrize("precision", ["fp32", "fp8", "int4_all"])
def test_run_names_read_back(row, precision):
  name = moe.run_name(row, precision, 5e-4, 12)
  assert moe.parse_run_name(name) == {"row": row, "precision": precision, "lr": 5e-4,
                                      "seed": 12}


def test_a_foreign_run_name_is_not_read():
  assert moe.parse_run_name("baseline_fp8_s0") is None
  assert moe.parse_run_name("unknown_fp8_lr0.001_s0") is None


def _run(row, precision, lr, seed, steps=600, mu=None, pi=None, stable=True):
  return {"name": moe.run_name(row, precision, lr, seed), "steps": steps, "mu_collapse": mu,
          "pi_collapse": pi, "mu_stable": stable, "pi_stable": stable}


def test_collapse_rich_takes_the_lowest_qualifying_lr():
  runs = []
  for seed in range(3):
    runs.append(_run("control", "fp32", 2e-4, seed))
    runs.append(_run("control", "fp32", 5e-4, seed))
    runs.append(_run("control", "fp32", 1e-3, seed))
    # 2e-4: 1 of 3 collapses (not most); 5e-4: 2 of 3, one of them on π only.
    runs.append(_run("baseline", "fp8", 2e-4, seed, mu=300 if seed == 0 else None))
    runs.append(_run("baseline", "fp8", 5e-4, seed, mu=400 if seed == 0 else None,
                     pi=450 if seed == 1 else None))
    runs.append(_run("baseline", "fp8", 1e-3, seed, mu=200))
    # An emulated sampler is not deployable: never chosen, however rich.
    runs.append(_run("baseline", "int4_all", 1e-4, seed, mu=100))
  out = moe.collapse_rich(runs, steps=600)
  assert (out["chosen"]["precision"], out["chosen"]["lr"]) == ("fp8", 5e-4)
  assert out["chosen"]["baseline_collapsed"] == 2
  assert [c["lr"] for c in out["cells"]] == [2e-4, 5e-4, 1e-3]
  assert out["verdict"].startswith("collapse-rich: fp8 at lr 0.0005 (2 of 3")


def test_collapse_rich_needs_a_clean_control_and_finished_runs():
  runs = []
  for seed in range(3):
    # At 1e-3 the control degrades in one seed: not clean, so not rich.
    runs.append(_run("control", "fp32", 1e-3, seed, stable=seed != 2))
    runs.append(_run("baseline", "bf16", 1e-3, seed, mu=100))
    runs.append(_run("control", "fp32", 5e-4, seed))
    # Unfinished runs do not count: 1 of the 2 finished collapses.
    runs.append(_run("baseline", "bf16", 5e-4, seed, mu=100 if seed else None,
                     steps=600 if seed < 2 else 350))
  out = moe.collapse_rich(runs, steps=600)
  assert out["chosen"] is None
  assert (out["closest"]["lr"], out["closest"]["baseline_collapsed"],
          out["closest"]["baseline_seeds"]) == (5e-4, 1, 2)
  assert out["verdict"].startswith("no collapse-rich cell; closest with a clean control: bf16")
  at_1e3 = [r for r in runs if "_lr0.001_" in r["name"]]
  assert moe.collapse_rich(at_1e3, steps=600)["verdict"].endswith("is not clean")
  assert moe.collapse_rich([], steps=600)["verdict"] == "no cell has finished runs (600 steps) yet"


def test_seed_counts_by_power():
  assert moe.seeds_for_power(0.8, 0.2) == 10
  assert moe.seeds_for_power(0.7, 0.2) == 15


def test_read_run_counts_collapse_on_pi_and_cap_hits(tmp_path):
  rows = [{"step": 0, "eval/avg": 0.9, "eval/avg_se": 0.01, "eval_pi/avg": 0.9,
           "eval_pi/avg_se": 0.01}]
  for step in range(1, 5):
    rows.append({"step": step, "rollout/truncated_fraction": 0.25 * (step == 4),
                 "rollout/response_length_max": 100 + step})
  rows.append({"step": 4, "eval/avg": 0.85, "eval/avg_se": 0.01, "eval_pi/avg": 0.6,
               "eval_pi/avg_se": 0.01})
  run = tmp_path / moe.run_name("baseline", "fp8", 5e-4, 0)
  run.mkdir()
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  out = moe.read_run(str(run))
  assert out["steps"] == 4 and out["mu_collapse"] is None and out["pi_collapse"] == 4
  assert not out["mu_stable"] and not out["pi_stable"]  # 0.85 is 5 SEs below 0.9
  assert out["cap_hit_mean"] == pytest.approx(0.0625) and out["cap_hit_max"] == 0.25
  assert out["length_max"] == 104
  # A committed run's metrics are compressed (experiments/compress_results.py): the same.
  rl.compress_jsonl(str(run / "metrics.jsonl"))
  assert not (run / "metrics.jsonl").exists() and moe.read_run(str(run)) == out


def test_pilot_report_draws_each_run_where_it_logged(tmp_path):
  dirs = []
  for i, name in enumerate([moe.run_name("control", "fp32", 5e-4, 0),
                            moe.run_name("baseline", "fp8", 5e-4, 0)]):
    rows = [{"step": 0, "eval/avg": 0.5, "eval/avg_se": 0.01}]
    for step in range(1, 13):
      row = {"step": step, "rollout/response_length_mean": 50.0 + step,
             "rollout/truncated_fraction": 0.0, "actor/grad_norm": 1.0,
             "rollout_corr/k3_kl": 1e-3 * step, "actor/entropy": 0.01 * step}
      if i == 1:  # only the baseline has a sampler whose routing can flip
        row["moe/routing_flip_rate"] = 0.02
      rows.append(row)
    rows.append({"step": 12, "eval/avg": 0.8, "eval/avg_se": 0.01})
    (tmp_path / name).mkdir()
    (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dirs.append(str(tmp_path / name))
  dirs.append(str(tmp_path / "not_started"))
  drawn = moe.plot_pilot(dirs, str(tmp_path / "curves.png"))
  assert drawn["eval/avg"] == 2 and drawn["rollout/response_length_mean"] == 2
  assert drawn["moe/routing_flip_rate"] == 1
  assert (tmp_path / "curves.png").stat().st_size > 10_000
  # The 10-step means: the last one averages steps 3..12 of 50 + step.
  xs, ys = moe._windowed([{"step": s, "x": 50.0 + s} for s in range(1, 13)], "x", 10)
  assert xs == [10, 11, 12] and ys[-1] == pytest.approx(57.5)
  assert moe._windowed([{"step": s, "x": float(s % 4)} for s in range(1, 13)], "x", 10,
                       "max")[1] == [3.0, 3.0, 3.0]
  moe.pilot_report(dirs, str(tmp_path / "out"), steps=12)
  assert (tmp_path / "out" / "curves_pilot.png").exists()


def test_moe_vs_dense_report_recomputes_from_its_record(tmp_path):
  # Hand-made record: per token, dense K3 0.01, MoE 0.02 on every prompt, R3 halves it.
  cell = lambda s, **kw: {"k3_per_prompt": [s] * 3, "tokens_per_prompt": [100.0] * 3, **kw}
  record = {"command": "python -m experiments.moe_vs_dense --prompts=3", "precisions": ["fp8"],
            "prompts": 3, "samples": 1,
            "cells": {"dense/fp8": cell(1.0), "moe/fp8": cell(2.0, k3_r3_per_prompt=[1.0] * 3,
                                                               **{"moe/routing_flip_rate": 0.25})}}
  (tmp_path / "moe_vs_dense.json").write_text(json.dumps(record))
  subprocess.run([sys.executable, "-m", "experiments.moe_vs_dense", f"--out_dir={tmp_path}",
                  "--report_only"], check=True, capture_output=True,
                 cwd=os.path.dirname(os.path.dirname(__file__)))
  row = (tmp_path / "moe_vs_dense.md").read_text().splitlines()[2]
  assert row == ("| fp8 | 1.00e-02 [1.00e-02, 1.00e-02] | 2.00e-02 [2.00e-02, 2.00e-02] | "
                 "2.00x [2.00, 2.00] | 50% [50%, 50%] | 33% / 33% | 0.250 / 0.000 | outside | "
                 "inside |")
  out = json.loads((tmp_path / "moe_vs_dense.json").read_text())
  assert out["intervals"]["fp8"]["moe_over_dense"] == pytest.approx([2.0, 2.0, 2.0])


def test_pilot_rows_flag_picks_the_runs_it_reports(tmp_path):
  # A baseline-only pass (seeds added to a cell whose control has run) reports its own
  # runs; a row the pilot does not have is refused before anything runs.
  run = lambda *flags: subprocess.run(
      [sys.executable, "-m", "experiments.moe_study", f"--workdir={tmp_path}", "--lrs=3e-4",
       "--seeds=1,2", "--report_only", *flags], capture_output=True, text=True,
      cwd=os.path.dirname(os.path.dirname(__file__)))
  name = moe.run_name("baseline", "fp8", 3e-4, 1)
  (tmp_path / "runs" / name).mkdir(parents=True)
  (tmp_path / "runs" / name / "metrics.jsonl").write_text(
      json.dumps({"step": 0, "eval/avg": 0.3, "eval/avg_se": 0.01}) + "\n")
  assert run("--rows=baseline").returncode == 0
  assert [r["name"] for r in json.loads((tmp_path / "pilot.json").read_text())["runs"]] == [name]
  bad = run("--rows=remedy")
  assert bad.returncode != 0 and "--rows takes control and/or baseline" in bad.stderr
