"""Test doubles shipped with the package, shared by tests, docs and the Colab.

Real components at toy sizes, not mocks: a tiny random Qwen3 policy, the task's
character tokenizer, and a constant reward.
"""

from typing import Sequence

import numpy as np
from flax import nnx

from mipu_jax import models
from mipu_jax.tasks import ProblemLike, make_tokenizer

__all__ = ["ConstantReward", "tiny_config", "tiny_policy", "toy_tokenizer"]


def tiny_config(**overrides) -> models.Qwen3Config:
  """A tiny Qwen3 with distinct (prime-ish) sizes, sized for the arithmetic task's vocab."""
  kw = dict(vocab_size=make_tokenizer().vocab_size, hidden_size=24, num_layers=2, num_heads=3,
            num_kv_heads=1, head_dim=8, intermediate_size=40, tie_embeddings=True,
            rope_theta=10_000.0)
  kw.update(overrides)
  return models.Qwen3Config(**kw)


def tiny_policy(seed: int = 0, **overrides) -> models.Qwen3:
  """A randomly initialised `tiny_config` policy."""
  return models.Qwen3(tiny_config(**overrides), rngs=nnx.Rngs(seed))


def toy_tokenizer():
  """The arithmetic task's character tokenizer (pad 0, eos 1, bos 2)."""
  return make_tokenizer()


class ConstantReward:
  """A `RewardFn` that gives every completion the same reward."""

  def __init__(self, value: float = 1.0):
    self.value = float(value)

  def __call__(self, problems: Sequence[ProblemLike], completions: Sequence[str]) -> np.ndarray:
    del problems
    return np.full((len(completions),), self.value, np.float32)
