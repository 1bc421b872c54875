"""The documented range of every numeric config field, checked on every run config.

One table instead of a check per section: each entry is the range its class's
docstring (or docs/method.md) gives. A value outside it (a negative seed, a
β1 of 1.5, a keep-last of 0) is a `ValueError` naming the field before
anything is built, wherever the config came from (docs/reliability.md, "Bad
inputs"). Ranges that depend on another field (bounds that must not cross,
a window longer than its history) stay with their sections.
"""

import dataclasses
import math
from typing import Any, NamedTuple


class Range(NamedTuple):
  lo: float = -math.inf
  hi: float = math.inf
  lo_open: bool = False
  hi_open: bool = False

  def __contains__(self, v) -> bool:
    return ((v > self.lo if self.lo_open else v >= self.lo)
            and (v < self.hi if self.hi_open else v <= self.hi))

  def __str__(self) -> str:
    lo = "(" if self.lo_open else "["
    hi = ")" if self.hi_open or self.hi == math.inf else "]"
    return f"{lo}{self.lo:g}, {self.hi:g}{hi}"


_GE0, _GE1, _GT0, _GT1 = Range(0), Range(1), Range(0, lo_open=True), Range(1, lo_open=True)
_UNIT = Range(0, 1)            # [0, 1]
_UNIT_OPEN_HI = Range(0, 1, hi_open=True)
_MESH = Range(-1)              # -1 (the remaining devices) or >= 1; 0 is refused by MeshConfig

# Fields without an entry: mipu.c (a margin of either sign, docs/method.md §5),
# data.reward_correct / reward_wrong (any values, the first above the second).
RANGES: dict[str, Range] = {
    "seed": _GE0, "num_steps": _GE1,
    "model.attention_block": _GE1, "model.init_seed": _GE0, "model.init_perturb_ulps": _GE0,
    "sampling.temperature": _GT0, "sampling.top_k": _GE0,
    "sampling.top_p": Range(0, 1, lo_open=True), "sampling.max_new_tokens": _GE1,
    "sampling.max_concurrent_decodes": _GE1,
    "data.prompts_per_step": _GE1, "data.group_size": Range(2),
    "data.max_sampling_rounds": _GE1, "data.max_prompt_tokens": _GE1,
    "data.probe_holdout": _GE1, "data.reward_workers": _GE1, "data.reward_timeout_s": _GT0,
    "loss.eps_low": _UNIT_OPEN_HI, "loss.eps_high": _GE0, "loss.dual_clip": _GT1,
    "loss.max_len": _GE1, "loss.kl_coef": _GE0, "loss.entropy_coef": _GE0,
    "loss.correction.is_lower": _GT0, "loss.correction.is_upper": _GT0,
    "loss.correction.rs_lower": _GT0, "loss.correction.rs_upper": _GT0,
    "loss.correction.veto_threshold": Range(0, 1, True, True),
    "optim.learning_rate": _GT0, "optim.weight_decay": _GE0, "optim.clip_norm": _GT0,
    "optim.b1": _UNIT_OPEN_HI, "optim.b2": _UNIT_OPEN_HI, "optim.eps": _GT0,
    "optim.cosine.total_steps": _GE0, "optim.cosine.warmup": _GE0,
    "optim.cosine.min_ratio": _UNIT,
    "optim.length_surge.decay_period": _GE1, "optim.length_surge.surge_ratio": _GT1,
    "optim.length_surge.surge_window": _GE1, "optim.length_surge.min_steps": _GE1,
    "optim.length_surge.period_factor": _GT0, "optim.length_surge.min_ratio": _UNIT,
    "optim.length_surge.ema_decay": _UNIT_OPEN_HI,
    "learner.ppo_epochs": _GE1, "learner.num_minibatches": _GE1,
    "learner.num_microbatches": _GE1, "learner.logits_chunk": _GE0,
    "learner.pack_length": _GE0, "learner.pack_rows": _GE0,
    "learner.max_nonfinite_steps": _GE1,
    "learner.mesh.data": _MESH, "learner.mesh.fsdp": _MESH, "learner.mesh.tensor": _MESH,
    "learner.mesh.expert": _GE1,   # a given size, never -1 (MeshConfig)
    "eval.every": _GE0, "eval.num_samples": _GE1, "eval.temperature": _GE0,
    "eval.seed": _GE0, "eval.n_per_tier": _GE1, "eval.max_problems": _GE0,
    "logging.health.is_mean_low": _GE0, "logging.health.is_mean_high": _GT0,
    "logging.health.ess_min": _GE0, "logging.health.is_std_max": _GE0,
    "logging.health.veto_fraction_max": _GE0, "logging.health.kl_abs_max": _GE0,
    "logging.health.chi2_token_max": _GE0, "logging.health.k3_surge_ratio": _GT1,
    "logging.health.k3_surge_floor": _GE0, "logging.health.k3_surge_window": _GE1,
    "logging.health.k3_surge_min_history": _GE1, "logging.health.grad_spike_ratio": _GT1,
    "logging.health.grad_spike_window": _GE1, "logging.health.grad_spike_min_history": _GE1,
    "logging.health.warn_every": _GE1,
    "checkpoint.every": _GE0, "checkpoint.keep": _GE1,
    "mipu.c_noise_multiple": _GT0, "mipu.num_probe_prompts": _GE1,
    "mipu.random_rollback_p": _UNIT, "mipu.seed": _GE0,
}


def check(cfg: Any) -> None:
  """Raises ValueError for a field of `cfg` (a `TrainConfig`) outside its range."""
  for path, value in _numbers(cfg, ""):
    r = RANGES.get(path)
    if r is not None and value not in r:
      raise ValueError(f"config field {path} must be in {r}, got {value!r}.")


def _numbers(obj: Any, prefix: str):
  for f in dataclasses.fields(obj):
    value = getattr(obj, f.name)
    if dataclasses.is_dataclass(value):
      yield from _numbers(value, f"{prefix}{f.name}.")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      yield f"{prefix}{f.name}", value
