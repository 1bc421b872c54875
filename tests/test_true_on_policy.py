"""True on-policy (docs/method.md §7): the sampler's log-probs of the tokens it drew
and the learner's, in the loss and in the recompute, compared with `==`."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mipu_jax import config as config_lib
from mipu_jax import rl
from mipu_jax.learner import Learner, host_batch, packing
from mipu_jax.learner import logprobs as logprobs_lib
from mipu_jax.models import make_mesh
from mipu_jax.sampler import Sampler, SamplerConfig
from mipu_jax.sampler import config as sampler_config
from mipu_jax.testing.models import SAMPLER_CFG, peaked_qwen3

# Ragged prompts (the last spans two key blocks), two samples each (GRPO
# prompt sharing), 8 samples through 4 slots (refills); a stop id makes the
# responses ragged.
PROMPTS = [[5, 9, 2], [7, 1, 8, 2, 8, 1, 3], [4, 4, 6, 10, 12, 3, 5, 9, 11, 2, 1],
           [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2]]
TEMPERATURE, NEW, EOS = 0.9, 24, 7
# Head dim 10: where the two sides' float32 attention scores once parted on XLA:CPU (the
# keys' layout into the scores' einsum; docs/method.md §7).
CFG = SAMPLER_CFG.replace(head_dim=10)


def _sample(dtype, *, true_on_policy=True, mesh=None, slots=4):
  model = peaked_qwen3(CFG.replace(dtype=dtype))
  sampler = Sampler(model, dtype=dtype, true_on_policy=true_on_policy, eos_ids=(EOS,),
                    max_concurrent_decodes=slots, mesh=mesh)
  out = sampler.generate(PROMPTS, max_new_tokens=NEW, num_samples=2, temperature=TEMPERATURE,
                         seed=3)
  return model, out


def _rows(out):
  """Learner rows of the samples: prompt + response, right-padded."""
  s, t = len(out.tokens), max(len(p) for p in PROMPTS) + NEW + 3
  tokens, mask = np.zeros((s, t), np.int32), np.zeros((s, t), np.float32)
  lp_mu, loss_mask = np.zeros((s, t), np.float32), np.zeros((s, t), np.float32)
  for i, (resp, lp) in enumerate(zip(out.tokens, out.logprobs)):
    p = PROMPTS[out.prompt_index[i]]
    n, r = len(p), len(resp)
    tokens[i, :n], tokens[i, n:n + r] = p, resp
    mask[i, :n + r], lp_mu[i, n:n + r], loss_mask[i, n:n + r] = 1, lp, 1
  return tokens, mask, lp_mu, loss_mask


def _in_loss(model, tokens, mask, loss_mask, segment_ids=None, positions=None):
  """The log-probs the loss differentiates: `policy_logprobs` under
  `jax.value_and_grad`, returned as its auxiliary output. Their values are the
  batch-invariant forward's; their gradient is the standard forward's (a
  `custom_vjp`, learner/logprobs.py `invariant_logprobs`; here only checked finite)."""
  graphdef, state = nnx.split(model)
  scoring = logprobs_lib.Scoring(TEMPERATURE, true_on_policy=True)

  def loss(state, tokens, mask, loss_mask, segment_ids, positions):
    lp = logprobs_lib.policy_logprobs(nnx.merge(graphdef, state), tokens, mask, scoring,
                                      with_entropy=True, segment_ids_BT=segment_ids,
                                      positions_BT=positions)[0]
    return jnp.sum(lp * loss_mask), lp

  (_, lp), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
      state, tokens, mask, loss_mask, segment_ids, positions)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  return np.asarray(lp)


def _sampled(dtype):
  model, out = _sample(dtype)
  return dtype, model, out, _rows(out)


@pytest.fixture(scope="module")
def fp32():
  return _sampled("float32")


@pytest.fixture(scope="module")
def bf16():
  return _sampled("bfloat16")


# Measured on an H200 (jax 0.11.2, bench/README.md "The accelerator window, measured"): in
# float32 XLA's GPU programs give 2 of 166 log-probs other bits (4.4e-5; 71, by up to 9.5e-7,
# without TF32); bf16 was bitwise. Measured before the keys' layout fix that made XLA:CPU's
# float32 bitwise (docs/method.md §7); whether it was the GPU's cause too is unmeasured.
_GPU_FP32 = pytest.mark.xfail(jax.default_backend() == "gpu", strict=True,
                              reason="float32 not bitwise on a GPU (measured on an H200)")
DTYPES = [pytest.param("fp32", marks=_GPU_FP32), "bf16"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_sampler_equals_the_loss_forward(dtype, request):
  _, model, out, (tokens, mask, lp_mu, loss_mask) = request.getfixturevalue(dtype)
  assert len(set(out.lengths.tolist())) > 1  # ragged responses
  lp = _in_loss(model, tokens, mask, loss_mask)
  on = loss_mask > 0
  np.testing.assert_array_equal(lp[on], lp_mu[on])


@pytest.mark.parametrize("dtype", DTYPES)
def test_sampler_equals_packed_rows_under_remat(dtype, request):
  _, model, _, (tokens, mask, lp_mu, loss_mask) = request.getfixturevalue(dtype)
  model = nnx.merge(*nnx.split(model))  # the learner's copy, under a remat policy
  model.config = model.config.replace(remat="layer")
  plan = packing.plan(mask, pack_length=64, rows_per_micro=2)
  gather = lambda x: np.asarray(packing.gather(jnp.asarray(x), plan.src_RP))
  assert (plan.segment_ids_RP.max(axis=1) > 1).any()  # rows hold several responses
  lp_RP = _in_loss(model, gather(tokens), (plan.src_RP >= 0).astype(np.float32),
                   gather(loss_mask), plan.segment_ids_RP, plan.positions_RP)
  lp = np.asarray(packing.scatter(jnp.asarray(lp_RP), plan.src_RP, tokens.shape))
  on = loss_mask > 0
  np.testing.assert_array_equal(lp[on], lp_mu[on])


def _train_config(dtype):
  return config_lib.TrainConfig(
      model=config_lib.ModelConfig(dtype=dtype),
      sampling=config_lib.SamplingConfig(dtype=dtype, true_on_policy=True,
                                         temperature=TEMPERATURE, max_new_tokens=NEW),
      data=config_lib.DataConfig(prompts_per_step=4, group_size=2),
      learner=config_lib.LearnerConfig(logits_chunk=16))


def _assert_first_step_on_policy(learner, model, tokens, mask, lp_mu, loss_mask):
  """The learner's `lp_old` is bitwise the sampler's, and its first step logs no mismatch."""
  state = learner.init_state(nnx.to_pure_dict(nnx.state(model, nnx.Param)), seed=0)
  lp_old = np.asarray(learner.logprobs(state.params, tokens, mask)) * loss_mask
  np.testing.assert_array_equal(lp_old, lp_mu)
  adv = np.tile([1.0, -1.0], len(tokens) // 2)
  _, metrics = learner.step(state, host_batch(tokens, mask, loss_mask, lp_mu, adv,
                                              lp_old_BT=lp_old))
  m = jax.device_get(metrics)
  assert m["rollout_corr/k3_kl"] == 0 and m["training/rollout_probs_diff_max"] == 0
  assert m["actor/first_update_ratio_min"] == 1 and m["actor/first_update_ratio_max"] == 1


@pytest.mark.extended
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.devices(8)
def test_sampler_and_learner_on_one_mesh(dtype):
  # An RL step on a mesh: the sampler and the learner both on the 8 devices
  # (rows over data x fsdp, the learner's weights over fsdp; one device:
  # test_rl_loop_logs_no_mismatch), at a model (2 layers of 64) where they once
  # differed by 9.5e-7, when XLA partitioned the sampler's tile loops and paged
  # attention itself.
  cfg = SAMPLER_CFG.replace(dtype=dtype, vocab_size=256, hidden_size=64, num_layers=2,
                            head_dim=16, intermediate_size=128)
  model, mesh = peaked_qwen3(cfg), make_mesh(4, 2, 1)
  sampler = Sampler(model, dtype=dtype, true_on_policy=True, eos_ids=(EOS,),
                    max_concurrent_decodes=8, mesh=mesh)
  out = sampler.generate(PROMPTS, max_new_tokens=NEW, num_samples=2, temperature=TEMPERATURE,
                         seed=3)
  learner = Learner.from_config(_train_config(dtype), model, mesh)
  _assert_first_step_on_policy(learner, model, *_rows(out))


@pytest.mark.parametrize("rows", [8, 3])
@pytest.mark.devices(8)
def test_learner_forward_on_a_mesh(bf16, rows):
  # 8 rows over 8 row shards: each device runs the mode's forward on its own row
  # with the whole weights (one shard_map); 3 rows (3 x 44 tokens) do not split
  # over 8: each tile loop splits its tokens, padded (invariant.map_rows).
  # Bitwise the sampler's either way.
  _, model, _, (tokens, mask, lp_mu, loss_mask) = bf16
  graphdef, state = nnx.split(model)
  scoring = logprobs_lib.Scoring(TEMPERATURE, true_on_policy=True)
  forward = lambda s, t, m: logprobs_lib.policy_logprobs(nnx.merge(graphdef, s), t, m, scoring)
  with jax.set_mesh(make_mesh(4, 2, 1)):
    args = (state, jnp.asarray(tokens[:rows]), jnp.asarray(mask[:rows]))
    splits = str(jax.make_jaxpr(forward)(*args)).count("shard_map[")
    assert splits == 1 if rows == 8 else splits > 1
    lp = np.asarray(jax.jit(forward)(*args))
  np.testing.assert_array_equal(lp * loss_mask[:rows], lp_mu[:rows])


# Extended, beside the other whole first steps of `_assert_first_step_on_policy`; packed
# rows stay bitwise in the suite (test_sampler_equals_packed_rows_under_remat).
@pytest.mark.extended
def test_packing_learner_is_on_policy(bf16):
  # The Learner's own packing (learner.pack_length): several responses a row.
  dtype, model, _, (tokens, mask, lp_mu, loss_mask) = bf16
  cfg = _train_config(dtype)
  cfg = dataclasses.replace(cfg, learner=dataclasses.replace(cfg.learner, pack_length=64))
  learner = Learner.from_config(cfg, model, make_mesh(1, 1, 1, devices=jax.devices()[:1]))
  assert (learner.pack_plan(mask).segment_ids_RP.max(axis=1) > 1).any()
  _assert_first_step_on_policy(learner, model, tokens, mask, lp_mu, loss_mask)


@pytest.mark.extended
@pytest.mark.parametrize("fixture", ["fp32", "bf16"])
@pytest.mark.devices(8)
def test_eight_device_sampler_equals_one_device(fixture, request):
  dtype, _, out_1, _ = request.getfixturevalue(fixture)
  _, out_8 = _sample(dtype, mesh=make_mesh(8, 1, 1), slots=8)  # a slot per row shard
  assert out_8.tokens == out_1.tokens
  np.testing.assert_array_equal(out_8.logprobs_array, out_1.logprobs_array)


def test_default_bf16_is_not_bitwise():
  # Mode off, the same bf16 sampler and bf16 learner differ: measured max |δ|
  # 0.025, mean 0.0063, over these samples' 166 tokens (in the mode: exactly 0).
  model, out = _sample("bfloat16", true_on_policy=False, slots=8)  # no refill program
  tokens, mask, lp_mu, loss_mask = _rows(out)
  graphdef, state = nnx.split(model)
  lp = jax.jit(lambda s: logprobs_lib.policy_logprobs(
      nnx.merge(graphdef, s), tokens, mask, logprobs_lib.Scoring(TEMPERATURE)))(state)
  gap = np.abs(np.asarray(lp) - lp_mu)[loss_mask > 0].max()
  assert 1e-3 < gap < 0.2, gap


def test_refusals():
  with pytest.raises(ValueError, match="compute dtype"):
    SamplerConfig(true_on_policy=True, weight_quant="int8")
  with pytest.raises(ValueError, match="compute dtype"):
    SamplerConfig(dtype="bfloat16", true_on_policy=True, kv_cache_dtype="fp8")
  with pytest.raises(ValueError, match="decode attention"):
    SamplerConfig(true_on_policy=True, decode_attention="paged")
  with pytest.raises(ValueError, match="multiple of the key block"):
    SamplerConfig(true_on_policy=True, min_decode_bucket=8)
  assert SamplerConfig(true_on_policy=True, page_size=64).page_size == 16
  with pytest.raises(ValueError, match="learner to compute in the sampler's dtype"):
    dataclasses.replace(_train_config("bfloat16"), model=config_lib.ModelConfig())
  with pytest.raises(ValueError, match="tensor=1"):
    dataclasses.replace(_train_config("float32"), learner=config_lib.LearnerConfig(
        mesh=config_lib.MeshConfig(1, 1, 2)))
  with pytest.raises(ValueError, match="top_k=0"):
    with pytest.warns(UserWarning):
      dataclasses.replace(_train_config("float32"), sampling=config_lib.SamplingConfig(
          true_on_policy=True, top_k=5))
  with pytest.raises(ValueError, match="full distribution"):
    logprobs_lib.Scoring(top_p=0.9, true_on_policy=True)
  if len(jax.devices()) >= 8:
    with pytest.raises(ValueError, match="tensor=1"):
      Sampler(peaked_qwen3(SAMPLER_CFG), true_on_policy=True, mesh=make_mesh(4, 1, 2))
  sampler = Sampler(peaked_qwen3(SAMPLER_CFG), true_on_policy=True)
  with pytest.raises(ValueError, match="top-k / top-p"):
    sampler.generate(PROMPTS[:1], max_new_tokens=2, top_k=5)


def test_float32_on_a_gpu_warns(caplog):
  """The mode in float32 on a GPU says it was measured not bitwise there; bf16
  and the CPU say nothing (once per process: the test starts the count again)."""
  sampler_config._warn_true_on_policy_float32_gpu.cache_clear()
  with caplog.at_level("WARNING"):
    assert SamplerConfig(dtype="bfloat16", true_on_policy=True).decode_attention_for(
        "gpu") == "invariant"
    SamplerConfig(dtype="float32", true_on_policy=True).decode_attention_for("cpu")
  assert "not bitwise" not in caplog.text
  with caplog.at_level("WARNING"):
    SamplerConfig(dtype="float32", true_on_policy=True).decode_attention_for("gpu")
  assert "not bitwise on an H200" in caplog.text


@pytest.mark.extended
@pytest.mark.xfail(
    jax.default_backend() == "gpu", strict=False,
    reason="on an H200 (jax 0.11.2, the second window) bf16 true on-policy is not bitwise: "
    "K3 2.1e-11 in the loop, log-probs up to 5.2e-3 apart (bench/README.md); cause not found")
def test_rl_loop_logs_no_mismatch(tmp_path):
  cfg = config_lib.TrainConfig(
      num_steps=3,
      model=config_lib.ModelConfig(dtype="bfloat16"),
      data=config_lib.DataConfig(prompts_per_step=2, group_size=4, train_tiers=("tier1",),
                                 max_sampling_rounds=1),
      sampling=config_lib.SamplingConfig(dtype="bfloat16", true_on_policy=True,
                                         max_new_tokens=16),
      optim=config_lib.OptimConfig(learning_rate=1e-3),
      learner=config_lib.LearnerConfig(mesh=config_lib.MeshConfig(1, 1, 1)),
      # Four samples per problem, as the rollouts draw: evaluation reuses the
      # rollout sampler's programs. Nothing the check does not read is written.
      eval=config_lib.EvalConfig(tiers=("tier1",), n_per_tier=2, num_samples=4),
      checkpoint=config_lib.CheckpointConfig(enabled=False),
      export=config_lib.ExportConfig(final=False),
      logging=config_lib.LoggingConfig(progress_bar=False, backends="jsonl", plots=False))
  steps = [r for r in rl.train(cfg, str(tmp_path)).rows if r["step"] > 0]
  assert len(steps) == 3
  for row in steps:
    assert row["rollout_corr/k3_kl"] == 0, row["step"]
    assert row["training/rollout_probs_diff_max"] == 0, row["step"]
    assert row["actor/first_update_ratio_max"] == 1 == row["actor/first_update_ratio_min"]


def test_bf16_rows_differ_in_exactly_the_mode():
  from studies import reproduce  # pylint: disable=g-import-not-at-top
  from studies.configs import table  # pylint: disable=g-import-not-at-top
  build = lambda row: config_lib.from_config_dict(table.get_config(f"{row},quick"))
  configs = {row: build(row) for row in ("control", "baseline", *reproduce.PRECISION_ROWS)}
  reproduce.check_like_with_like(configs)
  pair = configs["bf16"], configs["bf16_true_on_policy"]
  assert config_lib.config_diff(*pair) == {"sampling.true_on_policy": (False, True)}
  assert pair[0].model.dtype == pair[0].sampling.dtype == "bfloat16"
  assert pair[0].loss.correction == configs["baseline"].loss.correction  # uncorrected
  other = dataclasses.replace(pair[1], sampling=dataclasses.replace(
      pair[1].sampling, max_concurrent_decodes=8))
  with pytest.raises(ValueError, match="max_concurrent_decodes"):
    reproduce.check_like_with_like({"bf16": pair[0], "bf16_true_on_policy": other})
  assert {c.rows for c in reproduce.PRECISION_CLAIMS} == {
      ("bf16", "bf16_true_on_policy"), ("bf16_true_on_policy", "control")}
