"""TPU decode attention through jax's maintained paged-attention kernel (docs/method.md §7).

`decode` is `attention.paged` for one query per row, computed by
`jax.experimental.pallas.ops.tpu.paged_attention` (the kernel behind
JetStream's and MaxText's TPU paged attention). Its page layout is our
pool's, `[K, pages, G, H]` (the layer folded into the page axis: a layer's
page ids are offset by the layer), and it masks by length, which is what a
row is (rows have no holes).

Arithmetic: the kernel does not scale the logits, so the query is scaled by
`H ** -0.5` in float32 first; it reads K/V as bfloat16 and computes in
float32, renormalising after every block of pages. A bfloat16 or FP8 cache
holds bfloat16 values, so it reads what `attention.paged` reads. It cannot
take an int8 cache (its `QuantizedTensor` dequantizes `x * h / 127.5` to
bfloat16 where ours is `x * absmax / 127`, and broadcasts the scales to a
float32 pool-sized array) nor a float32 one (read as bfloat16).
`unsupported` says why, and on a TPU checks the tiles the interpreter does
not: the head dim in 128 lanes, pages in sublane tiles of the pool dtype.

On a mesh the kernel runs per shard under `shard_map`: rows over the data
axes, kv heads (and their query heads) over `tensor`. The sampler's pool has
one part per row shard (`kv_cache.py`), its rows' pages: a shard holds its
part and reads it through local page ids. Off a TPU it runs in Pallas' TPU
interpreter, and `jax.export` lowers it for 'tpu' on CPU.
"""

import contextlib
import functools
import logging
import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

NAME = "mipu_paged_decode_tpu"
_ROW_AXES = ("data", "fsdp")


def unsupported(pool_dtype, head_dim: int, page_size: Optional[int] = None, *,
                on_tpu: bool = True) -> Optional[str]:
  """Why the kernel cannot serve this cache, or None: the cache dtypes it
  reads as ours (module docstring), and on a TPU Mosaic's tiles: the head dim
  in 128-lane tiles, a page in sublane tiles (8 rows of 32 bits, 16 of 16, 32
  of 8). `page_size` None: not checked (not known yet)."""
  dtype = jnp.dtype(pool_dtype)
  if dtype == jnp.int8:
    return ("an int8 cache: the kernel's int8 path dequantizes x * h / 127.5 to bfloat16 "
            "(ours: x * absmax / 127) and broadcasts the scales to a float32 pool")
  if dtype == jnp.float32:
    return "a float32 cache: the kernel reads K/V as bfloat16"
  if not on_tpu:
    return None
  if head_dim % 128:
    return f"head dim {head_dim} is not a multiple of the TPU's 128 lanes"
  sublanes = 32 // dtype.itemsize
  if page_size is not None and page_size % sublanes:
    return f"pages of {page_size} slots are not whole {sublanes}-row tiles of {dtype.name}"
  return None


def takes(pool_dtype, head_dim: int, page_size: int, *, on_tpu: bool) -> bool:
  """Whether `decode` serves this cache; if not, says why (once per reason):
  the caller then runs `attention.paged`."""
  reason = unsupported(pool_dtype, head_dim, page_size, on_tpu=on_tpu)
  if reason is not None:
    _warn_once(reason)
  return reason is None


@functools.cache
def _warn_once(reason: str) -> None:
  logging.warning("decode attention runs 'paged' (XLA) instead of jax's TPU paged-attention "
                  "kernel: %s.", reason)


def pages_per_block(pages: int, page_size: int, keys: int = 256) -> int:
  """Pages the kernel copies and computes at once: the largest power of two
  dividing a row's `pages` with at most `keys` slots (at least 1; MaxText's
  default is 4 pages of 64)."""
  ppb = 1
  while 2 * ppb * page_size <= keys and pages % (2 * ppb) == 0:
    ppb *= 2
  return ppb


def decode(q_BTNH, k_pool, v_pool, k_scale, v_scale, page_ids_BJ, lengths_B, dtype, *,
           interpret=None, block_pages: Optional[int] = None, pool_parts: int = 1):
  """`attention.paged` for one query per row (T = 1), through jax's TPU kernel.

  Args and returns: as `paged_pallas.decode` (each row's length in place of
  the query slots); a row of length 0 gives 0. `interpret`: run in Pallas'
  TPU interpreter, True or a `pltpu.InterpretParams` (default: off a TPU).
  `block_pages`: the kernel's `pages_per_compute_block` (default
  `pages_per_block`). `pool_parts`: the pool's parts (`kv_cache.py`), one per
  row shard of the mesh (1: the pool whole on each row shard). Refuses the
  caches of `unsupported`.
  """
  del k_scale, v_scale  # only int8 pools have scales: refused
  b, t, n, h = q_BTNH.shape
  if t != 1:
    raise ValueError(f"paged_tpu.decode takes one query per row, got T={t}.")
  if reason := unsupported(k_pool.dtype, h, on_tpu=False):
    raise ValueError(f"jax's TPU paged attention cannot serve {reason}; use "
                     "decode_attention='paged'.")
  j = page_ids_BJ.shape[1]
  ppb = pages_per_block(j, k_pool.shape[2]) if block_pages is None else block_pages
  if interpret is None:
    interpret = jax.default_backend() != "tpu"
  kernel = functools.partial(paged_attention, pages_per_compute_block=ppb)
  q_BNH = q_BTNH[:, 0].astype(jnp.float32) * (h ** -0.5)
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    kernel = _per_shard(kernel, mesh, b, k_pool.shape[0], pool_parts)
  if interpret is False:
    interpreting = contextlib.nullcontext()
  else:
    params = interpret if isinstance(interpret, pltpu.InterpretParams) else (
        pltpu.InterpretParams())
    interpreting = pltpu.force_tpu_interpret_mode(params)
  with interpreting, jax.named_scope(NAME):
    out_BNH = kernel(q_BNH, k_pool, v_pool, lengths_B.astype(jnp.int32),
                     page_ids_BJ.astype(jnp.int32))
  return out_BNH[:, None].astype(dtype)


def _per_shard(kernel, mesh, rows: int, kv_heads: int, pool_parts: int):
  """`kernel` under `shard_map`: rows over the data axes that divide them, kv
  heads (with their query heads, which follow them in `N`) over `tensor`; a
  pool of parts split with the rows, each shard's page ids made local."""
  row_axes = tuple(a for a in _ROW_AXES if a in mesh.axis_names)
  shards = math.prod(mesh.shape[a] for a in row_axes)
  if pool_parts > 1 and (pool_parts != shards or rows % shards):
    raise ValueError(f"a pool of {pool_parts} parts needs as many row shards, and {rows} "
                     f"rows split over them; the mesh has {shards}.")
  r = row_axes if row_axes and rows % shards == 0 else None
  parts = r if pool_parts > 1 else None
  tensor = mesh.shape.get("tensor", 0)
  heads = "tensor" if tensor and kv_heads % tensor == 0 else None
  spec = jax.sharding.PartitionSpec

  def local(q, k_pages, v_pages, lengths, ids):  # a part's pages: global id modulo its size
    return kernel(q, k_pages, v_pages, lengths, ids % k_pages.shape[1])

  return jax.shard_map(
      local, mesh=mesh,
      in_specs=(spec(r, heads, None), spec(heads, parts, None, None),
                spec(heads, parts, None, None), spec(r), spec(r, None)),
      out_specs=spec(r, heads, None), check_vma=False)
