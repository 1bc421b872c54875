"""Reproduce the sources' tables: table rows x seeds through the RL loop, then a table and figures.

    result = run_table(make_config, ROWS, seeds=(0, 1), workdir="results/small_cpu")
    print(result.markdown)

`make_config(row, seed, p)` returns the ConfigDict (or `TrainConfig`) of one
table row (`configs/table.py` for the small CPU task); `p` is the
random-rollback probability, set to the rejection rate that the MIPU row
measured with the same seed (docs/method.md §5), which is why seeds are the outer
loop and `mipu` runs before `random_rollback`. Each run goes through
`mipu_jax.rl.train`, the loop's public entry point, into
`workdir/runs/<row>_s<seed>/`; a run that finished before (a `summary.json`
next to its metrics) is read back instead of re-run, so an interrupted
reproduction resumes. Rows whose validated configs are identical (`tis` and
`step1`: Step 1 *is* token TIS, docs/method.md §5) run once and are reported under
both names. A row whose config cannot be built (the MIPU rows before
`config.mipu` exists) is reported as pending, with the reason.

Scores are the loop's periodic evaluation of the inference policy μ: pass@1
averaged over k samples on the five held-out tiers (`eval/<tier>`,
`eval/avg`), the stand-ins of MATH / AIME / Olympiad / Minerva / AMC23.

**Stable** (the sources' last column, whose criterion they do not publish),
fixed before any run: a run is stable when each of its last two evaluations
reaches its peak evaluation minus `STABLE_SES` (2) standard errors of that
peak evaluation (`eval/avg_se`: the sampling noise of pass@1 over the eval
problems, `mipu_jax.rl.evaluation`), and no metric went non-finite. A run
that peaks early and then falls back by more than its eval noise is not
stable. A row is stable when every seed is.

Like with like. Every row of a table must hold every setting equal except the
one it is about (the correction preset, the LR schedule, the MIPU switches):
`run_table` checks the rows' validated configs against each other
(`check_like_with_like`) before training anything, and a finished run is read
back only if its saved `config.json` equals the config the row asks for now
(`run_one` refuses otherwise: delete the run directory or fix the config).

Outputs in `workdir`: `table.md` (the tables asked for: by default the MIPU
main table, its ablation, and the random-rollback comparison, in the sources'
layout: tiers, Avg., Stable, plus the eval SE, `k3_kl` and the rollback rate),
`summary.json`, `curves_<table>.png` (reward, eval accuracy, `k3_kl`,
response length, gradient norm, learning rate, rollback rate over steps; mean
over seeds, min-max band) and, when a row ran MIPU Step 2, `gap_post.png`
(the distribution of `T̂_post` and of `T̂_post / SE`, with the rejection
rate).
"""

import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from mipu_jax import config as config_lib
from mipu_jax import rl
from mipu_jax.rl import report

# The one table of row names and their labels in the sources' tables
# (`configs/rows.py` builds one config per row).
LABELS = {
    "control": "No mismatch (fp32 sampler)", "baseline": "Baseline", "tis": "TIS", "mis": "MIS", "lr_decay": "LR-decay",
    "mipu": "Ours (MIPU)", "step1": "+ Step 1", "step2": "+ Step 2",
    "random_rollback": "Random rollback",
}
# What a row may change relative to the others (dotted config paths): the
# settings the tables compare. Everything else must be equal across rows; the
# no-mismatch control also changes the sampler's precision.
ROW_FIELDS = ("loss.correction", "optim.schedule", "optim.length_surge",
              "mipu.step2", "mipu.random_rollback_p")
PRECISION_FIELDS = ("sampling.dtype", "sampling.weight_quant", "sampling.act_quant",
                    "sampling.kv_cache_dtype", "sampling.quant_lm_head")
_ROW_EXTRA_FIELDS = {"control": PRECISION_FIELDS}
# The sources' tables: MIPU's main table (plus TIS), its ablation, and the
# "Step 2 is not random rollback" comparison.
MAIN_ROWS = ("control", "baseline", "tis", "mis", "lr_decay", "mipu")
ABLATION_ROWS = ("baseline", "step1", "step2", "mipu")
ROLLBACK_ROWS = ("mipu", "random_rollback", "step2")
# The main job's side-by-side comparison (`experiments/compare.py`).
COMPARE_ROWS = ("control", "baseline", "tis", "mipu")
# (file key, title, rows) of each table; each gets `curves_<key>.png`.
SOURCE_TABLES = (
    ("main", "Main results (MIPU table, + TIS)", MAIN_ROWS),
    ("ablation", "Ablation (Step 1 and Step 2)", ABLATION_ROWS),
    ("rollback", "Step 2 is not random rollback", ROLLBACK_ROWS),
)
COMPARE_TABLES = (
    ("compare", "Side by side under a high-mismatch sampler", COMPARE_ROWS),)
PANELS = (
    ("rollout/reward_mean", "training reward"),
    ("eval/avg", "eval pass@1 (Avg of 5 tiers)"),
    ("rollout_corr/k3_kl", "k3_kl (sampler vs learner)"),
    ("rollout/response_length_mean", "response length"),
    ("actor/grad_norm", "grad norm"),
    ("actor/lr", "learning rate"),
    ("mipu/rollback_rate", "rollback rate"),
)
STABLE_SES = 2.0

MakeConfig = Callable[[str, int, Optional[float]], Any]


@dataclasses.dataclass(frozen=True)
class RunSummary:
  """One (row, seed) run, reduced to what the tables need.

  Attributes:
    row: table row name.
    seed: run seed.
    workdir: the run's directory (or the one it shares with a twin row).
    final: `{tier: pass@1, "avg": ...}` at the last evaluation.
    final_se: standard error of the last evaluation's Avg.
    peak_avg: best eval Avg over all evaluations (step 0 included).
    peak_step: step of `peak_avg`.
    peak_se: standard error of the peak evaluation's Avg.
    stable: the criterion in the module docstring.
    rollback_rate: the run's final `mipu/rollback_rate` (0 without MIPU).
    k3_kl: mean `rollout_corr/k3_kl` over the last quarter of the steps.
    seconds: wall time of the run.
    note: e.g. "same run as tis" for a deduplicated row.
  """
  row: str
  seed: int
  workdir: str
  final: Mapping[str, float]
  final_se: float
  peak_avg: float
  peak_step: int
  peak_se: float
  stable: bool
  rollback_rate: float
  k3_kl: float
  seconds: float
  note: str = ""


@dataclasses.dataclass
class TableResult:
  """What `run_table` returns: per-run summaries, pending rows, outputs."""
  runs: list[RunSummary]
  pending: dict[str, str]
  markdown: str
  files: dict[str, str]


def summarize(rows: Sequence[Mapping[str, float]], tiers: Sequence[str], *,
              num_ses: float = STABLE_SES) -> dict[str, Any]:
  """Final / peak eval and the Stable flag of one run's logged rows.

  Stable: each of the last two evaluations after step 0's is ≥ peak −
  `num_ses` × the peak evaluation's standard error, and every logged value is
  finite.
  """
  evals = [r for r in rows if "eval/avg" in r]
  if not evals:
    raise ValueError("the run has no evaluation rows (eval/avg).")
  if any("eval/avg_se" not in r for r in evals):
    raise ValueError("the run's evaluations carry no eval/avg_se (a run from "
                     "before standard errors were logged): re-run it.")
  last = evals[-1]
  peak = max(evals, key=lambda r: r["eval/avg"])
  floor = peak["eval/avg"] - num_ses * peak["eval/avg_se"]
  finite = all(math.isfinite(v) for r in rows for v in r.values())
  tail = evals[1:][-2:] or evals[-1:]  # the last two after step 0's
  held = all(r["eval/avg"] >= floor for r in tail)
  rate = [r["mipu/rollback_rate"] for r in rows if "mipu/rollback_rate" in r]
  k3 = [r["rollout_corr/k3_kl"] for r in rows if "rollout_corr/k3_kl" in r]
  return dict(
      final={**{t: last[f"eval/{t}"] for t in tiers}, "avg": last["eval/avg"]},
      final_se=float(last["eval/avg_se"]),
      peak_avg=peak["eval/avg"], peak_step=int(peak["step"]),
      peak_se=float(peak["eval/avg_se"]),
      stable=bool(finite and held),
      rollback_rate=float(rate[-1]) if rate else 0.0,
      k3_kl=float(np.mean(k3[-max(len(k3) // 4, 1):])) if k3 else 0.0)


def check_like_with_like(configs: Mapping[str, config_lib.TrainConfig]) -> None:
  """Raises unless every two rows differ only in what their rows compare.

  Two rows may differ in `ROW_FIELDS`, and in the sampler precision when one
  of them is the no-mismatch `control`.

  Args:
    configs: row name -> validated config, all of one seed.

  Raises:
    ValueError: naming the rows and the settings that differ.
  """
  names = list(configs)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      allowed = (ROW_FIELDS + _ROW_EXTRA_FIELDS.get(a, ())
                 + _ROW_EXTRA_FIELDS.get(b, ()))
      diff = config_lib.config_diff(configs[a], configs[b])
      diff = {k: v for k, v in diff.items() if not k.startswith(allowed)}
      if diff:
        raise ValueError(
            f"rows {a!r} and {b!r} differ in more than the compared setting: "
            f"{diff}. A table compares like with like; make every other setting "
            "equal.")


def enable_compilation_cache(path: Optional[str], workdir: str = "") -> None:
  """JAX's persistent compilation cache at `path`: runs of a row share compiles.

  Each run builds a new learner whose jitted step would otherwise recompile;
  with the cache, seeds of a row (and rows with the same learner program)
  compile once. Call before the first compilation.

  Args:
    path: the cache directory; None for `workdir/.jax_cache`, "" for no cache.
    workdir: the job's output directory.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if path is None:
    path = os.path.join(workdir, ".jax_cache")
  if not path:
    return
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _as_train_config(cfg) -> config_lib.TrainConfig:
  if isinstance(cfg, config_lib.TrainConfig):
    return cfg
  return config_lib.from_config_dict(cfg)


def run_one(cfg: config_lib.TrainConfig, row: str, seed: int, workdir: str,
             log: Callable[[str], None],
             train: bool = True) -> Optional[RunSummary]:
  """Trains one run (or reads back a finished one) and summarises it.

  Returns None for an unfinished run when `train` is False.

  Raises:
    ValueError: a finished run whose saved config differs from `cfg`.
  """
  done = os.path.join(workdir, "summary.json")
  if os.path.exists(done):
    with open(os.path.join(workdir, "config.json")) as f:
      saved = json.load(f)
    diff = config_lib.config_diff(cfg, saved)
    if diff:
      raise ValueError(
          f"{workdir} holds a finished run of another config (differences, "
          f"(wanted, saved): {diff}); delete it or restore the config.")
    with open(done) as f:
      seconds = float(json.load(f)["seconds"])
    log(f"[reproduce] {row} seed {seed}: finished before, read back")
    # Summarised again from its metrics, so a summary always follows the
    # current criterion.
    rows = rl.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    return RunSummary(row=row, seed=seed, workdir=workdir, seconds=seconds,
                      **summarize(rows, cfg.eval.tiers))
  if not train:
    return None
  log(f"[reproduce] {row} seed {seed}: training {cfg.num_steps} steps -> {workdir}")
  # An unfinished earlier attempt resumes from its newest checkpoint (the loop
  # checks its config and repairs its log: docs/reliability.md).
  start = time.perf_counter()
  result = rl.train(cfg, workdir)
  seconds = time.perf_counter() - start
  s = RunSummary(row=row, seed=seed, workdir=workdir, seconds=seconds,
                 **summarize(result.rows, cfg.eval.tiers))
  with open(done, "w") as f:
    json.dump(dataclasses.asdict(s), f, indent=2)
  log(f"[reproduce] {row} seed {seed}: Avg {s.final['avg']:.3f} (peak "
      f"{s.peak_avg:.3f} ± {s.peak_se:.3f} @ {s.peak_step}), stable={s.stable}, "
      f"rollback {s.rollback_rate:.2f}, {seconds:.0f} s")
  return s


def _order(rows: Sequence[str]) -> list[str]:
  """`mipu` before `random_rollback`, which needs its measured rate."""
  rows = list(dict.fromkeys(rows))
  if "mipu" in rows and "random_rollback" in rows:
    rows.remove("mipu")
    rows.insert(rows.index("random_rollback"), "mipu")
  return rows


def run_table(make_config: MakeConfig, rows: Sequence[str],
              seeds: Sequence[int], workdir: str, *,
              tables: Sequence[tuple[str, str, Sequence[str]]] = SOURCE_TABLES,
              log: Callable[[str], None] = print,
              train: bool = True) -> TableResult:
  """Runs `rows` x `seeds`, writes the tables and figures into `workdir`.

  Args:
    make_config: `(row, seed, p) -> ConfigDict | TrainConfig`; `p` is None
      except for `random_rollback` (see module docstring).
    rows: table rows (`configs/rows.py` names).
    seeds: seeds; the outer loop, so the first seed's table is complete first.
    workdir: output directory.
    tables: `(key, title, rows)` of the tables to write (`SOURCE_TABLES`, the
      sources' three; `COMPARE_TABLES`, the main job's), each with its figure
      `curves_<key>.png`.
    log: progress sink.
    train: False to only tabulate runs that finished before (a budget cut
      short: unfinished runs are left out and their seeds listed in the
      notes).

  Returns:
    A `TableResult`.

  Raises:
    ValueError: rows that differ in more than their compared setting
      (`check_like_with_like`), or a finished run of another config.
  """
  os.makedirs(workdir, exist_ok=True)
  runs, skipped, tiers = [], {}, None
  for seed in seeds:
    seen: dict[config_lib.TrainConfig, RunSummary] = {}
    built: dict[str, config_lib.TrainConfig] = {}
    for row in _order(rows):
      p = None
      if row == "random_rollback":
        mipu = [r for r in runs if r.row == "mipu" and r.seed == seed]
        if not mipu:
          raise ValueError("the random_rollback row needs the mipu row (its p "
                           "is MIPU's measured rejection rate): add it to rows.")
        p = mipu[0].rollback_rate
      if p == 0.0:  # MIPU rejected nothing: random rollback is Step 1.
        cfg = _as_train_config(make_config("step1", seed, None))
      else:
        cfg = _as_train_config(make_config(row, seed, p))
      built[row] = cfg
      check_like_with_like(built)
      tiers = cfg.eval.tiers
      if cfg in seen:
        twin = seen[cfg]
        runs.append(dataclasses.replace(twin, row=row,
                                        note=f"same run as {twin.row}"))
        log(f"[reproduce] {row} seed {seed}: identical config to {twin.row}, reused")
        continue
      s = run_one(cfg, row, seed, os.path.join(workdir, "runs", f"{row}_s{seed}"),
                   log, train)
      if s is None:
        skipped.setdefault(row, []).append(seed)
        continue
      if p is not None:
        s = dataclasses.replace(s, note=f"p = {p:.3f} (MIPU's rejection rate)")
      seen[cfg] = s
      runs.append(s)
  pending = {row: f"not run (seeds {missing} did not finish in the budget)"
             for row, missing in skipped.items()
             if not any(r.row == row for r in runs)}
  markdown = tables_markdown(runs, pending, tiers or (), tables=tables,
                             skipped=skipped)
  files = {"table": os.path.join(workdir, "table.md"),
           "summary": os.path.join(workdir, "summary.json")}
  with open(files["table"], "w") as f:
    f.write(markdown)
  with open(files["summary"], "w") as f:
    json.dump({"runs": [dataclasses.asdict(r) for r in runs], "pending": pending,
               "stable_ses": STABLE_SES, "seeds": list(seeds)}, f, indent=2)
  seeds_run = sorted({r.seed for r in runs})
  for key, title, group in tables:
    path = plot_curves(runs, [r for r in group if r in rows],
                       os.path.join(workdir, f"curves_{key}.png"),
                       title=f"{title}: mean over seeds {seeds_run} (band: min-max)")
    if path:
      files[f"curves_{key}"] = path
  path = plot_gap(runs, os.path.join(workdir, "gap_post.png"))
  if path:
    files["gap_post"] = path
  return TableResult(runs=runs, pending=pending, markdown=markdown, files=files)


# --- Table -----------------------------------------------------------------


def _row_cells(runs: Sequence[RunSummary], tiers: Sequence[str]) -> list[str]:
  """Per-tier means, Avg mean ± sd over seeds, eval SE, peak Avg, Stable (%)."""
  def mean(key):
    return 100 * float(np.mean([r.final[key] for r in runs]))
  cells = [f"{mean(t):.2f}" for t in tiers]
  avgs = 100 * np.array([r.final["avg"] for r in runs])
  sd = f" ± {avgs.std(ddof=1):.2f}" if len(runs) > 1 else ""
  cells.append(f"{avgs.mean():.2f}{sd}")
  cells.append(f"{100 * np.mean([r.final_se for r in runs]):.2f}")
  cells.append(f"{100 * np.mean([r.peak_avg for r in runs]):.2f}")
  n_stable = sum(r.stable for r in runs)
  mark = "✔" if n_stable == len(runs) else "✘"
  cells.append(mark if n_stable in (0, len(runs)) else f"{mark} ({n_stable}/{len(runs)})")
  return cells


def _table(title: str, names: Sequence[str], by_row: Mapping[str, list],
           pending: Mapping[str, str], tiers: Sequence[str]) -> list[str]:
  head = ["Method", *tiers, "Avg.", "Eval SE", "Peak Avg.", "Stable", "k3_kl",
          "Rollback rate"]
  lines = [f"### {title}", "", "| " + " | ".join(head) + " |",
           "|" + "---|" * len(head)]
  for name in names:
    rs = by_row.get(name)
    if rs:
      cells = _row_cells(rs, tiers)
      cells.append(f"{np.mean([r.k3_kl for r in rs]):.2e}")
      cells.append(f"{100 * np.mean([r.rollback_rate for r in rs]):.1f}%")
    elif name in pending:
      cells = ["—"] * (len(tiers) + 3) + ["pending", "—", "—"]
    else:
      continue
    lines.append(f"| {LABELS.get(name, name)} | " + " | ".join(cells) + " |")
  return lines + [""]


def tables_markdown(runs: Sequence[RunSummary], pending: Mapping[str, str],
                    tiers: Sequence[str], *,
                    tables: Sequence[tuple[str, str, Sequence[str]]] = SOURCE_TABLES,
                    skipped: Optional[Mapping[str, list]] = None) -> str:
  """The tables (default: the sources' main, ablation, random rollback) as markdown."""
  by_row: dict[str, list[RunSummary]] = {}
  for r in runs:
    by_row.setdefault(r.row, []).append(r)
  seeds = sorted({r.seed for r in runs})
  lines = [
      f"Pass@1 (%) at the last evaluation, mean over seeds {seeds} "
      f"(Avg.: mean ± sd over seeds). Eval SE: standard error of one "
      f"evaluation's Avg. (sampling noise over the eval problems, mean over "
      f"seeds). Peak Avg.: best evaluation of the run (mean over seeds). "
      f"Stable: the last two evaluations within {STABLE_SES:g} eval SEs of the "
      "run's peak, for every seed (✘ (k/n): k of n seeds stable). k3_kl: the "
      "mismatch over the last quarter of the steps. Rollback rate: MIPU Step 2 "
      "or random rollback.", ""]
  for _, title, names in tables:
    lines += _table(title, names, by_row, pending, tiers)
  notes = sorted({f"{LABELS.get(r.row, r.row)}: {r.note}" for r in runs if r.note})
  notes += [f"{LABELS.get(k, k)}: pending — {v}" for k, v in sorted(pending.items())]
  notes += [f"{LABELS.get(k, k)}: seeds {v} did not finish in the budget; not included"
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
  return report.save_figure(fig, path, title)


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
  return report.save_figure(fig, path, "MIPU Step 2: the post-update gap on the probes")
