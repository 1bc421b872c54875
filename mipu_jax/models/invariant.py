"""Batch-invariant arithmetic: the true on-policy mode's building blocks (docs/method.md §7).

In the mode the sampler's log-probs and the learner's are bitwise equal. A
jitted `x @ w` on XLA:CPU can give a row other bits when the batch has another
number of rows, so nothing here lets a token's arithmetic depend on the batch:

- `map_rows`: every per-token computation (norms, RoPE, projections, MLP, LM
  head, log-softmax) runs on fixed tiles of `TILE` rows, one `lax.map` step per
  tile: the same program whatever the row count, the token's place in its
  tile or its neighbours (bench/perf/true_on_policy.py measures it at the model's
  own shapes);
- `attend_rows` (the learner's rows, packed or padded) and `attend_paged` (the
  sampler's paged cache, prefill and decode) compute each query the same way:
  key blocks of `KEY_BLOCK` positions counted from its sequence's position 0,
  in order, with one online-softmax step (`_block_step`). A block past the
  query's position adds exact zeros, so the blocks a tile loops over beyond a
  query's own change nothing.

Shape letters: M tokens (flattened rows), t a tile's rows, N query heads,
K kv heads, Q = N // K, H head dim, G key-block positions, J page columns,
V vocab.
"""

import jax
import jax.numpy as jnp

from mipu_jax.models import kv_cache
from mipu_jax.models import sharding

TILE = 32  # rows of every per-token tile
KEY_BLOCK = 16  # key positions per attention block (the sampler's page size)
NEG_INF = float(jnp.finfo(jnp.float32).min)


def replicated(tree):
  """`tree` constrained to every device of the active mesh (a no-op without
  one, or inside `per_row_shard`): a contraction split over devices would sum
  in another order."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.manual_axes:
    return tree
  spec = jax.sharding.PartitionSpec()
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, spec), tree)


def per_row_shard(fn, whole, *rows):
  """`fn(whole, *rows)` on each device with its shard of the rows (`rows`'
  leading axis over the active mesh's row axes, `shard_map`) and all of
  `whole`: every row's arithmetic here is its own, so its bits do not depend on
  the split. Without a mesh, or with rows its shards do not divide, replicated
  (its tile loops then split their tokens: `map_rows`)."""
  mesh = jax.sharding.get_abstract_mesh()
  axes = sharding.split_axes(mesh)
  if not axes or rows[0].shape[0] % sharding.row_shards(mesh):
    return fn(*replicated((whole,) + rows))
  spec = jax.sharding.PartitionSpec
  return jax.shard_map(fn, mesh=mesh, in_specs=(spec(),) + (spec(axes),) * len(rows),
                       out_specs=spec(axes), check_vma=False)(whole, *rows)


def map_rows(fn, *xs_M):
  """`fn` over `[TILE, ...]` tiles of the `[M, ...]` arrays `xs_M`, one loop
  step per tile (rows padded with zeros), outputs back to `[M, ...]`. On a
  mesh each device maps its own rows (XLA cannot split a loop's steps over
  devices: it would run every tile on each)."""
  m = xs_M[0].shape[0]
  mesh = jax.sharding.get_abstract_mesh()
  axes = sharding.split_axes(mesh)
  if axes:  # rows padded with zeros to a multiple of the row shards
    grow = lambda x: jnp.pad(x, [(0, -m % sharding.row_shards(mesh))] + [(0, 0)] * (x.ndim - 1))
    spec = jax.sharding.PartitionSpec(axes)
    out = jax.shard_map(lambda *xs: map_rows(fn, *xs), mesh=mesh, in_specs=(spec,) * len(xs_M),
                        out_specs=spec, check_vma=False)(*map(grow, xs_M))
    return jax.tree.map(lambda y: y[:m], out)
  n = max(-(-m // TILE), 1)
  pad = n * TILE - m
  tiles = tuple(
      jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape((n, TILE) + x.shape[1:])
      for x in xs_M)
  out = jax.lax.map(lambda t: fn(*t), tiles)
  return jax.tree.map(lambda y: y.reshape((n * TILE,) + y.shape[2:])[:m], out)


def online_softmax_step(carry, s, v, pv: str):
  """One key block of the online softmax: the float32 state `(m, l, acc)`
  (running max, sum, weighted values) updated by the block's scores `s` (keys
  last) and values `v`; `pv` is the einsum of probabilities and values. Also
  the blockwise attention's step (`attention.py`)."""
  m, l, acc = carry
  m_new = jnp.maximum(m, s.max(-1))
  p = jnp.exp(s - m_new[..., None])
  corr = jnp.exp(m - m_new)
  acc = acc * corr[..., None] + jnp.einsum(pv, p.astype(v.dtype), v,
                                           preferred_element_type=jnp.float32)
  return m_new, l * corr + p.sum(-1), acc


def _block_step(carry, q_tKQH, k_tKGH, v_tKGH, valid_tG):
  """One key block of the online softmax for a tile of queries (float32 state).

  Both sides hand the keys and values in as `[t, K, G, H]`, the paged cache's
  own layout: with the learner's keys as `[t, G, K, H]` into the same einsum,
  XLA:CPU summed the scores' contraction over H in another order at some head
  dims (6 and 10 in float32), and the two sides' bits parted (docs/method.md §7)."""
  h = q_tKQH.shape[-1]
  s_tKQG = jnp.einsum("tKQH,tKGH->tKQG", q_tKQH, k_tKGH,
                      preferred_element_type=jnp.float32) * (h ** -0.5)
  s_tKQG = jnp.where(valid_tG[:, None, None, :], s_tKQG, NEG_INF)
  return online_softmax_step(carry, s_tKQG, v_tKGH, "tKQG,tKGH->tKQH")


def _attend_tile(q_tNH, pos_t, kh: int, dtype, keys):
  """A tile of queries over their key blocks 0 .. max(pos) // G; `keys(j)` is
  block j's `(k_tKGH, v_tKGH)` for each query (any values where not valid)."""
  t, n, h = q_tNH.shape
  q_tKQH = q_tNH.reshape(t, kh, n // kh, h)
  g_G = jnp.arange(KEY_BLOCK, dtype=jnp.int32)

  def step(j, carry):
    k_tKGH, v_tKGH = keys(j)
    valid_tG = (j * KEY_BLOCK + g_G[None, :]) <= pos_t[:, None]
    return _block_step(carry, q_tKQH, k_tKGH, v_tKGH, valid_tG)

  init = (jnp.full((t, kh, n // kh), NEG_INF, jnp.float32),
          jnp.zeros((t, kh, n // kh), jnp.float32),
          jnp.zeros((t, kh, n // kh, h), jnp.float32))
  _, l_tKQ, acc_tKQH = jax.lax.fori_loop(0, jnp.max(pos_t) // KEY_BLOCK + 1, step, init)
  return (acc_tKQH / l_tKQ[..., None]).reshape(t, n, h).astype(dtype)


def attend_rows(q_BTNH, k_BTKH, v_BTKH, positions_BT):
  """Causal attention of rows attending to themselves (the learner's forward):
  each token is a sequence's position `positions_BT` (padded rows and packed
  segments alike), its sequence's tokens contiguous in the row before it.
  `[B, T, N, H]` in the dtype of `v`."""
  b, t, n, h = q_BTNH.shape
  kh = k_BTKH.shape[2]
  k_MKH, v_MKH = k_BTKH.reshape(b * t, kh, h), v_BTKH.reshape(b * t, kh, h)
  row_M = jnp.repeat(jnp.arange(b, dtype=jnp.int32), t)
  col_M = jnp.tile(jnp.arange(t, dtype=jnp.int32), b)
  pos_M = positions_BT.reshape(-1).astype(jnp.int32)

  def tile(q_tNH, row_t, col_t, pos_t):
    start_t = col_t - pos_t  # the row position of the sequence's position 0

    def keys(j):
      at_tG = start_t[:, None] + (j * KEY_BLOCK + jnp.arange(KEY_BLOCK, dtype=jnp.int32))[None, :]
      flat_tG = row_t[:, None] * t + jnp.clip(at_tG, 0, t - 1)
      return (jnp.swapaxes(jnp.take(k_MKH, flat_tG, axis=0), 1, 2),
              jnp.swapaxes(jnp.take(v_MKH, flat_tG, axis=0), 1, 2))

    return _attend_tile(q_tNH, pos_t, kh, v_BTKH.dtype, keys)

  out_MNH = map_rows(tile, q_BTNH.reshape(b * t, n, h), row_M, col_M, pos_M)
  return out_MNH.reshape(b, t, n, h)


def attend_paged(q_BTNH, cache: kv_cache.LayerCache, dtype):
  """`attend_rows`' arithmetic over one layer's paged cache (the sampler's
  prefill and decode): query t of row b is position `cache.q_slot_BT[b, t]`
  of its row, and key block j is the row's page column j (pages of
  `KEY_BLOCK` slots). `[B, T, N, H]` in `dtype`."""
  b, t, n, h = q_BTNH.shape
  if cache.k.shape[2] != KEY_BLOCK:
    raise ValueError(f"the batch-invariant attention reads pages of {KEY_BLOCK} slots, "
                     f"not {cache.k.shape[2]}.")
  kh, j = cache.k.shape[0], cache.page_ids_BJ.shape[1]
  pages_MJ = jnp.repeat(cache.page_ids_BJ, t, axis=0)
  pos_M = cache.q_slot_BT.reshape(-1).astype(jnp.int32)

  def tile(q_tNH, pages_tJ, pos_t):
    def keys(col):
      ids_t = jax.lax.dynamic_index_in_dim(pages_tJ, jnp.minimum(col, j - 1), axis=1,
                                           keepdims=False)
      return (kv_cache.read_pages(cache.k, cache.k_scale, ids_t, dtype),
              kv_cache.read_pages(cache.v, cache.v_scale, ids_t, dtype))

    return _attend_tile(q_tNH, pos_t, kh, dtype, keys)

  out_MNH = map_rows(tile, q_BTNH.reshape(b * t, n, h), pages_MJ, pos_M)
  return out_MNH.reshape(b, t, n, h)


def head_logprobs(logits_fn, h_MD, temperature_M, targets_M):
  """The LM head and its log-softmax, per tile: `(logp_MV, lp_M, entropy_M)`,
  `logp` the float32 log-probs of `softmax(logits / t)` (t = 1 where the
  temperature is 0: greedy), `lp` those of `targets_M`. The sampler draws from
  `logp` and reads its token's entry; the learner reads `lp`: one arithmetic."""

  def tile(h_tD, temp_t, target_t):
    logits_tV = logits_fn(h_tD[None])[0].astype(jnp.float32)
    t_t = jnp.where(temp_t > 0, temp_t, 1.0).astype(jnp.float32)
    logp_tV = jax.nn.log_softmax(logits_tV / t_t[:, None], axis=-1)
    lp_t = jnp.take_along_axis(logp_tV, target_t[:, None], axis=-1)[:, 0]
    ent_t = -jnp.sum(jnp.exp(logp_tV) * logp_tV, axis=-1)
    return logp_tV, lp_t, ent_t

  return map_rows(tile, h_MD, temperature_M.astype(jnp.float32),
                  targets_M.astype(jnp.int32))
