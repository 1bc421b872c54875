"""The reproduced tables as markdown and figures (curves over steps, MIPU's
post-update gap)."""

import os
from typing import Mapping, Optional, Sequence

import numpy as np

from mipu_jax import rl
from mipu_jax.harness import stats
from mipu_jax.harness.summary import COLLAPSE_DROP
from mipu_jax.harness.summary import RunSummary
from mipu_jax.harness.summary import STABLE_SES
from mipu_jax.rl import run_report
from studies.reproduce.spec import CLAIMS
from studies.reproduce.spec import ISOLATE_CLAIMS
from studies.reproduce.spec import LABELS
from studies.reproduce.spec import PRECISION_CLAIMS
from studies.reproduce.spec import PANELS
from studies.reproduce.spec import SOURCE_TABLES

# --- Table -----------------------------------------------------------------


def _row_cells(runs: Sequence[RunSummary], tiers: Sequence[str]) -> list[str]:
  """Per-tier means, Avg. mean [95% bootstrap CI] t [95% t CI], eval SE, peak Avg., Stable
  and collapsed seeds (k/n)."""
  def mean(key):
    return 100 * float(np.mean([r.final[key] for r in runs]))
  cells = [f"{mean(t):.2f}" for t in tiers]
  row = stats.row_stats(runs[0].row, [r.final["avg"] for r in runs],
                        [r.stable for r in runs],
                        [r.collapse_step is not None for r in runs])
  ci = (f" [{row.ci[0]:.2f}, {row.ci[1]:.2f}] t [{row.t_ci[0]:.2f}, {row.t_ci[1]:.2f}]"
        if len(runs) > 1 else "")
  cells.append(f"{row.mean:.2f}{ci}")
  cells.append(f"{100 * np.mean([r.final_se for r in runs]):.2f}")
  cells.append(f"{100 * np.mean([r.peak_avg for r in runs]):.2f}")
  n = len(runs)
  n_stable = sum(r.stable for r in runs)
  mark = "✔" if n_stable == n else "✘"
  cells.append(f"{mark} {n_stable}/{n}")
  cells.append(f"{sum(r.collapse_step is not None for r in runs)}/{n}")
  return cells


def _pi_cells(runs: Sequence[RunSummary]) -> list[str]:
  """π's final Avg. mean [95% bootstrap CI] and peak, over the seeds that
  evaluated π (all of them, or the cell says how many)."""
  pi = [r for r in runs if r.final_pi is not None]
  if not pi:
    return ["—", "—"]
  x = 100 * np.array([r.final_pi for r in pi])
  ci = stats.bootstrap_ci(x)
  cell = f"{x.mean():.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if x.size > 1 else "")
  if len(pi) < len(runs):
    cell += f" ({len(pi)}/{len(runs)} seeds)"
  return [cell, f"{100 * np.mean([r.peak_pi for r in pi]):.2f}"]


def per_seed_markdown(runs: Sequence[RunSummary]) -> str:
  """Final Avg. (%) of every run, one row per table row, one column per seed."""
  seeds = sorted({r.seed for r in runs})
  by = {(r.row, r.seed): r for r in runs}
  rows = list(dict.fromkeys(r.row for r in runs))
  lines = ["| Row | " + " | ".join(f"s{s}" for s in seeds) + " |",
           "|---" * (len(seeds) + 1) + "|"]
  for row in rows:
    cells = []
    for s in seeds:
      r = by.get((row, s))
      cells.append("—" if r is None else f"{100 * r.final['avg']:.1f}"
                   + ("" if r.stable else "*") + ("↓" if r.collapse_step else ""))
    lines.append(f"| {LABELS.get(row, row)} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def placement_markdown(runs: Sequence[RunSummary],
                       reference: Sequence[RunSummary]) -> str:
  """Where each run falls among the committed runs of the same row.

  The float sums of XLA:CPU depend on the host (its vector units, the
  thread count), and RL turns a difference in the sixth digit into another
  trajectory, so a user's seed 0 is one more draw from the row's
  distribution, not a copy of the committed seed 0. Per run: its final
  Avg., the committed seeds' min / median / max, and how many committed
  seeds it beats.
  """
  lines = ["| Row | seed | your final Avg. | committed: min / median / max (n) | "
           "committed seeds below yours | committed seed of the same number |",
           "|---|---|---|---|---|---|"]
  for r in runs:
    ref = [x for x in reference if x.row == r.row]
    if not ref:
      continue
    x = 100 * np.array([q.final["avg"] for q in ref])
    mine = 100 * r.final["avg"]
    same = [f"{100 * q.final['avg']:.1f}" for q in ref if q.seed == r.seed] or ["—"]
    lines.append(
        f"| {LABELS.get(r.row, r.row)} | {r.seed} | {mine:.1f} | {x.min():.1f} / "
        f"{np.median(x):.1f} / {x.max():.1f} ({x.size}) | {int((x < mine).sum())} of "
        f"{x.size} | {same[0]} |")
  return "\n".join(lines) if len(lines) > 2 else ""


def claims_markdown(runs: Sequence[RunSummary]) -> str:
  """One verdict line per claim of the sources whose two rows ran
  (`spec.CLAIMS`, paired by seed on final Avg.)."""
  finals: dict[str, dict[int, float]] = {}
  for r in runs:
    finals.setdefault(r.row, {})[r.seed] = r.final["avg"]
  lines = [c.line() for c in stats.claim_results(finals, CLAIMS)]
  isolate = stats.claim_results(finals, ISOLATE_CLAIMS)  # its own Holm family
  if isolate:
    lines += ["", "What LR-decay's gain is made of (a Holm family of its own):"]
    lines += [c.line() for c in isolate]
  precision = stats.claim_results(finals, PRECISION_CLAIMS)  # its own Holm family
  if precision:
    lines += ["", "Mismatch or precision, the bf16 rows (a Holm family of its own):"]
    lines += [c.line() for c in precision]
  return "\n".join(lines)


def compared(names: Sequence[str]) -> list[str]:
  """A table's rows beside its reference, the fp32 control: a table (and its
  curves) is shown only when one of these has a run."""
  return [n for n in names if n != "control"]


def _table(title: str, names: Sequence[str], by_row: Mapping[str, list],
           pending: Mapping[str, str], tiers: Sequence[str]) -> list[str]:
  head = ["Method", *tiers, "Avg. [95% CI]", "Eval SE", "Peak Avg.", "Stable",
          "Collapsed", "k3_kl", "Rollback rate"]
  # π's evaluation (eval.pi), when any run of the table logged it.
  with_pi = any(r.final_pi is not None for n in names for r in by_row.get(n, ()))
  if with_pi:
    head += ["π Avg. [95% CI]", "π Peak Avg."]
  lines = [f"### {title}", "", "| " + " | ".join(head) + " |",
           "|" + "---|" * len(head)]
  listed = []
  for name in names:
    rs = by_row.get(name)
    if rs:
      cells = _row_cells(rs, tiers)
      cells.append(f"{np.mean([r.k3_kl for r in rs]):.2e}")
      cells.append(f"{100 * np.mean([r.rollback_rate for r in rs]):.1f}%")
      if with_pi:
        cells += _pi_cells(rs)
    elif name in pending:
      cells = (["—"] * (len(tiers) + 3) + ["pending", "—", "—", "—"]
               + ["—"] * (2 * with_pi))
    else:
      continue
    lines.append(f"| {LABELS.get(name, name)} | " + " | ".join(cells) + " |")
    listed.append(name)
  return lines + [""] if compared(listed) else []  # none but the reference ran: no table


def tables_markdown(runs: Sequence[RunSummary], pending: Mapping[str, str],
                    tiers: Sequence[str], *,
                    tables: Sequence[tuple[str, str, Sequence[str]]] = SOURCE_TABLES,
                    skipped: Optional[Mapping[str, list]] = None,
                    why: str = "did not finish in the budget") -> str:
  """The tables (default: the sources' main, ablation, random rollback) as markdown;
  `skipped` rows' seeds are noted with `why` they are missing."""
  by_row: dict[str, list[RunSummary]] = {}
  for r in runs:
    by_row.setdefault(r.row, []).append(r)
  seeds = sorted({r.seed for r in runs})
  lines = [
      f"Pass@1 (%) at the last evaluation, mean over seeds {seeds} "
      f"(Avg.: mean over seeds, its {100 * stats.CI_LEVEL:.0f}% percentile-"
      f"bootstrap interval over seeds and, after t, its Student t interval). "
      f"Eval SE: standard error of one "
      f"evaluation's Avg. (sampling noise over the eval problems, mean over "
      f"seeds). Peak Avg.: best evaluation of the run (mean over seeds). "
      f"Stable: seeds whose last two evaluations are within {STABLE_SES:g} "
      "eval SEs of the best evaluation up to them (✔ when all are). Collapsed: seeds with an "
      f"evaluation more than {100 * COLLAPSE_DROP:.0f} points below the best "
      "before it. k3_kl: the mismatch over the last quarter of the steps. "
      "Rollback rate: MIPU Step 2 or random rollback."
      + (" π Avg.: the learner's policy π evaluated at full precision on the "
         "same problems with the same seeds (eval.pi); the other columns are "
         "the deployed sampler μ's." if any(r.final_pi is not None for r in runs)
         else ""), ""]
  for _, title, names in tables:
    lines += _table(title, names, by_row, pending, tiers)
  claims = claims_markdown(runs)
  if claims:
    lines += ["### The sources' claims, tested (paired by seed, final Avg.)", "",
              f"Exact sign-flip permutation test on the per-seed differences; "
              f"verdicts at {stats.ALPHA:g} on p adjusted by Holm's correction "
              "across the claims below (raw p beside it); 95% intervals of the "
              "mean difference: percentile bootstrap and Student t "
              "(`mipu_jax/harness/stats.py`).", "", claims, ""]
  if len(seeds) > 1:
    lines += ["### Final Avg. per seed", "",
              "(*: not Stable; ↓: collapsed)", "", per_seed_markdown(runs), ""]
  notes = sorted({f"{LABELS.get(r.row, r.row)}: {r.note}" for r in runs if r.note})
  notes += [f"{LABELS.get(k, k)}: pending — {v}" for k, v in sorted(pending.items())]
  notes += [f"{LABELS.get(k, k)}: seeds {v} {why}; not included"
            for k, v in sorted((skipped or {}).items()) if k not in pending]
  if notes:
    lines += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
  return "\n".join(lines)


# --- Figures ---------------------------------------------------------------


def _series(workdir: str, name: str) -> tuple[np.ndarray, np.ndarray]:
  rows = rl.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  pts = [(r["step"], r[name]) for r in rows if name in r]
  return np.array([p[0] for p in pts]), np.array([p[1] for p in pts])


def plot_curves(runs: Sequence[RunSummary], names: Sequence[str],
                path: str, title: str = "") -> Optional[str]:
  """Sources-style panels over steps, one line per row (mean over seeds,
  min-max band); returns the path, or None when no row has a run."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  names = [n for n in names if any(r.row == n for r in runs)]
  if not names:
    return None
  fig, axes = plt.subplots(2, 4, figsize=(17, 7.5))
  for ax, (metric, panel) in zip(axes.flat, PANELS):
    drawn = False
    for name in names:
      curves = [_series(r.workdir, metric) for r in runs if r.row == name]
      curves = [c for c in curves if len(c[0])]
      if not curves:
        continue
      n = min(len(c[0]) for c in curves)
      xs, ys = curves[0][0][:n], np.stack([c[1][:n] for c in curves])
      # One colour per row in every panel, whichever rows log the metric.
      color = f"C{names.index(name)}"
      ax.plot(xs, ys.mean(0), label=LABELS.get(name, name), color=color,
              marker="o" if n < 15 else None, markersize=3)
      drawn = True
      if metric == "eval/avg":  # π at full precision, where the runs logged it
        pi = [_series(r.workdir, "eval_pi/avg") for r in runs if r.row == name]
        pi = [c for c in pi if len(c[0])]
        if pi:
          m = min(len(c[0]) for c in pi)
          ax.plot(pi[0][0][:m], np.stack([c[1][:m] for c in pi]).mean(0),
                  color=color, linestyle="--", marker="x" if m < 15 else None,
                  markersize=3)
      if len(curves) > 1:
        ax.fill_between(xs, ys.min(0), ys.max(0), alpha=0.15, color=color)
    if not drawn:
      ax.text(0.5, 0.5, "not logged by these rows", ha="center", va="center",
              transform=ax.transAxes, color="gray")
    ax.set_title(panel, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  handles, labels = axes.flat[0].get_legend_handles_labels()
  axes.flat[-1].axis("off")
  axes.flat[-1].legend(handles, labels, loc="center", fontsize=11)
  return run_report.save_figure(fig, path, title)


def plot_gap(runs: Sequence[RunSummary], path: str) -> Optional[str]:
  """MIPU Step 2's statistic: the distribution of `T̂_post` and of `T̂_post / SE`
  per MIPU-gated row (all seeds pooled), with its margin and rejection rate.

  Returns the path, or None when no run logged `mipu/gap_post`.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  by_row: dict[str, list[dict[str, float]]] = {}
  for r in runs:
    if r.note.startswith("same run"):
      continue
    rows = [x for x in rl.read_jsonl(os.path.join(r.workdir, "metrics.jsonl"))
            if "mipu/gap_post" in x]
    if rows:
      by_row.setdefault(r.row, []).extend(rows)
  if not by_row:
    return None
  fig, axes = plt.subplots(1, 2, figsize=(12, 4))
  for i, (name, rows) in enumerate(by_row.items()):
    gap = np.array([x["mipu/gap_post"] for x in rows])
    se = np.array([x.get("mipu/gap_post_se", np.nan) for x in rows])
    c = np.array([x.get("mipu/c", np.nan) for x in rows])
    rejected = 1.0 - np.mean([x["mipu/accepted"] for x in rows])
    label = (f"{LABELS.get(name, name)}: {len(rows)} decisions, "
             f"{100 * rejected:.0f}% rejected, median c {np.nanmedian(c):.1e}")
    axes[0].hist(gap, bins=30, alpha=0.5, color=f"C{i}", label=label)
    axes[1].hist(gap / np.where(se > 0, se, np.nan), bins=30, alpha=0.5, color=f"C{i}")
  axes[0].axvline(0.0, color="k", lw=0.8)
  axes[0].set_title("T̂_post (accept iff T̂_post ≥ -c)", fontsize=10)
  axes[0].legend(fontsize=8)
  axes[1].axvline(0.0, color="k", lw=0.8)
  axes[1].set_title("T̂_post / SE(T̂_post) (SE over probe groups)", fontsize=10)
  return run_report.save_figure(fig, path, "MIPU Step 2: the post-update gap on the probes")


def plot_lr_decay(runs: Sequence[RunSummary], path: str) -> Optional[str]:
  """LR-decay against the baseline: the learning rate and the mean response
  length over steps, every seed (docs/method.md §6). None without both rows."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  rows = [n for n in ("baseline", "lr_decay") if any(r.row == n for r in runs)]
  if rows != ["baseline", "lr_decay"]:
    return None
  fig, axes = plt.subplots(1, 3, figsize=(16, 4))
  for i, name in enumerate(rows):
    for r in (r for r in runs if r.row == name):
      label = LABELS.get(name, name) if r.seed == min(
          x.seed for x in runs if x.row == name) else None
      for ax, metric in zip(axes, ("actor/lr", "rollout/response_length_mean",
                                   "eval/avg")):
        xs, ys = _series(r.workdir, metric)
        ax.plot(xs, ys, color=f"C{i}", alpha=0.7, label=label,
                marker="o" if metric == "eval/avg" else None, markersize=3)
  for ax, title in zip(axes, ("learning rate (actor/lr)", "mean response length",
                              "eval pass@1 (Avg of 5 tiers)")):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  axes[0].set_yscale("log")
  axes[0].legend(fontsize=9)
  return run_report.save_figure(fig, path, "LR-decay (period from the measured surge step) "
                            "vs the baseline, every seed")


def perturbation_markdown(original: Sequence[RunSummary],
                          perturbed: Sequence[RunSummary]) -> str:
  """Does a row's distribution survive a perturbation of the float sums?

  `perturbed` are the same rows and seeds rerun with every other setting
  equal except the perturbation (`model.init_perturb_ulps`, checked by the
  caller); RL turns the changed sums into other trajectories, so each seed is
  a new draw. Per row, over the seeds both have: each side's mean final Avg.
  with its t interval, the mean of the per-seed differences (perturbed −
  original) with its t interval and the two-sided exact sign-flip p, and each
  side's Stable count. Then the sources' claims on each side, restricted to
  those seeds: a conclusion survives when its verdict is the same on both.
  """
  by = lambda runs: {(r.row, r.seed): r for r in runs}
  a, b = by(original), by(perturbed)
  rows = [r for r in dict.fromkeys(r.row for r in perturbed)]
  lines = ["| Row | seeds | original Avg. [t 95%] | perturbed Avg. [t 95%] | "
           "perturbed − original [t 95%] | p (two-sided) | Stable (orig / pert) |",
           "|---|---|---|---|---|---|---|"]
  ci = lambda v, sign="": ("[—]" if not np.all(np.isfinite(stats.t_ci(v))) else
                           "[{0:{2}.1f}, {1:{2}.1f}]".format(*stats.t_ci(v), sign))
  for row in rows:
    seeds = sorted(s for (r, s) in b if r == row and (r, s) in a)
    if not seeds:
      continue
    x = 100 * np.array([a[(row, s)].final["avg"] for s in seeds])
    y = 100 * np.array([b[(row, s)].final["avg"] for s in seeds])
    d = y - x
    p = stats.sign_flip_p(d, "two-sided") if d.size else float("nan")
    st = lambda q: sum(q[(row, s)].stable for s in seeds)
    lines.append(
        f"| {LABELS.get(row, row)} | {len(seeds)} | {x.mean():.1f} {ci(x)} | "
        f"{y.mean():.1f} {ci(y)} | {d.mean():+.1f} {ci(d, '+')} | {p:.3g} | "
        f"{st(a)} / {st(b)} |")
  common = {s for (_, s) in b} & {s for (_, s) in a}
  keep = lambda runs: [r for r in runs if r.seed in common and r.row in rows]
  out = "\n".join(lines)
  claims_a, claims_b = claims_markdown(keep(original)), claims_markdown(keep(perturbed))
  if claims_b:
    out += ("\n\nThe claims on the original runs of these seeds:\n\n" + claims_a +
            "\n\nThe same claims on the perturbed runs:\n\n" + claims_b)
  return out
