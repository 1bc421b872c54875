"""What every task hands the RL loop: problems with a prompt and a checkable answer,
a tokenizer, the prompts' ids, rewards, and the evaluation sets (`Task`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class ProblemLike(Protocol):
  """Anything with a prompt and a reference answer (task or benchmark problem)."""

  @property
  def prompt(self) -> str:
    """Text the policy is conditioned on."""

  @property
  def answer(self) -> str:
    """Reference final answer."""


@dataclasses.dataclass(frozen=True)
class Problem:
  """One problem of a synthetic task.

  Attributes:
    prompt: text the policy continues, e.g. `"Q:37+48+19="`.
    answer: the reference final answer, e.g. `"104"`.
    tier: difficulty tier the problem was drawn from, e.g. `"tier2"`.
  """

  prompt: str
  answer: str
  tier: str = ""


@runtime_checkable
class RewardFn(Protocol):
  """Host-side reward: one float per (problem, completion) pair."""

  def __call__(self, problems: Sequence[ProblemLike],
               completions: Sequence[str]) -> np.ndarray:
    """Returns float32 rewards of shape `[len(problems)]`."""


# The random stream of MIPU Step 2's probe prompts (kept apart from the
# training stream): `sample(..., split="probe")` draws with this tag.
PROBE_STREAM = 0x6d697075  # "mipu"


@runtime_checkable
class Task(Protocol):
  """What the RL loop needs from a task (`mipu_jax.rl` takes any of them).

  Attributes:
    name: the task's config name.
    tokenizer: the task's tokenizer (its `stop_ids` end a completion).
    prompt_budget: most tokens an encoded prompt has.
    eval_names: names of the evaluation sets, in table order.
  """
  name: str
  tokenizer: Any
  prompt_budget: int
  eval_names: tuple[str, ...]

  def sample(self, n: int, *, seed: int, step: int, round: int = 0,
             split: str = "train") -> Sequence[ProblemLike]:
    """`n` problems of `split`, a pure function of `(seed, step, round)`.

    `split="probe"`: MIPU Step 2's held-out probe prompts (`round` unused).
    """

  def encode(self, problem: ProblemLike) -> tuple[int, ...]:
    """The prompt's token ids, as the sampler and the learner see them."""

  def reward(self, problems: Sequence[ProblemLike], completions: Sequence[str],
             truncated: Sequence[bool]) -> tuple[np.ndarray, np.ndarray,
                                                 dict[str, float]]:
    """`(rewards, keep, stats)`: float32 rewards, bool `keep` (False: left
    out of the loss, e.g. a filtered truncated response), counters to log."""

  def correct(self, problems: Sequence[ProblemLike],
              completions: Sequence[str]) -> np.ndarray:
    """bool: the completion's final answer is right (pass@1 counts these)."""

  def eval_sets(self, seed: int) -> Mapping[str, Sequence[ProblemLike]]:
    """The evaluation sets, keyed by `eval_names`."""

  def data_stats(self) -> Mapping[str, float]:
    """Counters of the task's data, logged once in the run's step-0 row
    (e.g. prompts left out for length)."""
