"""The rows of the sources' tables, each a small function of a base ConfigDict.

Not a job by itself: `studies/configs/table.py` (the small CPU task) and
`studies/configs/pod_qwen3_*.py` (TPU pods) apply one of these to their base. A row
changes only what distinguishes it (the correction preset, the schedule, the
MIPU Step 2 switches), so every row shares the rest of its base.

| row | source label | what changes (docs/method.md section) |
| --- | --- | --- |
| `control` | No mismatch | the baseline with an fp32 sampler (not in the sources' tables) |
| `baseline` | Baseline | no mismatch correction (preset `none`, §3) |
| `tis` | TIS | token TIS, U = 2 (preset `token_tis`, §3) |
| `mis` | MIS | the Miles default (preset `mis_miles`, §3) |
| `lr_decay` | LR-decay | length-surge schedule, no correction (§6) |
| `mipu` | Ours (MIPU) | Step 1 (preset `mipu_step1`) + Step 2 (§5) |
| `step1` | + Step 1 | Step 1 only |
| `step2` | + Step 2 | Step 2 only (no correction) |
| `random_rollback` | Random rollback | Step 1 + rollback with probability p (§5) |
| `mipu_probe32` | (ablation) | MIPU with Step 2 probing 32 prompts instead of the base's |
| `control_lr_decay` | (isolating LR-decay) | LR-decay on the no-mismatch control |
| `lr_decay_long` | (isolating LR-decay) | LR-decay with the period the base config sets for it (`studies/configs/table.py`: 10x the surge step) |
| `baseline_lr_mean` | (isolating LR-decay) | the baseline at a constant rate equal to LR-decay's mean over the run |
| `baseline_lr_floor` | (isolating LR-decay) | the baseline at LR-decay's floor, `min_ratio` x lr, from step 1 |
| `bf16` | (mismatch or precision) | the baseline with a bf16 sampler and a bf16 learner (fp32 master weights) |
| `bf16_true_on_policy` | (mismatch or precision) | `bf16` in the true on-policy mode: the same bf16 arithmetic on both sides, no mismatch (docs/method.md §7) |

The four isolating rows ask whether LR-decay helps because of the mismatch
or because it lowers the step size: the rate-matched baselines take LR-decay's
period from `optim.length_surge` of the base config (which must set `fixed`
mode and `decay_period`, as `studies/configs/table.py` does) and compute the schedule's
rates with `schedules.fixed_rates`.

`tis` and `step1` are the same computation: docs/method.md §5 defines Step 1 as the
decoupled mode with token TIS (`mipu_step1` has exactly `token_tis`'s fields).
Both rows are kept because both tables name them; `studies.reproduce` runs
such rows once and reports the result under both names.

The two bf16 rows separate "no mismatch" from "full precision", which the
fp32 `control` conflates: both compute in bf16 on both sides, uncorrected, and
differ only in `sampling.true_on_policy` (their like-with-like check allows
exactly that field between them).

The random-rollback row is MIPU with Step 2's inference-gap test replaced by a
coin flip of the same rejection rate (`p` = the rate MIPU measured), so the
comparison isolates the signal, as the source's "Step 2 is not random
rollback" figure does; it refuses to run without that `p`.

MIPU Step 2 is configured through `config.mipu`: `step2`, `c` (or
`c_noise_multiple`), `probe`, `num_probe_prompts`, `random_rollback_p`.
Row labels (one table): `LABELS`.
"""

from typing import Callable

from ml_collections import config_dict

# The one table of row names and their labels in the sources' tables.
LABELS = {
    "control": "No mismatch (fp32 sampler)", "baseline": "Baseline", "tis": "TIS", "mis": "MIS", "lr_decay": "LR-decay",
    "mipu": "Ours (MIPU)", "step1": "+ Step 1", "step2": "+ Step 2",
    "random_rollback": "Random rollback",
    "mipu_probe32": "Ours (MIPU), 32 probe prompts",
    "control_lr_decay": "LR-decay, no mismatch (fp32 sampler)",
    "lr_decay_long": "LR-decay, period 10x the surge step",
    "baseline_lr_mean": "Baseline at LR-decay's mean rate",
    "baseline_lr_floor": "Baseline at LR-decay's floor rate",
    "bf16": "bf16 sampler and learner (mismatch)",
    "bf16_true_on_policy": "bf16 sampler and learner, true on-policy (no mismatch)",
}
ROWS = tuple(LABELS)


def control(config):
  """The no-mismatch control: the baseline with an fp32 sampler (μ = π up to
  kernel order), every other setting as the base's."""
  config = baseline(config)
  config.sampling.dtype = "float32"
  config.sampling.weight_quant = None
  config.sampling.act_quant = None
  config.sampling.kv_cache_dtype = None
  config.sampling.quant_lm_head = False
  return config


def baseline(config):
  """No mismatch correction (docs/method.md §3 preset `none`); decoupled recompute."""
  config.loss.correction.preset = "none"
  return config


def tis(config):
  """Token-level truncated IS, U = 2 (docs/method.md §3 preset `token_tis`)."""
  config.loss.correction.preset = "token_tis"
  return config


def mis(config):
  """The Miles default (docs/method.md §3 preset `mis_miles`): token TIS [0.5, 2] +
  token rejection + veto 1e-4 + self-normalisation."""
  config.loss.correction.preset = "mis_miles"
  return config


def lr_decay(config):
  """Length-surge learning-rate schedule (docs/method.md §6) on the baseline.

  The base config decides the mode: `auto` (online surge detection) unless it
  already set `optim.length_surge.mode`/`decay_period` (the pod configs use
  the source's fixed period where the source gives one).
  """
  config = baseline(config)
  config.optim.schedule = "length_surge"
  if config.optim.length_surge.mode is None:
    config.optim.length_surge.mode = "auto"
  return config


def step1(config):
  """MIPU Step 1 only (docs/method.md §5): sampler-referenced update, token TIS."""
  config.loss.correction.preset = "mipu_step1"
  return config


def step2(config):
  """MIPU Step 2 only (docs/method.md §5): gap-aware accept/rollback, no correction."""
  config = baseline(config)
  config.mipu.step2 = True
  return config


def mipu(config):
  """MIPU, Step 1 + Step 2 (docs/method.md §5): the source's "Ours"."""
  config = step1(config)
  config.mipu.step2 = True
  return config


def mipu_probe32(config):
  """MIPU with a 4x larger Step 2 probe (32 prompts; docs/method.md §5): whether
  the decision carries more signal when `T̂_post` is less noisy."""
  config = mipu(config)
  config.mipu.num_probe_prompts = 32
  return config


def random_rollback(config, p: float | None = None):
  """Step 1 + i.i.d. rollback with probability `p`, Step 2 off (docs/method.md §5).

  `p` must be the rejection rate MIPU measured on the same setting (its
  run's `mipu/rollback_rate`; `studies.reproduce` passes it): any other
  value compares Step 2 with a different amount of sparsification.
  """
  if p is None:
    raise ValueError(
        "the random_rollback row needs p=, the rejection rate MIPU measured on "
        "the same setting (e.g. `:random_rollback,p=0.31`); "
        "`experiments/reproduce_tables.py` runs MIPU first and passes it.")
  if not 0.0 < p <= 1.0:
    raise ValueError(f"random rollback needs 0 < p <= 1, got {p}.")
  config = step1(config)
  config.mipu.step2 = False
  config.mipu.random_rollback_p = float(p)
  return config


def control_lr_decay(config):
  """LR-decay on the no-mismatch control: LR-decay's gain without mismatch."""
  return lr_decay(control(config))


def lr_decay_long(config):
  """LR-decay with the longer period the base config sets for this row
  (`studies/configs/table.py`): whether the gain survives a schedule that decays slowly."""
  return lr_decay(config)


def _lr_decay_rates(config):
  """LR-decay's per-step rates in `config`'s setting (fixed mode only)."""
  from mipu_jax import schedules  # pylint: disable=g-import-not-at-top
  ls = config.optim.length_surge
  if ls.mode != "fixed" or not ls.decay_period:
    raise ValueError("the rate-matched baselines need the base config to set "
                     "optim.length_surge.mode='fixed' and its decay_period (the "
                     "period LR-decay runs with).")
  ratio = 0.1 if ls.min_ratio is None else ls.min_ratio
  rates = schedules.fixed_rates(config.optim.learning_rate, ls.decay_period,
                                config.num_steps, ratio)
  ls.mode = ls.decay_period = None  # a constant rate: nothing else differs
  return rates, ratio


def baseline_lr_mean(config):
  """The baseline at a constant rate equal to the mean of LR-decay's rates
  over the run (same lr, period, floor and steps): what LR-decay gives beyond
  a smaller average step."""
  rates, _ = _lr_decay_rates(config)
  config = baseline(config)
  config.optim.learning_rate = float(rates.mean())
  return config


def baseline_lr_floor(config):
  """The baseline at LR-decay's floor (`min_ratio` x lr) from step 1."""
  _, ratio = _lr_decay_rates(config)
  config = baseline(config)
  config.optim.learning_rate = float(ratio * config.optim.learning_rate)
  return config


def bf16(config):
  """The baseline with a bf16 sampler and a bf16 learner (float32 master weights):
  bf16's precision and the mismatch of its kernels, uncorrected."""
  config = control(config)
  config.sampling.dtype = "bfloat16"
  config.model.dtype = "bfloat16"
  return config


def bf16_true_on_policy(config):
  """`bf16` in the true on-policy mode (docs/method.md §7): bf16's precision with
  the sampler and the learner bitwise equal, so no mismatch."""
  config = bf16(config)
  config.sampling.true_on_policy = True
  return config


_FUNCTIONS: dict[str, Callable[..., config_dict.ConfigDict]] = {
    "control": control, "baseline": baseline, "tis": tis, "mis": mis, "lr_decay": lr_decay,
    "mipu": mipu, "step1": step1, "step2": step2,
    "random_rollback": random_rollback, "mipu_probe32": mipu_probe32,
    "control_lr_decay": control_lr_decay, "lr_decay_long": lr_decay_long,
    "baseline_lr_mean": baseline_lr_mean, "baseline_lr_floor": baseline_lr_floor,
    "bf16": bf16, "bf16_true_on_policy": bf16_true_on_policy,
}
assert tuple(_FUNCTIONS) == ROWS


def apply(config: config_dict.ConfigDict, row: str,
          p: float | None = None) -> config_dict.ConfigDict:
  """`config` changed into table row `row` (in place; also returned).

  Args:
    config: a base ConfigDict (`studies/configs/base.py` or `studies/configs/pod_base.py`).
    row: one of `ROWS`.
    p: the random-rollback probability (only, and required, for
      `random_rollback`).
  """
  if row not in _FUNCTIONS:
    raise ValueError(f"unknown table row {row!r}; choose one of {ROWS}.")
  if row == "random_rollback":
    return random_rollback(config, p)
  if p is not None:
    raise ValueError(f"p= is only for the random_rollback row, not {row!r}.")
  return _FUNCTIONS[row](config)
