"""Training–inference mismatch corrections: IS weights, rejection, veto, SNIS.

Implements SPEC.md §3 with the per-token log-ratio `δ_t = clamp(lp_old - lp_mu,
±20)` between the learner (π, lp_old) and the sampler (μ, lp_mu), in this order:
raw weights → IS bounds/mode → RS mask → veto → self-normalisation over the
final mask. Everything returned is stop-gradiented. A response left with no counted
token gets weight 0 and mask 0, never NaN.

Choices SPEC.md leaves open, made here (and mirrored by `CorrectionConfig`):
- `is_upper=None` means the mode's default: 5 for `icepop`, 2 otherwise.
  `is_lower=None` means 0.5 for `icepop` (IcePop's published bounds) and
  `1 / upper` otherwise (SPEC.md §3). The signature default `is_upper=2.0`
  applies to every mode, icepop included; the `icepop` preset sets [0.5, 5].
- `rs_upper=None` means the IS upper bound (as Miles' `rs_upper_bound`), and
  `rs_lower=None` means `1 / rs_upper` (SPEC.md §3).
- `truncate` is one-sided: a lower bound is accepted (Miles' TIS [0.5, 2]
  carries one to its RS) but does not change the weights.
- `icepop` zeroes the weight but keeps the token in the mask, as IcePop
  normalises over all generated tokens; `mask` (MIS) removes it from the mask.
- Fractions are token fractions over the original mask (a sequence-level
  decision counts once per token of its response); the veto fraction is over
  responses with at least one counted token.
- Weight statistics are over the final mask, after SNIS, per token for the
  token level and per response for the sequence and geometric levels.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from mipu_jax.losses import _masked

IS_LEVELS = ("token", "sequence", "geometric")
IS_MODES = ("truncate", "clip", "mask", "icepop")

_DEFAULT_UPPER = 2.0  # SPEC.md §3: default U = 2.
_ICEPOP_LOWER = 0.5  # SPEC.md §3: icepop defaults L = 0.5, U = 5.
_ICEPOP_UPPER = 5.0
_SNIS_MIN_MEAN = 1e-8  # SPEC.md §3: SNIS is skipped when the mean is <= 1e-8.

_P = "rollout_corr/"
METRIC_NAMES = tuple(_P + k for k in (
    "rollout_is_mean",
    "rollout_is_std",
    "rollout_is_min",
    "rollout_is_max",
    "rollout_is_eff_sample_size",
    "rollout_is_truncated_fraction",
    "rollout_is_clipped_low_fraction",
    "rollout_is_clipped_high_fraction",
    "rollout_is_masked_fraction",
    "rollout_rs_masked_fraction",
    "rollout_is_veto_fraction",
    "rollout_is_batch_norm_factor",
    "rejected_token_fraction",
))


class Bounds(NamedTuple):
  """IS and RS bounds after defaults are resolved."""
  is_lower: float
  is_upper: float
  rs_lower: float
  rs_upper: float


def _check_bound(name: str, value: float | None) -> None:
  if value is None:
    return
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ValueError(f"{name} must be a number or None, got {value!r}.")
  if not math.isfinite(value) or value < 0:
    raise ValueError(f"{name} must be finite and >= 0, got {value}.")


def resolve_bounds(
    *,
    is_level: str | None = "token",
    is_mode: str = "truncate",
    is_lower: float | None = None,
    is_upper: float | None = _DEFAULT_UPPER,
    rs_level: str | None = None,
    rs_lower: float | None = None,
    rs_upper: float | None = None,
    veto_threshold: float | None = None,
    self_normalize: bool = False,
) -> Bounds:
  """Validates correction arguments and resolves unset bounds (SPEC.md §3).

  Takes the keyword arguments of `correction_weights`; `CorrectionConfig`
  calls it too, so a bad combination fails at config time, before any compute.

  Returns:
    The resolved `Bounds`.

  Raises:
    ValueError: unknown level or mode, icepop at a non-token level, a negative
      or non-finite bound, an upper bound of 0, lower > upper, a veto threshold
      outside (0, 1), or a non-bool `self_normalize`.
  """
  if is_level is not None and is_level not in IS_LEVELS:
    raise ValueError(
        f"unknown is_level {is_level!r}; choose None or one of {IS_LEVELS}.")
  if rs_level is not None and rs_level not in IS_LEVELS:
    raise ValueError(
        f"unknown rs_level {rs_level!r}; choose None or one of {IS_LEVELS}.")
  if is_mode not in IS_MODES:
    raise ValueError(f"unknown is_mode {is_mode!r}; choose one of {IS_MODES}.")
  if is_mode == "icepop" and is_level not in (None, "token"):
    raise ValueError(
        f"is_mode='icepop' is token level only (SPEC.md §3), got "
        f"is_level={is_level!r}.")
  for name, value in (("is_lower", is_lower), ("is_upper", is_upper),
                      ("rs_lower", rs_lower), ("rs_upper", rs_upper)):
    _check_bound(name, value)

  icepop = is_mode == "icepop"
  up = is_upper if is_upper is not None else (
      _ICEPOP_UPPER if icepop else _DEFAULT_UPPER)
  rs_up = rs_upper if rs_upper is not None else up
  if up <= 0 or rs_up <= 0:
    raise ValueError(
        f"upper bounds must be > 0, got is_upper={up}, rs_upper={rs_up}.")
  lo = is_lower if is_lower is not None else (
      _ICEPOP_LOWER if icepop else 1.0 / up)
  rs_lo = rs_lower if rs_lower is not None else 1.0 / rs_up
  if lo > up:
    raise ValueError(
        f"IS lower bound {lo} > upper bound {up} (an unset lower bound is "
        f"1/upper, so an upper bound below 1 needs an explicit lower one).")
  if rs_lo > rs_up:
    raise ValueError(
        f"RS lower bound {rs_lo} > upper bound {rs_up} (an unset lower bound "
        f"is 1/upper).")

  if veto_threshold is not None:
    _check_bound("veto_threshold", veto_threshold)
    if not 0 < veto_threshold < 1:
      raise ValueError(
          f"veto_threshold must be in (0, 1), got {veto_threshold}.")
  if not isinstance(self_normalize, bool):
    raise ValueError(f"self_normalize must be a bool, got {self_normalize!r}.")
  return Bounds(float(lo), float(up), float(rs_lo), float(rs_up))


def _level_log_ratio(delta_BT: jax.Array, m_BT: jax.Array,
                     level: str) -> jax.Array:
  """Log-ratio ℓ at a level, broadcast to `[B, T]`, clamped (SPEC.md §3)."""
  if level == "token":
    return delta_BT
  if level == "sequence":
    l_B = _masked.row_sum(delta_BT, m_BT)
  else:  # geometric: Σ m δ / max(Σ m, 1); the numerator is 0 when Σ m = 0.
    l_B = _masked.row_mean(delta_BT, m_BT)
  return jnp.broadcast_to(_masked.clamp_log_ratio(l_B)[:, None], delta_BT.shape)


def _inside(rho_BT: jax.Array, lower: float, upper: float) -> jax.Array:
  return ((rho_BT >= lower) & (rho_BT <= upper)).astype(jnp.float32)


def correction_weights(
    lp_old: jax.Array,
    lp_mu: jax.Array,
    mask: jax.Array,
    *,
    is_level: str | None = "token",
    is_mode: str = "truncate",
    is_lower: float | None = None,
    is_upper: float | None = 2.0,
    rs_level: str | None = None,
    rs_lower: float | None = None,
    rs_upper: float | None = None,
    veto_threshold: float | None = None,
    self_normalize: bool = False,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
  """Mismatch-correction weights and mask (SPEC.md §3).

  IS, with ρ = exp(ℓ) at `is_level` (token δ_t, sequence Σ m δ, geometric
  Σ m δ / max(Σ m, 1)): `truncate` w = min(ρ, U); `clip` w = clamp(ρ, L, U);
  `mask` w = ρ and drop where ρ ∉ [L, U]; `icepop` w = ρ·1[L ≤ ρ ≤ U].
  RS: m' = m' · 1[L_rs ≤ ρ_rs ≤ U_rs] at `rs_level`. Veto: drop a response if
  any counted token has δ_t < log τ. SNIS: token level w ← w / (Σ w m' / Σ m'),
  sequence/geometric w ← w / mean_i w_i over responses with a counted token;
  skipped when the mean is <= 1e-8. See the module docstring for the defaults.

  Args:
    lp_old: learner log-probs log π_k, `[B, T]`.
    lp_mu: sampler log-probs log μ_k, `[B, T]`.
    mask: response mask m, `[B, T]`, bool or {0, 1}.
    is_level: IS level, one of `IS_LEVELS`, or None for no IS (w = 1).
    is_mode: one of `IS_MODES`.
    is_lower: IS lower bound L (None: see module docstring).
    is_upper: IS upper bound U (None: the mode's default).
    rs_level: rejection level, one of `IS_LEVELS`, or None for no RS.
    rs_lower: RS lower bound (None: 1 / rs_upper).
    rs_upper: RS upper bound (None: the IS upper bound).
    veto_threshold: τ_veto in (0, 1), or None for no veto.
    self_normalize: batch self-normalisation (SNIS) at the IS level (token
      when IS is off, where it is the identity).

  Returns:
    `(weights, mask, metrics)`: float32 `[B, T]` weights (0 where the final
    mask is 0), the final float32 {0, 1} mask m', and the scalar metrics named
    in `METRIC_NAMES`.

  Raises:
    ValueError: as `resolve_bounds`.
  """
  bounds = resolve_bounds(
      is_level=is_level, is_mode=is_mode, is_lower=is_lower, is_upper=is_upper,
      rs_level=rs_level, rs_lower=rs_lower, rs_upper=rs_upper,
      veto_threshold=veto_threshold, self_normalize=self_normalize)
  m_BT = _masked.as_float_mask(mask)
  on_BT = m_BT > 0
  lp_old = jax.lax.stop_gradient(jnp.asarray(lp_old, jnp.float32))
  lp_mu = jax.lax.stop_gradient(jnp.asarray(lp_mu, jnp.float32))
  # Padding may hold ±inf or NaN: `where` drops it before anything else.
  delta_BT = _masked.clamp_log_ratio(jnp.where(on_BT, lp_old - lp_mu, 0.0))
  zero = jnp.zeros((), jnp.float32)
  frac = {k: zero for k in ("truncated", "clipped_low", "clipped_high",
                            "is_masked", "rs_masked", "veto")}
  keep_BT = m_BT

  # 1-2. Raw weights and the IS mode.
  if is_level is None:
    w_BT = jnp.ones_like(m_BT)
  else:
    lo, up = bounds.is_lower, bounds.is_upper
    rho_BT = jnp.exp(_level_log_ratio(delta_BT, m_BT, is_level))
    if is_mode == "truncate":
      w_BT = jnp.minimum(rho_BT, up)
      frac["truncated"] = _masked.masked_mean(rho_BT > up, m_BT)
    elif is_mode == "clip":
      w_BT = jnp.clip(rho_BT, lo, up)
      frac["clipped_low"] = _masked.masked_mean(rho_BT < lo, m_BT)
      frac["clipped_high"] = _masked.masked_mean(rho_BT > up, m_BT)
    else:
      inside_BT = _inside(rho_BT, lo, up)
      frac["is_masked"] = _masked.masked_mean(1.0 - inside_BT, m_BT)
      if is_mode == "mask":
        w_BT = rho_BT
        keep_BT = keep_BT * inside_BT
      else:  # icepop
        w_BT = rho_BT * inside_BT

  # 3. Rejection sampling.
  if rs_level is not None:
    rho_rs_BT = jnp.exp(_level_log_ratio(delta_BT, m_BT, rs_level))
    inside_BT = _inside(rho_rs_BT, bounds.rs_lower, bounds.rs_upper)
    frac["rs_masked"] = _masked.masked_mean(1.0 - inside_BT, m_BT)
    keep_BT = keep_BT * inside_BT

  # 4. Veto: a catastrophic token under the learner drops its whole response.
  if veto_threshold is not None:
    vetoed_B = jnp.any(on_BT & (delta_BT < math.log(veto_threshold)), axis=-1)
    has_tokens_B = jnp.any(on_BT, axis=-1)
    frac["veto"] = _masked.masked_mean(vetoed_B, has_tokens_B)
    keep_BT = keep_BT * (~vetoed_B)[:, None]

  # 5. Self-normalisation over the final mask. Its "units" (tokens, or
  # responses for sequence-level weights) also carry the weight statistics.
  if is_level in (None, "token"):
    units_w, units_m = w_BT, keep_BT
  else:
    units_w = _masked.row_mean(w_BT, keep_BT)
    units_m = (jnp.sum(keep_BT, axis=-1) > 0).astype(jnp.float32)
  norm = jnp.ones((), jnp.float32)
  if self_normalize:
    mean = _masked.masked_mean(units_w, units_m)
    norm = jnp.where(mean > _SNIS_MIN_MEAN, mean, 1.0)
    w_BT = w_BT / norm
    units_w = units_w / norm

  w_BT = w_BT * keep_BT
  stats = _masked.weight_stats(units_w, units_m)
  rejected = 1.0 - _masked.safe_div(jnp.sum(keep_BT), jnp.sum(m_BT))
  rejected = jnp.where(jnp.sum(m_BT) > 0, rejected, 0.0)
  metrics = {
      _P + "rollout_is_mean": stats["mean"],
      _P + "rollout_is_std": stats["std"],
      _P + "rollout_is_min": stats["min"],
      _P + "rollout_is_max": stats["max"],
      _P + "rollout_is_eff_sample_size": stats["ess"],
      _P + "rollout_is_truncated_fraction": frac["truncated"],
      _P + "rollout_is_clipped_low_fraction": frac["clipped_low"],
      _P + "rollout_is_clipped_high_fraction": frac["clipped_high"],
      _P + "rollout_is_masked_fraction": frac["is_masked"],
      _P + "rollout_rs_masked_fraction": frac["rs_masked"],
      _P + "rollout_is_veto_fraction": frac["veto"],
      _P + "rollout_is_batch_norm_factor": norm,
      _P + "rejected_token_fraction": rejected,
  }
  return (jax.lax.stop_gradient(w_BT), jax.lax.stop_gradient(keep_BT),
          jax.tree.map(jax.lax.stop_gradient, metrics))
