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

On a mesh the kernel runs per shard (`kv_cache.per_shard`), each on its part
of the pool. Off a TPU it runs in Pallas' TPU interpreter, and `jax.export`
lowers it for 'tpu' on CPU.
"""

import contextlib
import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

from mipu_jax.models import kv_cache

NAME = "mipu_paged_decode_tpu"


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
  call = kv_cache.per_shard(lambda q, pools, ids, lengths: kernel(q, *pools, lengths, ids),
                            b, k_pool.shape[0], pool_parts)
  if interpret is False:
    interpreting = contextlib.nullcontext()
  else:
    params = interpret if isinstance(interpret, pltpu.InterpretParams) else (
        pltpu.InterpretParams())
    interpreting = pltpu.force_tpu_interpret_mode(params)
  with interpreting, jax.named_scope(NAME):
    out_BNH = call(q_BNH, (k_pool, v_pool), page_ids_BJ.astype(jnp.int32),
                   lengths_B.astype(jnp.int32))
  return out_BNH[:, None].astype(dtype)

