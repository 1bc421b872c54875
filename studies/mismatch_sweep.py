"""The mismatch study: where does training–inference mismatch hurt the small task?

Each cell is one config (`studies/configs/mismatch.py:<arg>`): a sampler precision
and a setting (learning rate, temperature, tiers, response budget, seed).
`run_sweep` trains every cell through the RL loop (`harness.run_one`:
resumable, a finished cell is read back only if its saved config
equals the cell's), then writes `grid.md`, `summary.json` and `sweep.png`.

Per cell it reports what the sources watch: final and peak eval Avg., the
Stable flag of the tables (`harness.summarize`), the collapse step, and the
mismatch over training (`rollout_corr/k3_kl`, mean over the first and the last
quarter of the steps, to see whether it grows), with the policy entropy.

**Collapse** (fixed before the runs): the first evaluation at which eval Avg.
is more than `COLLAPSE_DROP` (15 points of pass@1, several times the
evaluation's standard error here) below the best evaluation so far; None if
that never happens.

**Like with like**: every two cells differ only in the study's axes
(`STUDY_AXES`: sampler precision, learning rate, tiers, temperature, response
budget, correction, length and evaluation period, seed), checked before anything trains.
"""

import dataclasses
import json
import os
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from mipu_jax import config as config_lib
from mipu_jax import harness
from mipu_jax import rl
from mipu_jax.rl import run_report
from studies import reproduce

COLLAPSE_DROP = harness.COLLAPSE_DROP
collapse_step = harness.collapse_step  # one home: mipu_jax/harness/summary.py
# What cells may differ in: the study's axes (`studies/configs/mismatch.py`'s
# arguments). Everything else (batch, optimizer settings, evaluation, ...) must
# be equal, so two cells compare only what their names say.
STUDY_AXES = reproduce.PRECISION_FIELDS + (
    "optim.learning_rate", "data.train_tiers", "sampling.temperature",
    "eval.temperature", "sampling.max_new_tokens", "loss.correction", "num_steps",
    "eval.every", "checkpoint.every", "seed", "mipu.seed")


def check_cells_differ_only_in_axes(configs: Mapping[str, Any]) -> None:
  """Raises unless every two cells differ only in `STUDY_AXES`.

  Args:
    configs: cell name -> validated `TrainConfig`.

  Raises:
    ValueError: naming the cells and the settings outside the axes that differ.
  """
  names = list(configs)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      diff = {k: v for k, v in config_lib.config_diff(configs[a], configs[b]).items()
              if not k.startswith(STUDY_AXES)}
      if diff:
        raise ValueError(f"cells {a!r} and {b!r} differ outside the study's axes: "
                         f"{diff}. Make every other setting equal.")


@dataclasses.dataclass(frozen=True)
class CellResult:
  """One trained cell, reduced to the study's numbers.

  Attributes:
    name: the cell's name.
    arg: its `studies/configs/mismatch.py` argument.
    final_avg: last evaluation's Avg.
    peak_avg: best evaluation's Avg. (step 0 included).
    peak_step: its step.
    eval_se: standard error of the last evaluation's Avg.
    stable: the tables' Stable criterion (`harness.summarize`).
    collapse_step: see module docstring.
    k3_first: mean `rollout_corr/k3_kl` over the first quarter of the steps.
    k3_last: the same over the last quarter.
    entropy_first: mean `actor/entropy` over the first quarter.
    entropy_last: the same over the last quarter.
    seconds: wall time of the run's last attempt (a resumed cell's earlier
      attempts are not in it).
    step_minutes: minutes spent in RL steps over all attempts (the sum of
      `perf/step_seconds`; evaluations and compilation excluded).
    final_pi_avg: the last evaluation's Avg. of the learner's π at full
      precision (`eval_pi/avg`); None for a cell that did not evaluate π.
  """
  name: str
  arg: str
  final_avg: float
  peak_avg: float
  peak_step: int
  eval_se: float
  stable: bool
  collapse_step: Optional[int]
  k3_first: float
  k3_last: float
  entropy_first: float
  entropy_last: float
  seconds: float
  step_minutes: float
  final_pi_avg: Optional[float] = None


def _quarter_means(rows, name: str) -> tuple[float, float]:
  values = [r[name] for r in rows if name in r]
  if not values:
    return float("nan"), float("nan")
  q = max(len(values) // 4, 1)
  return float(np.mean(values[:q])), float(np.mean(values[-q:]))


def summarize_cell(name: str, arg: str, rows: Sequence[Mapping[str, float]],
                   tiers: Sequence[str], seconds: float) -> CellResult:
  """A `CellResult` from a run's logged rows."""
  s = harness.summarize(rows, tiers)
  k3 = _quarter_means(rows, "rollout_corr/k3_kl")
  ent = _quarter_means(rows, "actor/entropy")
  return CellResult(name=name, arg=arg, final_avg=s["final"]["avg"],
                    peak_avg=s["peak_avg"], peak_step=s["peak_step"],
                    eval_se=s["final_se"], stable=s["stable"],
                    collapse_step=collapse_step(rows), k3_first=k3[0],
                    k3_last=k3[1], entropy_first=ent[0], entropy_last=ent[1],
                    seconds=seconds,
                    step_minutes=sum(r.get("perf/step_seconds", 0.0) for r in rows) / 60,
                    final_pi_avg=s["final_pi"])


def run_sweep(make_config: Callable[[str], Any], cells: Mapping[str, str],
              workdir: str, *, log: Callable[[str], None] = print,
              train: bool = True) -> list[CellResult]:
  """Trains (or reads back) every cell; writes grid.md, summary.json, sweep.png.

  Args:
    make_config: `arg -> ConfigDict` (`studies/configs/mismatch.get_config`).
    cells: cell name -> its config argument, in the order to run them.
    workdir: output directory; cell `name` trains in `workdir/runs/<name>/`.
    log: progress sink.
    train: False to only read back the cells that finished.

  Returns:
    The finished cells' results, in `cells` order.

  Raises:
    ValueError: cells that differ outside `STUDY_AXES`.
  """
  os.makedirs(workdir, exist_ok=True)
  configs = {name: config_lib.from_config_dict(make_config(arg))
             for name, arg in cells.items()}
  check_cells_differ_only_in_axes(configs)  # before anything trains
  results = []
  for name, arg in cells.items():
    cfg = configs[name]
    run_dir = os.path.join(workdir, "runs", name)
    summary = harness.run_one(cfg, name, cfg.seed, run_dir, log, train)
    if summary is None:
      log(f"[sweep] {name}: not finished, left out")
      continue
    rows = rl.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    results.append(summarize_cell(name, arg, rows, cfg.eval.tiers,
                                  summary.seconds))
  with open(os.path.join(workdir, "grid.md"), "w") as f:
    f.write(grid_markdown(results) + "\n\n" + seeds_markdown(results) + "\n")
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump({"cells": [dataclasses.asdict(r) for r in results],
               "collapse_drop": COLLAPSE_DROP}, f, indent=2)
  if results:
    plot_sweep(results, workdir, os.path.join(workdir, "sweep.png"))
  return results


def grid_markdown(results: Sequence[CellResult]) -> str:
  """The grid as a markdown table (pass@1 in %; π's final Avg. when a cell
  evaluated it)."""
  with_pi = any(r.final_pi_avg is not None for r in results)
  lines = ["| cell | config | final Avg. ± SE | peak Avg. (step) | Stable | "
           "collapse step | k3_kl first → last quarter | entropy first → last | "
           "RL-step minutes |" + (" π final Avg. |" if with_pi else ""),
           "|---" * (9 + with_pi) + "|"]
  for r in results:
    pi = "" if not with_pi else (
        " — |" if r.final_pi_avg is None else f" {100 * r.final_pi_avg:.1f} |")
    lines.append(
        f"| {r.name} | `{r.arg}` | {100 * r.final_avg:.1f} ± {100 * r.eval_se:.1f} | "
        f"{100 * r.peak_avg:.1f} ({r.peak_step}) | {'✔' if r.stable else '✘'} | "
        f"{'—' if r.collapse_step is None else r.collapse_step} | "
        f"{r.k3_first:.2e} → {r.k3_last:.2e} | "
        f"{r.entropy_first:.3f} → {r.entropy_last:.3f} | {r.step_minutes:.1f} |" + pi)
  return "\n".join(lines)


def _without_seed(arg: str) -> str:
  return ",".join(p for p in arg.split(",") if not p.startswith("seed="))


def seeds_markdown(results: Sequence[CellResult]) -> str:
  """Cells that differ only in their seed, as one line each: how many seeds
  are Stable and how many collapsed, and the final Avg. per seed (pass@1 in %).
  """
  groups: dict[str, list[CellResult]] = {}
  for r in results:
    groups.setdefault(_without_seed(r.arg), []).append(r)
  lines = ["| setting | seeds | Stable | collapsed | final Avg. per seed | mean |",
           "|---" * 6 + "|"]
  for arg, rs in groups.items():
    if len(rs) < 2 and "seed=" not in rs[0].arg:
      continue
    finals = " / ".join(f"{100 * r.final_avg:.1f}" for r in rs)
    lines.append(
        f"| `{arg}` | {len(rs)} | {sum(r.stable for r in rs)}/{len(rs)} | "
        f"{sum(r.collapse_step is not None for r in rs)}/{len(rs)} | {finals} | "
        f"{100 * np.mean([r.final_avg for r in rs]):.1f} |")
  return "\n".join(lines)


def plot_sweep(results: Sequence[CellResult], workdir: str, path: str) -> str:
  """One figure: final and peak eval, collapse step, k3_kl per cell, and the
  eval and k3_kl curves of every cell."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  names = [r.name for r in results]
  x = np.arange(len(results))
  fig, axes = plt.subplots(2, 3, figsize=(18, 9))
  ax = axes[0, 0]
  ax.bar(x - 0.2, [100 * r.peak_avg for r in results], 0.4, label="peak")
  ax.bar(x + 0.2, [100 * r.final_avg for r in results], 0.4,
         yerr=[200 * r.eval_se for r in results], label="final (±2 SE)")
  ax.set_title("eval pass@1 Avg. (%)")
  ax.legend(fontsize=8)
  ax = axes[0, 1]
  steps = [np.nan if r.collapse_step is None else r.collapse_step for r in results]
  ax.bar(x, np.nan_to_num(steps, nan=0.0), color="C3")
  for i, s in enumerate(steps):
    if np.isnan(s):
      ax.text(i, 0, "none", ha="center", va="bottom", fontsize=8, rotation=90)
  ax.set_title(f"collapse step (eval > {100 * COLLAPSE_DROP:.0f} pts below its best)")
  ax = axes[0, 2]
  ax.bar(x - 0.2, [r.k3_first for r in results], 0.4, label="first quarter")
  ax.bar(x + 0.2, [r.k3_last for r in results], 0.4, label="last quarter")
  ax.set_yscale("symlog", linthresh=1e-5)
  ax.set_title("mean rollout_corr/k3_kl")
  ax.legend(fontsize=8)
  for ax in axes[0]:
    ax.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
    ax.grid(alpha=0.3, axis="y")
  for ax, (metric, title) in zip(axes[1], (
      ("eval/avg", "eval pass@1 Avg. over steps"),
      ("rollout_corr/k3_kl", "k3_kl over steps"),
      ("rollout/response_length_mean", "response length over steps"))):
    for i, r in enumerate(results):
      rows = rl.read_jsonl(os.path.join(workdir, "runs", r.name, "metrics.jsonl"))
      pts = [(row["step"], row[metric]) for row in rows if metric in row]
      if pts:
        xs, ys = zip(*pts)
        ax.plot(xs, ys, label=r.name, color=f"C{i % 10}",
                linestyle="-" if i < 10 else "--")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  axes[1, 1].set_yscale("symlog", linthresh=1e-5)
  axes[1, 0].legend(fontsize=6, ncol=2)
  return run_report.save_figure(fig, path, "mismatch study on the small task")
