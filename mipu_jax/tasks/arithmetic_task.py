"""The arithmetic task as the RL loop sees it (`base.Task`): the small CPU task."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mipu_jax.tasks import arithmetic
from mipu_jax.tasks import base


class ArithmeticTask:
  """Multi-operand addition with the character tokenizer (`arithmetic`).

  Args:
    train_tiers: tiers the training prompts are drawn from.
    eval_tiers: the evaluation sets.
    n_per_tier: problems per evaluation set.
    add_bos: prepend BOS to every prompt (the shipped base policy was
      pretrained with it).
  """

  name = "arithmetic"

  def __init__(self, train_tiers: Sequence[str], eval_tiers: Sequence[str],
               n_per_tier: int, add_bos: bool = True):
    self.train_tiers, self.eval_names = tuple(train_tiers), tuple(eval_tiers)
    self.n_per_tier, self.add_bos = n_per_tier, add_bos
    self.tokenizer = arithmetic.make_tokenizer()
    tiers = tuple(dict.fromkeys(self.train_tiers + self.eval_names))
    self.prompt_budget = arithmetic.max_prompt_len(tiers) + int(add_bos)

  def sample(self, n: int, *, seed: int, step: int, round: int = 0,  # pylint: disable=redefined-builtin
             split: str = "train") -> list[base.Problem]:
    key = [seed, base.PROBE_STREAM, step] if split == "probe" else [seed, step, round]
    return arithmetic.sample_problems(np.random.default_rng(key), n,
                                      self.train_tiers, split=split)

  def encode(self, problem: base.ProblemLike) -> tuple[int, ...]:
    bos = [self.tokenizer.bos_id] if self.add_bos else []
    return tuple(bos + self.tokenizer.encode(problem.prompt))

  def reward(self, problems, completions, truncated):
    del truncated  # a cut-off answer has no closing `.`: it is no answer
    rewards = arithmetic.reward_batch(problems, completions)
    return rewards, np.ones(len(rewards), bool), {}

  def correct(self, problems, completions) -> np.ndarray:
    return arithmetic.reward_batch(problems, completions) >= 1.0

  def eval_sets(self, seed: int) -> Mapping[str, list[base.Problem]]:
    sets = arithmetic.eval_sets(seed, self.n_per_tier)
    return {t: sets[t] for t in self.eval_names}

  def data_stats(self) -> dict[str, float]:
    """None: generated problems fit the prompt budget by construction."""
    return {}
