"""What every task hands the RL loop: problems with a prompt and a checkable answer,
and a host-side reward function over a batch of completions."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

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
