"""Peaked random Qwen3s and their prefill log-probs, for the sampler's tests and
`bench/probes/native_gap.py` (one definition, so the bench measures what the tests check)."""

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mipu_jax.models import Qwen3
from mipu_jax.models.config import Qwen3Config, get_config

# The sampler tests' model: prime-ish dims, shared by every sampler test file
# (and bench/probes/native_gap.py) so jit caches are shared too. One layer: XLA
# compiles a one-step layer scan ~2.5x faster on CPU, and compiling dominates
# those tests; the stacked [L, ...] layout is unchanged.
SAMPLER_CFG = get_config("tiny", vocab_size=61, hidden_size=40, num_layers=1, num_heads=4,
                         num_kv_heads=2, head_dim=12, intermediate_size=88)
# Ragged prompts of 3, 7 and 11 tokens.
PROMPTS = [[5, 9, 2], [7, 1, 8, 2, 8, 1, 3], [4, 4, 6, 10, 12, 3, 5, 9, 11, 2, 1]]


def peaked_qwen3(cfg: Qwen3Config, seed: int = 0, std: float = 0.16) -> Qwen3:
  """A Qwen3 with N(0, std) matmul weights (numpy: no compile), peaked like a trained one.

  At the tests' widths `std` is about 8x the model's own init scale, so the
  next-token law is far from uniform. Norm scales are 1.
  """
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
  rng = np.random.default_rng(seed)
  pure = jax.tree_util.tree_map_with_path(
      lambda p, x: np.ones(x.shape, np.float32) if "norm" in jax.tree_util.keystr(p)
      else rng.normal(0.0, std, x.shape).astype(np.float32), nnx.to_pure_dict(state))
  return nnx.merge(graphdef, jax.tree.map(jnp.asarray, pure))


def prefill_logits(sampler, prompts: Sequence[Sequence[int]], rows: int = 8,
                   bucket: int = 16) -> np.ndarray:
  """The first-token logits of `prompts` from `sampler`'s prefill, `[len(prompts), V]`.

  The prompts sit in a batch of `rows` right-padded rows of `bucket` tokens
  (the others 1-token dummies), so ragged lengths and padding are exercised.
  """
  n = len(prompts)
  tokens = np.zeros((rows, bucket), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, :len(p)] = p
  lengths = [len(p) for p in prompts] + [1] * (rows - n)
  prefix = sampler.engine.prefill(sampler.params, tokens, lengths, rng=jax.random.key(0))
  return np.asarray(prefix.logits_RV)[:n]
