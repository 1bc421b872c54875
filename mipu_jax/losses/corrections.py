"""Training–inference mismatch corrections: IS weights, rejection, veto, SNIS.

Implements docs/method.md §3 with the per-token log-ratio `δ_t = clamp(lp_old
- lp_mu, ±20)` between the learner (π, lp_old) and the sampler (μ, lp_mu), in
this order: raw weights → IS bounds/mode → RS mask (ratio bounds, then the
trust-region criteria on divergence estimators, all AND-ed) → veto →
self-normalisation over the final mask.

Trust-region rejection (verl 0.9's `rollout_rs`): criteria on `k1 = -δ`
(kept when `log(lower) ≤ k1 ≤ log(upper)`), `k2 = δ²/2` and
`k3 = exp(δ) - 1 - δ` (kept when ≤ the upper bound), per token or per
response as the sum, mean or max over its tokens (`CRITERIA`). They are given
as verl gives them: `rs_criteria="token_k1,seq_max_k3"` and
`rs_thresholds="0.5_2.0,0.01"` (one threshold for all, or one per criterion;
a k1 threshold is `"lower_upper"` in ratios, or one upper bound `U` meaning
`1/U_U`). Everything returned is stop-gradiented. A response left with no counted
token gets weight 0 and mask 0, never NaN.

Choices docs/method.md leaves open, made here (and mirrored by `CorrectionConfig`):
- `is_upper=None` means the mode's default: 5 for `icepop`, 2 otherwise.
  `is_lower=None` means 0.5 for `icepop` (IcePop's published bounds) and
  `1 / upper` otherwise (docs/method.md §3). The signature default `is_upper=2.0`
  applies to every mode, icepop included; the `icepop` preset sets [0.5, 5].
- `rs_upper=None` means the IS upper bound (as Miles' `rs_upper_bound`), and
  `rs_lower=None` means `1 / rs_upper` (docs/method.md §3).
- `truncate` is one-sided: a lower bound is accepted (Miles' TIS [0.5, 2]
  carries one to its RS) but does not change the weights.
- `icepop` zeroes the weight but keeps the token in the mask, as IcePop
  normalises over all generated tokens; `mask` (MIS) removes it from the mask.
  IcePop is published at token level; as verl, the same rule is accepted at
  the sequence and geometric levels (ρ of the whole response).
- Fractions are token fractions over the original mask (a sequence-level
  decision counts once per token of its response); the veto fraction is over
  responses with at least one counted token.
- Weight statistics are verl's (`metrics.is_metrics`): of the weights after
  the IS mode, before rejection and SNIS, over the response mask.
"""

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from mipu_jax.losses import _masked
from mipu_jax.losses import metrics as metrics_lib

IS_LEVELS = ("token", "sequence", "geometric")
IS_MODES = ("truncate", "clip", "mask", "icepop")

_DEFAULT_UPPER = 2.0  # docs/method.md §3: default U = 2.
_ICEPOP_LOWER = 0.5  # docs/method.md §3: icepop defaults L = 0.5, U = 5.
_ICEPOP_UPPER = 5.0
_SNIS_MIN_MEAN = 1e-8  # docs/method.md §3: SNIS is skipped when the mean is <= 1e-8.

_P = metrics_lib.P
CRITERIA = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2",
            "seq_sum_k3", "seq_mean_k1", "seq_mean_k2", "seq_mean_k3",
            "seq_max_k2", "seq_max_k3")


class Criterion(NamedTuple):
  """A parsed trust-region criterion: its name and thresholds.

  Attributes:
    name: one of `CRITERIA`.
    lower: k1 only: the lower bound as a log-ratio (log of the ratio given).
    upper: the upper bound (k1: as a log-ratio; k2 / k3: as given).
  """
  name: str
  lower: Optional[float]
  upper: float


def parse_criteria(criteria: Optional[str],
                   thresholds: Optional[str | float]) -> tuple[Criterion, ...]:
  """verl's `rollout_rs` / `rollout_rs_threshold` strings → `Criterion`s.

  Raises:
    ValueError: an unknown criterion, a missing or malformed threshold, a
      non-positive bound, lower > upper, or a k2 / k3 threshold with `_`.
  """
  if criteria is None or not str(criteria).strip():
    if thresholds not in (None, ""):
      raise ValueError("rs_thresholds is set but rs_criteria is not.")
    return ()
  names = list(dict.fromkeys(c.strip() for c in str(criteria).split(",") if c.strip()))
  unknown = [n for n in names if n not in CRITERIA]
  if unknown:
    raise ValueError(f"unknown trust-region criteria {unknown}; choose from {CRITERIA}.")
  if thresholds is None or not str(thresholds).strip():
    raise ValueError(f"rs_criteria={criteria!r} needs rs_thresholds (one per criterion, "
                     "or one for all; k1: 'lower_upper' ratios).")
  specs = [t.strip() for t in str(thresholds).split(",") if t.strip()]
  if len(specs) not in (1, len(names)):
    raise ValueError(f"rs_thresholds has {len(specs)} entries for {len(names)} criteria: "
                     "give one for all or one per criterion.")
  specs = specs * len(names) if len(specs) == 1 else specs
  out = []
  for name, spec in zip(names, specs):
    try:
      if name.endswith("k1"):
        lo, _, up = spec.partition("_")
        upper = float(up or lo)
        lower = float(lo) if up else 1.0 / upper
        if lower <= 0 or upper <= 0 or lower > upper:
          raise ValueError
        out.append(Criterion(name, math.log(lower), math.log(upper)))
      else:
        if "_" in spec:
          raise ValueError
        upper = float(spec)
        if upper <= 0:
          raise ValueError
        out.append(Criterion(name, None, upper))
    except ValueError:
      raise ValueError(f"bad threshold {spec!r} for {name}: k1 criteria take "
                       "'lower_upper' (0 < lower <= upper) or one positive upper "
                       "bound, k2 / k3 criteria one positive upper bound.") from None
  return tuple(out)


def _criterion_keep(c: Criterion, delta_BT: jax.Array, m_BT: jax.Array):
  """(keep_BT, per-token statistic, per-response statistic or None) of one criterion."""
  k = {"k1": -delta_BT, "k2": 0.5 * jnp.square(delta_BT),
       "k3": _masked.k3(delta_BT)}[c.name[-2:]]
  if c.name.startswith("token"):
    stat_BT, seq_B = k, None
    value = stat_BT
  else:
    if c.name.startswith("seq_sum"):
      seq_B = _masked.row_sum(k, m_BT)
    elif c.name.startswith("seq_mean"):
      seq_B = _masked.row_mean(k, m_BT)
    else:  # seq_max over counted tokens (0 for an empty response)
      seq_B = jnp.where(jnp.any(m_BT > 0, axis=-1),
                        jnp.max(jnp.where(m_BT > 0, k, -jnp.inf), axis=-1), 0.0)
    stat_BT = jnp.broadcast_to(seq_B[:, None], delta_BT.shape)
    value = stat_BT
  keep = value <= c.upper
  if c.lower is not None:
    keep = keep & (value >= c.lower)
  return keep.astype(jnp.float32), stat_BT, seq_B


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
    rs_criteria: str | None = None,
    rs_thresholds: str | None = None,
) -> Bounds:
  """Validates correction arguments and resolves unset bounds (docs/method.md §3).

  Takes the keyword arguments of `correction_weights`; `CorrectionConfig`
  calls it too, so a bad combination fails at config time, before any compute.

  Returns:
    The resolved `Bounds`.

  Raises:
    ValueError: unknown level or mode, a negative
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
  parse_criteria(rs_criteria, rs_thresholds)
  return Bounds(float(lo), float(up), float(rs_lo), float(rs_up))


def _level_log_ratio(delta_BT: jax.Array, m_BT: jax.Array,
                     level: str) -> jax.Array:
  """Log-ratio ℓ at a level, broadcast to `[B, T]`, clamped (docs/method.md §3)."""
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
    is_upper: float | None = _DEFAULT_UPPER,
    rs_level: str | None = None,
    rs_lower: float | None = None,
    rs_upper: float | None = None,
    veto_threshold: float | None = None,
    self_normalize: bool = False,
    rs_criteria: str | None = None,
    rs_thresholds: str | None = None,
) -> tuple[jax.Array, jax.Array, dict[str, jax.Array]]:
  """Mismatch-correction weights and mask (docs/method.md §3).

  IS, with ρ = exp(ℓ) at `is_level` (token δ_t, sequence Σ m δ, geometric
  Σ m δ / max(Σ m, 1)): `truncate` w = min(ρ, U); `clip` w = clamp(ρ, L, U);
  `mask` w = ρ and drop where ρ ∉ [L, U]; `icepop` w = ρ·1[L ≤ ρ ≤ U].
  RS: m' = m' · 1[L_rs ≤ ρ_rs ≤ U_rs] at `rs_level`, then every trust-region
  criterion of `rs_criteria` (module docstring). Veto: drop a response if any
  counted token has δ_t < log τ. SNIS: token level w ← w / (Σ w m' / Σ m'),
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
    rs_level: ratio-bound rejection level, one of `IS_LEVELS`, or None.
    rs_lower: RS lower bound (None: 1 / rs_upper).
    rs_upper: RS upper bound (None: the IS upper bound).
    veto_threshold: τ_veto in (0, 1), or None for no veto.
    self_normalize: batch self-normalisation (SNIS) at the IS level (token
      when IS is off, where it is the identity).
    rs_criteria: trust-region criteria, comma separated (`CRITERIA`), or None.
    rs_thresholds: their thresholds, verl's format (module docstring).

  Returns:
    `(weights, mask, metrics)`: float32 `[B, T]` weights (0 where the final
    mask is 0), the final float32 {0, 1} mask m', and the scalar metrics of
    `metrics.CORRECTION_METRIC_NAMES` plus one group per trust-region
    criterion (`metrics.rs_metrics`).

  Raises:
    ValueError: as `resolve_bounds`.
  """
  bounds = resolve_bounds(
      is_level=is_level, is_mode=is_mode, is_lower=is_lower, is_upper=is_upper,
      rs_level=rs_level, rs_lower=rs_lower, rs_upper=rs_upper,
      veto_threshold=veto_threshold, self_normalize=self_normalize,
      rs_criteria=rs_criteria, rs_thresholds=rs_thresholds)
  criteria = parse_criteria(rs_criteria, rs_thresholds)
  m_BT = _masked.as_float_mask(mask)
  on_BT = m_BT > 0
  lp_old = jax.lax.stop_gradient(jnp.asarray(lp_old, jnp.float32))
  lp_mu = jax.lax.stop_gradient(jnp.asarray(lp_mu, jnp.float32))
  # Padding may hold ±inf or NaN: `where` drops it before anything else.
  raw_delta_BT = jnp.where(on_BT, lp_old - lp_mu, 0.0)
  delta_BT = _masked.clamp_log_ratio(raw_delta_BT)
  zero = jnp.zeros((), jnp.float32)
  frac = {k: zero for k in ("truncated", "clipped_low", "clipped_high",
                            "is_masked", "veto")}
  metrics = {}

  # 1-2. Raw weights and the IS mode.
  lo, up = bounds.is_lower, bounds.is_upper
  if is_level is None:
    w_BT = rho_BT = m_BT
    applied_BT, level_log_B = m_BT, None
    keep_BT = m_BT
  else:
    rho_BT = jnp.exp(_level_log_ratio(delta_BT, m_BT, is_level)) * m_BT
    level_log_B = None if is_level == "token" else (
        _masked.row_sum(raw_delta_BT, m_BT) if is_level == "sequence"
        else _masked.row_mean(raw_delta_BT, m_BT))
    keep_BT = m_BT
    if is_mode == "truncate":
      w_BT = jnp.minimum(rho_BT, up)
      frac["truncated"] = _masked.masked_mean(rho_BT > up, m_BT)
      applied_BT = w_BT
    elif is_mode == "clip":
      w_BT = jnp.clip(rho_BT, lo, up) * m_BT
      frac["clipped_low"] = _masked.masked_mean(rho_BT < lo, m_BT)
      frac["clipped_high"] = _masked.masked_mean(rho_BT > up, m_BT)
      applied_BT = w_BT
    else:
      inside_BT = _inside(rho_BT, lo, up)
      frac["is_masked"] = _masked.masked_mean(1.0 - inside_BT, m_BT)
      applied_BT = rho_BT * inside_BT
      if is_mode == "mask":
        w_BT = rho_BT
        keep_BT = keep_BT * inside_BT
      else:  # icepop
        w_BT = applied_BT
        frac["oob"] = frac["is_masked"]
  metrics.update(metrics_lib.is_metrics(applied_BT, rho_BT, level_log_B, m_BT,
                                        upper=up, lower=lo))

  # 3. Rejection: ratio bounds, then the trust-region criteria (AND).
  rs_keep_BT = m_BT
  if rs_level is not None:
    rho_rs_BT = jnp.exp(_level_log_ratio(delta_BT, m_BT, rs_level))
    rs_keep_BT = rs_keep_BT * _inside(rho_rs_BT, bounds.rs_lower, bounds.rs_upper)
  for c in criteria:
    keep_c, stat_BT, seq_B = _criterion_keep(c, delta_BT, m_BT)
    metrics.update(metrics_lib.rs_metrics(c.name, stat_BT, seq_B, m_BT, keep_c,
                                          upper=c.upper, lower=c.lower))
    rs_keep_BT = rs_keep_BT * keep_c
  metrics.update(metrics_lib.rs_combined_metrics(m_BT, rs_keep_BT))
  keep_BT = keep_BT * rs_keep_BT

  # 4. Veto: a catastrophic token under the learner drops its whole response.
  if veto_threshold is not None:
    vetoed_B = jnp.any(on_BT & (delta_BT < math.log(veto_threshold)), axis=-1)
    has_tokens_B = jnp.any(on_BT, axis=-1)
    frac["veto"] = _masked.masked_mean(vetoed_B, has_tokens_B)
    keep_BT = keep_BT * (~vetoed_B)[:, None]

  # 5. Self-normalisation over the final mask, in the IS level's units
  # (tokens, or responses for sequence-level weights).
  norm = jnp.ones((), jnp.float32)
  if self_normalize:
    if is_level in (None, "token"):
      mean = _masked.masked_mean(w_BT, keep_BT)
    else:
      has_B = (jnp.sum(keep_BT, axis=-1) > 0).astype(jnp.float32)
      mean = _masked.masked_mean(_masked.row_mean(w_BT, keep_BT), has_B)
    norm = jnp.where(mean > _SNIS_MIN_MEAN, mean, 1.0)
    w_BT = w_BT / norm

  w_BT = w_BT * keep_BT
  metrics.update(metrics_lib.correction_metrics(frac, norm, keep_BT, m_BT))
  return (jax.lax.stop_gradient(w_BT), jax.lax.stop_gradient(keep_BT),
          jax.tree.map(lambda x: jax.lax.stop_gradient(jnp.asarray(x, jnp.float32)), metrics))
