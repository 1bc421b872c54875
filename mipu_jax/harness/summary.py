"""A run reduced to its evaluations: final and peak pass@1, the Stable flag, collapse.

Stable (fixed before the tables' ten-seed runs): each of the run's last two
evaluations reaches the best evaluation up to it minus `STABLE_SES` standard
errors of that best evaluation (`eval/avg_se`, the sampling noise of pass@1),
and no metric went non-finite. A run still rising at the end is Stable; one
that fell back from an earlier peak by more than the peak's noise is not.
Collapse: the first evaluation more than `COLLAPSE_DROP` below the best so far.
"""

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

STABLE_SES = 2.0
# Collapse (fixed before the mismatch study's runs): the first evaluation more
# than COLLAPSE_DROP (15 points of pass@1, several times the evaluation's
# standard error) below the best evaluation so far.
COLLAPSE_DROP = 0.15


@dataclasses.dataclass(frozen=True)
class RunSummary:
  """One (row, seed) run, reduced to what the tables need.

  Attributes:
    row: the run's label (a table row, a study cell).
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
    collapse_step: `collapse_step` of its evaluations (None: no collapse).
    seconds: wall time of the run.
    note: e.g. "same run as tis" for a deduplicated row.
    final_pi: the last evaluation's Avg. of the learner's π at full precision
      (`eval_pi/avg`, `eval.pi`); None for a run that did not evaluate it.
    peak_pi: the best `eval_pi/avg` (None likewise).
    commits: the code each training session of the run ran, in order
      (`rl.resume.record_commit`: the repository's commit, whether its tree
      had changes, the step the session started from); empty for a run trained
      before the record existed, or from code outside a git checkout.
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
  collapse_step: Optional[int] = None
  note: str = ""
  final_pi: Optional[float] = None
  peak_pi: Optional[float] = None
  commits: Sequence[Mapping[str, Any]] = ()


def collapse_step(rows: Sequence[Mapping[str, float]],
                  drop: float = COLLAPSE_DROP) -> Optional[int]:
  """The first eval step more than `drop` below the best eval so far, or None."""
  best = -np.inf
  for r in rows:
    if "eval/avg" not in r:
      continue
    if r["eval/avg"] < best - drop:
      return int(r["step"])
    best = max(best, r["eval/avg"])
  return None


def summarize(rows: Sequence[Mapping[str, float]], tiers: Sequence[str], *,
              num_ses: float = STABLE_SES) -> dict[str, Any]:
  """Final / peak eval (μ's, and π's when logged) and the Stable flag of one
  run's logged rows.

  Stable: each of the last two evaluations after step 0's is ≥ the best
  evaluation up to it (itself included) − `num_ses` × that best evaluation's
  standard error, and every logged value is finite. The reference is the best
  so far, not the run's overall peak, so a run still rising at the end (its
  second-to-last evaluation more than `num_ses` SEs below its last) is Stable:
  it has not fallen from anything. A run that fell back from an earlier peak
  by more than the peak's noise is not.
  """
  evals = [r for r in rows if "eval/avg" in r]
  if not evals:
    raise ValueError("the run has no evaluation rows (eval/avg).")
  if any("eval/avg_se" not in r for r in evals):
    raise ValueError("the run's evaluations carry no eval/avg_se (a run from "
                     "before standard errors were logged): re-run it.")
  last = evals[-1]
  peak = max(evals, key=lambda r: r["eval/avg"])
  finite = all(math.isfinite(v) for r in rows for v in r.values())
  # The last two evaluations after step 0's (step 0's alone if it is the only one).
  tail = range(max(1, len(evals) - 2), len(evals)) if len(evals) > 1 else (0,)

  def held(i: int) -> bool:
    best = max(evals[:i + 1], key=lambda r: r["eval/avg"])
    return evals[i]["eval/avg"] >= best["eval/avg"] - num_ses * best["eval/avg_se"]
  rate = [r["mipu/rollback_rate"] for r in rows if "mipu/rollback_rate" in r]
  k3 = [r["rollout_corr/k3_kl"] for r in rows if "rollout_corr/k3_kl" in r]
  return dict(
      final={**{t: last[f"eval/{t}"] for t in tiers}, "avg": last["eval/avg"]},
      final_se=float(last["eval/avg_se"]),
      peak_avg=peak["eval/avg"], peak_step=int(peak["step"]),
      peak_se=float(peak["eval/avg_se"]),
      stable=bool(finite and all(held(i) for i in tail)),
      rollback_rate=float(rate[-1]) if rate else 0.0,
      k3_kl=float(np.mean(k3[-max(len(k3) // 4, 1):])) if k3 else 0.0,
      collapse_step=collapse_step(rows),
      final_pi=float(last["eval_pi/avg"]) if "eval_pi/avg" in last else None,
      peak_pi=max((r["eval_pi/avg"] for r in evals if "eval_pi/avg" in r), default=None))
