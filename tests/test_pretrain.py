"""Base-policy pretraining: batch encoding, a loss that falls, and the shipped checkpoint."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mipu_jax import models
from mipu_jax import pretrain
from mipu_jax import tasks

_ASSET = os.path.join(os.path.dirname(tasks.__file__), "assets", "base_policy")
_TINY = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
             head_dim=16, intermediate_size=48, tiers=("tier1",), batch_size=8)


def test_encode_examples_marks_completion_and_eos():
  tok = tasks.make_tokenizer()
  batch = pretrain.encode_examples(tok, [("Q:1+2=", "A3."), ("Q:10+20=", "A30.")], 14)
  first = [tok.bos_id] + tok.encode("Q:1+2=") + tok.encode("A3.") + [tok.eos_id]
  np.testing.assert_array_equal(batch.tokens_BT[0, :len(first)], first)
  assert (batch.tokens_BT[0, len(first):] == tok.pad_id).all()
  np.testing.assert_array_equal(batch.mask_BT[0], [1] * 11 + [0] * 3)
  # Supervised: "A3." and EOS, i.e. positions 7..10; BOS and prompt are not.
  np.testing.assert_array_equal(batch.target_BT[0], [0] * 7 + [1] * 4 + [0] * 3)
  assert batch.target_BT[1].sum() == 5
  with pytest.raises(ValueError, match="does not fit"):
    pretrain.encode_examples(tok, [("Q:10+20=", "A30.")], 8)


def test_sft_batches_fit_buckets():
  cfg = pretrain.PretrainConfig(batch_size=4)
  batches = pretrain.sft_batches(cfg, tasks.make_tokenizer(), cot_fraction=0.3)
  lengths = {next(batches).tokens_BT.shape[1] for _ in range(40)}
  assert lengths <= {32, 56, cfg.max_seq_len()}


def test_train_reduces_loss():
  cfg = pretrain.PretrainConfig(**_TINY, learning_rate=1e-2, warmup_steps=0,
                                steps=10, skill_steps=4)
  model, nll = pretrain.train(cfg, progress=False)
  assert len(nll) == cfg.steps and np.isfinite(nll).all()
  # Starts near a uniform policy over 20 ids; a few steps learn the format.
  assert abs(nll[0] - np.log(20)) < 0.5
  assert np.mean(nll[-3:]) < 0.8 * nll[0], nll
  assert model.config.vocab_size == tasks.make_tokenizer().vocab_size


def test_sft_loss_uses_a_fixed_denominator():
  tok = tasks.make_tokenizer()
  cfg = pretrain.PretrainConfig(**_TINY)
  model = models.Qwen3(cfg.model_config(), rngs=nnx.Rngs(0))
  batch = pretrain.encode_examples(tok, [("Q:1+2=", "A3."), ("Q:10+20=", "A30.")], 14)
  tokens_BT, mask_BT = jnp.asarray(batch.tokens_BT), jnp.asarray(batch.mask_BT)
  loss, token_nll = pretrain.sft_loss(model, tokens_BT, mask_BT,
                                      jnp.asarray(batch.target_BT), norm_len=16)
  lp_BT = models.sequence_logprobs(model, tokens_BT, mask_BT)
  total = -float(jnp.sum(lp_BT * batch.target_BT))
  np.testing.assert_allclose(float(loss), total / (2 * 16), rtol=1e-6)
  np.testing.assert_allclose(float(token_nll), total / 9, rtol=1e-6)


@pytest.mark.parametrize("completion,style", [
    ("A104.", "direct"), ("37+48=85;A85.", "step"), (";A1.", "other"), ("", "other")])
def test_response_style(completion, style):
  assert pretrain.response_style(completion) == style


def test_config_validation():
  with pytest.raises(ValueError, match="tiers"):
    pretrain.PretrainConfig(tiers=("tier9",))
  with pytest.raises(ValueError, match="steps"):
    pretrain.PretrainConfig(steps=0)
  with pytest.raises(ValueError, match="skill_steps"):
    pretrain.PretrainConfig(steps=10, skill_steps=11)


def test_shipped_base_policy_loads():
  tok = tasks.make_tokenizer()
  model = models.from_pretrained(_ASSET)
  assert model.config.vocab_size == tok.vocab_size == 20
  assert model.config.tie_embeddings
  assert os.path.getsize(os.path.join(_ASSET, "model.safetensors")) < 2 * 1024**2
  with open(os.path.join(_ASSET, "tokenizer_meta.json")) as f:
    meta = json.load(f)
  assert meta["alphabet"] == tok.alphabet and meta["add_bos"]
  assert (meta["pad_id"], meta["eos_id"], meta["bos_id"]) == (
      tok.pad_id, tok.eos_id, tok.bos_id)
  prompt = [tok.bos_id] + tok.encode("Q:12+34=")
  logits_BTV = model(jnp.asarray([prompt], jnp.int32)).logits
  assert logits_BTV.shape == (1, len(prompt), 20)
  assert bool(jnp.isfinite(logits_BTV).all())
  # The base policy continues a prompt with an answer or with work, not specials.
  first = tok.decode([int(jnp.argmax(logits_BTV[0, -1]))])
  assert first == "A" or first.isdigit()
