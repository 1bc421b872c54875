"""Sampler quantization: per-channel weights, per-token activations, mismatch ordering."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mipu_jax.sampler import Sampler, mismatch, quant
from mipu_jax.sampler.weights import learner_params
from mipu_jax.testing import models
from test_sampler import PROMPTS, make_model

_BOUNDS = {"int8": 127.5, "int4": 7.5, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


@pytest.fixture(scope="module")
def model():
  return make_model()


@pytest.mark.parametrize("qtype", sorted(_BOUNDS))
def test_weights_are_quantized_per_output_channel(model, qtype):
  layers = {k: v for k, v in learner_params(model)["layers"].items() if not k.endswith("norm")}

  @jax.jit
  def scales_and_values(layers):
    return {name: (quant.quantize(w, qtype, quant.LAYER_CHANNEL_AXES[name]).scale,
                   quant.fake_quantize(w, qtype, quant.LAYER_CHANNEL_AXES[name]))
            for name, w in layers.items()}

  for name, (scale, fake) in jax.device_get(scales_and_values(layers)).items():
    w = np.asarray(layers[name])
    kept = quant.LAYER_CHANNEL_AXES[name]
    reduced = tuple(a for a in range(w.ndim) if a not in kept)
    absmax = np.abs(w).max(axis=reduced, keepdims=True)
    np.testing.assert_allclose(scale, absmax / _BOUNDS[qtype], rtol=1e-6)
    if qtype.startswith("int"):
      assert np.all(np.abs(fake - w) <= scale / 2 + 1e-7)
      np.testing.assert_allclose(fake / scale, np.round(fake / scale), atol=1e-4)
    else:  # every value is an fp8 number times its channel's scale
      grid = (fake / scale).astype(quant.WEIGHT_QTYPES[qtype]).astype(np.float32)
      np.testing.assert_allclose(fake / scale, grid, rtol=1e-6)


@pytest.mark.parametrize("quant_lm_head", [False, True])
def test_quantize_params_lm_head_flag_and_norms(model, quant_lm_head):
  params = learner_params(model)
  out = jax.jit(lambda p: quant.quantize_params(
      p, weight_quant="int8", compute_dtype=jnp.bfloat16, quant_lm_head=quant_lm_head,
      tie_embeddings=True))(params)
  for name in ("attn_norm", "mlp_norm", "q_norm", "k_norm"):
    np.testing.assert_array_equal(out["layers"][name], params["layers"][name])
  assert out["layers"]["q"].dtype == jnp.bfloat16
  embed = np.asarray(params["embed"])
  if quant_lm_head:  # per row of the tied [V, D] table
    ref = quant.fake_quantize(jnp.asarray(embed), "int8", (0,)).astype(jnp.bfloat16)
    np.testing.assert_array_equal(out["embed"], ref)
  else:
    np.testing.assert_array_equal(out["embed"], jnp.asarray(embed).astype(jnp.bfloat16))


@pytest.mark.parametrize("name,levels", [("int8", 127), ("fp8", None)])
def test_act_quant_is_per_token(name, levels):
  aq = jax.jit(quant.make_act_quant(name))
  x = np.random.default_rng(0).normal(size=(2, 3, 5, 7)).astype(np.float32)
  x_big = x.copy()
  x_big[1, 2] *= 1000.0
  y, y_big = np.asarray(aq(x)), np.asarray(aq(x_big))
  np.testing.assert_array_equal(np.delete(y.reshape(6, -1), 5, 0),
                                np.delete(y_big.reshape(6, -1), 5, 0))  # others unaffected
  absmax = np.abs(x).max(axis=(2, 3), keepdims=True)
  tol = absmax / 255 + 1e-6 if levels else 0.07 * np.abs(x) + absmax * 1e-3
  assert np.all(np.abs(y - x) <= tol)


def _prefill_logits(sampler):
  return models.prefill_logits(sampler, PROMPTS)


def test_real_storage_is_bit_identical_to_fake(model):
  kwargs = dict(weight_quant="int4", max_prefill_length=32, max_decode_length=32)
  real = Sampler(model, quant_storage="real", **kwargs)
  assert real.params["layers"]["q"].qvalue.dtype == jnp.int4
  np.testing.assert_array_equal(_prefill_logits(Sampler(model, **kwargs)),
                                _prefill_logits(real))


def test_activation_and_kv_quantization_reach_the_model(model):
  # Prefill attends through the KV cache, so int8 KV and int8 activations both
  # show in these logits; decoding runs the same model code.
  kwargs = dict(max_prefill_length=32, max_decode_length=32)
  ref = _prefill_logits(Sampler(model, **kwargs))
  quantized = _prefill_logits(Sampler(model, act_quant="int8", kv_cache_dtype="int8", **kwargs))
  err = np.abs(quantized - ref).max()
  assert 1e-4 < err < 0.05 * np.abs(ref).max(), err


def test_mismatch_grows_with_coarser_precision(model):
  prompts = PROMPTS + [[2, 3, 5, 7, 11]]
  rows = mismatch.measure_mismatch(
      model, prompts, modes=("fp32", "bf16", "int8", "fp8", "int4"),
      max_new_tokens=12, num_samples=2, temperature=0.7, seed=1,
      sampler_kwargs=dict(max_prefill_length=32, max_decode_length=32))
  by_mode = {r.mode: r for r in rows}
  order = [by_mode[m].mean_abs_diff for m in ("fp32", "bf16", "int8", "fp8", "int4")]
  assert order[0] < 1e-5
  assert all(a < b for a, b in zip(order, order[1:])), order
  assert by_mode["int4"].k3_kl > by_mode["int8"].k3_kl > by_mode["fp32"].k3_kl
  assert all(r.num_tokens == 8 * 12 for r in rows)
  table = mismatch.format_table(rows)
  assert "int4" in table and "k3_kl" in table


@pytest.mark.parametrize("kwargs", [
    dict(weight_quant="int4", act_quant="fp8", kv_cache_dtype="fp8", quant_lm_head=True),
    dict(kv_cache_dtype="bf16"),
    dict(dtype="bfloat16", kv_cache_dtype="fp8_e5m2"),
    dict(dtype="float16", kv_cache_dtype="fp8"),
    # The FP8 cache as the first case's, under native compute (tests/test_native_quant.py's).
    pytest.param(dict(weight_quant="int8", act_quant="int8", kv_cache_dtype="fp8",
                      quant_compute="native"), marks=pytest.mark.extended),
])
def test_fake_kv_storage_samples_bitwise_as_real(model, kwargs):
  """A cache kept as compute-dtype values rounded through the cache dtype (CPU's
  default) draws the same tokens with the same log-probs as a cache of that
  dtype: the attention reads the same numbers. Refill (more samples than slots)
  included."""
  common = dict(max_prefill_length=32, max_decode_length=32, max_concurrent_decodes=8,
                eos_ids=[1], **kwargs)
  out = {}
  for storage in ("real", "fake"):
    sampler = Sampler(model, kv_cache_storage=storage, **common)
    out[storage] = sampler.generate(PROMPTS, max_new_tokens=20, num_samples=3, seed=5)
  spec = Sampler(model, kv_cache_storage="fake", **common).engine._spec
  assert spec.inference.kv_round == jnp.dtype(Sampler(model, **common).config.kv_cache_dtype)
  assert spec.kv_dtype == jnp.dtype(kwargs.get("dtype", "float32"))
  np.testing.assert_array_equal(out["real"].tokens_array, out["fake"].tokens_array)
  np.testing.assert_array_equal(out["real"].logprobs_array, out["fake"].logprobs_array)
  assert out["real"].lengths.max() > 5  # the decode loop ran, not only prefill


def test_kv_storage_rule():
  """Fake storage only where the compute dtype holds every cache value exactly,
  and `auto` is fake on CPU only."""
  from mipu_jax.sampler.config import SamplerConfig  # pylint: disable=g-import-not-at-top

  def kv_round(dtype, kv, storage="auto", platform="cpu"):
    return SamplerConfig(dtype=dtype, kv_cache_dtype=kv, kv_cache_storage=storage).kv_round(
        platform)

  assert kv_round("float32", "fp8") == jnp.float8_e4m3fn
  assert kv_round("float32", "bf16") == jnp.bfloat16
  assert kv_round("bfloat16", "fp8_e5m2") == jnp.float8_e5m2
  assert kv_round("float32", "fp8", storage="fake") == jnp.float8_e4m3fn
  assert kv_round("float32", "fp8", platform="gpu") is None  # auto: real on accelerators
  assert kv_round("float32", "fp8", storage="real") is None
  # auto leaves every other cache real: nothing to round, or not exact in the compute dtype.
  for dtype, kv in [("bfloat16", "fp16"), ("bfloat16", "float32"), ("float32", None),
                    ("float32", "int8")]:
    assert kv_round(dtype, kv) is None
    with pytest.raises(ValueError, match="holds"):
      kv_round(dtype, kv, storage="fake")
  with pytest.raises(ValueError, match="CPU only"):
    kv_round("float32", "fp8", storage="fake", platform="gpu")
  with pytest.raises(ValueError, match="kv_cache_storage"):
    SamplerConfig(kv_cache_storage="fast")


def test_float8_codes_round_trip_exactly():
  """Every float8 code, as float32 and back, is itself: why a float32 array can
  hold a float8 cache (NaN codes aside)."""
  for dtype in (jnp.float8_e4m3fn, jnp.float8_e5m2):
    codes = np.arange(256, dtype=np.uint8).view(dtype)
    back = jnp.asarray(codes).astype(jnp.float32).astype(dtype)
    wide = np.asarray(back).view(np.uint8)
    finite = np.isfinite(np.asarray(codes, np.float32))
    np.testing.assert_array_equal(wide[finite], np.arange(256, dtype=np.uint8)[finite])


def test_int3_grid_by_hand():
  # Channel axis 0: row 0's absmax 0.9 gives the step 0.3; 0.1 rounds to 0. A zero
  # row stays zero (no 0 / 0).
  w = jnp.array([[0.9, -0.3, 0.1, 0.61], [0.0, 0.0, 0.0, 0.0]], jnp.float32)
  got = quant.fake_quantize(w, "int3", (0,))
  np.testing.assert_allclose(np.asarray(got), [[0.9, -0.3, 0.0, 0.6], [0, 0, 0, 0]], atol=1e-7)
  x = jax.random.normal(jax.random.key(0), (64, 48))
  err = {q: float(jnp.abs(quant.fake_quantize(x, q, (1,)) - x).mean()) for q in ("int3", "int4")}
  assert err["int3"] > 1.8 * err["int4"]  # 7 levels against 15: about twice the error


def test_int3_runs_with_fake_storage_only():
  params = {"layers": {"q": jnp.ones((1, 4, 2, 3))}, "final_norm": jnp.ones(4),
            "embed": jnp.ones((8, 4))}
  kw = dict(weight_quant="int3", compute_dtype=jnp.float32, quant_lm_head=False,
            tie_embeddings=True)
  assert quant.quantize_params(params, **kw)["layers"]["q"].dtype == jnp.float32
  for bad in (dict(storage="real"), dict(compute="native")):
    with pytest.raises(ValueError, match="no storage type"):
      quant.quantize_params(params, **kw, **bad)
  with pytest.raises(ValueError, match="int3"):
    quant.check_weight_quant("int2")
