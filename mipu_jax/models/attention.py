"""Attention behind one switch: dense (the reference), blockwise, cuDNN, TPU splash;
and over a paged KV cache, `decode` (docs/method.md §7).

Every implementation computes the same function of the same inputs
(`attend`), with one mask model for all uses (learner rows, packed rows,
prefill into a KV cache, decode): each query has a slot and a segment id,
each key a slot, a segment id and a validity bit, and

  query t attends key s  iff  k_slot[s] <= q_slot[t]
                              and k_seg[s] == q_seg[t] and k_valid[s].

Slots are positions in the row (or the cache), not RoPE positions: causality
is by slot, and RoPE positions may restart in each packed segment. A query
whose every key is masked (a padding query) averages all keys uniformly in
every implementation; callers ignore its output.

- `dense`: scores `[B, K, Q, T, S]` in fp32, masked softmax; the reference.
- `blockwise`: flash-style tiles, an online softmax over key tiles, and a
  custom VJP recomputing each tile from the saved log-sum-exp
  (FlashAttention-2's backward); pure JAX, runs everywhere.
- `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")` on GPU, for
  right-padded rows; packed rows use `blockwise`.
- `splash`: TPU splash attention with segment ids, per example (`splash_tpu`).
- `cpu_fused`: `dense`'s function as one XLA:CPU kernel, forward and backward,
  through jax's FFI, float32 (`cpu_attention`); within float32 rounding of
  `dense`, not bitwise.
- `auto` (the default): `cpu_fused` on a CPU in float32 where the kernel builds,
  else `dense` (`resolve`).

Over a cache, `decode` runs the `DecodeImpl` the engine resolved: `paged`
(pure XLA), jax's TPU kernel (`paged_tpu`), our GPU kernel (`paged_pallas`) or
`dense` over the gathered cache (the reference).

Shape letters: B batch, T query slots, S key slots, N query heads, K kv heads,
Q = N // K query heads per kv head, H head dim; in the flash kernel I query
blocks, t / s the query / key positions of one tile.
"""

from __future__ import annotations

import functools
import logging
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from mipu_jax.models import cpu_attention
from mipu_jax.models import invariant
from mipu_jax.models import kv_cache
from mipu_jax.models import paged_pallas
from mipu_jax.models import paged_tpu
from mipu_jax.models import splash_tpu

IMPLEMENTATIONS = ("auto", "dense", "blockwise", "cudnn", "splash", "cpu_fused")
NEG_INF = float(jnp.finfo(jnp.float32).min)


class AttentionMask(NamedTuple):
  """The mask model of the module docstring: each query's and key's slot and
  segment (int32), and whether the key holds a real token."""
  q_slot_BT: jax.Array
  q_seg_BT: jax.Array
  k_slot_BS: jax.Array
  k_seg_BS: jax.Array
  k_valid_BS: jax.Array

  def dense_BTS(self) -> jax.Array:
    """The full `[B, T, S]` boolean mask."""
    return self.tile(slice(None), slice(None))

  def tile(self, q: slice | jax.Array, k: slice | jax.Array) -> jax.Array:
    """The mask of the queries `q` and keys `k` (index arrays or slices)."""
    causal = self.k_slot_BS[:, None, k] <= self.q_slot_BT[:, q, None]
    same = self.k_seg_BS[:, None, k] == self.q_seg_BT[:, q, None]
    return causal & same & self.k_valid_BS[:, None, k]


def row_mask(mask_BT: jax.Array, segment_ids_BT: jax.Array | None = None) -> AttentionMask:
  """The mask of rows attending to themselves: slots 0..T-1, padding invalid.

  Args:
    mask_BT: 1 on real tokens.
    segment_ids_BT: packed rows' segment of each token (None: one per row).
  """
  b, t = mask_BT.shape
  slot_BT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  seg_BT = (jnp.zeros((b, t), jnp.int32) if segment_ids_BT is None
            else segment_ids_BT.astype(jnp.int32))
  return AttentionMask(slot_BT, seg_BT, slot_BT, seg_BT, mask_BT.astype(bool))


def cache_mask(index_B: jax.Array, t: int, s: int) -> AttentionMask:
  """The mask of `t` new queries written at cache slots `index_B[b] ..` of
  row b, over a cache of `s` slots per row: a row's cache has no holes
  (`kv_cache.KVCache`), so query t attends slots `[0, index_B[b] + t]`."""
  b = index_B.shape[0]
  q_BT = index_B.astype(jnp.int32)[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
  k_BS = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
  return AttentionMask(q_BT, jnp.zeros((b, t), jnp.int32), k_BS,
                       jnp.zeros((b, s), jnp.int32), jnp.ones((b, s), bool))


def attend(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array,
           mask: AttentionMask, *, implementation: str = "dense",
           block_q: int = 512, block_k: int = 512,
           prefix_rows: bool = False) -> jax.Array:
  """Softmax attention of `q` over `k`, `v` (RoPE applied) under `mask`;
  `[B, T, N, H]` in the dtype of `v`.

  `implementation`: one of `IMPLEMENTATIONS`; `block_q`, `block_k`: the tiles
  of `blockwise` (and splash's blocks); `prefix_rows`: the mask is `row_mask`
  of rows whose valid tokens are a prefix and no segments (what `cudnn`
  supports; otherwise it falls back to `blockwise`).
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"unknown attention {implementation!r}; choose one of "
                     f"{IMPLEMENTATIONS}.")
  implementation = resolve(implementation, q_BTNH.dtype, k_BSKH.dtype, v_BSKH.dtype)
  b, t, n, h = q_BTNH.shape
  kh = k_BSKH.shape[2]
  q_BTKQH = q_BTNH.reshape(b, t, kh, n // kh, h)
  if implementation == "dense" or t == 1:
    # One query row (decode) holds [B, K, Q, 1, S] scores: nothing to tile.
    out = _dense(q_BTKQH, k_BSKH, v_BSKH, mask.dense_BTS())
  elif implementation == "cpu_fused":
    return cpu_attention.attend(q_BTNH, k_BSKH, v_BSKH, mask.dense_BTS())
  elif implementation == "cudnn" and prefix_rows:
    return _cudnn(q_BTNH, k_BSKH, v_BSKH, mask)
  elif implementation == "splash" and mask.q_slot_BT.shape == mask.k_slot_BS.shape:
    return _splash(q_BTNH, k_BSKH, v_BSKH, mask, block_q, block_k)
  else:
    out = _blockwise(q_BTKQH, k_BSKH, v_BSKH, mask, block_q, block_k)
  return out.reshape(b, t, n, h)


def resolve(implementation: str, *dtypes) -> str:
  """The implementation `attend` runs for `implementation` on q, k, v of
  `dtypes`: "auto" is `cpu_fused` on a CPU where all are float32 and the kernel
  builds (one warning when it cannot), else `dense` (docs/method.md §7); any
  other name is itself."""
  if implementation != "auto":
    return implementation
  if jax.default_backend() != "cpu" or any(jnp.dtype(d) != jnp.float32 for d in dtypes):
    return "dense"
  why = cpu_attention.error()
  if why:
    _warn_auto_without_kernel(why)
    return "dense"
  return "cpu_fused"


@functools.cache
def _warn_auto_without_kernel(why: str) -> None:  # once per process and reason
  logging.warning('attention="auto" runs "dense" on this CPU instead of the fused kernel '
                  '("cpu_fused"): %s.', why)


def _dense(q_BTKQH, k_BSKH, v_BSKH, mask_BTS):
  h = q_BTKQH.shape[-1]
  scores_BKQTS = jnp.einsum("BTKQH,BSKH->BKQTS", q_BTKQH, k_BSKH,
                            preferred_element_type=jnp.float32) * (h ** -0.5)
  scores_BKQTS = jnp.where(mask_BTS[:, None, None], scores_BKQTS, NEG_INF)
  probs_BKQTS = jax.nn.softmax(scores_BKQTS, axis=-1).astype(v_BSKH.dtype)
  return jnp.einsum("BKQTS,BSKH->BTKQH", probs_BKQTS, v_BSKH)


# --- blockwise ------------------------------------------------------------


def _pad_to(x, axis: int, multiple: int, value=0):
  size = x.shape[axis]
  pad = -size % multiple
  if not pad:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad)
  return jnp.pad(x, widths, constant_values=value)


def _blockwise(q_BTKQH, k_BSKH, v_BSKH, mask: AttentionMask, block_q: int,
               block_k: int):
  t, s = q_BTKQH.shape[1], k_BSKH.shape[1]
  bq, bk = min(block_q, t), min(block_k, s)
  q = _pad_to(q_BTKQH, 1, bq)
  k, v = _pad_to(k_BSKH, 1, bk), _pad_to(v_BSKH, 1, bk)
  m = AttentionMask(_pad_to(mask.q_slot_BT, 1, bq), _pad_to(mask.q_seg_BT, 1, bq),
                    _pad_to(mask.k_slot_BS, 1, bk), _pad_to(mask.k_seg_BS, 1, bk),
                    _pad_to(mask.k_valid_BS, 1, bk, False))
  out = _flash(q, k, v, m, bq, bk)
  return out[:, :t]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q_BTKQH, k_BSKH, v_BSKH, mask, bq, bk):
  return _flash_fwd(q_BTKQH, k_BSKH, v_BSKH, mask, bq, bk)[0]


def _tile_scores(q_BtKQH, k_BsKH, mask: AttentionMask, qi, kj, bq, bk):
  """Scaled, masked fp32 scores of one tile, `[B, K, Q, bq, bk]`."""
  h = q_BtKQH.shape[-1]
  s_BKQts = jnp.einsum("BTKQH,BSKH->BKQTS", q_BtKQH, k_BsKH,
                       preferred_element_type=jnp.float32) * (h ** -0.5)
  rows = qi * bq + jnp.arange(bq)
  cols = kj * bk + jnp.arange(bk)
  return jnp.where(mask.tile(rows, cols)[:, None, None], s_BKQts, NEG_INF)


def _flash_fwd(q_BTKQH, k_BSKH, v_BSKH, mask, bq, bk):
  b, t, kh, per_kv, h = q_BTKQH.shape
  nq, nk = t // bq, k_BSKH.shape[1] // bk

  def q_block(qi):
    q_b = jax.lax.dynamic_slice_in_dim(q_BTKQH, qi * bq, bq, axis=1)

    def k_step(carry, kj):
      k_b = jax.lax.dynamic_slice_in_dim(k_BSKH, kj * bk, bk, axis=1)
      v_b = jax.lax.dynamic_slice_in_dim(v_BSKH, kj * bk, bk, axis=1)
      s = _tile_scores(q_b, k_b, mask, qi, kj, bq, bk)
      return invariant.online_softmax_step(carry, s, v_b, "BKQTS,BSKH->BKQTH"), None

    init = (jnp.full((b, kh, per_kv, bq), NEG_INF, jnp.float32),
            jnp.zeros((b, kh, per_kv, bq), jnp.float32),
            jnp.zeros((b, kh, per_kv, bq, h), jnp.float32))
    (m, l, acc), _ = jax.lax.scan(k_step, init, jnp.arange(nk))
    out_BKQtH = acc / l[..., None]
    return out_BKQtH, m + jnp.log(l)

  out_IBKQtH, lse_IBKQt = jax.lax.map(q_block, jnp.arange(nq))
  out_BTKQH = jnp.moveaxis(out_IBKQtH, (0, 4), (1, 2)).reshape(b, t, kh, per_kv, h)
  out_BTKQH = out_BTKQH.astype(v_BSKH.dtype)
  lse_BKQT = jnp.moveaxis(lse_IBKQt, 0, 3).reshape(b, kh, per_kv, t)
  return out_BTKQH, (q_BTKQH, k_BSKH, v_BSKH, mask, out_BTKQH, lse_BKQT)


def _flash_bwd(bq, bk, residuals, d_out_BTKGH):
  q_BTKQH, k_BSKH, v_BSKH, mask, out_BTKQH, lse_BKQT = residuals
  b, t, kh, per_kv, h = q_BTKQH.shape
  nq, nk = t // bq, k_BSKH.shape[1] // bk
  scale = h ** -0.5
  d_out = d_out_BTKGH.astype(jnp.float32)
  delta_BKQT = jnp.einsum("BTKQH,BTKQH->BKQT", d_out, out_BTKQH.astype(jnp.float32))

  def q_step(carry, qi):
    dk_BSKH, dv_BSKH = carry
    q_b = jax.lax.dynamic_slice_in_dim(q_BTKQH, qi * bq, bq, axis=1)
    do_b = jax.lax.dynamic_slice_in_dim(d_out, qi * bq, bq, axis=1)
    lse_b = jax.lax.dynamic_slice_in_dim(lse_BKQT, qi * bq, bq, axis=3)
    delta_b = jax.lax.dynamic_slice_in_dim(delta_BKQT, qi * bq, bq, axis=3)

    def k_step(inner, kj):
      dq_BtKQH, dk_BSKH, dv_BSKH = inner
      k_b = jax.lax.dynamic_slice_in_dim(k_BSKH, kj * bk, bk, axis=1)
      v_b = jax.lax.dynamic_slice_in_dim(v_BSKH, kj * bk, bk, axis=1)
      s = _tile_scores(q_b, k_b, mask, qi, kj, bq, bk)
      p = jnp.exp(s - lse_b[..., None])  # [B, K, Q, bq, bk]
      dv = jnp.einsum("BKQTS,BTKQH->BSKH", p, do_b)
      dp = jnp.einsum("BTKQH,BSKH->BKQTS", do_b, v_b.astype(jnp.float32))
      ds = p * (dp - delta_b[..., None]) * scale
      dq = jnp.einsum("BKQTS,BSKH->BTKQH", ds, k_b.astype(jnp.float32))
      dk = jnp.einsum("BKQTS,BTKQH->BSKH", ds, q_b.astype(jnp.float32))
      at = kj * bk
      dk_BSKH = jax.lax.dynamic_update_slice_in_dim(
          dk_BSKH, jax.lax.dynamic_slice_in_dim(dk_BSKH, at, bk, 1) + dk, at, 1)
      dv_BSKH = jax.lax.dynamic_update_slice_in_dim(
          dv_BSKH, jax.lax.dynamic_slice_in_dim(dv_BSKH, at, bk, 1) + dv, at, 1)
      return (dq_BtKQH + dq, dk_BSKH, dv_BSKH), None

    init = (jnp.zeros((b, bq, kh, per_kv, h), jnp.float32), dk_BSKH, dv_BSKH)
    (dq_b, dk_BSKH, dv_BSKH), _ = jax.lax.scan(k_step, init, jnp.arange(nk))
    return (dk_BSKH, dv_BSKH), dq_b

  zeros = jnp.zeros(k_BSKH.shape, jnp.float32)
  (dk, dv), dq_IBtKQH = jax.lax.scan(q_step, (zeros, zeros), jnp.arange(nq))
  dq = jnp.moveaxis(dq_IBtKQH, 0, 1).reshape(b, t, kh, per_kv, h)
  return (dq.astype(q_BTKQH.dtype), dk.astype(k_BSKH.dtype),
          dv.astype(v_BSKH.dtype), None)


_flash.defvjp(_flash_fwd, _flash_bwd)


# --- cuDNN and splash -------------------------------------------------------


def _cudnn(q_BTNH, k_BSKH, v_BSKH, mask: AttentionMask):
  lengths_B = mask.k_valid_BS.sum(axis=1).astype(jnp.int32)
  return jax.nn.dot_product_attention(
      q_BTNH, k_BSKH, v_BSKH, is_causal=True, query_seq_lengths=lengths_B,
      key_value_seq_lengths=lengths_B, implementation="cudnn")


def _splash(q_BTNH, k_BSKH, v_BSKH, mask: AttentionMask, block_q: int,
            block_k: int):
  t0 = q_BTNH.shape[1]
  # The kernel's tiles are multiples of 128 lanes; pad the row to a multiple
  # of the tile (padded keys are invalid, padded queries are dropped).
  bq = bk = max(128, min(block_q, block_k) // 128 * 128)
  q_BTNH = _pad_to(q_BTNH, 1, bq)
  k_BSKH, v_BSKH = _pad_to(k_BSKH, 1, bq), _pad_to(v_BSKH, 1, bq)
  q_seg_BT = _pad_to(mask.q_seg_BT, 1, bq)
  k_seg_BT = _pad_to(jnp.where(mask.k_valid_BS, mask.k_seg_BS,
                               jnp.iinfo(jnp.int32).min), 1, bq,
                     jnp.iinfo(jnp.int32).min)
  # Padding keys have a segment no query has; the slots are 0..T-1 (row_mask).
  out_BTNH = splash_tpu.attend(q_BTNH, k_BSKH, v_BSKH, q_seg_BT, k_seg_BT,
                               min(bq, q_BTNH.shape[1]))
  return out_BTNH[:, :t0].astype(v_BSKH.dtype)


# --- paged KV cache ----------------------------------------------------------


class DecodeImpl(NamedTuple):
  """Attention over a KV cache as the engine resolved it: `name` "paged"
  (`paged`), "pallas" (`paged_pallas.decode`), "pallas_tpu" (`paged_tpu.decode`),
  "invariant" (`invariant.attend_paged`, the true on-policy mode) or "dense"
  (the reference); `interpret`: the kernel runs in Pallas'
  interpreter (off the device it is written for); `pool_parts`: the decode
  pool's parts, one per row shard (`kv_cache.py`)."""
  name: str = "paged"
  interpret: bool = False
  pool_parts: int = 1


def _serves(kernel: str, reason: Optional[str]) -> bool:
  """Whether `kernel` serves this call (`reason` None); if not, the caller runs `paged`."""
  if reason is not None:
    _fallback(kernel, reason)
  return reason is None


@functools.cache
def _fallback(kernel: str, reason: str) -> None:  # once per reason
  logging.warning("decode attention runs 'paged' (XLA) instead of %s: %s.", kernel, reason)


def decode(q_BTNH: jax.Array, cache: kv_cache.LayerCache, impl: DecodeImpl,
           dtype) -> jax.Array:
  """Attention of T new queries over one layer's paged cache, which holds them
  already: query t of row b attends slots `[0, cache.q_slot_BT[b, t]]`.

  The kernels take one query per row (a decode step) and the shapes their
  tiles fit (`paged_pallas.unsupported`, `paged_tpu.unsupported`); otherwise
  `paged`, saying why once per reason.
  Returns `[B, T, N, H]` in `dtype`, the compute dtype K/V are dequantized to.
  """
  if impl.name == "invariant":  # the true on-policy mode (docs/method.md §7)
    return _on_parts(lambda q, c: invariant.attend_paged(q, c, dtype), q_BTNH, cache, impl)
  pools = (cache.k, cache.v, cache.k_scale, cache.v_scale, cache.page_ids_BJ)
  _, t, _, h = q_BTNH.shape
  j, g = cache.page_ids_BJ.shape[1], cache.k.shape[2]
  if impl.name == "dense":  # every slot, gathered
    keys_BSKH = kv_cache.logical_view(cache.k, cache.k_scale, cache.page_ids_BJ, dtype)
    values_BSKH = kv_cache.logical_view(cache.v, cache.v_scale, cache.page_ids_BJ, dtype)
    return attend(q_BTNH, keys_BSKH, values_BSKH, cache_mask(cache.q_slot_BT[:, 0], t, j * g))
  lengths_B = cache.q_slot_BT[:, 0] + 1  # one query: the row's length, its own slot included
  if t == 1 and impl.name == "pallas" and _serves("the GPU kernel", paged_pallas.unsupported(
      j, g, h, interpret=impl.interpret)):
    return paged_pallas.decode(q_BTNH, *pools, lengths_B, dtype, interpret=impl.interpret,
                               pool_parts=impl.pool_parts)
  if t == 1 and impl.name == "pallas_tpu" and _serves(
      "jax's TPU paged-attention kernel",
      paged_tpu.unsupported(cache.k.dtype, h, g, on_tpu=not impl.interpret)):
    return paged_tpu.decode(q_BTNH, *pools, lengths_B, dtype, interpret=impl.interpret,
                            pool_parts=impl.pool_parts)
  return _on_parts(lambda q, c: paged(q, c.k, c.v, c.k_scale, c.v_scale, c.page_ids_BJ,
                                      c.q_slot_BT, dtype), q_BTNH, cache, impl)


def _on_parts(attend_view, q_BTNH, cache: kv_cache.LayerCache, impl: DecodeImpl):
  """`attend_view(q, cache)`; with a pool of parts, each row shard on its own part
  (`kv_cache.per_shard`)."""
  if impl.pool_parts == 1:
    return attend_view(q_BTNH, cache)
  run = lambda q, parts, ids, q_slot: attend_view(q, kv_cache.LayerCache(*parts, ids, q_slot))
  return kv_cache.per_shard(run, q_BTNH.shape[0], cache.k.shape[0], impl.pool_parts)(
      q_BTNH, (cache.k, cache.v, cache.k_scale, cache.v_scale), cache.page_ids_BJ,
      cache.q_slot_BT)


def paged(q_BTNH: jax.Array, k_pool: jax.Array, v_pool: jax.Array, k_scale, v_scale,
          page_ids_BJ: jax.Array, q_slot_BT: jax.Array, dtype) -> jax.Array:
  """Attention of each row's T queries over its pages of a paged KV cache.

  Query t of row b (at slot `q_slot_BT[b, t]`) attends slots `[0, q_slot]`
  (a row has no holes). `k_pool`, `v_pool`: `[K, L*P, G, H]` pools
  (`kv_cache.KVCache`), `k_scale`, `v_scale` their int8 scales or None;
  `page_ids_BJ`: row b's j-th page, this layer's offset included. The loop
  runs over page columns up to the page of the batch's last query and
  gathers one page per row per step (`kv_cache.read_pages`): a decode step
  reads the pages of filled slots, not the whole cache. Online softmax in
  float32 (no backward: sampling only). A row's result does not depend on
  the other rows: the pages past its query add exact zeros. Returns
  `[B, T, N, H]` in `dtype`, the compute dtype K/V are dequantized to.
  """
  b, t, n, h = q_BTNH.shape
  kh, g = k_pool.shape[0], k_pool.shape[2]
  j = page_ids_BJ.shape[1]
  per_kv = n // kh
  q_BTKQH = q_BTNH.reshape(b, t, kh, per_kv, h)
  j_hi = jnp.minimum(jnp.max(q_slot_BT) // g + 1, j).astype(jnp.int32)

  def step(j, carry):
    m_BKQT, l_BKQT, acc_BKQTH = carry
    ids_B = jax.lax.dynamic_index_in_dim(page_ids_BJ, j, axis=1, keepdims=False)
    k_BKGH = kv_cache.read_pages(k_pool, k_scale, ids_B, dtype)
    v_BKGH = kv_cache.read_pages(v_pool, v_scale, ids_B, dtype)
    s_BKQTG = jnp.einsum("BTKQH,BKGH->BKQTG", q_BTKQH, k_BKGH,
                         preferred_element_type=jnp.float32) * (h ** -0.5)
    slots_G = j * g + jnp.arange(g, dtype=jnp.int32)
    mask_BTG = slots_G[None, None, :] <= q_slot_BT[:, :, None]
    s_BKQTG = jnp.where(mask_BTG[:, None, None], s_BKQTG, NEG_INF)
    m_new = jnp.maximum(m_BKQT, s_BKQTG.max(-1))
    p_BKQTG = jnp.exp(s_BKQTG - m_new[..., None])
    corr = jnp.exp(m_BKQT - m_new)
    l_new = l_BKQT * corr + p_BKQTG.sum(-1)
    acc = acc_BKQTH * corr[..., None] + jnp.einsum(
        "BKQTG,BKGH->BKQTH", p_BKQTG.astype(dtype), v_BKGH,
        preferred_element_type=jnp.float32)
    return m_new, l_new, acc

  init = (jnp.full((b, kh, per_kv, t), NEG_INF, jnp.float32),
          jnp.zeros((b, kh, per_kv, t), jnp.float32),
          jnp.zeros((b, kh, per_kv, t, h), jnp.float32))
  _, l_BKQT, acc_BKQTH = jax.lax.fori_loop(0, j_hi, step, init)
  out_BKQTH = acc_BKQTH / jnp.where(l_BKQT == 0, 1.0, l_BKQT)[..., None]
  return jnp.moveaxis(out_BKQTH, 3, 1).reshape(b, t, n, h).astype(dtype)
