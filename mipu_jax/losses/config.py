"""Frozen, validated loss and correction configs, and the named presets.

The `ml_collections` config stops at the boundary: it is
turned once into these frozen dataclasses, which validate on construction, so
an impossible combination is a `ValueError` before any compute. Both are
hashable and can be `static_argnames` of a jitted step.
"""

import dataclasses
import types
from typing import Any, Mapping

from mipu_jax.losses import advantages
from mipu_jax.losses import aggregation
from mipu_jax.losses import corrections
from mipu_jax.losses import ppo

MODES = ("on_policy_recompute", "bypass")

# docs/method.md §3 named presets, one per row of the source tables. Unlisted fields
# keep the `CorrectionConfig` defaults (token TIS, U = 2).
CORRECTION_PRESETS: Mapping[str, Mapping[str, Any]] = types.MappingProxyType({
    "none": {"is_level": None},
    "token_tis": {"is_level": "token", "is_mode": "truncate", "is_upper": 2.0},
    "seq_tis": {"is_level": "sequence", "is_mode": "truncate", "is_upper": 2.0},
    "geo_tis": {
        "is_level": "geometric", "is_mode": "truncate", "is_upper": 2.0},
    "token_mis": {
        "is_level": "token", "is_mode": "mask", "is_lower": 0.5,
        "is_upper": 2.0},
    "seq_mis": {
        "is_level": "sequence", "is_mode": "mask", "is_lower": 0.5,
        "is_upper": 2.0},
    # Rejection only, on the geometric-mean ratio; bounds as verl's geo_rs
    # preset (a per-token trust region of about ±0.1%).
    "geo_rs": {
        "is_level": None, "rs_level": "geometric", "rs_lower": 0.999,
        "rs_upper": 1.001},
    "icepop": {
        "is_level": "token", "is_mode": "icepop", "is_lower": 0.5,
        "is_upper": 5.0},
    # The Miles default: token TIS truncate [0.5, 2] (the lower bound is the
    # RS one, TIS itself is one-sided), token RS on [0.5, 2], veto 1e-4, SNIS.
    "mis_miles": {
        "is_level": "token", "is_mode": "truncate", "is_lower": 0.5,
        "is_upper": 2.0, "rs_level": "token", "rs_lower": 0.5,
        "rs_upper": 2.0, "veto_threshold": 1e-4, "self_normalize": True},
    # docs/method.md §5 Step 1: decoupled mode, w = min(exp(lp_old - lp_mu), 2),
    # token level by default; override `is_level` for the level option.
    "mipu_step1": {
        "is_level": "token", "is_mode": "truncate", "is_upper": 2.0},
    # Trust-region rejection by divergence estimators (verl 0.9's presets of
    # the same shape): sequence TIS + a sequence log-ratio band; token or
    # sequence TIS + a ±0.1% geometric band; a per-response mean-K3 bound.
    "seq_is_rs": {
        "is_level": "sequence", "is_mode": "truncate", "is_upper": 2.0,
        "rs_criteria": "seq_sum_k1", "rs_thresholds": "0.5_2.0"},
    "geo_rs_token_tis": {
        "is_level": "token", "is_mode": "truncate", "is_upper": 2.0,
        "rs_criteria": "seq_mean_k1", "rs_thresholds": "0.999_1.001"},
    "geo_rs_seq_tis": {
        "is_level": "sequence", "is_mode": "truncate", "is_upper": 2.0,
        "rs_criteria": "seq_mean_k1", "rs_thresholds": "0.999_1.001"},
    "k3_rs": {
        "is_level": None, "rs_criteria": "seq_mean_k3", "rs_thresholds": "0.01"},
})


def _check_fields(cls, names, kind: str) -> None:
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(names) - fields)
  if unknown:
    raise ValueError(
        f"unknown {kind} field(s) {unknown}; fields are {sorted(fields)}.")


@dataclasses.dataclass(frozen=True)
class CorrectionConfig:
  """Arguments of `correction_weights` (docs/method.md §3); see it for meanings.

  Attributes:
    is_level: None (no IS), "token", "sequence" or "geometric".
    is_mode: "truncate", "clip", "mask" or "icepop".
    is_lower: IS lower bound, None for the default.
    is_upper: IS upper bound, None for the mode's default.
    rs_level: None (no rejection) or a level.
    rs_lower: RS lower bound, None for 1 / rs_upper.
    rs_upper: RS upper bound, None for the IS upper bound.
    veto_threshold: τ_veto, None for off.
    self_normalize: batch self-normalisation (SNIS).
    rs_criteria: trust-region criteria on divergence estimators, comma
      separated, verl's names (`corrections.CRITERIA`, e.g.
      "token_k1,seq_max_k3"), or None.
    rs_thresholds: their thresholds in verl's format: one for all or one per
      criterion, comma separated; k1: "lower_upper" ratios (or one upper U,
      meaning 1/U_U); k2 / k3: an upper bound.
  """
  is_level: str | None = "token"
  is_mode: str = "truncate"
  is_lower: float | None = None
  is_upper: float | None = 2.0
  rs_level: str | None = None
  rs_lower: float | None = None
  rs_upper: float | None = None
  veto_threshold: float | None = None
  self_normalize: bool = False
  rs_criteria: str | None = None
  rs_thresholds: str | None = None

  def __post_init__(self):
    if isinstance(self.rs_thresholds, (int, float)) and not isinstance(
        self.rs_thresholds, bool):
      object.__setattr__(self, "rs_thresholds", repr(float(self.rs_thresholds)))
    self.validate()

  def validate(self) -> "CorrectionConfig":
    """Raises ValueError on an impossible setting; returns self."""
    corrections.resolve_bounds(**dataclasses.asdict(self))
    return self

  @property
  def enabled(self) -> bool:
    """Whether anything changes the weights or the mask."""
    return (self.is_level is not None or self.rs_level is not None
            or self.veto_threshold is not None or bool(self.rs_criteria))

  @classmethod
  def from_preset(cls, name: str, **overrides: Any) -> "CorrectionConfig":
    """The named preset (`CORRECTION_PRESETS`), then field overrides.

    Args:
      name: a key of `CORRECTION_PRESETS`.
      **overrides: fields to change, e.g. `is_level="geometric"`.

    Returns:
      A validated config.

    Raises:
      ValueError: unknown preset or field, or an invalid result.
    """
    if name not in CORRECTION_PRESETS:
      raise ValueError(
          f"unknown correction preset {name!r}; choose one of "
          f"{tuple(CORRECTION_PRESETS)}.")
    _check_fields(cls, overrides, "CorrectionConfig")
    return cls(**{**CORRECTION_PRESETS[name], **overrides})


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Everything `policy_loss` needs (docs/method.md §1–3).

  Attributes:
    advantage: advantage estimator, one of `ADVANTAGE_ESTIMATORS` (used by the
      RL loop through `compute_advantages`).
    eps_low: PPO lower clip ε_low.
    eps_high: PPO upper clip ε_high.
    dual_clip: dual-clip constant c > 1 for A < 0, or None for off.
    aggregation: one of `AGGREGATIONS`.
    max_len: fixed length for `seq_mean_token_sum_norm`; None for the padded
      response length T.
    rejected_in_denominator: rejected tokens stay in the normalisers (Miles,
      default) or leave them (False, verl).
    kl_coef: weight of the KL to a frozen reference; 0 turns it off.
    kl_estimator: one of `KL_ESTIMATORS`.
    entropy_coef: weight of the entropy bonus; 0 turns it off.
    mode: "on_policy_recompute" (decoupled, lp_ref = lp_old) or "bypass"
      (lp_ref = lp_mu; needs the correction off).
    correction: the docs/method.md §3 correction (default: token TIS, U = 2).
  """
  advantage: str = "grpo"
  eps_low: float = 0.2
  eps_high: float = 0.28
  dual_clip: float | None = None
  aggregation: str = "token_mean"
  max_len: int | None = None
  rejected_in_denominator: bool = True
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  entropy_coef: float = 0.0
  mode: str = "on_policy_recompute"
  correction: CorrectionConfig = dataclasses.field(
      default_factory=CorrectionConfig)

  def __post_init__(self):
    self.validate()

  def validate(self) -> "LossConfig":
    """Raises ValueError on an impossible setting; returns self."""
    def choice(field, value, options):
      if value not in options:
        raise ValueError(f"unknown {field} {value!r}; choose one of {options}.")

    choice("advantage estimator", self.advantage,
           advantages.ADVANTAGE_ESTIMATORS)
    choice("aggregation", self.aggregation, aggregation.AGGREGATIONS)
    choice("kl_estimator", self.kl_estimator, ppo.KL_ESTIMATORS)
    choice("mode", self.mode, MODES)
    if not 0 <= self.eps_low < 1:
      raise ValueError(f"eps_low must be in [0, 1), got {self.eps_low}.")
    if self.eps_high < 0:
      raise ValueError(f"eps_high must be >= 0, got {self.eps_high}.")
    if self.dual_clip is not None and not self.dual_clip > 1:
      raise ValueError(f"dual_clip must be > 1 or None, got {self.dual_clip}.")
    if self.max_len is not None and (
        isinstance(self.max_len, bool) or not isinstance(self.max_len, int)
        or self.max_len <= 0):
      raise ValueError(
          f"max_len must be a positive int or None, got {self.max_len!r}.")
    for name in ("kl_coef", "entropy_coef"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}.")
    if not isinstance(self.rejected_in_denominator, bool):
      raise ValueError("rejected_in_denominator must be a bool.")
    if not isinstance(self.correction, CorrectionConfig):
      raise ValueError(
          f"correction must be a CorrectionConfig, got "
          f"{type(self.correction).__name__}; use "
          f"CorrectionConfig.from_preset(name).")
    self.correction.validate()
    # docs/method.md §2: bypass has no learner recompute, so nothing of §3 exists.
    if self.mode == "bypass" and self.correction.enabled:
      raise ValueError(
          "mode='bypass' uses lp_mu as the PPO reference and has no lp_old: "
          "the docs/method.md §3 correction must be off (preset 'none'), got "
          f"{self.correction}.")
    return self

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "LossConfig":
    """Builds a validated config from a plain mapping (e.g. `cd.to_dict()`).

    `correction` may be a preset name, or a mapping with an optional `preset`
    key (default "token_tis") plus field overrides. Without `correction`,
    `mode="bypass"` gets the preset "none" (the only one it allows).

    Args:
      d: `LossConfig` field values; missing fields keep their defaults.

    Returns:
      A validated `LossConfig`.

    Raises:
      ValueError: unknown fields, preset or values.
    """
    d = dict(d)
    corr = d.pop("correction", None)
    if isinstance(corr, str):
      d["correction"] = CorrectionConfig.from_preset(corr)
    elif isinstance(corr, Mapping):
      corr = dict(corr)
      d["correction"] = CorrectionConfig.from_preset(
          corr.pop("preset", "token_tis"), **corr)
    elif corr is not None:
      d["correction"] = corr
    elif d.get("mode") == "bypass":
      d["correction"] = CorrectionConfig.from_preset("none")
    _check_fields(cls, d, "LossConfig")
    return cls(**d)
