"""Qwen3 policy: parity with Hugging Face transformers, KV cache, dtypes."""

import numpy as np
import jax.numpy as jnp
import pytest
from flax import nnx

from mipu_jax import models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
torch.set_num_threads(2)

# Random tiny configs: tied / untied, GQA ratio 1 and > 1, odd sizes.
CONFIGS = {
    "tied_gqa2": dict(vocab_size=97, hidden_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=12, intermediate_size=80, tie_embeddings=True),
    "untied_mha": dict(vocab_size=101, hidden_size=40, num_layers=3, num_heads=5, num_kv_heads=5,
                       head_dim=8, intermediate_size=72, tie_embeddings=False),
    "untied_gqa3_odd": dict(vocab_size=89, hidden_size=36, num_layers=2, num_heads=6,
                            num_kv_heads=2, head_dim=14, intermediate_size=58,
                            tie_embeddings=False, rope_theta=1e6),
}


def _random_model(kw, seed=0):
  cfg = models.Qwen3Config(**kw)
  model = models.Qwen3(cfg, rngs=nnx.Rngs(seed))
  # Non-trivial norm weights so a mis-mapped norm would show.
  rng = np.random.default_rng(seed)
  state = nnx.state(model, nnx.Param)
  pure = nnx.to_pure_dict(state)
  for name in ("attn_norm", "mlp_norm", "q_norm", "k_norm"):
    x = pure["layers"][name]
    pure["layers"][name] = jnp.asarray(1 + 0.3 * rng.standard_normal(x.shape), x.dtype)
  pure["final_norm"] = jnp.asarray(1 + 0.3 * rng.standard_normal(pure["final_norm"].shape))
  nnx.replace_by_pure_dict(state, pure)
  nnx.update(model, state)
  return model


def _hf_logits(hf, tokens, mask=None, positions=None):
  """The loaded transformers model `hf`'s logits of `tokens`."""
  hf.eval()
  kwargs = {}
  if mask is not None:
    kwargs["attention_mask"] = torch.tensor(np.asarray(mask, np.int64))
  if positions is not None:
    kwargs["position_ids"] = torch.tensor(np.asarray(positions, np.int64))
  with torch.no_grad():
    return hf(torch.tensor(np.asarray(tokens, np.int64)), **kwargs).logits.numpy()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_match_transformers(name, tmp_path):
  model = _random_model(CONFIGS[name])
  models.save_pretrained(model, str(tmp_path))
  v = model.config.vocab_size
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, v, (3, 13))
  fwd = nnx.jit(lambda m, t, k: m(t, mask_BT=k).logits)
  ours = np.asarray(fwd(model, jnp.asarray(tokens), jnp.ones((3, 13), bool)))
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
  ref = _hf_logits(hf, tokens)
  assert ours.dtype == np.float32
  np.testing.assert_array_less(np.abs(ours - ref).max(), 1e-4)

  # Left and right padding: compare at real positions, with HF given the same positions.
  lengths = np.array([13, 9, 5])
  for side in ("left", "right"):
    mask = np.zeros((3, 13), bool)
    for b, n in enumerate(lengths):
      if side == "left":
        mask[b, 13 - n:] = True
      else:
        mask[b, :n] = True
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    padded = np.where(mask, tokens, 0)
    ours = np.asarray(fwd(model, jnp.asarray(padded), jnp.asarray(mask)))
    ref = _hf_logits(hf, padded, mask, positions)
    diff = np.abs(ours - ref)[mask]
    assert diff.max() <= 1e-4, (side, diff.max())
    # The real tokens' logits do not depend on padding at all.
    alone = np.asarray(model(jnp.asarray(padded[2][mask[2]][None])).logits)[0]
    np.testing.assert_allclose(ours[2][mask[2]], alone, atol=1e-4)


def test_from_pretrained_roundtrip_sharded_files(tmp_path):
  model = _random_model(CONFIGS["untied_gqa3_odd"], seed=4)
  models.save_pretrained(model, str(tmp_path), max_shard_bytes=20_000)
  assert (tmp_path / "model.safetensors.index.json").exists()
  loaded = models.from_pretrained(str(tmp_path))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 89, (2, 7)))
  np.testing.assert_array_equal(np.asarray(loaded(tokens).logits),
                                np.asarray(model(tokens).logits))
  bf16 = models.from_pretrained(str(tmp_path), dtype="bfloat16")
  assert bf16.layers.q[...].dtype == jnp.bfloat16


@pytest.mark.parametrize("cache_dtype,atol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
def test_kv_cache_decode_equals_full_forward(cache_dtype, atol):
  """Ragged rows through a cache: a right-padded prefill (row 1 has 4 of 6
  tokens), then one token per step, each row at its own length; a row idle
  in a step (mask 0) neither writes nor advances."""
  model = _random_model(CONFIGS["tied_gqa2"], seed=2)
  rng = np.random.default_rng(3)
  tokens = rng.integers(0, 97, (2, 11))
  full = np.asarray(model(jnp.asarray(tokens)).logits)
  cache = models.init_cache(model.config, 2, 16, cache_dtype)
  step = nnx.jit(lambda m, t, k, c: m(t, mask_BT=k, cache=c)[:2])
  prompt = np.array([[1] * 6, [1] * 4 + [0] * 2], bool)
  logits, cache = step(model, jnp.asarray(tokens[:, :6]), jnp.asarray(prompt), cache)
  got = [[np.asarray(logits)[0, :6]], [np.asarray(logits)[1, :4]]]
  np.testing.assert_array_equal(np.asarray(cache.index), [6, 4])
  # The position each row feeds at each step; None: idle.
  feeds = zip([None, None, 6, 7, 8, 9, 10], [4, 5, 6, None, 7, 8, 9])
  for step_pos in feeds:
    live = np.array([p is not None for p in step_pos])
    new = np.array([[tokens[r, p or 0]] for r, p in enumerate(step_pos)])
    logits, cache = step(model, jnp.asarray(new), jnp.asarray(live[:, None]), cache)
    for r in np.flatnonzero(live):
      got[r].append(np.asarray(logits)[r])
  np.testing.assert_array_equal(np.asarray(cache.index), [11, 10])
  np.testing.assert_allclose(np.concatenate(got[0]), full[0], atol=atol)
  np.testing.assert_allclose(np.concatenate(got[1]), full[1, :10], atol=atol)


def test_bf16_compute_close_to_fp32_and_logits_fp32():
  kw = CONFIGS["tied_gqa2"]
  m32 = _random_model(kw, seed=5)
  m16 = _random_model(dict(kw, dtype="bfloat16"), seed=5)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 97, (2, 9)))
  a, b = np.asarray(m32(tokens).logits), np.asarray(m16(tokens).logits)
  assert b.dtype == np.float32 and m16.layers.q[...].dtype == jnp.float32
  assert 0 < np.abs(a - b).max() < 0.1


def test_presets_match_public_configs():
  c = models.get_config("qwen3_4b")
  assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim,
          c.intermediate_size, c.tie_embeddings, c.vocab_size) == (
              2560, 36, 32, 8, 128, 9728, True, 151936)
  assert models.get_config("qwen3_8b").tie_embeddings is False
  assert models.get_config("qwen3_1p7b").intermediate_size == 6144
  assert models.get_config("qwen3_0p6b").hidden_size == 1024
  # Qwen3-4B has ~4.02B parameters.
  assert 3.9e9 < c.num_params() < 4.1e9
  with pytest.raises(ValueError, match="Unknown model preset"):
    models.get_config("qwen3_70b")
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    models.Qwen3Config(vocab_size=8, hidden_size=8, num_layers=1, num_heads=3, num_kv_heads=2,
                       head_dim=4, intermediate_size=8)


def test_mlp_recompute_is_resolved_for_the_platform():
  from mipu_jax.models import qwen3  # pylint: disable=g-import-not-at-top
  assert qwen3.recompute_mlp_for("cpu")
  assert not qwen3.recompute_mlp_for("gpu") and not qwen3.recompute_mlp_for("tpu")


def test_the_bare_call_takes_the_platforms_mlp_recompute():
  """A bare `model(tokens)` under `jax.grad` runs what the learner runs on the
  default backend (`recompute_mlp_for`: on a CPU the recompute, bitwise the plain
  MLP, test below); an explicit flag still decides, and a cached (sampling)
  call never recomputes."""
  import jax  # pylint: disable=g-import-not-at-top
  from mipu_jax.models import qwen3  # pylint: disable=g-import-not-at-top
  graphdef, params = nnx.split(_random_model(CONFIGS["tied_gqa2"], seed=1))
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 97, (2, 7)))

  def grad_jaxpr(**kw):
    loss = lambda p: jnp.sum(nnx.merge(graphdef, p)(tokens, **kw).logits)
    return str(jax.make_jaxpr(jax.grad(loss))(params))

  platform = qwen3.recompute_mlp_for(jax.default_backend())
  assert grad_jaxpr() == grad_jaxpr(recompute_mlp=platform)
  assert grad_jaxpr() != grad_jaxpr(recompute_mlp=not platform)
  model = nnx.merge(graphdef, params)
  cache = qwen3.init_cache(model.config, 2, 16)
  cached = lambda **kw: str(jax.make_jaxpr(lambda t: model(t, cache=cache, **kw).logits)(tokens))
  assert cached() == cached(recompute_mlp=False)


@pytest.mark.skipif(__import__("jax").default_backend() != "cpu",
                    reason="bitwise equality is XLA:CPU's")
def test_recomputed_gated_mlp_is_bitwise_the_plain_one():
  """`recompute_mlp=True` (what the learner runs on CPU without remat,
  `qwen3.recompute_mlp_for`): the layer recomputes its MLP input projections in
  the backward pass; loss, logits and every gradient of the scanned model equal,
  bit for bit, those of the same model that keeps `silu(h W_gate) * (h W_up)`
  for the backward pass. Under a remat policy the flag changes nothing."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax._src import ad_checkpoint  # pylint: disable=g-import-not-at-top
  remat_name = ad_checkpoint.remat_p.name  # the primitive of jax.checkpoint
  model = _random_model(CONFIGS["untied_mha"], seed=3)
  graphdef, params = nnx.split(model)
  rng = np.random.default_rng(4)
  tokens = jnp.asarray(rng.integers(0, 101, (3, 11)))
  mask = jnp.asarray(np.arange(11)[None, :] >= np.array([[0], [2], [5]]))

  def value_and_grad(recompute_mlp, graphdef=graphdef):
    def loss(p):
      logits = nnx.merge(graphdef, p)(tokens, mask_BT=mask, recompute_mlp=recompute_mlp).logits
      return jnp.sum(jnp.sin(logits) * mask[..., None]), logits
    return jax.value_and_grad(loss, has_aux=True)

  def loss_and_grads(recompute_mlp):
    f = value_and_grad(recompute_mlp)
    return jax.jit(f)(params), str(jax.make_jaxpr(f)(params)).count(remat_name + "[")

  recomputed, n_recomputed = loss_and_grads(True)
  kept, n_kept = loss_and_grads(False)
  assert n_recomputed > n_kept == 0  # the recompute was on, then off
  leaves_r, leaves_k = jax.tree.leaves(recomputed), jax.tree.leaves(kept)
  assert len(leaves_r) == len(leaves_k) > 3
  for a, b in zip(leaves_r, leaves_k):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  for policy in ("layer", "dots"):
    model.config = model.config.replace(remat=policy)
    remat_graphdef = nnx.graphdef(model)
    jaxpr = lambda flag: str(jax.make_jaxpr(value_and_grad(flag, remat_graphdef))(params))
    assert jaxpr(True) == jaxpr(False)  # the same program: nothing to compile and run
