"""What a reproduced table is: its rows and labels, what rows may differ in,
the tables, their panels and the claims tested on them (the package docstring
has the whole procedure)."""

import dataclasses
from typing import Any, Callable, Optional

from mipu_jax.harness import RunSummary
from mipu_jax.harness.stats import Claim
from studies.configs.rows import LABELS

# What a row may change relative to the others (dotted config paths): the
# settings the tables compare. Everything else must be equal across rows; the
# no-mismatch control also changes the sampler's precision.
ROW_FIELDS = ("loss.correction", "optim.schedule", "optim.length_surge",
              "mipu.step2", "mipu.random_rollback_p")
PRECISION_FIELDS = ("sampling.dtype", "sampling.weight_quant", "sampling.act_quant",
                    "sampling.kv_cache_dtype", "sampling.quant_lm_head")
# The bf16 rows change both sides' precision, the learner's compute dtype too.
BF16_FIELDS = PRECISION_FIELDS + ("model.dtype", "sampling.true_on_policy")
_ROW_EXTRA_FIELDS = {"control": PRECISION_FIELDS,
                     "control_lr_decay": PRECISION_FIELDS,
                     "bf16": BF16_FIELDS, "bf16_true_on_policy": BF16_FIELDS,
                     "mipu_probe32": ("mipu.num_probe_prompts",),
                     "baseline_lr_mean": ("optim.learning_rate",),
                     "baseline_lr_floor": ("optim.learning_rate",)}
# The sources' tables: MIPU's main table (plus TIS), its ablation, and the
# "Step 2 is not random rollback" comparison.
MAIN_ROWS = ("control", "baseline", "tis", "mis", "lr_decay", "mipu")
ABLATION_ROWS = ("baseline", "step1", "step2", "mipu", "mipu_probe32")
ROLLBACK_ROWS = ("mipu", "random_rollback", "step2")
# Whether LR-decay's gain is about the mismatch or a smaller step size
# (studies/configs/rows.py): LR-decay with and without mismatch, a slower decay, and
# the baseline at LR-decay's mean and floor rates.
ISOLATE_ROWS = ("control", "control_lr_decay", "baseline", "lr_decay", "lr_decay_long",
                "baseline_lr_mean", "baseline_lr_floor")
# Mismatch or precision (docs/method.md §7): the fp32 control, and bf16 on both
# sides with the true on-policy mode on and off. Two rows of a pair in
# `PAIR_FIELDS` may differ in exactly those fields, whatever their extra fields.
PRECISION_ROWS = ("control", "bf16", "bf16_true_on_policy")
PAIR_FIELDS = {frozenset(("bf16", "bf16_true_on_policy")): ("sampling.true_on_policy",)}
# The main job's side-by-side comparison (`experiments/compare.py`).
COMPARE_ROWS = ("control", "baseline", "tis", "mipu")
# (file key, title, rows) of each table; each gets `curves_<key>.png`.
SOURCE_TABLES = (
    ("main", "Main results (MIPU table, + TIS)", MAIN_ROWS),
    ("ablation", "Ablation (Step 1 and Step 2)", ABLATION_ROWS),
    ("rollback", "Step 2 is not random rollback", ROLLBACK_ROWS),
    ("isolate", "What LR-decay's gain is made of", ISOLATE_ROWS),
    ("precision", "Mismatch or precision: bf16 with and without true on-policy",
     PRECISION_ROWS),
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
TABLE_SEEDS = tuple(range(10))  # seeds per row of the tables
# The sources' claims, each tested on final eval Avg. paired by seed. "+ Step 1"
# is token TIS (studies/configs/rows.py), so its line repeats TIS vs baseline.
CLAIMS = (
    Claim("mipu", "baseline", "greater", "MIPU > baseline"),
    Claim("mipu", "tis", "greater", "MIPU > TIS"),
    Claim("mipu", "mis", "greater", "MIPU > MIS"),
    Claim("mis", "baseline", "less", "MIS < baseline"),
    Claim("lr_decay", "baseline", "greater", "LR-decay > baseline"),
    Claim("mipu", "random_rollback", "two-sided",
          "Step 2 ≠ random rollback at the same rate (MIPU vs random rollback)"),
    Claim("step1", "baseline", "greater", "+ Step 1 > baseline"),
    Claim("step2", "baseline", "greater", "+ Step 2 > baseline"),
)
# What LR-decay's gain is made of (the isolating rows, studies/configs/rows.py),
# a family of its own: fixed before those rows ran.
ISOLATE_CLAIMS = (
    Claim("lr_decay", "baseline_lr_mean", "greater",
          "LR-decay > the baseline at a constant rate of LR-decay's mean"),
    Claim("lr_decay", "baseline", "greater",
          "LR-decay's gain with mismatch > its gain without "
          "((LR-decay − baseline) − (LR-decay fp32 − control))",
          minus=("control_lr_decay", "control")),
)

# Mismatch or precision (the bf16 rows), a Holm family of its own, fixed
# before those rows ran: does bf16's mismatch change the result (the mode on
# against off, the same arithmetic otherwise), and does bf16's precision
# without mismatch (the mode against the fp32 control)?
PRECISION_CLAIMS = (
    Claim("bf16", "bf16_true_on_policy", "two-sided",
          "bf16's mismatch changes the result (bf16 ≠ bf16 true on-policy)"),
    Claim("bf16_true_on_policy", "control", "two-sided",
          "bf16's precision without mismatch changes the result "
          "(bf16 true on-policy ≠ the fp32 control)"),
)


MakeConfig = Callable[[str, int, Optional[float]], Any]


@dataclasses.dataclass
class TableResult:
  """What `run_table` returns: per-run summaries, pending rows, outputs."""
  runs: list[RunSummary]
  pending: dict[str, str]
  markdown: str
  files: dict[str, str]
