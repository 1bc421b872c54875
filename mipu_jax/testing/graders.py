"""Graders for the reward pool's tests (`mipu_jax.tasks.math_reward`).

`parity(completion, gold)` calls a completion right when its length is even:
a deterministic grader that gives a random policy mixed rewards, so a tiny
end-to-end run has groups with nonzero advantages. `stubborn(completion,
gold)` grades like `mipu_jax.math_eval.grading.grade` but
hangs on a completion containing `HANG`, raises on one containing `RAISE` and
kills its own process on one containing `EXIT`: the three ways a
pathological answer can misbehave in a worker. `slow_first` grades like
`grade` but takes 1.5 s on its first call in a process, as math-verify's
first call loads its parsers.
"""

import os
import time

from mipu_jax.math_eval import grading


def stubborn(completion: str, gold: str) -> bool:
  if "HANG" in completion:
    time.sleep(3600)
  if "RAISE" in completion:
    raise RuntimeError("a grader error")
  if "EXIT" in completion:
    os._exit(3)  # pylint: disable=protected-access
  return grading.grade(completion, gold)


_called = False


def slow_first(completion: str, gold: str) -> bool:
  global _called
  if not _called:
    _called = True
    time.sleep(1.5)
  return grading.grade(completion, gold)


def parity(completion: str, gold: str) -> bool:
  del gold
  return len(completion) % 2 == 0
