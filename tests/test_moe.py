"""Qwen3-MoE policy: parity with transformers' Qwen3MoeForCausalLM, the grouped
matmul against every-expert-on-every-token, routing replay's properties, and
the config's errors (docs/method.md §7a)."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mipu_jax import models
from mipu_jax.models import moe, qwen3
from mipu_jax.models.hf import CheckpointError
from test_models import _random_model  # tests/ is on the path (no package)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
torch.set_num_threads(2)

_BASE = dict(vocab_size=83, hidden_size=40, num_heads=4, num_kv_heads=2, head_dim=10,
             intermediate_size=56, num_experts=6, num_experts_per_tok=2,
             moe_intermediate_size=24)
# norm_topk_prob both ways; a dense / MoE mix by mlp_only_layers and by decoder_sparse_step.
CONFIGS = {
    "all_moe_norm_tied": dict(_BASE, num_layers=2, norm_topk_prob=True, tie_embeddings=True),
    "all_moe_nonorm_untied": dict(_BASE, num_layers=2, norm_topk_prob=False,
                                  tie_embeddings=False, num_experts_per_tok=3),
    "mixed_layers": dict(_BASE, num_layers=4, norm_topk_prob=True, tie_embeddings=False,
                         mlp_only_layers=(0,), decoder_sparse_step=2),
}


def _random_moe(kw, seed=0):
  """`test_models`' random model (non-trivial norms) with a router and experts peaked
  enough that top-k is decided by margins far above float noise."""
  model = _random_model(kw, seed)
  rng = np.random.default_rng(seed + 1000)
  state = nnx.state(model, nnx.Param)
  pure = nnx.to_pure_dict(state)
  for name in ("router", "experts_gate", "experts_up", "experts_down"):
    x = pure["layers"][name]
    pure["layers"][name] = jnp.asarray(0.15 * rng.standard_normal(x.shape), x.dtype)
  nnx.replace_by_pure_dict(state, pure)
  nnx.update(model, state)
  return model


def _hf(path):
  hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  hf.eval()
  return hf


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_and_routing_match_transformers(name, tmp_path):
  model = _random_moe(CONFIGS[name])
  models.save_pretrained(model, str(tmp_path))
  hf = _hf(str(tmp_path))
  assert type(hf).__name__ == "Qwen3MoeForCausalLM"
  cfg = model.config
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, cfg.vocab_size, (3, 11))
  lengths = np.array([11, 8, 5])
  mask = np.arange(11)[None, :] < lengths[:, None]  # right padding
  tokens = np.where(mask, tokens, 0)
  out = nnx.jit(lambda m, t, k: m(t, mask_BT=k))(model, jnp.asarray(tokens), jnp.asarray(mask))
  with torch.no_grad():
    ref = hf(torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
             output_router_logits=True)
  diff = np.abs(np.asarray(out.logits) - ref.logits.numpy())[mask]
  assert diff.max() <= 1e-4, diff.max()
  # The same experts in every MoE layer at every real token (sets: slot order aside).
  routing = np.asarray(out.routing)
  assert routing.shape == (3, 11, len(cfg.moe_layers), cfg.num_experts_per_tok)
  assert (routing[~mask] == -1).all()
  assert len(ref.router_logits) == len(cfg.moe_layers)  # HF records the MoE layers only
  for j in range(len(cfg.moe_layers)):
    hf_top = torch.topk(ref.router_logits[j], cfg.num_experts_per_tok, dim=-1).indices.numpy()
    hf_top = hf_top.reshape(3, 11, -1)
    np.testing.assert_array_equal(np.sort(routing[:, :, j][mask], -1),
                                  np.sort(hf_top[mask], -1))


def test_transformers_checkpoint_loads_and_exports_back(tmp_path):
  """A Qwen3MoeForCausalLM made by transformers (its own init and config.json,
  `num_local_experts` as transformers 5 writes it) loads; our export loads in
  transformers with the same logits."""
  hf_cfg = transformers.Qwen3MoeConfig(
      vocab_size=71, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
      num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=5,
      num_experts_per_tok=2, moe_intermediate_size=16, mlp_only_layers=[1],
      norm_topk_prob=True, tie_word_embeddings=False)
  torch.manual_seed(0)
  hf = transformers.Qwen3MoeForCausalLM(hf_cfg)
  with torch.no_grad():  # a router far from uniform
    for layer in hf.model.layers:
      if hasattr(layer.mlp, "gate"):
        layer.mlp.gate.weight.normal_(0, 0.5)
  hf.save_pretrained(str(tmp_path / "hf"))
  model = models.from_pretrained(str(tmp_path / "hf"))
  cfg = model.config
  assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_layers) == (5, 2, (0, 2))
  tokens = np.random.default_rng(2).integers(0, 71, (2, 9))
  ours = np.asarray(model(jnp.asarray(tokens)).logits)
  with torch.no_grad():
    ref = hf(torch.tensor(tokens)).logits.numpy()
  assert np.abs(ours - ref).max() <= 1e-4
  models.save_pretrained(model, str(tmp_path / "back"))
  back = _hf(str(tmp_path / "back"))
  with torch.no_grad():
    np.testing.assert_allclose(back(torch.tensor(tokens)).logits.numpy(), ref, atol=1e-5)
  hf_json = json.loads((tmp_path / "back" / "config.json").read_text())
  assert hf_json["model_type"] == "qwen3_moe" and hf_json["num_experts"] == 5


@pytest.mark.parametrize("n", [37, 400])  # blocks of 8 rows; of `moe.BLOCK_ROWS` rows
@pytest.mark.parametrize("impl", ["blocked", "blocked_loop", "ragged_dot"])
def test_grouped_matmul_equals_every_expert_on_every_token(impl, n, monkeypatch):
  if impl == "blocked_loop":  # the blocked form one block at a time (large weights)
    monkeypatch.setattr(moe, "LOOP_WEIGHT_BYTES", 0)
    impl = "blocked"
  rng = np.random.default_rng(0)
  d, f, e, k = 16, 12, 5, 2
  h = jnp.asarray(rng.standard_normal((n, d)), jnp.float32)
  normal = lambda *shape: jnp.asarray(0.3 * rng.standard_normal(shape), jnp.float32)
  w = {"router": normal(d, e), "experts_gate": normal(e, d, f), "experts_up": normal(e, d, f),
       "experts_down": normal(e, f, d)}
  # Skewed routing: one expert takes most tokens, another none (dropless either way).
  experts = np.stack([np.where(rng.random(n) < 0.7, 3, rng.integers(0, 3, n)),
                      np.full(n, 1)], -1)
  experts[:, 1] = np.where(experts[:, 0] == 1, 0, 1)
  gates = rng.random((n, k))
  # Expert id E marks a slot another device computes (`experts_on_mesh`): it adds zero.
  elsewhere = rng.random(n) < 0.2
  experts[elsewhere, 1] = e
  routing = moe.Routing(jnp.asarray(experts, jnp.int32), jnp.asarray(gates, jnp.float32), None)
  kept = moe.Routing(jnp.asarray(np.where(experts < e, experts, 0), jnp.int32),
                     jnp.asarray(np.where(experts < e, gates, 0.0), jnp.float32), None)
  # Jitted, as the learner and the sampler run them (one compile each, not one per op).
  grouped = lambda h, w, r: moe.experts_mlp(h, h, r, w, None, impl)
  got = jax.jit(grouped)(h, w, routing)
  ref = jax.jit(moe.experts_mlp_reference)(h, kept, w)
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-5, atol=2e-5)
  per_token = jax.jit(moe.experts_mlp_per_token)(h, kept, w)
  np.testing.assert_allclose(np.asarray(per_token), np.asarray(ref), rtol=2e-5, atol=2e-5)
  # Gradients through the grouped matmul (the learner's backward: the weights'
  # and, through the rows' moves in and out of the sorted buffer, the tokens').
  cot = normal(n, d)
  grad = lambda fn: jax.jit(jax.grad(lambda h, w, r: jnp.sum(fn(h, w, r) * cot), (0, 1)))
  g = grad(grouped)(h, w, routing)
  g_ref = grad(lambda h, w, r: moe.experts_mlp_reference(h, r, w))(h, w, kept)
  np.testing.assert_allclose(np.asarray(g[0]), np.asarray(g_ref[0]), rtol=1e-4, atol=1e-4)
  for name in ("experts_gate", "experts_up", "experts_down"):
    np.testing.assert_allclose(np.asarray(g[1][name]), np.asarray(g_ref[1][name]), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_block_loop_equals_the_batched_dot_of_gathered_weights(dtype):
  # The CPU's blocked matmul, one block at a time with each block's expert weight
  # read in place: values and both gradients as the batched dot over gathered
  # weights; the weight gradient sums an expert's blocks in float32.
  rng = np.random.default_rng(1)
  b, s, i, o, e = 7, 8, 16, 12, 4
  x = jnp.asarray(rng.standard_normal((b, s, i)), dtype)
  w = jnp.asarray(0.3 * rng.standard_normal((e, i, o)), dtype)
  expert_b = jnp.asarray([0, 0, 2, 2, 2, 3, 3], jnp.int32)  # expert 1 has no block
  cot = jnp.asarray(rng.standard_normal((b, s, o)), dtype)
  f32 = lambda a: a.astype(jnp.float32)
  ref = lambda x, w: jnp.einsum("bsI,bIO->bsO", f32(x), f32(w)[expert_b])
  got = jax.jit(moe._block_loop)(x, w, expert_b)
  tol = 1e-6 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(np.asarray(f32(got)), np.asarray(ref(x, w)), rtol=tol, atol=tol)
  g = jax.jit(jax.grad(lambda x, w: jnp.sum(f32(moe._block_loop(x, w, expert_b) * cot)),
                       (0, 1)))(x, w)
  g_ref = jax.grad(lambda x, w: jnp.sum(ref(x, w) * f32(cot)), (0, 1))(x, w)
  assert g[0].dtype == g[1].dtype == dtype
  for got_g, want in zip(g, g_ref):
    np.testing.assert_allclose(np.asarray(f32(got_g)), np.asarray(want), rtol=tol,
                               atol=tol * float(jnp.max(jnp.abs(want))))
  assert not np.any(np.asarray(f32(g[1][1])))  # no block, no gradient


@pytest.fixture(scope="module")
def tiny():
  return _random_moe(CONFIGS["mixed_layers"], seed=3)


def test_replaying_own_routing_is_bitwise_and_slot_order_free(tiny):
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 83, (2, 9)))
  fwd = nnx.jit(lambda m, t, r: m(t, routing_BTLk=r))
  free = nnx.jit(lambda m, t: m(t))(tiny, tokens)
  forced = fwd(tiny, tokens, free.routing)
  np.testing.assert_array_equal(np.asarray(forced.logits), np.asarray(free.logits))
  np.testing.assert_array_equal(np.asarray(forced.routing), np.asarray(free.routing))
  flipped = fwd(tiny, tokens, free.routing[..., ::-1])
  np.testing.assert_array_equal(np.asarray(flipped.logits), np.asarray(free.logits))
  # Another forced set (each token's slots moved to other experts) changes the log-probs.
  other = (free.routing + 1) % tiny.config.num_experts
  other = jnp.where(other[..., :1] == other[..., 1:], (other + 2) % 6, other)
  moved = fwd(tiny, tokens, other)
  assert np.abs(np.asarray(moved.logits) - np.asarray(free.logits)).max() > 1e-3
  assert set(np.unique(np.asarray(moved.routing))) <= set(range(6))
  np.testing.assert_array_equal(np.sort(np.asarray(moved.routing), -1),
                                np.sort(np.asarray(other), -1))


@pytest.mark.extended  # the loop's values and gradients: the suite's grouped-matmul tests
def test_block_loop_gives_the_models_logits_and_gradients(monkeypatch):
  # The whole model (a dense and an MoE layer, each kind's layer scan) with the CPU's
  # blocked matmul both ways: the batched dot (the tiny weights' default) and the loop
  # over blocks that large weights take.
  model = _random_moe(dict(CONFIGS["mixed_layers"], num_layers=2, decoder_sparse_step=1),
                      seed=3)
  assert model.config.moe_layers == (1,)
  tokens = jnp.asarray(np.random.default_rng(4).integers(0, 83, (2, 9)))
  graphdef, params = nnx.split(model, nnx.Param)

  def run():
    def loss(params):
      logits = nnx.merge(graphdef, params)(tokens).logits
      return jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits
    (_, logits), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(logits), [np.asarray(x) for x in jax.tree.leaves(g)]

  batched = run()
  monkeypatch.setattr(moe, "LOOP_WEIGHT_BYTES", 0)
  looped = run()
  np.testing.assert_allclose(looped[0], batched[0], rtol=1e-5, atol=1e-6)
  for got, want in zip(looped[1], batched[1]):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_load_balancing_loss_is_one_when_uniform():
  e = 4
  stats = moe.LayerStats(jnp.full((3, e), 1 / e), jnp.full((3, e), 1 / e))
  np.testing.assert_allclose(float(moe.load_balancing_loss(stats)), 1.0, rtol=1e-6)
  skew = moe.LayerStats(jnp.array([[1.0, 0, 0, 0]]), jnp.array([[0.7, 0.1, 0.1, 0.1]]))
  np.testing.assert_allclose(float(moe.load_balancing_loss(skew)), 4 * 0.7, rtol=1e-6)


def test_stats_count_real_tokens_only(tiny):
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 83, (2, 6)))
  mask = jnp.asarray([[1] * 6, [1, 1, 0, 0, 0, 0]], bool)
  out = tiny(tokens, mask_BT=mask)
  load = np.asarray(out.moe_stats.load)
  np.testing.assert_allclose(load.sum(-1), 1.0, rtol=1e-6)
  routing = np.asarray(out.routing)
  for j in range(load.shape[0]):
    counts = np.bincount(routing[:, :, j][np.asarray(mask)].ravel(), minlength=6)
    np.testing.assert_allclose(load[j], counts / counts.sum(), rtol=1e-6)


def test_kv_cache_decode_equals_full_forward(tiny):
  """Prefill then one-token decode steps through the KV cache give the full
  forward's logits and routing (the sampler's path)."""
  from mipu_jax.models.kv_cache import init_cache  # pylint: disable=g-import-not-at-top
  cfg = tiny.config
  tokens = jnp.asarray(np.random.default_rng(4).integers(0, 83, (2, 8)))
  full = tiny(tokens)
  cache = init_cache(cfg, batch=2, max_len=16, dtype=jnp.float32)
  step = nnx.jit(lambda m, t, c: m(t, cache=c))
  out = step(tiny, tokens[:, :5], cache)
  logits, routing = [out.logits], [out.routing]
  cache = out.cache
  for i in range(5, 8):
    out = step(tiny, tokens[:, i:i + 1], cache)
    cache = out.cache
    logits.append(out.logits)
    routing.append(out.routing)
  np.testing.assert_allclose(np.concatenate(logits, 1), np.asarray(full.logits), atol=1e-5)
  np.testing.assert_array_equal(np.concatenate(routing, 1), np.asarray(full.routing))


def test_bad_input_is_refused_with_the_field():
  kw = dict(CONFIGS["all_moe_norm_tied"])
  with pytest.raises(ValueError, match="num_experts_per_tok"):
    models.Qwen3Config(**dict(kw, num_experts_per_tok=7))
  with pytest.raises(ValueError, match="mlp_only_layers"):
    models.Qwen3Config(**dict(kw, mlp_only_layers=(5,)))
  with pytest.raises(ValueError, match="moe_intermediate_size"):
    models.Qwen3Config(**dict(kw, moe_intermediate_size=0))
  dense = models.Qwen3(models.get_config("tiny"), rngs=nnx.Rngs(0))
  tokens = jnp.zeros((1, 3), jnp.int32)
  with pytest.raises(ValueError, match="dense model"):
    dense(tokens, routing_BTLk=jnp.zeros((1, 3, 2, 2), jnp.int32))
  model = models.Qwen3(models.Qwen3Config(**kw), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"need \[B, T, L_moe, k\] = \[1, 3, 2, 2\]"):
    model(tokens, routing_BTLk=jnp.zeros((1, 4, 2, 2), jnp.int32))


def test_checkpoint_with_another_expert_count_is_refused(tmp_path):
  model = _random_moe(CONFIGS["all_moe_norm_tied"])
  models.save_pretrained(model, str(tmp_path))
  cfg = json.loads((tmp_path / "config.json").read_text())
  cfg["num_experts"] = 8
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(CheckpointError, match="missing tensors: .*experts.6"):
    models.from_pretrained(str(tmp_path))


def test_presets_match_public_configs():
  c = models.get_config("qwen3_30b_a3b")
  assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.num_experts,
          c.num_experts_per_tok, c.moe_intermediate_size, c.norm_topk_prob) == (
              2048, 48, 32, 4, 128, 8, 768, True)
  # Qwen3-30B-A3B: 30.5B parameters, 3.3B activated (its model card).
  assert 30.0e9 < c.num_params() < 31.0e9
  assert 3.2e9 < c.num_active_params() < 3.4e9
  big = models.get_config("qwen3_235b_a22b")
  assert 234e9 < big.num_params() < 236e9 and 21.5e9 < big.num_active_params() < 22.5e9
  dense = models.get_config("qwen3_4b")
  assert dense.num_active_params() == dense.num_params() and not dense.is_moe


@pytest.mark.long
def test_sampler_returns_each_tokens_routing_through_refills(one_layer):
  """Prompt routing at prefill and each generated token's routing when it is fed
  back equal a full forward's (experts as sets), with slots refilled (9 samples
  through 4 slots) and each prompt's 3 samples sharing its prefill."""
  from mipu_jax.sampler import Sampler  # pylint: disable=g-import-not-at-top
  model = one_layer[0]
  sampler = Sampler(model, eos_ids=[1], return_routing=True, max_concurrent_decodes=4)
  prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]
  out = sampler.generate(prompts, max_new_tokens=6, num_samples=3, seed=0)
  lm, k = len(model.config.moe_layers), model.config.num_experts_per_tok
  assert out.routing_array.shape == (9, 6, lm, k) and out.routing_array.dtype == np.int32
  rows = np.zeros((9, 10), np.int32)  # each sample's prompt + response, right-padded
  for i in range(9):
    p, t = prompts[out.prompt_index[i]], out.tokens[i]
    rows[i, :len(p) + len(t)] = p + t
  ref_all = np.sort(np.asarray(model(jnp.asarray(rows)).routing), -1)
  for i in range(9):
    p, t = prompts[out.prompt_index[i]], out.tokens[i]
    ref = ref_all[i]
    np.testing.assert_array_equal(np.sort(out.prompt_routing[out.prompt_index[i]], -1),
                                  ref[:len(p)])
    np.testing.assert_array_equal(np.sort(out.routing_array[i, :len(t) - 1], -1),
                                  ref[len(p):len(p) + len(t) - 1])
    assert (out.routing_array[i, len(t) - 1:] == -1).all()
  # Recording routing changes no token or log-prob.
  plain = Sampler(model, eos_ids=[1], max_concurrent_decodes=4).generate(
      prompts, max_new_tokens=6, num_samples=3, seed=0)
  assert plain.tokens == out.tokens and plain.logprobs == out.logprobs
  assert plain.routing_array is None


_PROMPTS = [[3, 4, 5], [6, 7]]


@pytest.fixture(scope="module")
def one_layer():
  """A one-layer MoE (one scan: the sampler's programs compile fastest) and its
  fp32 samples."""
  from mipu_jax.sampler import Sampler  # pylint: disable=g-import-not-at-top
  model = _random_moe(dict(CONFIGS["all_moe_norm_tied"], num_layers=1), seed=5)
  ref = Sampler(model, eos_ids=[1]).generate(_PROMPTS, max_new_tokens=4, num_samples=2, seed=1)
  return model, ref


@pytest.mark.parametrize("precision", [
    dict(dtype="bfloat16"), dict(weight_quant="int8"), dict(weight_quant="fp8_e4m3",
                                                            act_quant="fp8"),
    dict(weight_quant="int4", act_quant="fp8", kv_cache_dtype="fp8"), dict(weight_quant="int3"),
    dict(weight_quant="int8", act_quant="int8", quant_compute="native")])
def test_sampler_decodes_moe_under_every_precision(one_layer, precision):
  """Every sampler precision decodes an MoE, experts quantized like the dense MLP:
  the first token's log-prob stays near the fp32 sampler's, and lower precisions
  move it (the mismatch the corrections see)."""
  from mipu_jax.sampler import Sampler  # pylint: disable=g-import-not-at-top
  model, ref = one_layer
  out = Sampler(model, eos_ids=[1], return_routing=True, **precision).generate(
      _PROMPTS, max_new_tokens=4, num_samples=2, seed=1)
  assert out.routing_array.shape[:2] == (4, 4)
  lp, lp_ref = out.logprobs_array[:, 0], ref.logprobs_array[:, 0]
  assert np.isfinite(lp).all() and np.abs(lp - lp_ref).max() < 0.5
  assert np.abs(lp - lp_ref).max() > 0


# float32 bitwise at head dim 10 (where it once parted): the suite's dense
# tests/test_true_on_policy.py cases; the MoE's router in float32 here, in the extended tier.
@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.extended),
                                   "bfloat16"])
def test_true_on_policy_is_bitwise_on_an_moe(dtype):
  """The true on-policy mode on an MoE (docs/method.md §7, §7a): the router and
  the experts run per token on both sides, so the sampler picks the same experts
  and its log-probs equal the learner's loss forward bitwise, through refills
  and shared prompts; the routing it returns is the learner's."""
  from mipu_jax.learner import logprobs as logprobs_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax.sampler import Sampler  # pylint: disable=g-import-not-at-top
  # The module's head dim 10: where the two sides' attention scores once parted in float32
  # (the keys' layout into the scores' einsum; docs/method.md §7).
  model = _random_moe(dict(CONFIGS["all_moe_norm_tied"], dtype=dtype, num_layers=1), seed=7)
  prompts = [[5, 9, 2], [7, 1, 8, 2, 8, 1, 3], [4, 4, 6, 10, 12, 3, 5, 9, 11, 2, 1]]
  out = Sampler(model, dtype=dtype, true_on_policy=True, eos_ids=(7,), return_routing=True,
                max_concurrent_decodes=4).generate(prompts, max_new_tokens=12, num_samples=2,
                                                   temperature=0.9, seed=3)
  s, t = len(out.tokens), 11 + 12 + 1
  tokens, mask = np.zeros((s, t), np.int32), np.zeros((s, t), np.float32)
  lp_mu, on = np.zeros((s, t), np.float32), np.zeros((s, t), bool)
  for i, (resp, lp) in enumerate(zip(out.tokens, out.logprobs)):
    p = prompts[out.prompt_index[i]]
    tokens[i, :len(p)], tokens[i, len(p):len(p) + len(resp)] = p, resp
    mask[i, :len(p) + len(resp)], lp_mu[i, len(p):len(p) + len(resp)] = 1, lp
    on[i, len(p):len(p) + len(resp)] = True
  graphdef, state = nnx.split(model)
  scoring = logprobs_lib.Scoring(0.9, true_on_policy=True)

  def loss(state, tokens, mask):
    (lp, _), routing = logprobs_lib.policy_logprobs(
        nnx.merge(graphdef, state), tokens, mask, scoring, with_entropy=True,
        with_routing=True)
    return jnp.sum(lp * mask), (lp, routing)

  (_, (lp, routing)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
      state, tokens, mask)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  np.testing.assert_array_equal(np.asarray(lp)[on], lp_mu[on])
  routing = np.asarray(routing)
  for i, resp in enumerate(out.tokens):
    p = len(prompts[out.prompt_index[i]])
    np.testing.assert_array_equal(routing[i, p:p + len(resp) - 1],
                                  out.routing_array[i, :len(resp) - 1])


def test_load_balancing_loss_reaches_the_router():
  """`policy_logprobs(with_aux=True)` is the forward's load-balancing loss, and its
  gradient reaches every MoE layer's router."""
  from mipu_jax.learner import logprobs as logprobs_lib  # pylint: disable=g-import-not-at-top
  model = _random_moe(CONFIGS["all_moe_norm_tied"], seed=2)
  tokens = jnp.asarray(np.random.default_rng(3).integers(0, 83, (2, 9)))
  mask = jnp.ones((2, 9))
  graphdef, params = nnx.split(model, nnx.Param)

  def aux(params):
    _, a = logprobs_lib.policy_logprobs(nnx.merge(graphdef, params), tokens, mask,
                                        logprobs_lib.Scoring(), with_aux=True)
    return a

  value, g = jax.jit(jax.value_and_grad(aux))(params)
  np.testing.assert_allclose(float(value), float(moe.load_balancing_loss(
      model(tokens).moe_stats)), rtol=1e-6)
  assert float(value) >= 1.0 - 1e-6  # E Σ f P ≥ 1 when f and P move together; ≈1 near uniform
  router_g = np.asarray(nnx.to_pure_dict(g)["layers"]["router"])
  assert (np.abs(router_g).max(axis=(1, 2)) > 0).all()


def test_replay_through_packed_rows_and_remat_equals_unpacked():
  """Routing replay on packed rows (segments, per-segment positions, routing gathered
  with the tokens) and under a remat policy gives the unpacked rows' log-probs."""
  from mipu_jax.learner import logprobs as logprobs_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax.learner import packing  # pylint: disable=g-import-not-at-top
  model = _random_moe(CONFIGS["all_moe_norm_tied"], seed=4)
  rng = np.random.default_rng(5)
  lengths = np.array([7, 4, 9, 3])
  mask = (np.arange(10)[None, :] < lengths[:, None]).astype(np.float32)
  tokens = jnp.asarray(rng.integers(3, 83, (4, 10)) * mask.astype(np.int32))
  scoring = logprobs_lib.Scoring()
  free, routing = logprobs_lib.policy_logprobs(model, tokens, jnp.asarray(mask), scoring,
                                               with_routing=True)
  # Another routing than the model's own, so replay is visible in the log-probs.
  forced = jnp.where(routing >= 0, (routing + 3) % 6, -1)
  forced = jnp.where(forced[..., :1] == forced[..., 1:], (forced + 1) % 6, forced)
  unpacked = logprobs_lib.policy_logprobs(model, tokens, jnp.asarray(mask), scoring,
                                          routing_BTLk=forced)
  assert np.abs(np.asarray(unpacked - free))[mask > 0].max() > 1e-4
  plan = packing.plan(mask, 16, 1)
  lp_packed = logprobs_lib.packed_logprobs(
      nnx.graphdef(model), nnx.state(model), tokens, jax.tree.map(jnp.asarray, plan), scoring,
      1, routing_BTLk=forced)
  on = np.asarray(mask) > 0
  on[:, 0] = False  # a row's first token has no log-prob either way
  np.testing.assert_allclose(np.asarray(lp_packed)[on], np.asarray(unpacked)[on], atol=2e-5)
  remat = nnx.merge(nnx.graphdef(models.Qwen3(model.config.replace(remat="layer"),
                                              rngs=nnx.Rngs(0))), nnx.state(model))
  lp_remat = logprobs_lib.policy_logprobs(remat, tokens, jnp.asarray(mask), scoring,
                                          routing_BTLk=forced)
  np.testing.assert_array_equal(np.asarray(lp_remat), np.asarray(unpacked))


def _one_device_learner(model, **kwargs):
  """`Learner.from_config` for `model` on one device, a small run config; `kwargs` as
  its own (the XLA options, the layer unrolling)."""
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax.learner import Learner  # pylint: disable=g-import-not-at-top
  train = config_lib.TrainConfig(data=config_lib.DataConfig(prompts_per_step=1, group_size=2),
                                 sampling=config_lib.SamplingConfig(max_new_tokens=4))
  return Learner.from_config(train, model, models.make_mesh(1, 1, 1, devices=jax.devices()[:1]),
                             **kwargs)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's options")
def test_learner_compiles_batched_experts_with_eigen_dots():
  """On a CPU the learner compiles an MoE whose experts run as batched dots of blocks
  without XLA:CPU's YNNPACK dot fusions (`moe.learner_compiler_options`, bench/README.md);
  a dense model, the block loop, `ragged_dot`, the true on-policy mode (which compiles as
  the sampler does) and other platforms keep jax's defaults."""
  cfg = models.Qwen3Config(**CONFIGS["all_moe_norm_tied"])
  options = moe.learner_compiler_options
  assert options(cfg, "cpu") == moe.EIGEN_DOTS
  assert options(cfg, "gpu") == options(cfg, "tpu") == {}
  assert options(cfg, "cpu", true_on_policy=True) == {}
  assert options(cfg.replace(moe_impl="ragged_dot"), "cpu") == {}
  assert options(cfg.replace(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0),
                 "cpu") == {}
  # One expert matrix of LOOP_WEIGHT_BYTES runs block by block: float32 256 x 256 does,
  # the same in bf16 (half the bytes) does not.
  wide = cfg.replace(hidden_size=256, moe_intermediate_size=256)
  assert options(wide, "cpu") == {}
  assert options(wide.replace(dtype="bfloat16"), "cpu") == moe.EIGEN_DOTS

  model = _random_moe(dict(CONFIGS["all_moe_norm_tied"], num_layers=1), seed=1)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  tokens, mask = jnp.ones((2, 6), jnp.int32), jnp.ones((2, 6), jnp.float32)
  hlo, lps, used = {}, {}, {}
  for name, given in (("resolved", None), ("jax defaults", {})):
    learner = _one_device_learner(model, compiler_options=given)
    used[name] = learner.compiler_options
    with jax.set_mesh(learner.mesh):
      compiled = learner._logprobs.lower(params, tokens, mask).compile()
      hlo[name], lps[name] = compiled.as_text(), np.asarray(compiled(params, tokens, mask))
  assert used == {"resolved": moe.EIGEN_DOTS, "jax defaults": {}}
  assert "__ynn_fusion" not in hlo["resolved"]
  # If this fails, jax no longer fuses lone dots into YNNPACK by default: EIGEN_DOTS may
  # be moot there, so re-measure (bench/README.md) before keeping it.
  assert "__ynn_fusion" in hlo["jax defaults"]
  np.testing.assert_allclose(lps["resolved"], lps["jax defaults"], atol=1e-5)


def test_learner_unrolls_a_small_moe_on_a_cpu():
  """On a CPU the learner's step runs a small MoE's layer scans unrolled
  (`moe.learner_unroll_layers`, bench/README.md): the same log-probs and gradients
  under forced routing on a dense / MoE mix (the router's nonzero under that replay),
  with no while loop over the layers left;
  dense models, deeper MoEs, the true on-policy mode and other platforms keep the scan;
  a call with a cache refuses it."""
  from mipu_jax.learner import logprobs as logprobs_lib  # pylint: disable=g-import-not-at-top
  rule = moe.learner_unroll_layers
  cfg = models.Qwen3Config(**CONFIGS["mixed_layers"])
  assert rule(cfg, "cpu") and not rule(cfg, "gpu") and not rule(cfg, "tpu")
  assert not rule(cfg, "cpu", true_on_policy=True)
  assert not rule(cfg.replace(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0,
                              mlp_only_layers=(), decoder_sparse_step=1), "cpu")
  assert not rule(cfg.replace(num_layers=moe.UNROLL_MAX_LAYERS + 1), "cpu")

  # Two dense layers, then two MoE layers: two scans of two layers each.
  model = _random_moe(dict(CONFIGS["mixed_layers"], mlp_only_layers=(0, 1),
                           decoder_sparse_step=1), seed=6)
  rng = np.random.default_rng(7)
  mask = jnp.asarray((np.arange(9)[None, :] < np.array([[9], [6]])).astype(np.float32))
  tokens = jnp.asarray(rng.integers(1, 83, (2, 9))) * mask.astype(jnp.int32)
  scoring = logprobs_lib.Scoring()
  # Replayed routing through the unrolled layers: two distinct experts of 6 per token.
  first = rng.integers(0, 6, (2, 9, 2))
  forced = jnp.asarray(np.stack([first, (first + rng.integers(1, 6, first.shape)) % 6], -1),
                       jnp.int32)
  graphdef, params = nnx.split(model, nnx.Param)

  def loss(params, unroll):
    lp = logprobs_lib.policy_logprobs(nnx.merge(graphdef, params), tokens, mask, scoring,
                                      routing_BTLk=forced, unroll_layers=unroll)
    return jnp.sum(lp * mask), lp

  def layer_loops(hlo):  # compiled loops whose carry starts with the [2, 9, 40] hidden state
    return sum(" while(" in line and "(s32[], f32[2,9,40]" in line for line in hlo.splitlines())

  out, whiles = {}, {}
  for unroll in (False, True):
    fn = jax.jit(jax.value_and_grad(functools.partial(loss, unroll=unroll), has_aux=True))
    compiled = fn.lower(params).compile()
    whiles[unroll] = layer_loops(compiled.as_text())
    out[unroll] = compiled(params)
  assert whiles[True] == 0 < whiles[False], whiles
  (_, lp), grads = out[True]
  (_, lp_scan), grads_scan = out[False]
  np.testing.assert_allclose(np.asarray(lp), np.asarray(lp_scan), rtol=0, atol=1e-6)
  for g, g_scan in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_scan)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_scan), rtol=1e-5, atol=1e-7)
  # Under replay the router still gets a gradient (the gates are its live softmax).
  g = nnx.to_pure_dict(grads)
  assert (np.abs(np.asarray(g["layers"]["router"])).max(axis=(1, 2)) > 0).all()  # each MoE layer
  assert np.abs(np.asarray(g["layers"]["experts_gate"])).max() > 0

  learner = _one_device_learner(model)
  assert learner.spec.unroll_layers == (jax.default_backend() == "cpu")
  scanned = _one_device_learner(model, unroll_layers=False)
  assert scanned.spec.unroll_layers is False
  # The step's program is the unrolled one. Unrolling happens at trace time, so the
  # lowered HLO shows it as the compiled program does, without the step's compile.
  step_loops = lambda which: layer_loops(which.lower_step(2, 9).as_text(dialect="hlo"))
  if learner.spec.unroll_layers:
    assert step_loops(learner) == 0 < step_loops(scanned)
  with pytest.raises(ValueError, match="unroll_layers"):
    model(tokens, cache=models.init_cache(model.config, 2, 16), unroll_layers=True)
