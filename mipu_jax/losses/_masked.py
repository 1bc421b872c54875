"""Masked reductions shared by the loss modules (private).

Every helper here is NaN-safe on empty masks: a division whose denominator is
zero returns zero, and its gradient is zero too (the denominator is replaced
*before* dividing, so no `inf * 0` appears in the backward pass).
"""

import jax
import jax.numpy as jnp

# docs/method.md §0: every log-ratio is clamped to [-20, 20] before `exp`.
LOG_RATIO_BOUND = 20.0


def clamp_log_ratio(x: jax.Array) -> jax.Array:
  """Clamps a log-ratio to [-20, 20] (docs/method.md §0) so that `exp` stays finite."""
  return jnp.clip(x, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)


# Below this |δ| the k3 estimator is its Taylor series (docs/method.md §4).
K3_SERIES_BOUND = 0.5


def k3(delta: jax.Array) -> jax.Array:
  """`exp(δ) - 1 - δ` without cancellation (docs/method.md §4).

  Written as it reads, float32 returns exactly 0 for |δ| up to about 3e-4,
  where the true value is about δ²/2: a nonzero mismatch would read as none.
  For |δ| < `K3_SERIES_BOUND` it is the series δ²/2 + δ³/6 + ... + δ⁹/9!
  (truncation below 3e-9 relative), above it `expm1(δ) - δ`.
  """
  small = jnp.abs(delta) < K3_SERIES_BOUND
  d = jnp.where(small, delta, 0.0)
  c = (1 / 2, 1 / 6, 1 / 24, 1 / 120, 1 / 720, 1 / 5040, 1 / 40320, 1 / 362880)
  series = c[-1]
  for coef in c[-2::-1]:  # Horner
    series = coef + d * series
  series = d * d * series
  return jnp.where(small, series, jnp.expm1(delta) - delta)


def as_float_mask(mask: jax.Array) -> jax.Array:
  """A {0, 1} float32 mask from a bool or numeric mask (nonzero = counted)."""
  return (jnp.asarray(mask) != 0).astype(jnp.float32)


def safe_div(num: jax.Array, den: jax.Array) -> jax.Array:
  """`num / den`, and 0 where `den == 0` (value and gradient both finite)."""
  nonzero = den != 0
  return jnp.where(nonzero, num / jnp.where(nonzero, den, 1.0), 0.0)


def row_sum(x_BT: jax.Array, mask_BT: jax.Array) -> jax.Array:
  """Σ_t x m per row, `[B]` (entries outside the mask are ignored, even NaN)."""
  return jnp.sum(jnp.where(mask_BT != 0, x_BT * mask_BT, 0.0), axis=-1)


def row_mean(x_BT: jax.Array, mask_BT: jax.Array) -> jax.Array:
  """Mean of x over each row's counted tokens, `[B]`; 0 for an empty row."""
  return safe_div(row_sum(x_BT, mask_BT), jnp.sum(mask_BT, axis=-1))


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of x over all counted entries (any shape); 0 if none count."""
  mask = jnp.asarray(mask, jnp.float32)
  x = jnp.where(mask != 0, jnp.asarray(x, jnp.float32), 0.0)
  return safe_div(jnp.sum(x * mask), jnp.sum(mask))


def masked_min(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Min of x over counted entries; 0 if none count."""
  m = mask != 0
  return jnp.where(jnp.any(m), jnp.min(jnp.where(m, x, jnp.inf)), 0.0)


def masked_max(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Max of x over counted entries; 0 if none count."""
  m = mask != 0
  return jnp.where(jnp.any(m), jnp.max(jnp.where(m, x, -jnp.inf)), 0.0)


def weight_stats(w: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
  """Mean / std / min / max / ESS of weights over counted entries.

  ESS is the Kish fraction `1 / mean((w / mean w)^2) = (mean w)^2 / mean(w^2)`
  (docs/method.md §4), in (0, 1]; 0 when nothing counts or every weight is 0.

  Args:
    w: weights, any shape.
    mask: {0, 1} float mask of the same shape.

  Returns:
    Scalars keyed `mean`, `std`, `min`, `max`, `ess`.
  """
  mean = masked_mean(w, mask)
  mean_sq = masked_mean(jnp.square(w), mask)
  var = masked_mean(jnp.square(w - mean), mask)
  return {
      "mean": mean,
      "std": jnp.sqrt(jnp.maximum(var, 0.0)),
      "min": masked_min(w, mask),
      "max": masked_max(w, mask),
      "ess": safe_div(jnp.square(mean), mean_sq),
  }
