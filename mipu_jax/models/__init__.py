"""Qwen3 policy model, Hugging Face interop and sharding."""

from mipu_jax.models.config import PRESETS, Qwen3Config, as_dtype, get_config
from mipu_jax.models.logprobs import chunked_token_logprobs, entropy, sequence_logprobs, token_logprobs
from mipu_jax.models.qwen3 import KVCache, Qwen3, init_cache
from mipu_jax.models.hf import CheckpointError, from_pretrained, read_config, save_pretrained
from mipu_jax.models.sharding import (batch_sharding, init_sharded, make_mesh, param_shardings,
                                      shard_model)
