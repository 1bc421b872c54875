"""Attention implementations and chunked log-probs equal the dense references.

fp32, odd sizes, grouped-query heads, left and right padding, packed segments;
outputs and gradients. Splash runs in Pallas interpret mode on CPU; cuDNN only
where a GPU is present (skipped otherwise).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mipu_jax import config as config_lib
from mipu_jax import models
from mipu_jax.learner.logprobs import policy_logprobs
from mipu_jax.learner.logprobs import Scoring
from mipu_jax.models import attention


def _inputs(b=2, t=37, n=6, k=2, h=8, seed=0):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
  kk = jnp.asarray(rng.normal(size=(b, t, k, h)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(b, t, k, h)), jnp.float32)
  valid = np.ones((b, t), bool)
  valid[0, t - 7:] = False  # right padding
  valid[1, :5] = False  # left padding
  seg = np.zeros((b, t), np.int32)
  seg[1, t // 2:] = 1  # two packed segments in row 1
  return q, kk, v, jnp.asarray(valid), jnp.asarray(seg)


def _loss_and_grads(impl, q, k, v, mask, valid, **kw):
  h = q.shape[-1]
  w = jnp.cos(jnp.arange(h, dtype=jnp.float32))[None, None, None, :]

  def loss(q, k, v):
    out = attention.attend(q, k, v, mask, implementation=impl, **kw)
    # Only real queries count: a padding query's output is never used.
    return jnp.sum(out * w * valid[:, :, None, None]), out

  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return out * valid[:, :, None, None], grads


@pytest.mark.parametrize("segments", [False, True])
@pytest.mark.parametrize("blocks", [(8, 16), (5, 3), (64, 64)])
def test_blockwise_equals_dense_outputs_and_gradients(segments, blocks):
  q, k, v, valid, seg = _inputs()
  mask = attention.row_mask(valid, seg if segments else None)
  want, want_g = _loss_and_grads("dense", q, k, v, mask, valid)
  got, got_g = _loss_and_grads("blockwise", q, k, v, mask, valid,
                               block_q=blocks[0], block_k=blocks[1])
  np.testing.assert_allclose(got, want, atol=2e-6)
  for g, w in zip(got_g, want_g):
    np.testing.assert_allclose(g, w, atol=2e-5)


def test_blockwise_cache_mask_equals_dense():
  """Queries at cache slots `index ..` (a prefill into a cache whose rows hold
  0 and 3 earlier tokens)."""
  q, k, v, _, _ = _inputs(t=29)
  mask = attention.cache_mask(jnp.array([0, 3]), 26, 29)
  want = attention.attend(q[:, :26], k, v, mask, implementation="dense")
  got = attention.attend(q[:, :26], k, v, mask, implementation="blockwise", block_q=7,
                         block_k=4)
  np.testing.assert_allclose(got, want, atol=2e-6)


@pytest.mark.extended
def test_splash_in_interpret_mode_equals_dense():
  q, k, v, valid, seg = _inputs(t=150, n=4, k=2, h=16)  # padded to 256 inside
  mask = attention.row_mask(valid, seg)
  want, want_g = _loss_and_grads("dense", q, k, v, mask, valid)
  got, got_g = _loss_and_grads("splash", q, k, v, mask, valid, block_q=128, block_k=128)
  # Row 1's left padding: its first queries see no key at all; skip them.
  rows = np.asarray(valid).copy()
  rows[1, :5] = False
  np.testing.assert_allclose(got * rows[:, :, None, None], want * rows[:, :, None, None],
                             atol=2e-5)
  for g, w in zip(got_g, want_g):  # the query, key and value gradients
    np.testing.assert_allclose(g, w, atol=5e-5)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN needs a GPU")
def test_cudnn_equals_dense_on_gpu():
  q, k, v, _, _ = _inputs(t=128, n=8, k=2, h=64)
  valid = jnp.asarray(np.arange(128)[None, :] < np.array([[128], [100]]))
  mask = attention.row_mask(valid)
  q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
  want = attention.attend(q, k, v, mask, implementation="dense")
  got = attention.attend(q, k, v, mask, implementation="cudnn", prefix_rows=True)
  np.testing.assert_allclose(np.asarray(got * valid[:, :, None, None], np.float32),
                             np.asarray(want * valid[:, :, None, None], np.float32),
                             atol=2e-2)


def _model(**kw):
  cfg = models.get_config("tiny", vocab_size=67, num_layers=2, **kw)
  return models.Qwen3(cfg, rngs=nnx.Rngs(3))


def test_model_blockwise_equals_dense_with_padding_and_cache():
  dense, block = _model(), _model(attention="blockwise", attention_block=4)
  rng = np.random.default_rng(1)
  tokens = jnp.asarray(rng.integers(3, 67, (2, 13)))
  mask = jnp.asarray(np.arange(13)[None, :] < np.array([[13], [9]]))
  np.testing.assert_allclose(block(tokens, mask_BT=mask).logits * mask[..., None],
                             dense(tokens, mask_BT=mask).logits * mask[..., None], atol=2e-5)
  # A prefill into a KV cache (right padding) goes through the same switch.
  outs = []
  for model in (dense, block):
    cache = models.init_cache(model.config, 2, 16, jnp.float32)
    logits = model(tokens, mask_BT=mask, cache=cache).logits
    outs.append(logits * mask[..., None])
  np.testing.assert_allclose(outs[1], outs[0], atol=2e-5)


@pytest.mark.parametrize("impl", ["dense", "blockwise"])
def test_a_packed_row_equals_its_segments_run_separately(impl):
  model = _model(attention=impl, attention_block=4)
  rng = np.random.default_rng(2)
  a, b = rng.integers(3, 67, 7), rng.integers(3, 67, 5)
  packed = jnp.asarray(np.concatenate([a, b, [0, 0]])[None])
  seg = jnp.asarray(np.array([0] * 7 + [1] * 5 + [2, 2])[None])
  pos = jnp.asarray(np.array(list(range(7)) + list(range(5)) + [0, 0])[None])
  mask = jnp.asarray(np.array([1] * 12 + [0, 0])[None])
  got = model(packed, mask_BT=mask, segment_ids_BT=seg, positions_BT=pos).logits[0]
  np.testing.assert_allclose(got[:7], model(jnp.asarray(a[None])).logits[0], atol=2e-5)
  np.testing.assert_allclose(got[7:12], model(jnp.asarray(b[None])).logits[0], atol=2e-5)
  with pytest.raises(ValueError, match="KV cache"):
    model(packed, segment_ids_BT=seg, cache=models.init_cache(model.config, 1, 16))


@pytest.mark.parametrize("with_entropy", [False, True])
def test_chunked_logprobs_equal_dense_values_and_gradients(with_entropy):
  model = _model()
  graphdef, params = nnx.split(model)
  rng = np.random.default_rng(4)
  tokens = jnp.asarray(rng.integers(3, 67, (3, 11)))
  mask = jnp.asarray(np.arange(11)[None, :] < np.array([[11], [6], [9]]))
  scoring = Scoring(temperature=0.7)

  def run(chunk):
    def f(p):
      out = policy_logprobs(nnx.merge(graphdef, p), tokens, mask, scoring,
                            with_entropy=with_entropy, entropy_grad=with_entropy,
                            logits_chunk=chunk)
      lp, ent = out if with_entropy else (out, jnp.zeros_like(out))
      return jnp.sum((lp + 0.3 * ent) * mask), (lp, ent)
    (_, (lp, ent)), g = jax.value_and_grad(f, has_aux=True)(params)
    return lp, ent, g

  lp_d, ent_d, g_d = run(0)
  lp_c, ent_c, g_c = run(4)  # 10 positions in chunks of 4: a padded last chunk
  np.testing.assert_allclose(lp_c, lp_d, atol=1e-5)
  np.testing.assert_allclose(ent_c, ent_d, atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g_c, g_d)


def test_remat_policies_give_the_same_gradients():
  tokens = jnp.asarray(np.random.default_rng(5).integers(3, 67, (2, 9)))

  def grads(policy):
    graphdef, params = nnx.split(_model(remat=policy))
    return jax.grad(lambda p: jnp.sum(nnx.merge(graphdef, p)(tokens).logits ** 2))(params)

  ref = grads("none")
  for policy in ("layer", "dots"):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
                 grads(policy), ref)
  with pytest.raises(ValueError, match="remat policy"):
    models.get_config("tiny", remat="sometimes")


def test_cudnn_with_packed_rows_warns_that_they_run_blockwise():
  cd = config_lib.default_config()
  cd.model.attention = "cudnn"
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    config_lib.from_config_dict(cd)  # unpacked rows: cuDNN runs, no warning
  cd.learner.pack_length = 256
  with pytest.warns(UserWarning, match="packed rows use the blockwise kernel"):
    config_lib.from_config_dict(cd)
