"""Decode attention over the paged KV cache as one Pallas TPU (Mosaic) kernel.

The TPU counterpart of `paged_pallas` (the GPU kernel): the same computation
as `attention.paged` for one query per row, in one kernel per layer. The grid
has a step per row; the row's page table and its first and last page holding
an attended slot are scalar-prefetched into SMEM. The pools stay in HBM
(`pl.ANY`) and the kernel copies them by hand: blocks of `pages_per_block`
page columns (256 slots at Qwen3-0.6B's pages of 64; fewer where the ring
would pass `VMEM_BUDGET`), one strided copy of every kv head's page of keys,
of values (and of int8 scales) per column, into a ring of `depth` VMEM
buffers, `depth - 1` blocks ahead of the block it computes. It loops from the
block holding the row's first attended page to the one holding its last, so a
step reads each row's filled pages and, in its first and last block, at most
`2 * (pages_per_block - 1)` more page copies (columns outside the row's pages
copy its nearest page again, masked), not the whole cache.

Why this shape: a grid step costs a fixed overhead on a TPU (a fraction of a
microsecond), and a page of one head is 16 KiB at Qwen3-0.6B's shape. The
first version had a step per (row, kv head, page column), Pallas' pipeline
copying one page per step: 16k steps per layer at 64 rows x 8 kv heads x 32
pages, whatever the fill. Now it is 64 steps, each with a loop over its
row's blocks, and each block's compute is a `[Q, 256]` dot per head instead
of a `[Q, 64]` one.

Why not jax's `pallas.ops.tpu.paged_attention` or `ragged_paged_attention`:
they mask by a length (slots 0 .. n-1 of the row's pages), and the sampler's
rows have left-padded prompts, holes and refilled slots, so the kernel takes
the slot mask `attention.paged` takes. What it keeps from them: the pool
layout `[K, pages, G, H]` (`kv_cache.KVCache`), pages copied by hand from a
scalar-prefetched page table into multi-page VMEM blocks, FlashAttention's
running max and sum in float32. int8 pools are dequantized per slot before
the dot, FP8 pools cast to the compute dtype, as `kv_cache.read_pages` does.

What was checked, without a TPU (none has reached this project): on CPU the
kernel runs in Pallas' TPU interpreter (`pltpu.InterpretParams`, which
simulates the copies between HBM and VMEM; the tests run each copy when it is
started and check for races, so a copy into a block still being read shows)
and equals `attention.paged` on ragged rows for every cache dtype
(tests/test_kv_cache.py): bitwise with one page per block; with blocks of two
16-slot pages, whose softmax sums cover a block at once, within 2.5e-7 in
float32 compute and one bf16 ulp in bf16 compute. It lowers for TPU at
Qwen3-0.6B's head and page shape (`jax.export` with `platforms=["tpu"]` runs
Pallas' lowering of every op, copy and block to Mosaic's dialect). Mosaic's
own passes (vector layouts, then compilation) run only in a TPU's runtime and
are untested, as is the kernel's speed, so `decode_attention='auto'` does not
pick this kernel: ask for it with `decode_attention='pallas_tpu'`.

What waits for a TPU: the block size and ring depth (`decode(...,
block_pages=, depth=)`); the first block's copy latency at each row (nothing
is prefetched across grid steps, which keeps the steps independent for
megacore's "parallel" split); int8 scales, stored `[.., G, 1]` float32 and so
padded to 128 lanes in HBM and VMEM (32 KiB copied per 8 KiB page: a
lane-dense scale layout in `kv_cache` would fix it); the query heads of a kv
head padded to the sublane tile; and float8 pools on TPU generations without
float8 support.

One device only, as the GPU kernel: jax cannot partition a Pallas kernel over
a sharded cache ("pallas_call requires all mesh axes to be Manual"), so
`Qwen3Config.decode_attention_for` runs such a cache with `attention.paged`.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from mipu_jax.models import kv_cache


NAME = "mipu_paged_decode_tpu"


def _kernel(pages_ref, bounds_ref, q_ref, k_hbm, ks_hbm, v_hbm, vs_hbm, mask_ref, o_ref,
            *scratch, pages: int, depth: int, scale: float, dtype):
  """Grid step b: row b's attention, every kv head, over its attended pages.

  The loop runs over blocks of `ppb` page columns (`k_buf`: `[depth, K, ppb,
  G, H]`) from the block holding the row's first attended page to the one
  holding its last, with `depth - 1` blocks' copies in flight ahead of the
  block being computed; one DMA semaphore per ring slot counts all of that
  block's copies. A column of a block outside the row's attended pages copies
  the nearest attended page (a page id the row owns) and is masked.
  """
  if ks_hbm is None:
    (k_buf, v_buf, sems), ks_buf, vs_buf = scratch, None, None
  else:
    k_buf, v_buf, ks_buf, vs_buf, sems = scratch
  b = pl.program_id(0)
  kh, ppb = k_buf.shape[1], k_buf.shape[2]
  lo, hi = bounds_ref[2 * b], bounds_ref[2 * b + 1]
  # Non-negative integers: lax's truncating div / rem (jnp's floor division
  # lowers through sign, which Mosaic's lowering asks the TPU generation for).
  b_lo = jax.lax.div(lo, ppb)
  n_blocks = jnp.maximum(jax.lax.div(hi + ppb - 1, ppb) - b_lo, 0)

  def copies(blk, slot):
    """A block's copies: per page column, one strided copy of every kv head's
    page (`[K, 1, G, H]`) for keys, values and int8 scales."""
    out = []
    for c in range(ppb):
      page = pages_ref[b * pages + jnp.clip(blk * ppb + c, lo, hi - 1)]
      for hbm, buf in ((k_hbm, k_buf), (v_hbm, v_buf), (ks_hbm, ks_buf), (vs_hbm, vs_buf)):
        if hbm is not None:
          out.append(pltpu.make_async_copy(hbm.at[:, pl.ds(page, 1)],
                                            buf.at[slot, :, pl.ds(c, 1)], sems.at[slot]))
    return out

  for ahead in range(depth - 1):
    @pl.when(ahead < n_blocks)
    def _prefetch():
      for cp in copies(b_lo + ahead, ahead):
        cp.start()

  def load(buf, sbuf, slot, head):
    """One head's keys or values of the block as `[ppb * G, H]` in `dtype`."""
    x = buf[slot, head]  # [ppb, G, H]
    g, h = x.shape[1:]
    if sbuf is None and x.dtype == dtype and g % _sublanes(dtype) == 0:
      return x.reshape(ppb * g, h)  # tile-aligned as it is: no conversion
    x = x.astype(jnp.float32)
    if sbuf is not None:
      x = x * sbuf[slot, head]
    return x.reshape(ppb * g, h).astype(dtype)

  def body(i, carry):
    blk, slot = b_lo + i, jax.lax.rem(i, depth)

    @pl.when(i + depth - 1 < n_blocks)
    def _next():
      for cp in copies(blk + depth - 1, jax.lax.rem(i + depth - 1, depth)):
        cp.start()

    for cp in copies(blk, slot):
      cp.wait()
    # 0 on an attended slot, -inf elsewhere: adding it is the mask (x + 0 = x),
    # and exp(-inf - m) = 0 drops the slot from the sums.
    bias_1K = jnp.where(mask_ref[blk] != 0, 0.0, -jnp.inf)  # [1, ppb * G] float32
    out = []
    for head, (m, l, acc) in enumerate(carry):
      k = load(k_buf, ks_buf, slot, head)
      v = load(v_buf, vs_buf, slot, head)
      s = jax.lax.dot_general(q_ref[head], k, (((1,), (1,)), ((), ())),
                              preferred_element_type=jnp.float32) * scale + bias_1K
      m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))
      # A block with no attended slot leaves m at -inf: keep exp's argument finite.
      m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
      p = jnp.exp(s - m_safe)
      corr = jnp.exp(m - m_safe)
      out.append((m_new, l * corr + p.sum(axis=-1, keepdims=True),
                  acc * corr + jax.lax.dot_general(
                      p.astype(dtype), v, (((1,), (0,)), ((), ())),
                      preferred_element_type=jnp.float32)))
    return tuple(out)

  qn, h = q_ref.shape[1:]
  init = tuple((jnp.full((qn, 1), -jnp.inf, jnp.float32), jnp.zeros((qn, 1), jnp.float32),
                jnp.zeros((qn, h), jnp.float32)) for _ in range(kh))
  final = jax.lax.fori_loop(0, n_blocks, body, init)
  for head, (_, l, acc) in enumerate(final):
    o_ref[head] = acc / jnp.where(l == 0, 1.0, l)


def _sublanes(dtype) -> int:
  """Rows of a VMEM tile of `dtype` (8 of 32 bits, 16 of 16, 32 of 8)."""
  return 8 * 4 // jnp.dtype(dtype).itemsize


# The ring's VMEM, kept under v5e's and v4's default scoped limit (16 MiB)
# with room for the pipelined query, mask and output blocks.
VMEM_BUDGET = 12 * 2**20


def ring_bytes(kv_heads: int, ppb: int, page_size: int, head_dim: int, pool_dtype,
               scaled: bool, depth: int) -> int:
  """VMEM of the kernel's ring buffers: keys and values `[depth, K, ppb, G, H]`
  in tiles of (sublanes, 128 lanes), int8 scales `[.., G, 1]` float32 padded
  to 128 lanes."""
  up = lambda x, m: -(-x // m) * m
  rows = depth * kv_heads * ppb
  kv = 2 * rows * up(page_size, _sublanes(pool_dtype)) * up(head_dim, 128) * jnp.dtype(
      pool_dtype).itemsize
  return kv + (2 * rows * up(page_size, 8) * 128 * 4 if scaled else 0)


def pages_per_block(pages: int, page_size: int, keys: int = 256, ring=None) -> int:
  """The columns a block copies and computes at once: the largest power of
  two dividing a row's `pages` with at most `keys` slots and, given `ring`
  (`ppb` -> the ring's bytes), a ring within `VMEM_BUDGET` (at least 1)."""
  fits = lambda ppb: ring is None or ring(ppb) <= VMEM_BUDGET
  ppb = 1
  while 2 * ppb * page_size <= keys and pages % (2 * ppb) == 0 and fits(2 * ppb):
    ppb *= 2
  return ppb


def _attend(q_BKQH, k_pool, v_pool, k_scale, v_scale, pages_BJ, bounds_B2, mask_BS,
            *, dtype, ppb, depth, interpret):
  b, kh, qn, h = q_BKQH.shape
  j = pages_BJ.shape[1]
  g = k_pool.shape[2]
  hbm = pl.BlockSpec(memory_space=pl.ANY)  # the pools stay in HBM: copied by hand
  per_row = lambda bi, *_: (bi, 0, 0, 0)
  scaled = k_scale is not None
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2,
      grid=(b,),
      in_specs=[pl.BlockSpec((None, kh, qn, h), per_row),
                hbm, hbm if scaled else None, hbm, hbm if scaled else None,
                pl.BlockSpec((None, j // ppb, 1, ppb * g), per_row)],
      out_specs=pl.BlockSpec((None, kh, qn, h), per_row),
      scratch_shapes=(
          [pltpu.VMEM((depth, kh, ppb, g, h), k_pool.dtype),
           pltpu.VMEM((depth, kh, ppb, g, h), v_pool.dtype)]
          + [pltpu.VMEM((depth, kh, ppb, g, 1), jnp.float32)] * (2 if scaled else 0)
          + [pltpu.SemaphoreType.DMA((depth,))]))
  kernel = functools.partial(_kernel, pages=j, depth=depth, scale=h ** -0.5, dtype=dtype)
  return pl.pallas_call(
      kernel,
      grid_spec=grid_spec,
      out_shape=jax.ShapeDtypeStruct((b, kh, qn, h), jnp.float32),
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
      interpret=interpret,
      name=NAME,
  )(pages_BJ.reshape(-1), bounds_B2.reshape(-1), q_BKQH, k_pool, k_scale, v_pool,
    v_scale, mask_BS.reshape(b, j // ppb, 1, ppb * g))


def decode(q_BTNH, k_pool, v_pool, k_scale, v_scale, page_ids_BJ, lengths_B, dtype, *,
           interpret=None, block_pages=None, depth: int = 3):
  """`attention.paged` for one query per row (T = 1), as a Pallas TPU kernel.

  Args and returns: as `paged_pallas.decode` (each row's length in place of
  the query slots), and a row with no slot to attend
  (a free sampler slot, whose result is never used): 0 here, as in
  `paged_pallas.decode`, where `attention.paged` gives the mean of the values
  its loop visited. `interpret`: False (compile for
  the TPU), True (Pallas' interpreter: the kernel's blocks as XLA ops, about
  1 ms a call at the tests' shapes) or a `pltpu.InterpretParams` (the TPU
  interpreter, which also simulates the copies between HBM and VMEM and
  checks them, about 2,000x slower); default: True off a TPU.
  `block_pages`: page columns per block (default `pages_per_block`; with
  1 the float operations are `attention.paged`'s, in its order). `depth`:
  blocks in VMEM at once (`depth - 1` in flight).
  """
  b, t, n, h = q_BTNH.shape
  if t != 1:
    raise ValueError(f"paged_pallas_tpu.decode takes one query per row, got T={t}.")
  g = k_pool.shape[2]
  j = page_ids_BJ.shape[1]
  kh = k_pool.shape[0]
  ring = lambda ppb: ring_bytes(kh, ppb, g, h, k_pool.dtype, k_scale is not None, depth)
  if depth < 2:
    raise ValueError(f"depth {depth}: the ring needs at least 2 blocks.")
  if block_pages is not None and (block_pages < 1 or j % block_pages):
    raise ValueError(f"block_pages {block_pages} does not divide a row's {j} pages.")
  ppb = pages_per_block(j, g, ring=ring) if block_pages is None else block_pages
  if ring(ppb) > VMEM_BUDGET:
    raise ValueError(f"a ring of {depth} blocks of {ppb} pages needs {ring(ppb) / 2**20:.1f} "
                     f"MiB of VMEM (budget {VMEM_BUDGET / 2**20:.0f} MiB): fewer pages per "
                     "block or a shallower ring.")
  if interpret is None:
    interpret = jax.default_backend() != "tpu"
  mask_BS, bounds_B2 = kv_cache.attended_pages(lengths_B, j * g, g)
  q_BKQH = q_BTNH[:, 0].reshape(b, kh, n // kh, h).astype(dtype)
  if k_scale is not None:
    k_scale, v_scale = k_scale.astype(jnp.float32), v_scale.astype(jnp.float32)
  with jax.named_scope(NAME):  # in the program's op metadata, interpreted or compiled
    out = _attend(q_BKQH, k_pool, v_pool, k_scale, v_scale, page_ids_BJ.astype(jnp.int32),
                  bounds_B2, mask_BS.astype(jnp.int32), dtype=dtype, ppb=ppb, depth=depth,
                  interpret=interpret)
  return out.reshape(b, 1, n, h).astype(dtype)
