"""TPU splash attention through jax's kernel, per example (docs/method.md §7).

`attend` runs `jax.experimental.pallas.ops.tpu.splash_attention` on rows `attention.attend` has
padded to whole tiles: causal by slot, a key attended only by queries of its own segment (padding
keys carry a segment no query has). Off a TPU it runs in Pallas' TPU interpreter by default (as
`paged_tpu.decode`), so tests check it on CPU against the dense reference.

Shape letters: B batch, T slots (a multiple of the tile), N query heads, K kv heads, H head dim.
"""

from typing import Optional

import jax
import jax.numpy as jnp


def attend(q_BTNH, k_BTKH, v_BTKH, q_seg_BT, k_seg_BT, block: int, *,
           interpret: Optional[bool] = None):
  """Causal attention within segments, `[B, T, N, H]` in `q`'s dtype; `block`: the query and key
  tile (it divides T); `interpret`: run in Pallas' interpreter (default: off a TPU)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=g-import-not-at-top

  if interpret is None:
    interpret = jax.default_backend() != "tpu"
  _, t, n, h = q_BTNH.shape
  kh = k_BTKH.shape[2]
  bq = bk = block
  blocks = splash.BlockSizes(block_q=bq, block_kv=bk, block_kv_compute=bk,
                             block_q_dkv=bq, block_kv_dkv=bk,
                             block_kv_dkv_compute=bk, block_q_dq=bq, block_kv_dq=bk)
  heads = splash.MultiHeadMask([splash.CausalMask((t, t))] * n)
  kernel = splash.make_splash_mha(heads, block_sizes=blocks, head_shards=1,
                                  q_seq_shards=1, interpret=interpret)
  q_NTH = jnp.swapaxes(q_BTNH, 1, 2) * jnp.asarray(h ** -0.5, q_BTNH.dtype)
  k_NTH = jnp.repeat(jnp.swapaxes(k_BTKH, 1, 2), n // kh, axis=1)
  v_NTH = jnp.repeat(jnp.swapaxes(v_BTKH, 1, 2), n // kh, axis=1)

  def one(q, k, v, q_seg, k_seg):
    return kernel(q, k, v, segment_ids=splash.SegmentIds(q=q_seg, kv=k_seg))

  out_BNTH = jax.vmap(one)(q_NTH, k_NTH, v_NTH, q_seg_BT, k_seg_BT)
  return jnp.swapaxes(out_BNTH, 1, 2)
