"""Decode attention over the paged KV cache as one Pallas TPU (Mosaic) kernel.

The TPU counterpart of `paged_pallas` (the GPU kernel): the same computation
as `attention.paged` for one query per row, in one kernel per layer. The grid
is (row, kv head, page column). The page table and each row's first and last
page holding an attended slot are scalar-prefetched into SMEM, and the key,
value (and int8 scale) blocks are fetched through an index map that reads the
page table, so Pallas' pipeline copies one pool page per grid step from HBM
into VMEM while the previous one is computed. A step outside the row's pages
maps to the same block as its neighbour (no copy) and computes nothing, so a
step reads each row's filled pages and nothing else.

Why not jax's `pallas.ops.tpu.paged_attention` or `ragged_paged_attention`:
they mask by a length (slots 0 .. n-1 of the row's pages), and the sampler's
rows have left-padded prompts, holes and refilled slots, so the kernel takes
the slot mask `attention.paged` takes. What it keeps from them: the pool
layout `[K, pages, G, H]` (`kv_cache.KVCache`), page-granular fetches driven
by a scalar-prefetched page table, FlashAttention's running max and sum in
float32.

Blocks are whole trailing dimensions (a page `[G, H]`, a row's mask page
`[1, G]`, its queries `[Q, H]`), which Mosaic accepts for any G and H; a page
of G slots is a (G, H) tile, so G a multiple of the dtype's sublane tile (8
for float32, 16 bfloat16, 32 int8 / FP8) and H of 128 avoid padded copies.
int8 pools are dequantized per slot before the dot, FP8 pools cast to the
compute dtype, as `kv_cache.read_pages` does.

What was checked, without a TPU (none has reached this project): on CPU the
kernel runs in Pallas' TPU interpreter (`pltpu.InterpretParams`, which
simulates the pipeline's copies; the sampler's tests use Pallas' plain
interpreter, 2,000x faster) and equals `attention.paged` on ragged rows
for every cache dtype (tests/test_kv_cache.py), and it lowers for TPU
(`jax.export` with `platforms=["tpu"]`: Pallas' Mosaic lowering, which checks
block shapes and index maps). Mosaic's own compilation runs only on a TPU and
is untested, so `decode_attention='auto'` does not pick this kernel: ask for
it with `decode_attention='pallas_tpu'`.

What a real TPU may show that nothing here can: the grid has a step per
(row, kv head, page column) whatever a row's fill, one page of one head per
step (Qwen3-0.6B's 64 rows x 8 kv heads x 32 pages: 16k steps per layer), so
the per-step overhead may dominate a decode step; jax's TPU paged kernels
copy several pages per step by hand (`pl.ANY` pools, async copies) and take
several heads per block. That, and float8 pools on TPU generations without
float8 support, wait for a TPU.

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


def _kernel(pages_ref, bounds_ref, q_ref, k_ref, ks_ref, v_ref, vs_ref, mask_ref,
            o_ref, m_sc, l_sc, acc_sc, *, scale: float, dtype):
  """Grid step (row b, kv head, page column j): one page of keys and values."""
  b, j = pl.program_id(0), pl.program_id(2)

  @pl.when(j == 0)
  def _init():
    m_sc[...] = jnp.full_like(m_sc, -jnp.inf)
    l_sc[...] = jnp.zeros_like(l_sc)
    acc_sc[...] = jnp.zeros_like(acc_sc)

  def load(ref, sref):
    x = ref[...]
    if sref is None:
      return x.astype(dtype)
    return (x.astype(jnp.float32) * sref[...]).astype(dtype)

  @pl.when((j >= bounds_ref[2 * b]) & (j < bounds_ref[2 * b + 1]))
  def _page():
    q = q_ref[...]
    k = load(k_ref, ks_ref)
    v = load(v_ref, vs_ref)
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * scale
    valid = jnp.broadcast_to(mask_ref[...] != 0, s.shape)
    s = jnp.where(valid, s, -jnp.inf)
    m = m_sc[...]
    m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))
    # A page with no attended slot leaves m at -inf: keep exp's argument finite.
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.where(valid, jnp.exp(s - m_safe), 0.0)
    corr = jnp.exp(m - m_safe)
    l_sc[...] = l_sc[...] * corr + p.sum(axis=-1, keepdims=True)
    acc_sc[...] = acc_sc[...] * corr + jax.lax.dot_general(
        p.astype(dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    m_sc[...] = m_new

  @pl.when(j == pl.num_programs(2) - 1)
  def _out():
    l = l_sc[...]
    o_ref[...] = acc_sc[...] / jnp.where(l == 0, 1.0, l)


def _attend(q_BKQH, k_pool, v_pool, k_scale, v_scale, pages_BJ, bounds_B2, mask_BJ1G,
            *, dtype, interpret):
  b, kh, qn, h = q_BKQH.shape
  j = pages_BJ.shape[1]
  g = k_pool.shape[2]

  def column(bi, ji, bounds_ref):
    """Row bi's page column ji clamped to the row's attended pages (in
    [0, j): `lo < j`, `hi <= j`): a step outside them fetches the block its
    neighbour fetched."""
    lo, hi = bounds_ref[2 * bi], bounds_ref[2 * bi + 1]
    return jnp.clip(ji, lo, jnp.maximum(hi - 1, lo))

  def pool_map(bi, ki, ji, pages_ref, bounds_ref):
    return (ki, pages_ref[bi * j + column(bi, ji, bounds_ref)], 0, 0)

  def mask_map(bi, ki, ji, pages_ref, bounds_ref):
    del ki, pages_ref
    return (bi, column(bi, ji, bounds_ref), 0, 0)

  per_row = lambda bi, ki, ji, *_: (bi, ki, 0, 0)
  pool_spec = pl.BlockSpec((None, None, g, h), pool_map)
  scale_spec = None if k_scale is None else pl.BlockSpec((None, None, g, 1), pool_map)
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2,
      grid=(b, kh, j),
      in_specs=[pl.BlockSpec((None, None, qn, h), per_row),
                pool_spec, scale_spec, pool_spec, scale_spec,
                pl.BlockSpec((None, None, 1, g), mask_map)],
      out_specs=pl.BlockSpec((None, None, qn, h), per_row),
      scratch_shapes=[pltpu.VMEM((qn, 1), jnp.float32),
                      pltpu.VMEM((qn, 1), jnp.float32),
                      pltpu.VMEM((qn, h), jnp.float32)])
  kernel = functools.partial(_kernel, scale=h ** -0.5, dtype=dtype)
  return pl.pallas_call(
      kernel,
      grid_spec=grid_spec,
      out_shape=jax.ShapeDtypeStruct((b, kh, qn, h), jnp.float32),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary")),
      interpret=interpret,
      name=NAME,
  )(pages_BJ.reshape(-1), bounds_B2.reshape(-1), q_BKQH, k_pool, k_scale, v_pool,
    v_scale, mask_BJ1G)


def decode(q_BTNH, k_pool, v_pool, k_scale, v_scale, page_ids_BJ, valid_BS, q_slot_BT,
           dtype, *, interpret=None):
  """`attention.paged` for one query per row (T = 1), as a Pallas TPU kernel.

  Args and returns: as `attention.paged`, except a row with no slot to attend
  (a free sampler slot, whose result is never used): 0 here, as in
  `paged_pallas.decode`, where `attention.paged` gives the mean of the values
  its loop visited. `interpret`: False (compile for
  the TPU), True (Pallas' interpreter: the kernel's blocks as XLA ops, about
  1 ms a call at the tests' shapes) or a `pltpu.InterpretParams` (the TPU
  interpreter, which also simulates the pipeline's copies between HBM and VMEM
  and checks them, about 2,000x slower); default: True off a TPU.
  """
  b, t, n, h = q_BTNH.shape
  if t != 1:
    raise ValueError(f"paged_pallas_tpu.decode takes one query per row, got T={t}.")
  g = k_pool.shape[2]
  j = page_ids_BJ.shape[1]
  if valid_BS.shape[1] != j * g:
    raise ValueError(f"{valid_BS.shape[1]} slots per row is not {j} pages of {g}.")
  if interpret is None:
    interpret = jax.default_backend() != "tpu"
  mask_BS, bounds_B2 = kv_cache.attended_pages(valid_BS, q_slot_BT, g)
  kh = k_pool.shape[0]
  q_BKQH = q_BTNH[:, 0].reshape(b, kh, n // kh, h).astype(dtype)
  if k_scale is not None:
    k_scale, v_scale = k_scale.astype(jnp.float32), v_scale.astype(jnp.float32)
  with jax.named_scope(NAME):  # in the program's op metadata, interpreted or compiled
    out = _attend(q_BKQH, k_pool, v_pool, k_scale, v_scale, page_ids_BJ.astype(jnp.int32),
                  bounds_B2, mask_BS.astype(jnp.int32).reshape(b, j, 1, g),
                  dtype=dtype, interpret=interpret)
  return out.reshape(b, 1, n, h).astype(dtype)
