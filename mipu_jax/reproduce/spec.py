"""What a reproduced table is: its rows and labels, what rows may differ in,
the tables and their panels, a run's summary and the Stable criterion
(the package docstring has the whole procedure)."""

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

# The one table of row names and their labels in the sources' tables
# (`configs/rows.py` builds one config per row).
LABELS = {
    "control": "No mismatch (fp32 sampler)", "baseline": "Baseline", "tis": "TIS", "mis": "MIS", "lr_decay": "LR-decay",
    "mipu": "Ours (MIPU)", "step1": "+ Step 1", "step2": "+ Step 2",
    "random_rollback": "Random rollback",
    "mipu_probe32": "Ours (MIPU), 32 probe prompts",
    "control_lr_decay": "LR-decay, no mismatch (fp32 sampler)",
    "lr_decay_long": "LR-decay, period 10x the surge step",
    "baseline_lr_mean": "Baseline at LR-decay's mean rate",
    "baseline_lr_floor": "Baseline at LR-decay's floor rate",
}
# What a row may change relative to the others (dotted config paths): the
# settings the tables compare. Everything else must be equal across rows; the
# no-mismatch control also changes the sampler's precision.
ROW_FIELDS = ("loss.correction", "optim.schedule", "optim.length_surge",
              "mipu.step2", "mipu.random_rollback_p")
PRECISION_FIELDS = ("sampling.dtype", "sampling.weight_quant", "sampling.act_quant",
                    "sampling.kv_cache_dtype", "sampling.quant_lm_head")
_ROW_EXTRA_FIELDS = {"control": PRECISION_FIELDS,
                     "control_lr_decay": PRECISION_FIELDS,
                     "mipu_probe32": ("mipu.num_probe_prompts",),
                     "baseline_lr_mean": ("optim.learning_rate",),
                     "baseline_lr_floor": ("optim.learning_rate",)}
# The sources' tables: MIPU's main table (plus TIS), its ablation, and the
# "Step 2 is not random rollback" comparison.
MAIN_ROWS = ("control", "baseline", "tis", "mis", "lr_decay", "mipu")
ABLATION_ROWS = ("baseline", "step1", "step2", "mipu", "mipu_probe32")
ROLLBACK_ROWS = ("mipu", "random_rollback", "step2")
# Whether LR-decay's gain is about the mismatch or a smaller step size
# (configs/rows.py): LR-decay with and without mismatch, a slower decay, and
# the baseline at LR-decay's mean and floor rates.
ISOLATE_ROWS = ("control", "control_lr_decay", "baseline", "lr_decay", "lr_decay_long",
                "baseline_lr_mean", "baseline_lr_floor")
# The main job's side-by-side comparison (`experiments/compare.py`).
COMPARE_ROWS = ("control", "baseline", "tis", "mipu")
# (file key, title, rows) of each table; each gets `curves_<key>.png`.
SOURCE_TABLES = (
    ("main", "Main results (MIPU table, + TIS)", MAIN_ROWS),
    ("ablation", "Ablation (Step 1 and Step 2)", ABLATION_ROWS),
    ("rollback", "Step 2 is not random rollback", ROLLBACK_ROWS),
    ("isolate", "What LR-decay's gain is made of", ISOLATE_ROWS),
)
COMPARE_TABLES = (
    ("compare", "Side by side under a high-mismatch sampler", COMPARE_ROWS),)
PANELS = (
    ("rollout/reward_mean", "training reward"),
    ("eval/avg", "eval pass@1 (Avg of 5 tiers; dashed: π at full precision)"),
    ("rollout_corr/k3_kl", "k3_kl (sampler vs learner)"),
    ("rollout/response_length_mean", "response length"),
    ("actor/grad_norm", "grad norm"),
    ("actor/lr", "learning rate"),
    ("mipu/rollback_rate", "rollback rate"),
)
STABLE_SES = 2.0
# Collapse (fixed before the mismatch study's runs): the first evaluation more
# than COLLAPSE_DROP (15 points of pass@1, several times the evaluation's
# standard error) below the best evaluation so far.
COLLAPSE_DROP = 0.15

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
    collapse_step: `collapse_step` of its evaluations (None: no collapse).
    seconds: wall time of the run.
    note: e.g. "same run as tis" for a deduplicated row.
    final_pi: the last evaluation's Avg. of the learner's π at full precision
      (`eval_pi/avg`, `eval.pi`); None for a run that did not evaluate it.
    peak_pi: the best `eval_pi/avg` (None likewise).
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


@dataclasses.dataclass
class TableResult:
  """What `run_table` returns: per-run summaries, pending rows, outputs."""
  runs: list[RunSummary]
  pending: dict[str, str]
  markdown: str
  files: dict[str, str]


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
