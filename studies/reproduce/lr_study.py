"""The learning rate × sampler precision study: does mismatch hurt training at
a learning rate that is right for the full-precision run?

Cells are (precision, lr): `fp32` is the tables' `control` row (no
mismatch), `int4_all` their uncorrected `baseline` row (int4 weights, FP8
activations, FP8 KV cache, quantized LM head), at the same lr, seed, task
and budget (`studies/configs/table.py`; checked like with like). Per cell, over its
seeds: final and peak Avg. with the percentile bootstrap and t intervals,
Stable and collapsed counts, `k3_kl` over the last quarter, and the learner's
π evaluated at full precision beside the deployed μ (`eval.pi`). The
stated answers: the lr whose fp32 cell has the best mean final Avg., and at
each lr the paired difference fp32 − int4_all (same seed: same initial
policy, prompts and evaluation problems) with its intervals and the exact
sign-flip p, Holm-adjusted across the lrs (`stats`, fixed before the runs).
"""

import dataclasses
import json
import math
import os
from typing import Mapping, Optional, Sequence

import numpy as np

from mipu_jax.harness import stats
from mipu_jax.harness.summary import RunSummary

PRECISION_OF_ROW = {"control": "fp32", "baseline": "int4_all"}
ROWS = tuple(PRECISION_OF_ROW)


def run_name(row: str, lr: float, seed: int) -> str:
  """A cell's run directory name under `runs/`."""
  return f"{row}_lr{lr:g}_s{seed}"


@dataclasses.dataclass(frozen=True)
class Cell:
  """One (precision, lr) over its seeds; Avg. in points of pass@1."""
  precision: str
  lr: float
  seeds: tuple[int, ...]
  final: stats.RowStats
  peak_mean: float
  n_stable: int
  n_collapsed: int
  k3_kl: float
  pi_final_mean: Optional[float]
  pi_n: int
  source: str  # where the runs live


def cell_stats(precision: str, lr: float, runs: Sequence[RunSummary], source: str) -> Cell:
  runs = sorted(runs, key=lambda r: r.seed)
  finals = [r.final["avg"] for r in runs]
  collapsed = [r.collapse_step is not None for r in runs]
  pi = [r.final_pi for r in runs if r.final_pi is not None]
  return Cell(precision=precision, lr=lr, seeds=tuple(r.seed for r in runs),
              final=stats.row_stats(precision, finals, [r.stable for r in runs], collapsed),
              peak_mean=100 * float(np.mean([r.peak_avg for r in runs])),
              n_stable=sum(r.stable for r in runs), n_collapsed=sum(collapsed),
              k3_kl=float(np.mean([r.k3_kl for r in runs])),
              pi_final_mean=100 * float(np.mean(pi)) if pi else None, pi_n=len(pi),
              source=source)


def differences(by_cell: Mapping[tuple[str, float], Sequence[RunSummary]]
                ) -> list[tuple[float, stats.ClaimResult]]:
  """At each lr with both precisions: fp32 − int4_all, paired by seed,
  one-sided "fp32 > int4_all" (mismatch hurts), Holm across the lrs."""
  lrs = sorted({lr for _, lr in by_cell})
  claims, finals = [], {}
  for lr in lrs:
    if ("fp32", lr) not in by_cell or ("int4_all", lr) not in by_cell:
      continue
    a, b = f"fp32@{lr:g}", f"int4_all@{lr:g}"
    finals[a] = {r.seed: r.final["avg"] for r in by_cell[("fp32", lr)]}
    finals[b] = {r.seed: r.final["avg"] for r in by_cell[("int4_all", lr)]}
    claims.append(stats.Claim(a, b, "greater",
                              f"lr {lr:g}: fp32 > int4_all (mismatch costs final Avg.)"))
  results = stats.claim_results(finals, claims)
  return [(float(r.claim.a.split("@")[1]), r) for r in results]


def best_fp32_lr(cells: Sequence[Cell]) -> Optional[Cell]:
  """The fp32 cell with the highest mean final Avg. (None without fp32 cells)."""
  fp32 = [c for c in cells if c.precision == "fp32"]
  return max(fp32, key=lambda c: c.final.mean) if fp32 else None


def _ci(c: tuple[float, float]) -> str:
  return "—" if any(math.isnan(x) for x in c) else f"[{c[0]:.1f}, {c[1]:.1f}]"


def markdown(cells: Sequence[Cell], diffs, *, steps: int) -> str:
  """The study's table, the paired differences and the stated answers."""
  lines = ["| precision | lr | seeds | final Avg. | bootstrap 95% CI | t 95% CI | "
           "peak Avg. | Stable | Collapsed | k3_kl | π final Avg. | runs |",
           "|---" * 12 + "|"]
  for c in sorted(cells, key=lambda c: (c.precision, c.lr)):
    pi = "—" if c.pi_final_mean is None else (
        f"{c.pi_final_mean:.1f}" + ("" if c.pi_n == len(c.seeds) else
                                    f" ({c.pi_n}/{len(c.seeds)} seeds)"))
    lines.append(
        f"| {c.precision} | {c.lr:g} | {len(c.seeds)} | {c.final.mean:.1f} | "
        f"{_ci(c.final.ci)} | {_ci(c.final.t_ci)} | {c.peak_mean:.1f} | "
        f"{c.n_stable}/{len(c.seeds)} | {c.n_collapsed}/{len(c.seeds)} | "
        f"{c.k3_kl:.2e} | {pi} | `{c.source}` |")
  lines += ["", f"Final Avg.: the last evaluation (step {steps}) of the deployed "
            "sampler μ, mean over seeds, in points of pass@1 over five tiers. "
            "π final Avg.: the learner's policy evaluated at full precision on the "
            "same problems with the same seeds (runs made before `eval.pi` existed "
            "have none).", "", "### Paired differences fp32 − int4_all", ""]
  lines += [r.line() for _, r in diffs] or ["- no lr has both precisions yet"]
  best = best_fp32_lr(cells)
  lines += ["", "### Stated answers", ""]
  if best is None:
    lines.append("- no fp32 cell has finished yet.")
  else:
    lines.append(f"- The lr that is best for fp32 (highest mean final Avg. over "
                 f"{len(best.seeds)} seeds): {best.lr:g}, at {best.final.mean:.1f} "
                 f"(t 95% CI {_ci(best.final.t_ci)}; Stable {best.n_stable}/"
                 f"{len(best.seeds)}).")
    lrs = sorted(c.lr for c in cells if c.precision == "fp32")
    if len(lrs) > 1 and best.lr in (lrs[0], lrs[-1]):
      lines.append(f"  It is the {'lowest' if best.lr == lrs[0] else 'highest'} lr of the "
                   "grid: the best lr for fp32 may lie beyond it.")
    others = [c for c in cells if c.precision == "fp32" and c is not best]
    overlap = [c for c in others if c.final.t_ci[1] >= best.final.t_ci[0]]
    if overlap:
      lines.append("  Its t interval overlaps that of lr " + ", ".join(
          f"{c.lr:g}" for c in sorted(overlap, key=lambda c: c.lr))
                   + ": the best lr is not singled out at this number of seeds.")
    at_best = [r for lr, r in diffs if lr == best.lr]
    if at_best:
      lines.append(f"- The cost of mismatch there: {at_best[0].line()[2:]}")
  return "\n".join(lines)


def plot(cells: Sequence[Cell], by_cell, path: str) -> Optional[str]:
  """Final Avg. against lr per precision (mean, t interval), with π's dashed."""
  if not cells:
    return None
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  for precision, color in (("fp32", "tab:blue"), ("int4_all", "tab:red")):
    cs = sorted([c for c in cells if c.precision == precision], key=lambda c: c.lr)
    if not cs:
      continue
    x = [c.lr for c in cs]
    y = np.array([c.final.mean for c in cs])
    lo = np.array([c.final.t_ci[0] for c in cs])
    hi = np.array([c.final.t_ci[1] for c in cs])
    err = np.nan_to_num(np.stack([y - lo, hi - y]))
    ax.errorbar(x, y, yerr=err, color=color, marker="o", capsize=3,
                label=f"{precision} sampler μ (n = {', '.join(str(len(c.seeds)) for c in cs)})")
    for c in cs:  # each seed, faint
      ax.scatter([c.lr] * len(by_cell[(precision, c.lr)]),
                 [100 * r.final["avg"] for r in by_cell[(precision, c.lr)]],
                 color=color, alpha=0.25, s=10)
    pi = [(c.lr, c.pi_final_mean) for c in cs if c.pi_final_mean is not None]
    if pi and precision != "fp32":
      ax.plot(*zip(*pi), color=color, linestyle="--", marker="x",
              label=f"{precision} run, π at full precision")
  ax.set_xscale("log")
  ax.set_xlabel("learning rate (constant)")
  ax.set_ylabel("final eval Avg. (pass@1, %)")
  ax.set_title("lr × sampler precision, no correction (mean, t 95% CI; dots: seeds)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def report(by_cell: Mapping[tuple[str, float], Sequence[RunSummary]],
           sources: Mapping[tuple[str, float], str], workdir: str, *, steps: int) -> dict:
  """Writes `study.md`, `summary.json` and `final_vs_lr.png` into `workdir`."""
  cells = [cell_stats(p, lr, runs, sources[(p, lr)]) for (p, lr), runs in by_cell.items()
           if runs]
  diffs = differences({k: v for k, v in by_cell.items() if v})
  text = markdown(cells, diffs, steps=steps)
  files = {"study": os.path.join(workdir, "study.md"),
           "summary": os.path.join(workdir, "summary.json")}
  with open(files["study"], "w") as f:
    f.write("# lr × sampler precision, no correction\n\n" + text + "\n")
  with open(files["summary"], "w") as f:
    json.dump({"cells": [dataclasses.asdict(c) for c in cells],
               "differences": [{"lr": lr, "mean_diff": r.mean_diff, "diff_ci": r.diff_ci,
                                "diff_t_ci": r.diff_t_ci, "p": r.p, "p_holm": r.p_holm,
                                "seeds": r.seeds, "verdict": r.verdict}
                               for lr, r in diffs],
               "runs": {f"{p}@{lr:g}": [dataclasses.asdict(r) for r in runs]
                        for (p, lr), runs in by_cell.items()}}, f, indent=2)
  path = plot(cells, by_cell, os.path.join(workdir, "final_vs_lr.png"))
  if path:
    files["figure"] = path
  return {"markdown": text, "files": files, "cells": cells, "differences": diffs}
