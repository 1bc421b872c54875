"""The MoE study's rules, fixed before its runs, and the pilot's report (docs/method.md §7a).

Rules (fixed 2026-11-27, before the first pilot run):

- **Collapse**, on μ (the deployed sampler's `eval/avg`) and, separately, on π
  (the learner at full precision, `eval_pi/avg`): the first evaluation more
  than `COLLAPSE_DROP` (15 points of pass@1) below the best evaluation so far
  (`harness.summary.collapse_step`, the rule of every earlier study). A run
  collapses when it collapses on μ **or** on π; both are reported.
- **Degradation**: not collapsed, and the last evaluation more than
  `STABLE_SES` (2) standard errors of the best below the best (the tables'
  Stable rule, failed), on μ or on π.
- **Cap hits**: the share of sampled responses that reached `max_new_tokens`
  (`rollout/truncated_fraction`), mean over the run and the largest step's.
- **Collapse-rich setting** (the pilot's question): a (precision, lr) cell in
  which the uncorrected baseline collapses in at least `RICH_MIN_SHARE` of the
  pilot seeds while the fp32 control collapses in none and is Stable (μ and π)
  in all. The study takes the lowest such lr of a deployable precision (bf16
  or FP8); with none, the answer is "no such setting in the budget" and the
  closest cell (most baseline collapses, control still clean) is reported.
- **Seed counts** (power, one-sided Fisher exact test at α = 0.05 with power
  0.8): a remedy that brings a collapse rate of 0.8 down to 0.2 needs 10 seeds
  per row (`seeds_for_power(0.8, 0.2)`); 0.7 to 0.2 needs 15 — ten seeds is
  the floor, more where the pilot's rate is below 0.8.
- **Which remedies run**: all nine rows of `studies/configs/moe.py` in the
  chosen setting, in the order of the issue (baseline, R3, R2, token TIS,
  geometric-mean rejection, MIPU, the length-surge schedule, true on-policy in
  bf16, the fp32 control), seeds as the outer loop.
"""

import json
import math
import os
from typing import Mapping, Optional, Sequence

import numpy as np

from mipu_jax import rl
from mipu_jax.harness.summary import COLLAPSE_DROP
from mipu_jax.harness.summary import STABLE_SES
from mipu_jax.harness.summary import collapse_step

RICH_MIN_SHARE = 0.5  # "most seeds": more than half, at least 2 of 3 in a 3-seed pilot
ALPHA, POWER = 0.05, 0.8


def _curve(rows: Sequence[Mapping[str, float]], key: str) -> list[dict]:
  """`rows`' evaluations of `key` renamed to `eval/avg` (for `collapse_step`)."""
  return [{"step": r["step"], "eval/avg": r[key],
           "se": r.get(key + "_se", r.get(key.replace("avg", "avg_se"), 0.0))}
          for r in rows if key in r]


def stable(curve: Sequence[Mapping[str, float]]) -> bool:
  """The tables' Stable rule on one evaluation curve (`harness.summary`)."""
  if len(curve) < 2:
    return True
  best, best_se = -np.inf, 0.0
  ok = []
  for e in curve:
    if e["eval/avg"] >= best:
      best, best_se = e["eval/avg"], e["se"]
    ok.append(e["eval/avg"] >= best - STABLE_SES * best_se)
  return ok[-1] and ok[-2]


def read_run(workdir: str) -> Optional[dict]:
  """One pilot run, finished or not: its evaluations and rollout statistics."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not (os.path.exists(path) or os.path.exists(path + ".gz")):  # .gz: a committed run
    return None
  rows = rl.read_jsonl(path)
  steps = [r for r in rows if r.get("step", 0) > 0]
  out = {"name": os.path.basename(workdir), "steps": int(max([r["step"] for r in rows] + [0]))}
  for side, key in (("mu", "eval/avg"), ("pi", "eval_pi/avg")):
    curve = _curve(rows, key)
    out[f"{side}_collapse"] = collapse_step(curve, COLLAPSE_DROP)
    out[f"{side}_stable"] = stable(curve)
    out[f"{side}_final"] = curve[-1]["eval/avg"] if curve else None
    out[f"{side}_peak"] = max((e["eval/avg"] for e in curve), default=None)
  def mean(key):
    v = [r[key] for r in steps if key in r and math.isfinite(r[key])]
    return float(np.mean(v)) if v else None
  out["cap_hit_mean"] = mean("rollout/truncated_fraction")
  out["cap_hit_max"] = max((r.get("rollout/truncated_fraction", 0.0) for r in steps), default=None)
  out["length_max"] = max((r.get("rollout/response_length_max", 0.0) for r in steps), default=None)
  for key in ("rollout_corr/k3_kl", "moe/routing_flip_rate", "moe/token_flip_rate",
              "rollout/response_length_mean"):
    out[key] = mean(key)
  return out


def seeds_for_power(p_base: float, p_remedy: float, alpha: float = ALPHA,
                    power: float = POWER, limit: int = 200) -> int:
  """Seeds per row for a one-sided Fisher exact test of `p_remedy < p_base` to reach
  `power` at `alpha`, by exact enumeration of the two binomials."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  for n in range(2, limit):
    k = np.arange(n + 1)
    pa, pb = stats.binom.pmf(k, n, p_base), stats.binom.pmf(k, n, p_remedy)
    reject = np.zeros((n + 1, n + 1), bool)
    for a in k:
      for b in k:
        reject[a, b] = stats.fisher_exact([[a, n - a], [b, n - b]],
                                          alternative="greater")[1] <= alpha
    if float(pa @ reject @ pb) >= power:
      return n
  return limit


def check_pilot_pair(control, baseline) -> None:
  """Like with like: the pilot's control and baseline differ only in the sampler."""
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  other = [k for k in config_lib.config_diff(control, baseline) if not k.startswith("sampling.")]
  if other:
    raise ValueError(f"the pilot's control and baseline differ beyond the sampler: {other}")


def run_name(row: str, precision: str, lr: float, seed: int) -> str:
  """A study run's directory name under `WORKDIR/runs` (`parse_run_name` reads it)."""
  return f"{row}_{precision}_lr{lr:g}_s{seed}"


def parse_run_name(name: str) -> Optional[dict]:
  """`run_name`'s fields back, None for a name of another form."""
  from studies.configs import moe as moe_config  # pylint: disable=g-import-not-at-top
  for row in sorted(moe_config.ROWS, key=len, reverse=True):
    if name.startswith(row + "_"):
      rest = name[len(row) + 1:]
      precision, sep, tail = rest.rpartition("_lr")
      lr, sep2, seed = tail.rpartition("_s")
      if sep and sep2 and precision and seed.isdigit():
        try:
          return {"row": row, "precision": precision, "lr": float(lr), "seed": int(seed)}
        except ValueError:
          return None
  return None


def collapse_rich(runs: Sequence[Mapping], steps: int) -> dict:
  """The pilot's question under the rule fixed above: per (precision, lr) cell,
  the baseline's collapses and the control's collapses and Stable flags over the
  seeds whose runs reached `steps`, and the verdict (the lowest lr of a
  deployable precision that qualifies, else the closest cell)."""
  cells = {}
  for r in runs:
    f = parse_run_name(r["name"])
    if f is None or r["steps"] < steps:
      continue
    if f["row"] not in ("control", "baseline"):
      continue
    c = cells.setdefault((f["row"] if f["row"] == "control" else f["precision"], f["lr"]),
                         {"seeds": 0, "collapsed": 0, "stable": 0})
    c["seeds"] += 1
    c["collapsed"] += bool(r["mu_collapse"] or r["pi_collapse"])
    c["stable"] += bool(r["mu_stable"] and r["pi_stable"])
  table = []
  for (precision, lr), c in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    if precision not in ("bf16", "fp8"):  # the control's cells, the emulated samplers
      continue
    control = cells.get(("control", lr), {"seeds": 0, "collapsed": 0, "stable": 0})
    control_clean = (control["seeds"] > 0 and control["collapsed"] == 0
                     and control["stable"] == control["seeds"])
    rich = control_clean and c["collapsed"] > RICH_MIN_SHARE * c["seeds"]
    table.append({"precision": precision, "lr": lr, "baseline_seeds": c["seeds"],
                  "baseline_collapsed": c["collapsed"], "control_seeds": control["seeds"],
                  "control_collapsed": control["collapsed"],
                  "control_stable": control["stable"], "control_clean": control_clean,
                  "rich": rich})
  chosen = next((t for t in table if t["rich"]), None)
  clean = [t for t in table if t["control_clean"]]
  closest = max(clean, key=lambda t: t["baseline_collapsed"] / t["baseline_seeds"],
                default=None)
  if chosen is not None:
    verdict = (f"collapse-rich: {chosen['precision']} at lr {chosen['lr']:g} "
               f"({chosen['baseline_collapsed']} of {chosen['baseline_seeds']} baseline seeds "
               "collapse, the control none)")
  elif closest is not None:
    verdict = (f"no collapse-rich cell; closest with a clean control: {closest['precision']} at "
               f"lr {closest['lr']:g} ({closest['baseline_collapsed']} of "
               f"{closest['baseline_seeds']} baseline seeds collapse)")
  elif table:
    verdict = "no collapse-rich cell: in every finished cell the fp32 control itself is not clean"
  else:
    verdict = f"no cell has finished runs ({steps} steps) yet"
  return {"cells": table, "chosen": chosen, "closest": closest, "verdict": verdict}


def pilot_report(workdirs: Sequence[str], out_dir: str, steps: int) -> str:
  """A markdown table of the pilot's runs (`read_run`) and the collapse-rich
  verdict over those that reached `steps` (`collapse_rich`), written to
  `pilot.md` and `pilot.json` in `out_dir`."""
  runs = [r for r in (read_run(w) for w in workdirs) if r is not None]
  fmt = lambda x, f="{:.3f}": "—" if x is None else f.format(x)
  lines = [
      "| run | steps | μ final / peak | μ collapse | π final / peak | π collapse | "
      "Stable μ / π | K3 | flip (pair / token) | length mean / max | cap hits mean / max |",
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in runs:
    lines.append(
        f"| {r['name']} | {r['steps']} | {fmt(r['mu_final'])} / {fmt(r['mu_peak'])} | "
        f"{r['mu_collapse'] or '—'} | {fmt(r['pi_final'])} / {fmt(r['pi_peak'])} | "
        f"{r['pi_collapse'] or '—'} | {r['mu_stable']} / {r['pi_stable']} | "
        f"{fmt(r['rollout_corr/k3_kl'], '{:.2e}')} | {fmt(r['moe/routing_flip_rate'])} / "
        f"{fmt(r['moe/token_flip_rate'])} | {fmt(r['rollout/response_length_mean'], '{:.1f}')}"
        f" / {fmt(r['length_max'], '{:.0f}')} | {fmt(r['cap_hit_mean'])} / "
        f"{fmt(r['cap_hit_max'])} |")
  rich = collapse_rich(runs, steps)
  lines += ["", f"Verdict ({steps}-step runs, the rule above): {rich['verdict']}."]
  text = "\n".join(lines)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "pilot.md"), "w") as f:
    f.write(text + "\n")
  with open(os.path.join(out_dir, "pilot.json"), "w") as f:
    json.dump({"runs": runs, "collapse_rich": rich}, f, indent=1)
  plot_pilot(workdirs, os.path.join(out_dir, "curves_pilot.png"))
  return text


# (metric, panel title, steps per point, "mean" or "max" over them, log scale): the
# precursors the LR-schedule source reads before a collapse (length, entropy,
# gradient spikes) beside the mismatch. The gradient norm is a 10-step max: a
# step whose groups all tie has no gradient (0), which a log-scale mean hides.
PILOT_PANELS = (
    ("eval/avg", "held-out pass@1 (μ solid, π dashed)", 1, "mean", False),
    ("rollout/response_length_mean", "response length (mean, 10 steps)", 10, "mean", False),
    ("rollout/truncated_fraction", "responses at the cap (10 steps)", 10, "mean", False),
    ("rollout_corr/k3_kl", "k3_kl sampler vs learner (10 steps)", 10, "mean", True),
    ("moe/routing_flip_rate", "routing decisions flipped (10 steps)", 10, "mean", False),
    ("actor/entropy", "policy entropy (10 steps)", 10, "mean", True),
    ("actor/grad_norm", "gradient norm (max of 10 steps)", 10, "max", True),
)


def _windowed(rows: Sequence[Mapping[str, float]], key: str, window: int, agg: str = "mean"):
  """Steps and values of `key` (finite, step > 0 unless an evaluation), each the
  mean (or max) of the last `window` logged values."""
  pts = [(r["step"], r[key]) for r in rows
         if key in r and math.isfinite(r[key]) and (r["step"] > 0 or key.startswith("eval"))]
  if len(pts) < window:
    return [], []
  views = np.lib.stride_tricks.sliding_window_view(np.array([p[1] for p in pts]), window)
  ys = views.max(axis=1) if agg == "max" else views.mean(axis=1)
  return [p[0] for p in pts][window - 1:], [float(y) for y in ys]


def plot_pilot(workdirs: Sequence[str], path: str) -> dict[str, int]:
  """The pilot's runs over steps, one colour per run, in `PILOT_PANELS`; written
  to `path` (PNG). Returns, per metric, how many runs it drew."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from mipu_jax.rl import run_report  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(2, 4, figsize=(18, 7.5))
  drawn = {panel[0]: 0 for panel in PILOT_PANELS}
  for i, workdir in enumerate(workdirs):
    path_m = os.path.join(workdir, "metrics.jsonl")
    if not (os.path.exists(path_m) or os.path.exists(path_m + ".gz")):
      continue
    rows = rl.read_jsonl(path_m)
    for ax, (metric, _, window, agg, _) in zip(axes.flat, PILOT_PANELS):
      xs, ys = _windowed(rows, metric, window, agg)
      if not xs:
        continue
      ax.plot(xs, ys, color=f"C{i}", label=os.path.basename(workdir),
              marker="o" if metric == "eval/avg" else None, markersize=2, linewidth=1)
      drawn[metric] += 1
      if metric == "eval/avg":
        xs, ys = _windowed(rows, "eval_pi/avg", 1)
        ax.plot(xs, ys, color=f"C{i}", linestyle="--", linewidth=1)
  for ax, (metric, title, _, _, log) in zip(axes.flat, PILOT_PANELS):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if log and drawn[metric]:
      ax.set_yscale("log")
    if not drawn[metric]:
      ax.text(0.5, 0.5, "not logged by these runs", ha="center", va="center",
              transform=ax.transAxes, color="gray")
  handles, labels = axes.flat[0].get_legend_handles_labels()
  axes.flat[-1].axis("off")
  axes.flat[-1].legend(handles, labels, loc="center", fontsize=10)
  run_report.save_figure(fig, path, "MoE pilot: fp32 control and uncorrected FP8 baseline")
  return drawn
