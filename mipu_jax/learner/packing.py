"""Sequence packing: responses of different lengths share rows of a token budget.

Unpacked, every response is a row padded to `prompt budget + response budget`
(`T`), so a batch whose responses are mostly short still pays for `B × T`
tokens in every matmul and activation. Packed, the learner places the real
tokens of several responses one after another in rows of `pack_length` tokens
(`P`), each response a *segment*: attention stays inside a segment
(`segment_ids`), RoPE positions restart at every segment, and the loss reads
the same per-token values as before through a gather map. Nothing of the loss
changes: the aggregation coefficients, corrections and metrics are computed
on the unpacked `[B, T]` layout (`losses.policy`) and only the model's forward
and backward run on the packed rows, so packed == unpacked up to float
summation order (tested; docs/method.md §7).

The plan is made on the host (lengths are data), by first-fit decreasing. The
number of packed rows is rounded up to a multiple of the micro-batch's rows and
then to a power of two of micro-batches, so a run compiles the step for a few
sizes only (one per power of two it meets).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class PackPlan(NamedTuple):
  """Where each packed token comes from; `[R, P]` int32 arrays.

  Attributes:
    src_RP: flat index `b * T + t` of the token in the unpacked `[B, T]`
      layout, or -1 on padding.
    segment_ids_RP: 1, 2, ... per response within a row; 0 on padding.
    positions_RP: position of the token within its response (0 on padding).
  """
  src_RP: np.ndarray | jax.Array
  segment_ids_RP: np.ndarray | jax.Array
  positions_RP: np.ndarray | jax.Array


def row_lengths(input_mask_BT: np.ndarray) -> np.ndarray:
  """Real tokens per row; each row's real tokens must be a prefix.

  Raises:
    ValueError: a row with a gap (a real token after padding).
  """
  m = np.asarray(input_mask_BT) > 0
  n_B = m.sum(axis=1)
  prefix = np.arange(m.shape[1])[None, :] < n_B[:, None]
  if not np.array_equal(m, prefix):
    bad = int(np.argmax(np.any(m != prefix, axis=1)))
    raise ValueError(f"packing needs each row's real tokens first (row {bad} "
                     "has padding before a real token).")
  return n_B.astype(np.int64)


def num_packed_rows(bins: int, rows_per_micro: int) -> int:
  """`bins` rounded up to `rows_per_micro × 2^k` (few distinct compiles)."""
  micro = max(-(-bins // rows_per_micro), 1)
  return rows_per_micro * (1 << (micro - 1).bit_length())


def plan(input_mask_BT: np.ndarray, pack_length: int,
         rows_per_micro: int) -> PackPlan:
  """First-fit-decreasing packing of the rows' real tokens.

  Args:
    input_mask_BT: 1 on real (prompt and response) tokens, a prefix per row.
    pack_length: P, tokens per packed row.
    rows_per_micro: packed rows per micro-batch; the row count is a multiple.

  Returns:
    The numpy `PackPlan`.

  Raises:
    ValueError: a row longer than `pack_length`, or a row with a gap.
  """
  n_B = row_lengths(input_mask_BT)
  b, l = np.shape(input_mask_BT)
  if n_B.max(initial=0) > pack_length:
    raise ValueError(f"a row of {n_B.max()} tokens does not fit "
                     f"learner.pack_length={pack_length}; raise it to at least "
                     "the prompt budget + the response budget.")
  free, members = [], []
  for i in sorted(range(b), key=lambda i: -n_B[i]):
    if n_B[i] == 0:
      continue
    for j, room in enumerate(free):
      if room >= n_B[i]:
        free[j] -= n_B[i]
        members[j].append(i)
        break
    else:
      free.append(pack_length - n_B[i])
      members.append([i])
  r = num_packed_rows(len(members), rows_per_micro)
  src = np.full((r, pack_length), -1, np.int32)
  seg = np.zeros((r, pack_length), np.int32)
  pos = np.zeros((r, pack_length), np.int32)
  for j, rows in enumerate(members):
    at = 0
    for s, i in enumerate(sorted(rows), start=1):
      n = n_B[i]
      src[j, at:at + n] = i * l + np.arange(n)
      seg[j, at:at + n] = s
      pos[j, at:at + n] = np.arange(n)
      at += n
  return PackPlan(src, seg, pos)


def gather(x_BT: jax.Array, src_RP: jax.Array, fill=0) -> jax.Array:
  """Unpacked per-token values (`[B, T, ...]`) → packed rows (`fill` on padding)."""
  flat = x_BT.reshape((-1,) + x_BT.shape[2:])
  keep = (src_RP >= 0).reshape(src_RP.shape + (1,) * (x_BT.ndim - 2))
  return jnp.where(keep, flat[jnp.maximum(src_RP, 0)], jnp.asarray(fill, x_BT.dtype))


def gather_rows(x_B: jax.Array, src_RP: jax.Array, length: int) -> jax.Array:
  """A per-row value (an advantage) → every packed token of that row."""
  return jnp.where(src_RP >= 0, x_B[jnp.maximum(src_RP, 0) // length],
                   jnp.zeros((), x_B.dtype))


def scatter(x_RP: jax.Array, src_RP: jax.Array, shape: tuple[int, int], fill=0) -> jax.Array:
  """Packed per-token values (`[R, P, ...]`) → the unpacked `[B, T, ...]` layout
  (`fill` elsewhere)."""
  size = shape[0] * shape[1]
  rest = x_RP.shape[2:]
  index = jnp.where(src_RP >= 0, src_RP, size).reshape(-1)
  out = jnp.full((size,) + rest, fill, x_RP.dtype).at[index].set(
      x_RP.reshape((-1,) + rest), mode="drop")
  return out.reshape(tuple(shape) + rest)
