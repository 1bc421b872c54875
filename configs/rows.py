"""The rows of the sources' tables, each a small function of a base ConfigDict.

Not a job by itself: `configs/table.py` (the small CPU task) and
`configs/pod_qwen3_*.py` (TPU pods) apply one of these to their base. A row
changes only what distinguishes it (the correction preset, the schedule, the
MIPU Step 2 switches), so every row shares the rest of its base.

| row | source label | what changes (SPEC.md section) |
| --- | --- | --- |
| `baseline` | Baseline | no mismatch correction (preset `none`, §3) |
| `tis` | TIS | token TIS, U = 2 (preset `token_tis`, §3) |
| `mis` | MIS | the Miles default (preset `mis_miles`, §3) |
| `lr_decay` | LR-decay | length-surge schedule, no correction (§6) |
| `mipu` | Ours (MIPU) | Step 1 (preset `mipu_step1`) + Step 2 (§5) |
| `step1` | + Step 1 | Step 1 only |
| `step2` | + Step 2 | Step 2 only (no correction) |
| `random_rollback` | Random rollback | Step 1 + rollback with probability p (§5) |

`tis` and `step1` are the same computation: SPEC.md §5 defines Step 1 as the
decoupled mode with token TIS (`mipu_step1` has exactly `token_tis`'s fields).
Both rows are kept because both tables name them; `mipu_jax.reproduce` runs
such rows once and reports the result under both names.

The random-rollback row is MIPU with Step 2's inference-gap test replaced by a
coin flip of the same rejection rate (`p` = the rate MIPU measured), so the
comparison isolates the signal, as the source's "Step 2 is not random
rollback" figure does.

MIPU Step 2 is configured through `config.mipu` (issue 5): `step2`, `c`,
`probe`, `num_probe_prompts`, `random_rollback_p`. Rows that need it raise a
clear error on a base config without that section.
"""

from typing import Callable

from ml_collections import config_dict

ROWS = ("baseline", "tis", "mis", "lr_decay", "mipu", "step1", "step2",
        "random_rollback")

LABELS = {
    "baseline": "Baseline",
    "tis": "TIS",
    "mis": "MIS",
    "lr_decay": "LR-decay",
    "mipu": "Ours (MIPU)",
    "step1": "+ Step 1",
    "step2": "+ Step 2",
    "random_rollback": "Random rollback",
}

# Rows whose config needs the `mipu` section (MIPU Step 2, issue 5).
NEEDS_MIPU = ("mipu", "step2", "random_rollback")

# The random-rollback row's p when none is given: MIPU's measured rejection
# rate is only known after the MIPU row has run (`mipu_jax.reproduce` passes
# it); this placeholder keeps the row a valid config on its own.
DEFAULT_RANDOM_ROLLBACK_P = 0.2


def _mipu(config: config_dict.ConfigDict) -> config_dict.ConfigDict:
  if "mipu" not in config:
    raise ValueError(
        "this row needs MIPU Step 2's `config.mipu` section (step2, c, probe, "
        "num_probe_prompts, random_rollback_p; issue 5), which this version of "
        "mipu_jax.config does not have yet.")
  return config.mipu


def baseline(config):
  """No mismatch correction (SPEC.md §3 preset `none`); decoupled recompute."""
  config.loss.correction.preset = "none"
  return config


def tis(config):
  """Token-level truncated IS, U = 2 (SPEC.md §3 preset `token_tis`)."""
  config.loss.correction.preset = "token_tis"
  return config


def mis(config):
  """The Miles default (SPEC.md §3 preset `mis_miles`): token TIS [0.5, 2] +
  token rejection + veto 1e-4 + self-normalisation."""
  config.loss.correction.preset = "mis_miles"
  return config


def lr_decay(config):
  """Length-surge learning-rate schedule (SPEC.md §6) on the baseline.

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
  """MIPU Step 1 only (SPEC.md §5): sampler-referenced update, token TIS."""
  config.loss.correction.preset = "mipu_step1"
  return config


def step2(config):
  """MIPU Step 2 only (SPEC.md §5): gap-aware accept/rollback, no correction."""
  config = baseline(config)
  _mipu(config).step2 = True
  return config


def mipu(config):
  """MIPU, Step 1 + Step 2 (SPEC.md §5): the source's "Ours"."""
  config = step1(config)
  _mipu(config).step2 = True
  return config


def random_rollback(config, p: float = DEFAULT_RANDOM_ROLLBACK_P):
  """Step 1 + i.i.d. rollback with probability `p`, Step 2 off (SPEC.md §5)."""
  if not 0.0 < p < 1.0:
    raise ValueError(f"random rollback needs 0 < p < 1, got {p}.")
  config = step1(config)
  section = _mipu(config)
  section.step2 = False
  section.random_rollback_p = float(p)
  return config


_FUNCTIONS: dict[str, Callable[..., config_dict.ConfigDict]] = {
    "baseline": baseline, "tis": tis, "mis": mis, "lr_decay": lr_decay,
    "mipu": mipu, "step1": step1, "step2": step2,
    "random_rollback": random_rollback,
}


def apply(config: config_dict.ConfigDict, row: str,
          p: float | None = None) -> config_dict.ConfigDict:
  """`config` changed into table row `row` (in place; also returned).

  Args:
    config: a base ConfigDict (`configs/base.py` or `configs/pod_base.py`).
    row: one of `ROWS`.
    p: the random-rollback probability (only for `random_rollback`).
  """
  if row not in _FUNCTIONS:
    raise ValueError(f"unknown table row {row!r}; choose one of {ROWS}.")
  if row == "random_rollback":
    return random_rollback(config, DEFAULT_RANDOM_ROLLBACK_P if p is None else p)
  if p is not None:
    raise ValueError(f"p= is only for the random_rollback row, not {row!r}.")
  return _FUNCTIONS[row](config)


def parse_arg(arg: str | None, default_row: str) -> tuple[str, dict[str, str]]:
  """big_vision-style `"row,flag,key=value"` → (row, {key: value, flag: ""}).

  The first item is the row when it names one; otherwise `default_row`.
  """
  items = [s.strip() for s in (arg or "").split(",") if s.strip()]
  row = default_row
  if items and "=" not in items[0] and items[0] in ROWS:
    row = items.pop(0)
  opts = {}
  for item in items:
    key, _, value = item.partition("=")
    opts[key.strip()] = value.strip()
  return row, opts
