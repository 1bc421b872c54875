"""Hugging Face checkpoint errors: each bad case names what is wrong."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.flax import load_file, save_file

from mipu_jax import models
from mipu_jax.models import CheckpointError

KW = dict(vocab_size=31, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8,
          intermediate_size=24, tie_embeddings=True)


@pytest.fixture
def ckpt(tmp_path):
  models.save_pretrained(models.Qwen3(models.Qwen3Config(**KW), rngs=nnx.Rngs(0)), str(tmp_path))
  return tmp_path


def _edit_tensors(path, fn):
  fname = str(path / "model.safetensors")
  tensors = load_file(fname)
  fn(tensors)
  save_file(tensors, fname)


def _edit_config(path, **changes):
  cfg = json.loads((path / "config.json").read_text())
  cfg.update(changes)
  (path / "config.json").write_text(json.dumps(cfg))


def test_good_checkpoint_loads(ckpt):
  model = models.from_pretrained(str(ckpt))
  assert model.config == models.Qwen3Config(**KW)


def test_missing_tensor(ckpt):
  _edit_tensors(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
  with pytest.raises(CheckpointError, match=r"missing tensors: \['model.layers.1.mlp.up_proj"):
    models.from_pretrained(str(ckpt))


def test_unexpected_tensor(ckpt):
  _edit_tensors(ckpt, lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": jnp.zeros(16)}))
  with pytest.raises(CheckpointError, match="unexpected tensors: .*q_proj.bias"):
    models.from_pretrained(str(ckpt))


def test_misshaped_tensor(ckpt):
  _edit_tensors(ckpt, lambda t: t.update({"model.norm.weight": jnp.ones(17)}))
  with pytest.raises(CheckpointError, match=r"model.norm.weight .* shape \(17,\), expected \(16,\)"):
    models.from_pretrained(str(ckpt))


def test_untied_config_needs_lm_head(ckpt):
  _edit_config(ckpt, tie_word_embeddings=False)
  with pytest.raises(CheckpointError, match=r"missing tensors: \['lm_head.weight'\]"):
    models.from_pretrained(str(ckpt))


@pytest.mark.parametrize("changes,message", [
    (dict(model_type="llama", architectures=["LlamaForCausalLM"]), "Unsupported architecture"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(use_sliding_window=True), "sliding_window"),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "RoPE scaling 'yarn'"),
])
def test_unsupported_config(ckpt, changes, message):
  _edit_config(ckpt, **changes)
  with pytest.raises(CheckpointError, match=message):
    models.from_pretrained(str(ckpt))


def test_missing_files(tmp_path, ckpt):
  with pytest.raises(CheckpointError, match="does not exist"):
    models.from_pretrained(str(tmp_path / "nope"))
  (ckpt / "model.safetensors").unlink()
  with pytest.raises(CheckpointError, match="No model.safetensors"):
    models.from_pretrained(str(ckpt))
  (ckpt / "config.json").unlink()
  with pytest.raises(CheckpointError, match="No config.json"):
    models.from_pretrained(str(ckpt))


def test_index_naming_missing_shard(tmp_path):
  model = models.Qwen3(models.Qwen3Config(**KW), rngs=nnx.Rngs(0))
  models.save_pretrained(model, str(tmp_path), max_shard_bytes=4_000)
  shards = sorted(tmp_path.glob("model-*.safetensors"))
  assert len(shards) > 1
  shards[-1].unlink()
  with pytest.raises(CheckpointError, match=f"shard files that do not exist: .*{shards[-1].name}"):
    models.from_pretrained(str(tmp_path))


def test_bf16_save_roundtrip(tmp_path):
  model = models.Qwen3(models.Qwen3Config(**KW), rngs=nnx.Rngs(1))
  models.save_pretrained(model, str(tmp_path), dtype="bfloat16")
  assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
  loaded = models.from_pretrained(str(tmp_path))
  want = np.asarray(model.layers.q[...].astype(jnp.bfloat16).astype(jnp.float32))
  np.testing.assert_array_equal(np.asarray(loaded.layers.q[...]), want)
