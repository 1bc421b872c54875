"""`attention="cpu_fused"` (the XLA:CPU kernel through jax's FFI) equals `dense`.

Outputs and the three gradients within float32 rounding on odd sizes, grouped
heads, head dims that are not a multiple of the kernel's 16 lanes, keys longer
than queries, random masks with rows that see no key at all; the model and the
learner step with it; 8 devices equal 1 bitwise; clear errors; "auto" (the
default) runs it on a CPU in float32 and `dense` otherwise.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mipu_jax import models
from mipu_jax.models import attention
from mipu_jax.models import cpu_attention

# Only a host without a C++ compiler skips: a kernel that fails to build fails the tests.
pytestmark = pytest.mark.skipif(cpu_attention._compiler() is None,  # pylint: disable=protected-access
                                reason="no C++ compiler to build the kernel with")


def _case(b, t, s, n, k, h, seed, density=0.6):
  rng = np.random.default_rng(seed)
  q, kk, v, w = (jnp.asarray(rng.normal(size=shape), jnp.float32)
                 for shape in ((b, t, n, h), (b, s, k, h), (b, s, k, h), (b, t, n, h)))
  mask = rng.random((b, t, s)) < density
  mask[0, 0] = False  # a query that sees no key: the uniform average, as `dense`
  return q, kk, v, w, jnp.asarray(mask)


def _dense(q, k, v, mask):
  b, t, n, h = q.shape
  kh = k.shape[2]
  return attention._dense(q.reshape(b, t, kh, n // kh, h), k, v, mask).reshape(b, t, n, h)  # pylint: disable=protected-access


def _out_and_grads(fn, q, k, v, w, mask):
  def loss(q, k, v):
    out = fn(q, k, v, mask)
    return jnp.sum(out * w), out
  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return out, grads


@pytest.mark.parametrize("shape", [(2, 37, 37, 6, 2, 8), (3, 20, 29, 4, 4, 40),
                                   (2, 9, 9, 2, 1, 128), (1, 1, 5, 2, 2, 16),
                                   (2, 130, 130, 4, 2, 32)])
@pytest.mark.parametrize("seed", [0, 1])
def test_fused_equals_dense_outputs_and_gradients(shape, seed):
  q, k, v, w, mask = _case(*shape, seed=seed)
  want, want_g = _out_and_grads(_dense, q, k, v, w, mask)
  got, got_g = _out_and_grads(cpu_attention.attend, q, k, v, w, mask)
  np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)
  for g, wg in zip(got_g, want_g):  # the query, key and value gradients
    np.testing.assert_allclose(g, wg, atol=1e-5, rtol=1e-5)


def test_fused_causal_and_packed_masks_through_attend():
  """The learner's own masks (causal, padding, two packed segments) through
  `attention.attend`'s switch."""
  q, k, v, w, _ = _case(2, 37, 37, 6, 2, 8, seed=3)
  valid = np.ones((2, 37), bool)
  valid[0, 30:] = False
  valid[1, :5] = False
  seg = np.zeros((2, 37), np.int32)
  seg[1, 18:] = 1
  mask = attention.row_mask(jnp.asarray(valid), jnp.asarray(seg))
  fn = lambda impl: lambda q, k, v, m: attention.attend(q, k, v, m, implementation=impl)
  want, want_g = _out_and_grads(fn("dense"), q, k, v, w, mask)
  got, got_g = _out_and_grads(fn("cpu_fused"), q, k, v, w, mask)
  np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)
  for g, wg in zip(got_g, want_g):
    np.testing.assert_allclose(g, wg, atol=1e-5, rtol=1e-5)


def test_a_rows_result_does_not_depend_on_the_other_rows():
  """Each batch row is computed on its own: row 1 alone gives the bits it gets
  in the batch (what makes 8 devices equal 1 under `shard_map`)."""
  q, k, v, w, mask = _case(3, 21, 21, 4, 2, 32, seed=4)
  out, full = _out_and_grads(cpu_attention.attend, q, k, v, w, mask)
  out1, alone = _out_and_grads(cpu_attention.attend, q[1:2], k[1:2], v[1:2], w[1:2], mask[1:2])
  np.testing.assert_array_equal(out[1:2], out1)
  for g, a in zip(full, alone):
    np.testing.assert_array_equal(g[1:2], a)


def test_eight_devices_equal_one_bitwise():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (the suite's fake CPU devices)")
  q, k, v, w, mask = _case(8, 19, 19, 4, 2, 32, seed=5)
  one = _out_and_grads(cpu_attention.attend, q, k, v, w, mask)
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  with jax.set_mesh(mesh):
    args = [jax.device_put(x, rows) for x in (q, k, v, w, mask)]
    eight = jax.jit(lambda q, k, v, w, m: _out_and_grads(cpu_attention.attend, q, k, v, w, m))(*args)
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(eight)):
    np.testing.assert_array_equal(a, b)


def test_model_logits_and_gradients_equal_dense():
  # One layer: the kernel's shapes are tested above; the MoE runs it in tests/test_moe.py.
  cfg = models.get_config("tiny", vocab_size=67, num_layers=1, attention="dense")
  dense = models.Qwen3(cfg, rngs=nnx.Rngs(3))
  fused = models.Qwen3(cfg.replace(attention="cpu_fused"), rngs=nnx.Rngs(3))
  rng = np.random.default_rng(1)
  tokens = jnp.asarray(rng.integers(3, 67, (2, 13)))
  mask = jnp.asarray(np.arange(13)[None, :] < np.array([[13], [9]]))

  def grads(model):
    graphdef, params = nnx.split(model)
    def loss(params):
      logits = nnx.merge(graphdef, params)(tokens, mask_BT=mask).logits
      return jnp.sum(jax.nn.log_softmax(logits)[..., 5] * mask), logits
    return jax.jit(jax.grad(loss, has_aux=True))(params)

  (g_dense, l_dense), (g_fused, l_fused) = grads(dense), grads(fused)
  m = np.asarray(mask)[..., None]
  np.testing.assert_allclose(np.asarray(l_fused) * m, np.asarray(l_dense) * m, atol=2e-5)
  for a, b in zip(jax.tree.leaves(g_fused), jax.tree.leaves(g_dense)):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)


def test_a_nan_score_gives_nan_as_dense_and_far_scores_stay_finite():
  q, k, v, _, mask = _case(1, 5, 5, 2, 1, 16, seed=7, density=1.0)
  mask = mask.at[0, 0].set(True)
  q_nan = q.at[0, 2, 0, 3].set(jnp.nan)  # one query row's scores all NaN
  got, want = cpu_attention.attend(q_nan, k, v, mask), _dense(q_nan, k, v, mask)
  np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
  assert np.isnan(got[0, 2, 0]).all()
  q_far = q * 60.0  # scores ~60 apart, some over 87: exponents below the kernel's clamp
  got = cpu_attention.attend(q_far, k, v, mask)
  assert np.isfinite(got).all()  # the scores' own rounding is ~1e-5 at this size
  np.testing.assert_allclose(got, _dense(q_far, k, v, mask), atol=1e-4, rtol=0)


def test_vmap_runs_each_slice():
  q, k, v, _, mask = _case(3, 6, 6, 2, 1, 16, seed=8)
  got = jax.vmap(cpu_attention.attend)(q[:, None], k[:, None], v[:, None], mask[:, None])
  np.testing.assert_allclose(got[:, 0], _dense(q, k, v, mask), atol=2e-6, rtol=0)


def test_clear_errors():
  q, k, v, _, mask = _case(1, 4, 4, 2, 2, 16, seed=6)
  with pytest.raises(ValueError, match="float32"):
    cpu_attention.attend(q.astype(jnp.bfloat16), k, v, mask)
  with pytest.raises(ValueError, match="mask \\[B, T, S\\]"):
    cpu_attention.attend(q, k, v, mask[:, :, :3])
  with pytest.raises(ValueError, match="K dividing N"):
    cpu_attention.attend(q[:, :, :1], k, v, mask)  # 1 query head over 2 kv heads
  with pytest.raises(ValueError, match="got q"):
    cpu_attention.attend(q, k, v[..., :8], mask)


def test_no_compiler_is_a_clear_error(monkeypatch):
  monkeypatch.setattr(cpu_attention, "_built", {})
  monkeypatch.setattr(cpu_attention, "_compiler", lambda: None)
  q, k, v, _, mask = _case(1, 4, 4, 2, 2, 16, seed=6)
  with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
    cpu_attention.attend(q, k, v, mask)


def test_the_build_is_cached_per_source(tmp_path, monkeypatch):
  # A one-line source through the same build (the kernel's own builds on every cold cache).
  source, cache = tmp_path / "kernel.cc", tmp_path / "cache"
  source.write_text('extern "C" int mipu_probe() { return 0; }\n')
  monkeypatch.setattr(cpu_attention, "SOURCE", source)
  monkeypatch.setenv("MIPU_JAX_KERNEL_CACHE", str(cache))
  cxx = cpu_attention._compiler()  # pylint: disable=protected-access
  first = cpu_attention._library(cxx)  # pylint: disable=protected-access
  stamp = first.stat().st_mtime_ns
  assert cpu_attention._library(cxx) == first and first.stat().st_mtime_ns == stamp  # pylint: disable=protected-access
  assert [p.name for p in cache.iterdir()] == [first.name]  # no temporary left behind
  source.write_text('extern "C" int mipu_probe() { return 1; }\n')  # another source: rebuilt
  second = cpu_attention._library(cxx)  # pylint: disable=protected-access
  assert second != first and sorted(p.name for p in cache.iterdir()) == sorted(
      [first.name, second.name])


def test_auto_is_the_kernel_in_float32_on_a_cpu_and_dense_otherwise():
  assert models.get_config("tiny").attention == "auto"
  assert attention.resolve("auto", jnp.float32, jnp.float32, jnp.float32) == "cpu_fused"
  assert attention.resolve("auto", jnp.bfloat16, jnp.bfloat16, jnp.bfloat16) == "dense"
  assert attention.resolve("auto", jnp.float32, jnp.bfloat16, jnp.float32) == "dense"
  assert attention.resolve("blockwise", jnp.float32) == "blockwise"
  q, k, v, *_ = _case(2, 9, 9, 4, 2, 16, seed=9)
  am = attention.row_mask(jnp.ones((2, 9), bool), None)
  auto = attention.attend(q, k, v, am, implementation="auto")
  np.testing.assert_array_equal(auto, attention.attend(q, k, v, am, implementation="cpu_fused"))
  half = [x.astype(jnp.bfloat16) for x in (q, k, v)]
  np.testing.assert_array_equal(attention.attend(*half, am, implementation="auto"),
                                attention.attend(*half, am, implementation="dense"))


def test_auto_without_the_kernel_runs_dense_and_says_why(monkeypatch, caplog):
  monkeypatch.setattr(cpu_attention, "_built", {})
  monkeypatch.setattr(cpu_attention, "_compiler", lambda: None)
  attention._warn_auto_without_kernel.cache_clear()  # pylint: disable=protected-access
  assert attention.resolve("auto", jnp.float32) == "dense"
  assert "no C++ compiler" in caplog.text and 'attention="auto" runs "dense"' in caplog.text
