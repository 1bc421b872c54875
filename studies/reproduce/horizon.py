"""The long-horizon study: does mismatch make RL degrade or collapse late, at a
sound lr? Its statistics and criteria, fixed before its runs.

Settings are sampler precisions at the tables' setting (tiers 4-5, the lr of
`choose_lr`) run for `STEPS` RL steps: `fp32` (the no-mismatch control),
`int4_all` (the tables' uncorrected baseline) and a higher-mismatch sampler
(`STRONG`, chosen by `choose_strong`). Per run, from its evaluations of μ
(every 20 steps):

- final: the last evaluation's Avg.; at120: the evaluation at step 120, the
  tables' horizon.
- smoothed: the mean of three consecutive evaluations (60 steps), which damps
  the evaluation's sampling noise; peak3 is its maximum over the run (window
  end = peak step), final3 the last window.
- late degradation D = peak3 - final3 (>= 0). Its noise, for a flat run, is
  that of a difference of two 3-evaluation means, sigma_D = sqrt(2/3) * SE
  (SE: the run's mean `eval/avg_se`), plus the upward bias of a maximum over
  windows; **Degraded**: D > `DEGRADE_SIGMAS` (3) sigma_D.
- **Collapsed**: final3 < peak3 - `spec.COLLAPSE_DROP` (15 points): a fall the
  run has not recovered from at its end (`spec.collapse_step`, the first
  evaluation 15 points below the best so far, is reported as where a fall
  began, recovered or not, on μ's evaluations and on π's).
- **Stable** (600-step reading): every logged value finite and not Degraded.
  The tables' rule (last two evaluations within 2 SE of the best so far) reads
  a long plateau as unstable: the best of 30 noisy evaluations sits about 2 SE
  above the plateau's mean by chance.

Claims (`HORIZON_CLAIMS`, one Holm family; paired by seed, exact sign-flip,
`stats.claim_results`), on D, the final Avg. and the growth of the mismatch
cost from step 120 to the end. Remedies are run only where a sampler degrades
late against the control by a supported claim whose t interval excludes 0
(`degraded_setting`); their claims (`REMEDY_CLAIMS`, a family of their own)
are fixed here too.
"""

import dataclasses
import json
import math
import os
from typing import Mapping, Optional, Sequence

import numpy as np

from mipu_jax import rl
from mipu_jax.harness import stats
from mipu_jax.harness.summary import COLLAPSE_DROP
from mipu_jax.harness.summary import collapse_step
from mipu_jax.harness.summary import RunSummary
from studies.reproduce import report as report_lib

STEPS = 600
LRS = (1e-4, 2e-4)  # the lr grid's lower edge and the tables' lr
CONTROL, BASELINE = "fp32", "int4_all"
# The higher-mismatch sampler, by `choose_strong` over `STRONG_CANDIDATES`
# (experiments/horizon.py --probe; results/horizon/probe.txt): 3-bit weights, FP8
# activations and KV cache, quantized head.
STRONG = "int3_all"
STRONG_CANDIDATES = ("int4_all", "int4_e5m2_all", "int3_all", "int3_e5m2_all")
STRONG_TARGET = 3.0  # wanted step-1 k3_kl ratio of the strong sampler to int4_all
SETTINGS = (CONTROL, BASELINE, STRONG)
WINDOW = 3  # evaluations per smoothed point
DEGRADE_SIGMAS = 3.0
K3_STEPS = (100, 300, 600)
K3_SPAN = 20  # steps averaged for k3 at a step: (step - K3_SPAN, step]

HORIZON_CLAIMS = tuple(
    c for s in (BASELINE, STRONG) for c in (
        stats.Claim(f"D:{s}", f"D:{CONTROL}", "greater",
                    f"{s} degrades late more than {CONTROL} (D = peak3 − final3)"),
        stats.Claim(f"final:{CONTROL}", f"final:{s}", "greater",
                    f"mismatch costs final Avg. at the last step ({CONTROL} > {s})"),
        stats.Claim(f"final:{CONTROL}", f"final:{s}", "greater",
                    f"the cost of mismatch ({CONTROL} − {s}) grows from step 120 to the end",
                    minus=(f"at120:{CONTROL}", f"at120:{s}")),
    ))
# Rows of the remedies' study at the degraded setting (studies/configs/rows.py names).
REMEDY_ROWS = ("baseline", "tis", "mis", "lr_decay", "mipu", "random_rollback")
REMEDY_CLAIMS = (
    stats.Claim("final:mipu", "final:baseline", "greater", "MIPU > baseline (final)"),
    stats.Claim("final:mipu", "final:tis", "greater", "MIPU > TIS (final)"),
    stats.Claim("final:mipu", "final:mis", "greater", "MIPU > MIS (final)"),
    stats.Claim("final:mipu", "final:lr_decay", "greater", "MIPU > LR-decay (final)"),
    stats.Claim("D:mipu", "D:baseline", "less", "MIPU degrades late less than the baseline"),
    stats.Claim("final:lr_decay", "final:baseline", "greater", "LR-decay > baseline (final)"),
    stats.Claim("final:tis", "final:baseline", "greater", "TIS (Step 1) > baseline (final)"),
    stats.Claim("final:mipu", "final:random_rollback", "two-sided",
                "Step 2 ≠ random rollback at MIPU's rate (final)"),
)


@dataclasses.dataclass(frozen=True)
class LongRun:
  """One long run reduced to the study's measures (Avg. as fractions)."""
  name: str  # setting or row
  seed: int
  workdir: str
  steps: tuple[int, ...]  # evaluation steps
  avg: tuple[float, ...]  # μ's eval Avg. at them
  final: float
  at120: float
  peak: float
  peak_step: int
  peak3: float
  peak3_step: int
  final3: float
  late_drop: float  # D
  sigma_d: float
  degraded: bool
  collapsed: bool
  dip_step: Optional[int]
  stable: bool
  k3: Mapping[int, float]
  final_pi: Optional[float]
  dip_step_pi: Optional[int] = None  # `collapse_step` of π's evaluations


def long_run(name: str, seed: int, workdir: str, rows: Sequence[Mapping[str, float]],
             *, steps: int = STEPS) -> LongRun:
  """The measures of the module docstring from one run's logged rows."""
  evals = [r for r in rows if "eval/avg" in r]
  if len(evals) < WINDOW + 1:
    raise ValueError(f"{workdir}: {len(evals)} evaluations; the measures need {WINDOW + 1}.")
  st = np.array([int(r["step"]) for r in evals])
  avg = np.array([r["eval/avg"] for r in evals], np.float64)
  se = float(np.mean([r["eval/avg_se"] for r in evals]))
  sm = np.convolve(avg, np.ones(WINDOW) / WINDOW, mode="valid")  # sm[i]: evals i..i+W-1
  sm = sm[1:]  # windows after step 0's evaluation only
  i = int(np.argmax(sm))
  peak3, final3 = float(sm[i]), float(sm[-1])
  sigma_d = math.sqrt(2.0 / WINDOW) * se
  late_drop = peak3 - final3
  degraded = late_drop > DEGRADE_SIGMAS * sigma_d
  finite = all(math.isfinite(v) for r in rows for v in r.values())
  k3 = {}
  for s in K3_STEPS:
    v = [r["rollout_corr/k3_kl"] for r in rows
         if "rollout_corr/k3_kl" in r and s - K3_SPAN < r["step"] <= s]
    if v and s <= steps:
      k3[s] = float(np.mean(v))
  at = {int(s): float(a) for s, a in zip(st, avg)}
  j = int(np.argmax(avg))
  return LongRun(
      name=name, seed=seed, workdir=workdir, steps=tuple(int(s) for s in st),
      avg=tuple(float(a) for a in avg), final=float(avg[-1]), at120=at.get(120, math.nan),
      peak=float(avg[j]), peak_step=int(st[j]), peak3=peak3,
      peak3_step=int(st[i + WINDOW]), final3=final3, late_drop=late_drop, sigma_d=sigma_d,
      degraded=bool(degraded), collapsed=bool(final3 < peak3 - COLLAPSE_DROP),
      dip_step=collapse_step(rows), stable=bool(finite and not degraded), k3=k3,
      final_pi=float(evals[-1]["eval_pi/avg"]) if "eval_pi/avg" in evals[-1] else None,
      dip_step_pi=collapse_step([{"step": r["step"], "eval/avg": r["eval_pi/avg"]}
                                 for r in evals if "eval_pi/avg" in r]))


def read_run(name: str, seed: int, workdir: str, *, steps: int = STEPS) -> Optional[LongRun]:
  """A finished run (its `summary.json` written) as a `LongRun`, else None."""
  if not os.path.exists(os.path.join(workdir, "summary.json")):
    return None
  return long_run(name, seed, workdir, rl.read_jsonl(os.path.join(workdir, "metrics.jsonl")),
                  steps=steps)


def prefix_difference(long_rows: Sequence[Mapping[str, float]],
                      short_rows: Sequence[Mapping[str, float]]) -> float:
  """The largest |difference| of any logged value (timings aside) over the
  steps of `short_rows`: 0.0 when a long run repeats the shorter run of the
  same config bitwise before going on (the same code, seed and constant lr)."""
  short = {int(r["step"]): r for r in short_rows}
  worst = 0.0
  for r in long_rows:
    other = short.get(int(r["step"]))
    if other is None:
      continue
    for k, v in r.items():
      if k.startswith("perf/") or k not in other:
        continue
      a, b = float(v), float(other[k])
      if a != b and not (math.isnan(a) and math.isnan(b)):
        worst = max(worst, abs(a - b) if math.isfinite(a - b) else math.inf)
  return worst


def choose_lr(fp32_final_by_lr: Mapping[float, Sequence[float]]) -> float:
  """The long runs' lr: the one of `LRS` where the fp32 control's mean final
  Avg. (120 steps, ten seeds) is highest."""
  means = {lr: float(np.mean(v)) for lr, v in fp32_final_by_lr.items() if lr in LRS and v}
  if set(means) != set(LRS):
    raise ValueError(f"choose_lr needs fp32 runs at every lr of {LRS}; has {sorted(means)}.")
  return max(means, key=means.get)


def choose_strong(k3_step1: Mapping[str, Sequence[float]]) -> tuple[str, float]:
  """The candidate with the largest mean step-1 `k3_kl` and its ratio to int4_all's."""
  means = {k: float(np.mean(v)) for k, v in k3_step1.items()}
  best = max(means, key=means.get)
  return best, means[best] / means[BASELINE]


def values(runs: Sequence[LongRun]) -> dict[str, dict[int, float]]:
  """`stats.claim_results`' input: "D:<name>", "final:<name>", "at120:<name>"
  -> seed -> value (fractions)."""
  out: dict[str, dict[int, float]] = {}
  for r in runs:
    for key, v in (("D", r.late_drop), ("final", r.final), ("at120", r.at120)):
      out.setdefault(f"{key}:{r.name}", {})[r.seed] = v
  return out


def degraded_setting(results: Sequence[stats.ClaimResult]) -> Optional[str]:
  """The sampler whose late degradation against the control is supported with a
  t interval above 0 (the larger mean difference if both), else None."""
  hits = [r for r in results if r.claim.a.startswith("D:") and r.verdict == "supported"
          and r.diff_t_ci[0] > 0]
  return max(hits, key=lambda r: r.mean_diff).claim.a[2:] if hits else None


def _mean(xs: Sequence[float]) -> Optional[float]:
  xs = [x for x in xs if math.isfinite(x)]
  return float(np.mean(xs)) if xs else None


def _fmt(x: Optional[float], scale: float = 100, spec: str = ".1f") -> str:
  return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(
      scale * x, spec)


def markdown(runs: Sequence[LongRun], names: Sequence[str],
             claims: Sequence[stats.Claim] = HORIZON_CLAIMS) -> tuple[str, list]:
  """The study's table, its claims with raw and Holm p, and the stated answers."""
  head = ("| setting | seeds | final Avg. [t 95% CI] | Avg. at 120 | peak (step) | "
          "peak3 − final3 = D | Degraded | Collapsed | Stable | k3 @ "
          + " / ".join(str(s) for s in K3_STEPS) + " | π − μ |")
  lines = [head, "|---" * 11 + "|"]
  for name in names:
    rs = sorted((r for r in runs if r.name == name), key=lambda r: r.seed)
    if not rs:
      lines.append(f"| {name} | 0 | not run yet |" + " |" * 8)
      continue
    f = np.array([r.final for r in rs])
    lo, hi = stats.t_ci(100 * f)
    pi = [r.final_pi - r.final for r in rs if r.final_pi is not None]
    k3 = " / ".join(_fmt(float(np.mean([r.k3[s] for r in rs if s in r.k3])), 1, ".1e")
                    if any(s in r.k3 for r in rs) else "—" for s in K3_STEPS)
    lines.append(
        f"| {name} | {len(rs)} | {100 * f.mean():.1f} [{lo:.1f}, {hi:.1f}] | "
        f"{_fmt(_mean([r.at120 for r in rs]))} | "
        f"{_fmt(float(np.mean([r.peak for r in rs])))} "
        f"({int(np.median([r.peak_step for r in rs]))}) | "
        f"{_fmt(float(np.mean([r.late_drop for r in rs])))} | "
        f"{sum(r.degraded for r in rs)}/{len(rs)} | {sum(r.collapsed for r in rs)}/{len(rs)} | "
        f"{sum(r.stable for r in rs)}/{len(rs)} | {k3} | "
        f"{_fmt(float(np.mean(pi))) if pi else '—'} |")
  lines += ["", falls(runs, names)]
  results = stats.claim_results(values(runs), claims)
  lines += ["", "Claims (paired by seed, exact sign-flip, Holm across the family; "
            "points of pass@1):", ""]
  lines += [r.line() for r in results] or ["- no claim has both rows yet"]
  if claims is HORIZON_CLAIMS and results:
    lines += ["", remedies_decision(results)]
  return "\n".join(lines), results


def falls(runs: Sequence[LongRun], names: Sequence[str]) -> str:
  """Where each fall began (`collapse_step`), on μ and on π, by setting and seed."""
  parts = []
  for side, attr in (("μ", "dip_step"), ("π", "dip_step_pi")):
    hits = [f"{r.name} seed {r.seed} at {getattr(r, attr)}"
            for name in names for r in sorted(runs, key=lambda r: r.seed)
            if r.name == name and getattr(r, attr) is not None]
    parts.append(f"{side}: " + (", ".join(hits) if hits else "none"))
  return (f"Falls (`collapse_step`: the first evaluation more than "
          f"{100 * COLLAPSE_DROP:g} points below the best so far, recovered or not): "
          + "; ".join(parts) + ".")


def remedies_decision(results: Sequence[stats.ClaimResult]) -> str:
  """Whether and where the remedies run (`degraded_setting`), with the D claims it read."""
  setting = degraded_setting(results)
  d = "; ".join(f"{r.claim.a[2:]}: {r.verdict.split(' (')[0]}, t [{r.diff_t_ci[0]:+.2f}, "
                f"{r.diff_t_ci[1]:+.2f}]" for r in results if r.claim.a.startswith("D:"))
  if setting:
    return (f"**Remedies run at {setting}**: its late degradation is supported, t interval "
            f"above 0 ({d}).")
  return ("**Remedies not run**: no sampler's late degradation against the control is supported "
          f"with a t interval above 0, the rule fixed before the runs ({d}).")


def report(runs: Sequence[LongRun], names: Sequence[str], workdir: str, *,
           claims: Sequence[stats.Claim] = HORIZON_CLAIMS, key: str = "horizon") -> dict:
  """Writes `<key>.md`, `<key>.json` and `curves_<key>.png` into `workdir`."""
  text, results = markdown(runs, names, claims)
  files = {"table": os.path.join(workdir, f"{key}.md"),
           "summary": os.path.join(workdir, f"{key}.json")}
  with open(files["table"], "w") as f:
    f.write(text + "\n")
  with open(files["summary"], "w") as f:
    json.dump({"runs": [dataclasses.asdict(r) for r in runs],
               "claims": [{"text": r.claim.text, "seeds": r.seeds, "mean_diff": r.mean_diff,
                           "diff_t_ci": r.diff_t_ci, "p": r.p, "p_holm": r.p_holm,
                           "verdict": r.verdict} for r in results],
               "degraded_setting": degraded_setting(results)}, f, indent=2, default=str)
  # The tables' curve panels (mean over seeds, min-max band) over the long runs.
  as_summary = [RunSummary(row=r.name, seed=r.seed, workdir=r.workdir, final={"avg": r.final},
                           final_se=0.0, peak_avg=r.peak, peak_step=r.peak_step, peak_se=0.0,
                           stable=r.stable, rollback_rate=0.0, k3_kl=0.0, seconds=0.0)
                for r in runs]
  seeds = sorted({r.seed for r in runs})
  path = report_lib.plot_curves(as_summary, list(names), os.path.join(workdir, f"curves_{key}.png"),
                                title=f"{STEPS} steps: mean over seeds {seeds} (band: min-max)")
  if path:
    files["curves"] = path
  return {"markdown": text, "files": files, "claims": results}
