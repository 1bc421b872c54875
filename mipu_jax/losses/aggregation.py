"""Token-to-scalar loss aggregation modes (docs/method.md §2).

Two masks take part. `mask_BT` (m') selects the tokens whose loss is summed:
the response mask after the rejections of docs/method.md §3. `denom_mask_BT` sets the
normalisers: the original response mask m when rejected tokens stay in the
denominator (Miles; keeps the step size stable when many tokens are rejected)
or m' itself when they leave it (verl). The numerator never counts a token
outside `mask_BT`, so it is fine for `denom_mask_BT` to be a superset.

A sequence "counts" in the sequence means when it has at least one token in
`denom_mask_BT`; padding rows (no token at all) never count, and an empty batch
gives 0, never NaN.
"""

import jax
import jax.numpy as jnp

from mipu_jax.losses import _masked

AGGREGATIONS = (
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
)


def aggregate(
    x_BT: jax.Array,
    mask_BT: jax.Array,
    mode: str = "token_mean",
    *,
    denom_mask_BT: jax.Array | None = None,
    max_len: int | None = None,
) -> jax.Array:
  """Reduces a per-token quantity to a scalar (docs/method.md §2).

  With n_b = Σ_t d_bt (d = `denom_mask_BT`), S = #{b : n_b > 0}:
  - `token_mean`: Σ_bt x m / Σ_bt d.
  - `seq_mean_token_mean`: (1/S) Σ_b (Σ_t x m / n_b).
  - `seq_mean_token_sum` (Dr. GRPO): (1/S) Σ_b Σ_t x m.
  - `seq_mean_token_sum_norm`: (1/S) Σ_b Σ_t x m / max_len, a fixed length so
    the per-token scale does not depend on the response lengths (Dr. GRPO's
    "divide by the generation budget").

  Args:
    x_BT: per-token values `[B, T]` (already weighted).
    mask_BT: tokens that are summed, `[B, T]`, bool or {0, 1}.
    mode: one of `AGGREGATIONS`.
    denom_mask_BT: tokens that count in normalisers; defaults to `mask_BT`.
    max_len: the fixed length for `seq_mean_token_sum_norm`; defaults to `T`.

  Returns:
    A float32 scalar.

  Raises:
    ValueError: unknown mode or non-positive `max_len`.
  """
  if mode not in AGGREGATIONS:
    raise ValueError(
        f"unknown aggregation {mode!r}; choose one of {AGGREGATIONS}.")
  if max_len is not None and max_len <= 0:
    raise ValueError(f"max_len must be positive, got {max_len}.")
  m_BT = _masked.as_float_mask(mask_BT)
  d_BT = m_BT if denom_mask_BT is None else _masked.as_float_mask(denom_mask_BT)
  # `where`, not `*`: a masked-out inf or NaN must not leak into the sum.
  x_BT = jnp.where(m_BT > 0, x_BT, 0.0)

  if mode == "token_mean":
    return _masked.safe_div(jnp.sum(x_BT), jnp.sum(d_BT))

  n_B = jnp.sum(d_BT, axis=-1)
  seq_counts_B = (n_B > 0).astype(jnp.float32)
  sum_B = jnp.sum(x_BT, axis=-1)
  if mode == "seq_mean_token_mean":
    per_seq_B = _masked.safe_div(sum_B, n_B)
  elif mode == "seq_mean_token_sum":
    per_seq_B = sum_B
  else:  # seq_mean_token_sum_norm
    per_seq_B = sum_B / float(x_BT.shape[-1] if max_len is None else max_len)
  return _masked.safe_div(jnp.sum(per_seq_B * seq_counts_B),
                          jnp.sum(seq_counts_B))
