"""TPU decode through jax's paged-attention kernel (mipu_jax/models/paged_tpu.py).

In Pallas' TPU interpreter (it simulates the copies between HBM and VMEM):
the kernel against the XLA paged path on ragged rows for the cache dtypes it
takes, on one device and per shard on the 8-device mesh; the caches it
refuses and why; its lowering for 'tpu'; a sampler running it through
shared prompts, refilled slots and a sharded mesh; and `auto`'s choice.
"""

import contextlib
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from mipu_jax.models import attention, kv_cache, make_mesh, paged_tpu
from mipu_jax.sampler import Sampler, SamplerConfig
from test_sampler import make_model

LENGTHS = [41, 34, 96, 71, 1, 0, 16, 17]  # a full row, one slot, none, page edges


def _ragged(dtype, compute="float32", s=96, g=16, seed=0):
  """Pools of 8 rows of `s` slots (shuffled pages, the second of 2 layers),
  a query per row, and each row's length."""
  rng = np.random.default_rng(seed)
  b, k, n, h, layers = len(LENGTHS), 2, 4, 16, 2
  per = b * (s // g)
  pool = lambda: jnp.asarray(rng.standard_normal((k, per * layers, g, h)), jnp.float32)
  k_pool, v_pool = pool().astype(dtype), pool().astype(dtype)
  ids = jnp.asarray(rng.permutation(per).reshape(b, s // g), jnp.int32) + per
  q = jnp.asarray(rng.standard_normal((b, 1, n, h)), compute)
  return q, (k_pool, v_pool, None, None, ids), jnp.asarray(LENGTHS, jnp.int32)


@pytest.mark.extended
@pytest.mark.parametrize("dtype,compute", [("bfloat16", "float32"), ("float8_e4m3fn", "float32"),
                                           ("bfloat16", "bfloat16")])
def test_kernel_equals_paged_on_ragged_rows(dtype, compute):
  """Within float32 rounding of `attention.paged` (3.6e-7 measured; the
  kernel renormalises per block of 2 pages) in float32 compute, within a
  bf16 ulp in bf16 compute (ours rounds q and the probabilities to bf16);
  an empty row gives 0; a row alone and 8 devices (rows over the data axes,
  kv heads over `tensor`) the same numbers."""
  q, pools, lengths = _ragged(dtype, compute)
  compute = jnp.dtype(compute)
  decode = jax.jit(paged_tpu.decode, static_argnums=7,
                   static_argnames=("interpret", "block_pages"))
  simulated = pltpu.InterpretParams(detect_races=True)
  f32 = lambda x: np.asarray(x, np.float32)
  with jax.default_matmul_precision("highest"):
    want = f32(attention.paged(q, *pools, lengths[:, None] - 1, compute))
    got = f32(decode(q, *pools, lengths, compute, interpret=simulated))
  real = np.asarray(LENGTHS) > 0
  tol = dict(rtol=0, atol=2 ** -8 * np.abs(want).max()) if compute == jnp.bfloat16 else dict(
      rtol=2e-6, atol=1e-6)
  np.testing.assert_allclose(got[real], want[real], **tol)
  np.testing.assert_array_equal(got[~real], 0.0)
  one = list(pools)
  one[4] = pools[4][:1]
  np.testing.assert_array_equal(f32(paged_tpu.decode(q[:1], *one, lengths[:1], compute)), got[:1])
  if dtype == "bfloat16" and compute == jnp.float32:
    with jax.set_mesh(make_mesh(2, 2, 2)):
      np.testing.assert_array_equal(f32(decode(q, *pools, lengths, compute)), got)


@pytest.mark.extended
def test_kernel_per_shard_reads_a_pool_in_parts():
  """The sampler's pod layout (kv_cache.py): a pool of 4 parts, each holding
  its 2 rows' shuffled pages of 2 layers, over the 4 row shards of the
  8-device mesh (kv heads over `tensor`): each shard reads its part through
  local page ids, and the rows get the numbers of one device reading the
  whole pool (bitwise), each pool array sharded, not gathered."""
  rng = np.random.default_rng(3)
  parts, b, j, g, k, n, h, layers = 4, len(LENGTHS), 6, 16, 2, 4, 16, 2
  per = b // parts * j  # a layer's pages in a part
  pool = lambda: jnp.asarray(rng.standard_normal((k, parts * layers * per, g, h)), jnp.bfloat16)
  k_pool, v_pool = pool(), pool()
  part_B = np.arange(b) // (b // parts)
  local = np.stack([rng.permutation(per)[:j] for _ in range(b)])
  ids = jnp.asarray(part_B[:, None] * layers * per + per + local, jnp.int32)  # layer 1
  q = jnp.asarray(rng.standard_normal((b, 1, n, h)), jnp.float32)
  lengths = jnp.asarray(LENGTHS, jnp.int32)
  f32 = lambda x: np.asarray(x, np.float32)
  want = f32(paged_tpu.decode(q, k_pool, v_pool, None, None, ids, lengths, jnp.float32))
  mesh = make_mesh(2, 2, 2)
  split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
      "tensor", ("data", "fsdp"), None, None))
  k_pool, v_pool = jax.device_put(k_pool, split), jax.device_put(v_pool, split)
  assert k_pool.addressable_shards[0].data.shape[:2] == (k // 2, layers * per)
  with jax.set_mesh(mesh):
    got = jax.jit(lambda *a: paged_tpu.decode(*a, jnp.float32, pool_parts=parts))(
        q, k_pool, v_pool, None, None, ids, lengths)
  np.testing.assert_array_equal(f32(got), want)
  with pytest.raises(ValueError, match="4 parts needs as many row shards"), jax.set_mesh(
      make_mesh(1, 1, 8)):
    paged_tpu.decode(q, k_pool, v_pool, None, None, ids, lengths, jnp.float32, pool_parts=parts)


def test_caches_it_does_not_take_are_refused_with_the_reason():
  assert paged_tpu.unsupported(jnp.bfloat16, 128, 64) is None
  assert paged_tpu.unsupported(jnp.float8_e4m3fn, 128, 32) is None
  assert "int8" in paged_tpu.unsupported(jnp.int8, 128, 64)
  assert "bfloat16" in paged_tpu.unsupported(jnp.float32, 128, 64)
  # A TPU's tiles, which the interpreter does not check.
  assert "128 lanes" in paged_tpu.unsupported(jnp.bfloat16, 64, 64)
  assert "16-row tiles" in paged_tpu.unsupported(jnp.bfloat16, 128, 8)
  assert "32-row tiles" in paged_tpu.unsupported(jnp.float8_e4m3fn, 128, 16)
  assert paged_tpu.unsupported(jnp.bfloat16, 12, 4, on_tpu=False) is None
  q, pools, lengths = _ragged("float32")
  with pytest.raises(ValueError, match="float32 cache"):
    paged_tpu.decode(q, *pools, lengths, jnp.float32)
  cfg = type("C", (), dict(num_kv_heads=2, head_dim=16, num_layers=1))
  k8, v8, ks, vs = kv_cache.init_pool(cfg, 8, 16, jnp.int8)
  with pytest.raises(ValueError, match="int8 cache"):
    paged_tpu.decode(q[:1], k8, v8, ks, vs, jnp.zeros((1, 8), jnp.int32), lengths[:1],
                     jnp.float32)
  assert paged_tpu.pages_per_block(32, 64) == 4  # 256 keys: MaxText's 4 pages of 64
  assert paged_tpu.pages_per_block(6, 16) == 2


@pytest.mark.parametrize("dtype,mesh", [("bfloat16", None), ("float8_e4m3fn", None),
                                        ("bfloat16", (2, 2, 2))])
def test_kernel_lowers_for_tpu(dtype, mesh):
  """Pallas' Mosaic lowering at Qwen3-0.6B's shape (8 kv heads of 128, 16
  query heads, 32 pages of 64), through jax.export for 'tpu' on CPU: on one
  device, and per shard on an 8-device mesh, where each kernel call takes its
  shard's part of the pool (4 parts, 2 of the 8 kv heads), not all of it."""
  b, j, g, k, n, h = 8, 32, 64, 8, 16, 128
  parts = 4 if mesh else 1
  cfg = type("C", (), dict(num_kv_heads=k, head_dim=h, num_layers=2))
  kp, vp, _, _ = kv_cache.init_pool(cfg, b * j, g, jnp.dtype(dtype))
  fn = jax.jit(lambda q, kp, vp, ids, lengths: paged_tpu.decode(
      q, kp, vp, None, None, ids, lengths, jnp.bfloat16, interpret=False, pool_parts=parts))
  args = (jnp.zeros((b, 1, n, h), jnp.bfloat16), kp, vp, jnp.zeros((b, j), jnp.int32),
          jnp.full((b,), j * g, jnp.int32))
  with jax.set_mesh(make_mesh(*mesh)) if mesh else contextlib.nullcontext():
    exported = jax.export.export(fn, platforms=["tpu"])(*args)
  module = exported.mlir_module()
  assert "tpu_custom_call" in module
  assert exported.nr_devices == (8 if mesh else 1)
  heads = k // 2 if mesh else k
  short = {"bfloat16": "bf16", "float8_e4m3fn": "f8E4M3FN"}[dtype]
  assert f"tensor<{heads}x{2 * b * j // parts}x{g}x{h}x{short}>" in module


PROMPTS = [[5, 9, 2], [7, 1, 8, 2, 8, 1, 3], [4, 4, 6, 10, 12], [3], [9, 9, 9, 1, 2, 3]]


@pytest.mark.extended
@pytest.mark.long
def test_sampler_with_the_kernel_equals_the_paged_path():
  """A bf16 cache, 5 prompts x 3 samples through 4 refilled slots (prompts
  sharing their pages) on the 8-device mesh (the kernel per shard: a row and
  a kv head per device): the tokens and finish reasons of the XLA paged path
  on the same mesh and schedule, log-probs within 3e-6 (1.2e-6 measured;
  the mesh itself moves the paged path by 2.7e-4 from one device, and the
  kernel on one device is within 1.4e-6 of it); the kernel is in the decode
  program."""
  model = make_model(seed=1)
  kw = dict(eos_ids=[7], kv_cache_dtype="bf16", kv_cache_storage="real",
            mesh=make_mesh(2, 2, 2), max_concurrent_decodes=4, min_slot_bucket=4)
  run = lambda s: s.generate(PROMPTS, max_new_tokens=11, num_samples=3, temperature=0.9, seed=5)
  want = run(Sampler(model, decode_attention="paged", **kw))
  sampler = Sampler(model, decode_attention="pallas_tpu", **kw)
  assert sampler.engine.decode_attention == "pallas_tpu"
  got = run(sampler)
  assert got.tokens == want.tokens and got.finish_reasons == want.finish_reasons
  for a, b in zip(got.logprobs, want.logprobs):
    np.testing.assert_allclose(a, b, rtol=0, atol=3e-6)
  assert sampler.engine.trace_counts["generate_until_free"] >= 1  # it did refill
  eng = sampler.engine
  state = eng.init_decode_state()
  assert eng.pool_parts == 4  # a part of the pool per row shard: its rows' pages
  assert state.cache.k.sharding.spec[:2] == ("tensor", ("data", "fsdp"))
  lowered = eng.programs["generate_until_free"].lower(eng._spec, sampler.params, state,
                                                      jnp.int32(1))  # pylint: disable=protected-access
  assert f'"{paged_tpu.NAME}/' in lowered.as_text(debug_info=True)


def test_auto_runs_the_kernel_on_a_tpu_where_it_serves_the_cache(caplog):
  """On one TPU and on a pod (the pool in a part per row shard: the same choice), for the
  caches it takes."""
  pick = lambda asked, kv, head_dim=128: SamplerConfig(
      decode_attention=asked).decode_attention_for("tpu", kv_dtype=jnp.dtype(kv),
                                                   head_dim=head_dim)
  assert pick("auto", "bfloat16") == pick("auto", "float8_e4m3fn") == "pallas_tpu"
  with caplog.at_level(logging.WARNING):
    assert pick("auto", "int8") == pick("auto", "float32") == "paged"
    assert pick("auto", "bfloat16", head_dim=16) == "paged"  # not whole 128-lane tiles
  assert "int8 cache" in caplog.text and "128 lanes" in caplog.text
  for kv in ("int8", "float32"):
    with pytest.raises(ValueError, match="cannot serve"):
      pick("pallas_tpu", kv)
  with pytest.raises(ValueError, match="int8 cache"):  # the engine asks, on any platform
    Sampler(make_model(), decode_attention="pallas_tpu", kv_cache_dtype="int8")
