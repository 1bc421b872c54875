"""Decode attention over the paged KV cache as one Pallas GPU kernel (docs/method.md §7).

`attention.paged` (pure XLA) runs a few small ops per page column: on a GPU, a kernel launch per
op, per page, per layer. This kernel takes one launch per layer: a program per (row, kv head,
split of the row's pages) gathers `pages_per_block` pages of keys and values at a time from the
pool (`kv_cache.KVCache`, `[K, L*P, G, H]`) below the row's length (a row has no holes), with
FlashAttention's float32 running max, sum and output; splits are merged outside by log-sum-exp.

It follows jax's `pallas.ops.gpu.paged_attention` (grid, page gathers, split merge, masking by
length), plus: the softmax scale on the float32 logits (as `attention.paged`, so the two agree to
rounding), int8 pools dequantized per slot before the dot (as `kv_cache.read_pages`), FP8 pools
cast in the kernel. Query heads of one kv head are padded to 16 (the smallest dot tile); only the
real rows are stored and merged. Two gathers (`gather=`, or `MIPU_PALLAS_DECODE_PLAN="slots:..."`,
compared in `bench/gpu/paged_kernel.py`): "pages" (default) loads a block's page ids, then each
page's keys; "slots" loads one pool-row index per slot (as SGLang's Triton decode kernel).

Written against Pallas' core API and its Triton backend, not the `pallas.ops.gpu` kernels jax
deprecated after 0.11.0 (bench/README.md: what ran on which jax). Off a GPU it runs in Pallas'
interpreter (tested against `attention.paged`); its 'cuda' lowering is checked on CPU. XLA
cannot partition the kernel's custom call, so on a mesh it runs per shard under `shard_map`, as
jax's TPU kernel (`kv_cache.per_shard`).
"""

import functools
import importlib
import os
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from mipu_jax.models import kv_cache

_MIN_TILE = 16  # Triton's smallest dot dimension.
NAME = "mipu_paged_decode"


def missing_backend() -> Optional[str]:
  """Why the installed jax cannot run this kernel, or None: without Pallas' Triton backend
  (`jax.experimental.pallas.triton`, deprecated in jax 0.11.0, to be removed) it neither lowers
  for a GPU nor runs in the interpreter (docs/method.md §7)."""
  try:
    importlib.import_module("jax.experimental.pallas.triton")
  except ImportError as e:
    return f"jax {jax.__version__} has no Pallas Triton backend ({e})"
  return None


def _kernel(length_ref, q_ref, k_ref, ks_ref, v_ref, vs_ref, pages_ref,
            o_ref, l_ref, m_ref, *, block: int, unit: int, scale: float, dtype, heads: int):
  """One (kv head, query-head block, split) program of one row; `length_ref`: the row's length
  (it attends slots `[0, length)`). Page gather (`unit` = the page size G): `pages_ref` holds the
  split's page ids, a block is `block` pages. Slot gather (`unit` 1): the pools are `[P * G, H]`
  rows, `pages_ref` holds the split's slots' pool rows, a block is `block` slots."""
  split = pl.program_id(2)
  block_h, h = q_ref.shape
  per_split = pages_ref.shape[0]
  block_k = block * unit
  first = split * per_split
  length = length_ref[0]
  hi = jnp.minimum(pl.cdiv(length, unit), first + per_split) - first
  n_blocks = jnp.maximum(pl.cdiv(hi, block), 0)
  q = q_ref[...]

  def load(ref, sref, ids):
    x = ref[ids].reshape(block_k, h)
    if sref is not None:
      s = jax.lax.broadcast_in_dim(sref[ids].reshape(block_k), (block_k, h), (0,))
      return (x.astype(jnp.float32) * s).astype(dtype)
    return x.astype(dtype)

  def body(i, carry):
    o, m, l = carry
    ids = pages_ref[pl.ds(i * block, block)]
    slots = (first + i * block) * unit + jax.lax.broadcasted_iota(jnp.int32, (block_k,), 0)
    valid = slots < length
    k = load(k_ref, ks_ref, ids)
    v = load(v_ref, vs_ref, ids)
    s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * scale
    valid = jax.lax.broadcast_in_dim(valid, (block_h, block_k), (1,))
    s = jnp.where(valid, s, -jnp.inf)
    m_new = jnp.maximum(m, s.max(axis=-1))
    # A block with no valid slot leaves m at -inf: keep exp's argument finite.
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.where(valid, jnp.exp(s - m_safe[:, None]), 0.0)
    corr = jnp.exp(m - m_safe)
    l_new = l * corr + p.sum(axis=-1)
    o_new = o * corr[:, None] + jax.lax.dot_general(
        p.astype(dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    return o_new, m_new, l_new

  init = (jnp.zeros((block_h, h), jnp.float32),
          jnp.full((block_h,), -jnp.inf, jnp.float32),
          jnp.zeros((block_h,), jnp.float32))
  o, m, l = jax.lax.fori_loop(0, n_blocks, body, init)
  # Store only the kv head's `heads` real query rows of the partial output: the merge reads those.
  from jax.experimental.pallas import triton as plgpu  # pylint: disable=g-import-not-at-top
  plgpu.store(o_ref, o, mask=jax.lax.broadcasted_iota(jnp.int32, o.shape, 0) < heads)
  m_ref[...] = m
  l_ref[...] = l


def _row(q_NH, length_1, pages_J, k_pool, v_pool, k_scale, v_scale, *, unit: int,
         block: int, k_splits: int, dtype, interpret: bool, num_warps: int,
         num_stages: int):
  """One row's attention, `[N, H]` (vmapped over rows by `decode`); `length_1`: the row's length.
  Page gather (`unit` G): pools `[K, P, G, H]`, `pages_J` the page ids; slot gather (`unit` 1):
  pools `[K, P * G, H]`, `pages_J` the `[S]` slots' pool rows."""
  n, h = q_NH.shape
  kh = k_pool.shape[0]
  per_kv = n // kh
  block_h = max(_MIN_TILE, 1 << (per_kv - 1).bit_length())
  per_split = pages_J.shape[0] // k_splits
  q_KQH = q_NH.reshape(kh, per_kv, h)
  if block_h != per_kv:
    q_KQH = jnp.pad(q_KQH, ((0, 0), (0, block_h - per_kv), (0, 0)))
  rest = k_pool.shape[1:]  # (P, G, H) or (P * G, H): the whole kv head's pool
  pool_spec = pl.BlockSpec((None, *rest), lambda k, i, s: (k,) + (0,) * len(rest))
  scale_spec = None
  if k_scale is not None:
    k_scale, v_scale = k_scale[..., 0], v_scale[..., 0]
    scale_spec = pl.BlockSpec((None, *rest[:-1]),
                              lambda k, i, s: (k,) + (0,) * (len(rest) - 1))
  kernel = functools.partial(_kernel, block=block, unit=unit, scale=h ** -0.5, dtype=dtype,
                             heads=per_kv)
  from jax.experimental.pallas import triton as plgpu  # pylint: disable=g-import-not-at-top
  o, l, m = pl.pallas_call(
      kernel,
      grid=(kh, 1, k_splits),
      in_specs=[
          pl.BlockSpec((1,), lambda k, i, s: (0,)),  # length
          pl.BlockSpec((None, block_h, h), lambda k, i, s: (k, i, 0)),  # q
          pool_spec, scale_spec, pool_spec, scale_spec,
          pl.BlockSpec((per_split,), lambda k, i, s: (s,)),  # page ids / slots' rows
      ],
      out_specs=[
          pl.BlockSpec((None, None, block_h, h), lambda k, i, s: (s, k, i, 0)),
          pl.BlockSpec((None, None, block_h), lambda k, i, s: (s, k, i)),
          pl.BlockSpec((None, None, block_h), lambda k, i, s: (s, k, i)),
      ],
      out_shape=[
          jax.ShapeDtypeStruct((k_splits, kh, block_h, h), jnp.float32),
          jax.ShapeDtypeStruct((k_splits, kh, block_h), jnp.float32),
          jax.ShapeDtypeStruct((k_splits, kh, block_h), jnp.float32),
      ],
      interpret=interpret,
      compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
      name=NAME,
  )(length_1, q_KQH, k_pool, k_scale, v_pool, v_scale, pages_J)
  # Merge the splits (log-sum-exp). A row with no slot to attend gives 0 (attention.paged: the
  # mean of the values its loop visited); neither is used, such a row is not sampling.
  o, l, m = o[:, :, :per_kv], l[:, :, :per_kv], m[:, :, :per_kv]  # the rows written
  m_max = m.max(axis=0)
  m_safe = jnp.where(m_max == -jnp.inf, 0.0, m_max)
  corr = jnp.exp(m - m_safe[None])
  l_sum = (l * corr).sum(axis=0)
  o_sum = (o * corr[..., None]).sum(axis=0)
  out = o_sum / jnp.where(l_sum == 0, 1.0, l_sum)[..., None]
  return out.reshape(n, h).astype(dtype)


def split_plan(batch: int, kv_heads: int, pages: int, page_size: int,
               target_programs: int = 2048) -> tuple[int, int]:
  """`(pages_per_block, k_splits)`: blocks of at least 64 keys (one dot tile of useful width), the
  row's pages split until the grid has about `target_programs` programs (a small batch still
  fills the GPU); plans measured: bench/README.md ("On a GPU: the Pallas decode kernel")."""
  ppb = 1
  while ppb * page_size < 64 and pages % (ppb * 2) == 0:
    ppb *= 2
  splits = 1
  while (batch * kv_heads * splits < target_programs
         and pages % (ppb * splits * 2) == 0):
    splits *= 2
  return ppb, splits


def _pow2(x: int) -> bool:
  return x > 0 and not x & (x - 1)


def supports(pages: int, page_size: int, head_dim: int, *, interpret: bool = False) -> bool:
  """Whether the kernel compiles for rows of `pages` pages: Triton's tiles are powers of two, at
  least 16 keys wide (the interpreter takes any shape)."""
  if interpret:
    return True
  ppb, _ = split_plan(1, 1, pages, page_size)
  return _pow2(page_size) and _pow2(head_dim) and ppb * page_size >= _MIN_TILE


def unsupported(pages: int, page_size: int, head_dim: int, *,
                interpret: bool = False) -> Optional[str]:
  """Why the kernel cannot serve rows of this shape (`supports`), or None."""
  if supports(pages, page_size, head_dim, interpret=interpret):
    return None
  return (f"rows of {pages} pages of {page_size} slots, head dim {head_dim}: Triton's tiles "
          f"need powers of two, at least {_MIN_TILE} keys wide")


PLAN_ENV = "MIPU_PALLAS_DECODE_PLAN"
GATHERS = ("pages", "slots")


def env_plan() -> Optional[tuple[str, tuple[int, int, int, int]]]:
  """`(gather, (block, k_splits, num_warps, num_stages))` from `MIPU_PALLAS_DECODE_PLAN`
  (bench/gpu/paged_kernel.py's sweep), or None: `"2,2,4,2"` gathers pages (blocks of 2 pages),
  `"slots:64,4,4,3"` slots (blocks of 64). Read when traced; the default where it does not fit."""
  text = os.environ.get(PLAN_ENV, "").strip()
  if not text:
    return None
  gather, _, numbers = text.rpartition(":")
  gather = gather or "pages"
  try:
    plan = tuple(int(x) for x in numbers.split(","))
  except ValueError:
    plan = ()
  if gather not in GATHERS or len(plan) != 4 or min(plan) < 1:
    raise ValueError(f"{PLAN_ENV}={text!r}: want four positive integers "
                     "'block,k_splits,num_warps,num_stages', optionally after 'pages:' or "
                     "'slots:' (a block of pages or of slots).")
  return gather, plan


# The best launch plan measured per shape class (`plan_class`) by bench/gpu/paged_kernel.py
# on a GPU, which prints the rows to paste here; bench/README.md has each row's date, device
# and command. A class not here takes `split_plan`'s default; MIPU_PALLAS_DECODE_PLAN
# overrides both.
MEASURED_PLANS: dict[tuple, tuple[str, tuple[int, int, int, int]]] = {
    # 1.02x its read bound at full fill, 1.17x at 1/8 (the default plan 1.63x / 1.60x).
    ("NVIDIA H200", "bfloat16", 2, 64, 128, 512, 2048): ("slots", (64, 4, 4, 3)),
}


def plan_class(device_kind: str, pool_dtype, rows: int, kv_heads: int, heads_per_kv: int,
               slots: int, page_size: int, head_dim: int) -> tuple:
  """The key of `MEASURED_PLANS`: the device, the pool's dtype, the query heads per kv
  head, the page and head sizes exactly; rows x kv heads (the grid before splits) and a
  row's slots rounded down to powers of two (a plan measured at one fits the class)."""
  floor2 = lambda x: 1 << (max(int(x), 1).bit_length() - 1)
  return (device_kind, jnp.dtype(pool_dtype).name, heads_per_kv, page_size, head_dim,
          floor2(rows * kv_heads), floor2(slots))


def default_plan(rows: int, kv_heads: int, heads_per_kv: int, pages: int, page_size: int,
                 head_dim: int, pool_dtype, *, interpret: bool = False,
                 device_kind: Optional[str] = None) -> tuple[str, tuple[int, int, int, int]]:
  """`(gather, plan)` where neither the call nor the environment names one: the measured
  plan of the shape's class where it fits, else pages with `split_plan`'s blocks and
  splits, 4 warps, 2 stages."""
  if device_kind is None:
    device_kind = jax.devices()[0].device_kind
  key = plan_class(device_kind, pool_dtype, rows, kv_heads, heads_per_kv, pages * page_size,
                   page_size, head_dim)
  measured = MEASURED_PLANS.get(key)
  if measured is not None:
    gather, plan = measured
    if _fits(plan[0], plan[1], pages * page_size, page_size if gather == "pages" else 1,
             interpret):
      return gather, tuple(plan)
  return "pages", split_plan(rows, kv_heads, pages, page_size) + (4, 2)


def _fits(block: int, splits: int, slots: int, unit: int, interpret: bool) -> bool:
  """Whether blocks of `block` units of `unit` slots (a page, or one slot) x `splits` tile a row
  of `slots` slots, in Triton's tiles."""
  keys = block * unit
  return (slots // unit) % (block * splits) == 0 and (
      interpret or (keys >= _MIN_TILE and _pow2(keys)))


def decode(q_BTNH, k_pool, v_pool, k_scale, v_scale, page_ids_BJ, lengths_B, dtype, *,
           interpret=None, plan=None, gather=None, pool_parts: int = 1):
  """`attention.paged` for one query per row (T = 1), as a Pallas kernel.

  Args and returns: as `attention.paged`, with each row's length `lengths_B` (it attends slots
  `[0, length)`) in place of the query slots. `interpret`: run in Pallas' interpreter (default:
  off a GPU). `plan`: `(block, k_splits, num_warps, num_stages)`; `gather`: "pages" (a block is
  `block` pages, fetched through the page table) or "slots" (the pools as `[K, P * G, H]` rows, a
  block is `block` slots, each fetched through its own row index: no page-id loads). Default:
  `env_plan()`, else `default_plan` (the measured plan of the shape's class, else "pages" with
  `split_plan`'s blocks and splits, 4 warps, 2 stages).
  `pool_parts`: as `paged_tpu.decode`; on a mesh the kernel runs per shard (`kv_cache.per_shard`).
  """
  b, t, n, h = q_BTNH.shape
  if t != 1:
    raise ValueError(f"paged_pallas.decode takes one query per row, got T={t}.")
  g = k_pool.shape[2]
  j = page_ids_BJ.shape[1]
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  if not supports(j, g, h, interpret=interpret):
    raise ValueError(f"the Pallas decode kernel needs a power-of-two page size and head "
                     f"dim and blocks of >= {_MIN_TILE} keys; got {j} pages of {g} slots, "
                     f"head dim {h} (decode_attention='paged' takes any shape).")
  local = functools.partial(_decode, dtype=dtype, interpret=interpret, plan=plan,
                            gather=gather)
  call = kv_cache.per_shard(lambda q, pools, ids, lengths: local(q, *pools, ids, lengths),
                            b, k_pool.shape[0], pool_parts)
  return call(q_BTNH, (k_pool, v_pool, k_scale, v_scale), page_ids_BJ, lengths_B)


def _decode(q_BTNH, k_pool, v_pool, k_scale, v_scale, page_ids_BJ, lengths_B, *, dtype,
            interpret, plan, gather):
  """`decode` on one device's rows and pool."""
  b, _, _, h = q_BTNH.shape
  g, j = k_pool.shape[2], page_ids_BJ.shape[1]
  unit_of = lambda gather: g if gather == "pages" else 1  # slots per gathered unit
  if plan is None:
    env = env_plan()
    if env is not None and (gather is None or env[0] == gather) and _fits(
        env[1][0], env[1][1], j * g, unit_of(env[0]), interpret):
      gather, plan = env  # else the environment's plan does not fit: the default
  if plan is None:
    best = default_plan(b, k_pool.shape[0], q_BTNH.shape[2] // k_pool.shape[0], j, g, h,
                        k_pool.dtype, interpret=interpret)
    if gather is None or best[0] == gather:
      gather, plan = best
  gather = gather or "pages"
  if gather not in GATHERS:
    raise ValueError(f"gather {gather!r}: one of {GATHERS}.")
  unit = unit_of(gather)
  if plan is None:
    block, splits = split_plan(b, k_pool.shape[0], j * g // unit, unit)
    num_warps, num_stages = 4, 2
  else:
    block, splits, num_warps, num_stages = plan
    if not _fits(block, splits, j * g, unit, interpret):
      raise ValueError(f"plan {plan}: blocks of {block} {gather} x {splits} splits do not "
                       f"tile a row of {j} pages of {g} slots, or a block is under "
                       f"{_MIN_TILE} keys or not a power of two.")
  if gather == "pages":
    index_BX = page_ids_BJ
  else:
    index_BX = (jnp.repeat(page_ids_BJ.astype(jnp.int32), g, axis=1) * g
                + jnp.tile(jnp.arange(g, dtype=jnp.int32), j)[None])
    kh = k_pool.shape[0]
    k_pool, v_pool = k_pool.reshape(kh, -1, h), v_pool.reshape(kh, -1, h)
    if k_scale is not None:
      k_scale, v_scale = k_scale.reshape(kh, -1, 1), v_scale.reshape(kh, -1, 1)
  row = functools.partial(_row, k_pool=k_pool, v_pool=v_pool, k_scale=k_scale,
                          v_scale=v_scale, unit=unit, block=block, k_splits=splits,
                          dtype=dtype, interpret=interpret, num_warps=num_warps,
                          num_stages=num_stages)
  with jax.named_scope(NAME):  # in the program's op metadata, interpreted or compiled
    out_BNH = jax.vmap(row)(q_BTNH[:, 0], lengths_B.astype(jnp.int32)[:, None], index_BX)
  return out_BNH[:, None]
