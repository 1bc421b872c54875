"""The decoder's paged KV cache: a page pool, a page table per row, in-place writes.

Layout (docs/method.md §7). Keys and values live in one pool per tensor,
`[K, D * L * P, G, H]`: K kv heads; D parts (one per row shard of a mesh,
else 1), each holding the P pages of each of the L layers side by side (part
d's page p of layer l is pool page `d * L * P + l * P + p`); G slots per
page, H head dim: the paged-attention kernels' layout (`k_pages[K, pages,
page_size, H]`) with the layer folded into the page axis, so one array serves
every layer of the layer scan and a layer never slices itself out of the pool
(a copy of its whole cache at every decode step); it reads and writes through
page ids offset by `l * P` (`LayerCache`). Sharding the page axis over the
row axes gives each device its part: its rows' pages, every layer.

Row b's slot s lives at pool page `pages[b, s // G]`, offset `s % G`, and
its cache is the run of slots `[0, index[b])`: no holes, so attention masks
by length. A contiguous cache is the identity table; the sampler's decode
state shares a prompt's full pages among its samples, each with its own copy
of the partly filled last page (`mipu_jax/sampler/_steps.py`). New entries
are one scatter into the donated pool (in place; tests/test_kv_cache.py
checks the compiled step for cache-sized copies).

Shape letters: B rows, T new positions, S slots per row (J pages of G),
K kv heads, H head dim, L layers, P pages per layer of a part, D parts.
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from mipu_jax.models import sharding

# Default page size: the largest power of two up to this that divides a row.
# Decode attention runs one loop step per page: bigger pages mean fewer steps
# (XLA:CPU pays a few microseconds per loop step), smaller pages less waste at
# each row's ends. bench/perf/decode.py measures it.
DEFAULT_PAGE_SIZE = 64


class KVCache(NamedTuple):
  """A paged key/value cache (module docstring).

  Attributes:
    k: [K, D * L * P, G, H] keys in the cache dtype (int8 with `k_scale`).
    v: [K, D * L * P, G, H] values.
    k_scale: [K, D * L * P, G, 1] float32 absmax scales when the cache is int8, else None.
    v_scale: as `k_scale`.
    pages: [B, J] int32, row b's j-th page (slots j*G .. j*G+G-1) in layer 0.
    index: [B] int32, each row's length: its cache is slots `[0, index[b])`
      and a call writes its T entries at `index[b] ..` (past the end:
      dropped). Rows advance on their own (a sampler slot refilled with a new
      request restarts its row).
  """

  k: jax.Array
  v: jax.Array
  k_scale: Optional[jax.Array]
  v_scale: Optional[jax.Array]
  pages: jax.Array
  index: jax.Array

  @property
  def page_size(self) -> int:
    return self.k.shape[2]

  @property
  def slots(self) -> int:
    """S, the slots of a row's page table."""
    return self.pages.shape[1] * self.page_size

  def pages_per_layer(self, num_layers: int, parts: int = 1) -> int:
    """P, the pages of a layer in one of the pool's `parts` (the layer stride)."""
    return self.k.shape[1] // (num_layers * parts)


class LayerCache(NamedTuple):
  """One layer's view of a `KVCache` in the layer scan: what its attention writes and reads.

  Attributes:
    k, v, k_scale, v_scale: the pools of every layer (`KVCache`).
    page_ids_BJ: row b's j-th page of this layer in the pools (`pages + layer * P`).
    q_slot_BT: the slots of the call's T new entries, `index[b] + t`; query t
      attends the row's slots `[0, q_slot]`.
  """

  k: jax.Array
  v: jax.Array
  k_scale: Optional[jax.Array]
  v_scale: Optional[jax.Array]
  page_ids_BJ: jax.Array
  q_slot_BT: jax.Array

  def append(self, k_BTKH, v_BTKH, mask_BT, kv_round=None) -> "LayerCache":
    """The view with the new K/V written at `q_slot_BT` where `mask_BT`
    (quantized to the pool dtype; one scatter per pool, in place)."""
    page_BT, off_BT = write_targets(self.page_ids_BJ, self.q_slot_BT, mask_BT, self.k.shape[2])
    kq, ks = quantize(k_BTKH, self.k.dtype, kv_round)
    vq, vs = quantize(v_BTKH, self.v.dtype, kv_round)
    k, v = write(self.k, kq, page_BT, off_BT), write(self.v, vq, page_BT, off_BT)
    k_scale, v_scale = self.k_scale, self.v_scale
    if k_scale is not None:
      k_scale, v_scale = write(k_scale, ks, page_BT, off_BT), write(v_scale, vs, page_BT, off_BT)
    return self._replace(k=k, v=v, k_scale=k_scale, v_scale=v_scale)


def page_size_for(*lengths: int, maximum: int = DEFAULT_PAGE_SIZE) -> int:
  """The largest power of two ≤ `maximum` that divides every length."""
  if maximum < 1:
    raise ValueError(f"page size must be >= 1, got {maximum}.")
  g = 1
  while g * 2 <= maximum and all(n % (g * 2) == 0 for n in lengths):
    g *= 2
  return g


def init_pool(cfg, num_pages: int, page_size: int, dtype):
  """Empty `(k, v, k_scale, v_scale)` pools of `num_pages` pages per layer."""
  dtype = jnp.dtype(dtype)
  shape = (cfg.num_kv_heads, cfg.num_layers * num_pages, page_size, cfg.head_dim)
  scale = None
  if dtype == jnp.int8:
    scale = jnp.ones(shape[:-1] + (1,), jnp.float32)
  return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), scale, scale


def init_cache(cfg, batch: int, max_len: int, dtype=jnp.bfloat16, *,
               page_size: Optional[int] = None) -> KVCache:
  """An empty contiguous cache of `max_len` slots per row (identity page table).

  Args:
    cfg: the model's `Qwen3Config`.
    batch: rows.
    max_len: slots per row.
    dtype: float32 / bfloat16 / float8_* / int8.
    page_size: slots per page; must divide `max_len` (default:
      `page_size_for(max_len)`).
  """
  g = page_size_for(max_len) if page_size is None else page_size
  if max_len % g:
    raise ValueError(f"page_size {g} does not divide the {max_len} slots of a row.")
  j = max_len // g
  k, v, ks, vs = init_pool(cfg, batch * j, g, dtype)
  pages = jnp.arange(batch * j, dtype=jnp.int32).reshape(batch, j)
  return KVCache(k=k, v=v, k_scale=ks, v_scale=vs, pages=pages,
                 index=jnp.zeros((batch,), jnp.int32))


def quantize(x, dtype, kv_round=None):
  """Casts new K/V to the cache dtype; int8 uses per-(token, head) absmax scales.

  `kv_round` (a float dtype): round through it first, i.e. keep a cache of that
  dtype's values in a wider float array (the sampler's `kv_cache_storage='fake'`).
  """
  if kv_round is not None:
    return x.astype(kv_round).astype(dtype), None
  if dtype == jnp.int8:
    scale = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=-1, keepdims=True) / 127.0
    scale = jnp.where(scale == 0, 1.0, scale)
    q = jnp.clip(jnp.round(x.astype(jnp.float32) / scale), -127, 127).astype(jnp.int8)
    return q, scale
  return x.astype(dtype), None


def is_float8(dtype) -> bool:
  return jnp.dtype(dtype).itemsize == 1 and jnp.issubdtype(dtype, jnp.floating)


_BITS = {1: jnp.uint8, 2: jnp.uint16}


def _narrow_float(dtype) -> bool:
  dtype = jnp.dtype(dtype)
  return jnp.issubdtype(dtype, jnp.floating) and dtype.itemsize in _BITS


def scatter_set(pool, index, new):
  """`pool.at[index].set(new, mode="drop")`, in place on a donated pool.

  XLA:CPU has no scatter for floats narrower than 32 bits: it would convert
  the whole pool to float32, scatter, and convert back, on every write
  (tests/test_kv_cache.py finds such a convert in the compiled step). FP8 and
  bfloat16 pools are scattered as the same bytes in unsigned integers.
  """
  new = new.astype(pool.dtype)
  if not _narrow_float(pool.dtype):
    return pool.at[index].set(new, mode="drop")
  bits = _BITS[pool.dtype.itemsize]
  as_bits = lambda a: jax.lax.bitcast_convert_type(a, bits)
  out = as_bits(pool).at[index].set(as_bits(new), mode="drop")
  return jax.lax.bitcast_convert_type(out, pool.dtype)


def write_targets(page_ids_BJ, slots_BT, mask_BT, page_size: int):
  """Pool pages and offsets of each row's T new entries at `slots_BT`; where
  `mask_BT` is False (padding, an idle row) or past the row's end: an
  out-of-range page id (the write is dropped)."""
  j = page_ids_BJ.shape[1]
  page_BT = jnp.take_along_axis(page_ids_BJ, jnp.clip(slots_BT // page_size, 0, j - 1), axis=1)
  inside = (slots_BT < j * page_size) & mask_BT
  return jnp.where(inside, page_BT, jnp.iinfo(jnp.int32).max), slots_BT % page_size


def write(pool, new_BTKH, page_BT, off_BT):
  """Writes the new entries into the pool (one scatter; in place on a donated pool)."""
  return scatter_set(pool, (slice(None), page_BT, off_BT), jnp.moveaxis(new_BTKH, 2, 0))


def read_pages(pool, scale, page_ids_B, dtype):
  """One page of each row, `[B, K, G, H]` in `dtype` (dequantized): a gather of B
  pages, the only cache bytes a decode-attention step reads."""
  # Page ids come from the cache's own page table: in bounds. With "clip"
  # (XLA's gather clamps anyway) the gather is not followed by jnp.take's
  # default select that fills out-of-bounds pages with NaN: a second pass over
  # the gathered pages at every page step (bench/README.md, "Sampler").
  take = functools.partial(jnp.take, indices=page_ids_B, axis=1, mode="clip")
  if _narrow_float(pool.dtype):
    # As in `scatter_set`: gathered as bytes, or XLA:CPU converts the whole
    # pool to float32 first (no float8 gather; a bfloat16 one that its
    # simplifier widens ahead of the float32 dot).
    bits = jax.lax.bitcast_convert_type(pool, _BITS[pool.dtype.itemsize])
    x = jax.lax.bitcast_convert_type(take(bits), pool.dtype)
  else:
    x = take(pool)
  x = jnp.moveaxis(x, 1, 0)
  if scale is None:
    return x.astype(dtype)
  s = jnp.moveaxis(take(scale), 1, 0)
  return (x.astype(jnp.float32) * s).astype(dtype)


def logical_view(pool, scale, page_ids_BJ, dtype):
  """A layer's whole cache as `[B, S, K, H]` (every page of every row; `page_ids_BJ`
  with the layer's offset): the dense reference path's input, a cache-sized gather."""
  b, j = page_ids_BJ.shape
  x_BKGH = read_pages(pool, scale, page_ids_BJ.reshape(-1), dtype)  # [B*J, K, G, H]
  k, g, h = x_BKGH.shape[1:]
  return jnp.moveaxis(x_BKGH.reshape(b, j, k, g, h), 2, 3).reshape(b, j * g, k, h)


def per_shard(fn, rows: int, kv_heads: int, pool_parts: int):
  """`fn(q, pools, page_ids, per_row)` under `shard_map` on the ambient mesh (else `fn`):
  rows over the data axes that divide them, kv heads (and their query heads) over `tensor`,
  a pool of parts split with the rows, its page ids made local (modulo the part's size)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return fn
  row_axes, shards = sharding.row_axes(mesh), sharding.row_shards(mesh)
  if pool_parts > 1 and (pool_parts != shards or rows % shards):
    raise ValueError(f"a pool of {pool_parts} parts needs as many row shards, and {rows} "
                     f"rows split over them; the mesh has {shards}.")
  r = row_axes if row_axes and rows % shards == 0 else None
  tensor = mesh.shape.get("tensor", 0)
  heads = "tensor" if tensor and kv_heads % tensor == 0 else None
  spec = jax.sharding.PartitionSpec
  pool = spec(heads, r if pool_parts > 1 else None, None, None)

  def run(q, pools, page_ids, per_row):
    q_spec = spec(r, *[None] * (q.ndim - 3), heads, None)
    local = lambda q, pools, ids, per_row: fn(q, pools, ids % pools[0].shape[1], per_row)
    return jax.shard_map(
        local, mesh=mesh, check_vma=False, out_specs=q_spec,
        in_specs=(q_spec, tuple(None if x is None else pool for x in pools), spec(r, None),
                  spec(r, *[None] * (per_row.ndim - 1))))(q, pools, page_ids, per_row)
  return run
