"""Multi-operand addition: a synthetic reasoning task with verifiable answers for CPU RL.

A prompt asks for a sum of 2-digit numbers, `Q:37+48+19=`. A completion answers it
either directly, `A104.`, or step by step, one two-operand addition at a time,
`37+48=85;85+19=104;A104.`. The final answer is the digits between `A` and `.`.

Why this shape:
- A tiny transformer learns one two-number addition reliably but not a
  many-operand sum in a single shot, so step-by-step answers are more accurate
  than direct ones, and RL that rewards correctness lengthens responses (the
  "length surge" of the sources): the first completion character is the
  decision (`A` = answer now, a digit = show the work).
- `sft_examples` mixes both styles (`cot_fraction`) and, by default, makes some
  direct answers off by a carry-slip-sized amount (`direct_error_rate`): a base
  policy that guesses when it skips the work. This makes "direct is less
  accurate" hold by construction, whatever the tiny model's capacity, and
  leaves the base policy with clearly nonzero but imperfect accuracy.

Tiers (the five held-out evaluation sets, standing in for the five benchmarks of
the source tables) differ in the number of 2-digit operands. Lengths in
characters, which are tokens for `make_tokenizer()` (add 1 for EOS, and 1 for
BOS if used):

| tier  | operands | max prompt | max completion (step by step) | direct |
| ----- | -------- | ---------- | ----------------------------- | ------ |
| tier1 | 2        | 8          | 15                            | 5      |
| tier2 | 3        | 11         | 26                            | 5      |
| tier3 | 4        | 14         | 37                            | 5      |
| tier4 | 5        | 17         | 48                            | 5      |
| tier5 | 6        | 20         | 59                            | 5      |

Splits: each problem belongs to exactly one of `train` / `probe` / `eval`, by a
fixed hash of its prompt (about 85% / 5% / 10%), so the splits are disjoint for
every seed; seeds only choose which problems of a split are drawn.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from mipu_jax import tokenizer as tokenizer_lib
from mipu_jax.tasks import base

ALPHABET = "0123456789+=;:.AQ"
SPLITS = ("train", "probe", "eval")
_EVAL_PERCENT = 10
_PROBE_PERCENT = 5


@dataclasses.dataclass(frozen=True)
class Tier:
  """A difficulty tier: `num_operands` numbers of `digits` digits each."""

  name: str
  num_operands: int
  digits: int = 2

  @property
  def max_prompt_len(self) -> int:
    return len(_prompt([10**self.digits - 1] * self.num_operands))

  @property
  def max_completion_len(self) -> int:
    """Length of the longest (step-by-step) completion; sums grow monotonically."""
    return len(cot_completion([10**self.digits - 1] * self.num_operands))


TIERS: Mapping[str, Tier] = {
    f"tier{k}": Tier(f"tier{k}", num_operands=k + 1) for k in range(1, 6)
}
TIER_NAMES: tuple[str, ...] = tuple(TIERS)


def make_tokenizer() -> tokenizer_lib.CharTokenizer:
  """The task's character tokenizer (20 ids: pad, eos, bos, then `ALPHABET`)."""
  return tokenizer_lib.CharTokenizer(ALPHABET)


def max_prompt_len(tiers: Sequence[str] = TIER_NAMES) -> int:
  """Longest prompt, in characters, over `tiers`."""
  return max(_tier(t).max_prompt_len for t in tiers)


def max_completion_len(tiers: Sequence[str] = TIER_NAMES) -> int:
  """Longest well-formed completion, in characters (EOS excluded), over `tiers`."""
  return max(_tier(t).max_completion_len for t in tiers)


def direct_completion(total: int) -> str:
  """`A104.`"""
  return f"A{total}."


def cot_completion(operands: Sequence[int]) -> str:
  """`37+48=85;85+19=104;A104.`: one two-operand addition per step."""
  steps = []
  acc = operands[0]
  for x in operands[1:]:
    steps.append(f"{acc}+{x}={acc + x};")
    acc += x
  return "".join(steps) + direct_completion(acc)


def split_of(prompt: str) -> str:
  """The split a prompt belongs to, fixed for all seeds."""
  bucket = zlib.crc32(prompt.encode("ascii")) % 100
  if bucket < _EVAL_PERCENT:
    return "eval"
  if bucket < _EVAL_PERCENT + _PROBE_PERCENT:
    return "probe"
  return "train"


def sample_problems(rng: np.random.Generator, n: int,
                    tiers: Sequence[str] = TIER_NAMES, *,
                    split: str = "train") -> list[base.Problem]:
  """Draws `n` problems (with replacement) of `split`, tiers chosen uniformly.

  Args:
    rng: numpy random generator; the only source of randomness.
    n: number of problems.
    tiers: tier names to draw from.
    split: `"train"`, `"probe"` or `"eval"`.

  Returns:
    The problems, in draw order.
  """
  return [p for p, _ in _sample(rng, n, tiers, split)]


def sft_examples(rng: np.random.Generator, n: int, *,
                 tiers: Sequence[str] = TIER_NAMES,
                 cot_fraction: float = 0.3,
                 direct_error_rate: float = 0.4,
                 split: str = "train") -> list[tuple[str, str]]:
  """Supervised (prompt, completion) pairs for pretraining the base policy.

  Completions carry no EOS: append the tokenizer's `eos_id` after encoding.

  Args:
    rng: numpy random generator.
    n: number of examples.
    tiers: tier names to draw from (uniformly).
    cot_fraction: probability that an example answers step by step; otherwise
      it answers directly. The base policy's initial share of long answers.
    direct_error_rate: probability that a direct answer is wrong (off by a
      carry-slip-sized amount). Step-by-step answers are always correct.
    split: split the prompts come from; `"train"` unless you know otherwise.

  Returns:
    `n` pairs such as `("Q:37+48+19=", "37+48=85;85+19=104;A104.")`.
  """
  if not 0.0 <= cot_fraction <= 1.0:
    raise ValueError(f"cot_fraction must be in [0, 1], got {cot_fraction}.")
  if not 0.0 <= direct_error_rate <= 1.0:
    raise ValueError(
        f"direct_error_rate must be in [0, 1], got {direct_error_rate}.")
  examples = []
  for problem, operands in _sample(rng, n, tiers, split):
    if rng.random() < cot_fraction:
      examples.append((problem.prompt, cot_completion(operands)))
      continue
    total = sum(operands)
    if rng.random() < direct_error_rate:
      total = _slip(rng, total)
    examples.append((problem.prompt, direct_completion(total)))
  return examples


def eval_sets(seed: int, n_per_tier: int = 128, *,
              split: str = "eval") -> dict[str, list[base.Problem]]:
  """The five held-out evaluation sets: distinct problems of `split` per tier.

  Each tier has its own stream (`default_rng([seed, tier_index])`), so a tier's
  set does not depend on which other tiers exist.

  Args:
    seed: integer seed.
    n_per_tier: problems per tier.
    split: `"eval"` (default) or `"probe"`.

  Returns:
    `{"tier1": [...], ..., "tier5": [...]}`.
  """
  sets = {}
  for index, name in enumerate(TIER_NAMES):
    rng = np.random.default_rng([seed, index])
    seen: dict[str, base.Problem] = {}
    # Distinct draws get rare as a split runs out (tier1's eval split holds
    # 815 problems); this bounds the coupon-collector loop.
    budget = 20 * n_per_tier + 1000
    while len(seen) < n_per_tier:
      budget -= 1
      if budget < 0:
        raise ValueError(
            f"Could not draw {n_per_tier} distinct {split} problems of {name}.")
      (problem, _), = _sample(rng, 1, (name,), split)
      seen.setdefault(problem.prompt, problem)
    sets[name] = list(seen.values())
  return sets


_PROMPT_RE = re.compile(r"Q:(\d+(?:\+\d+)+)=")
_ANSWER_RE = re.compile(r"A(\d+)\.")


def parse_prompt(prompt: str) -> list[int]:
  """The operands of a prompt such as `Q:37+48+19=`."""
  match = _PROMPT_RE.fullmatch(prompt.strip())
  if match is None:
    raise ValueError(f"Not an addition prompt: {prompt!r}.")
  return [int(x) for x in match.group(1).split("+")]


def extract_answer(completion: str) -> str | None:
  """The final answer of a completion, or None if it gives none.

  The answer is the first `A<digits>.`: the `.` closes it, so anything the
  model writes after it is ignored; text before it (steps, junk) is skipped.
  An answer cut off before its `.` (length limit) is no answer.
  """
  match = _ANSWER_RE.search(completion)
  return None if match is None else match.group(1)


def reward(problem: base.ProblemLike | str, completion: str) -> float:
  """1.0 if the completion's final answer equals the problem's, else 0.0.

  Args:
    problem: a problem, or just its prompt text (the answer is then computed).
    completion: decoded completion text (junk and special markers allowed).
  """
  if isinstance(problem, str):
    gold = sum(parse_prompt(problem))
  else:
    gold = int(problem.answer)
  predicted = extract_answer(completion)
  return float(predicted is not None and int(predicted) == gold)


def reward_batch(problems: Sequence[base.ProblemLike | str],
                 completions: Sequence[str]) -> np.ndarray:
  """`reward` over a batch: float32 `[len(problems)]`. A `base.RewardFn`."""
  if len(problems) != len(completions):
    raise ValueError(
        f"{len(problems)} problems but {len(completions)} completions.")
  return np.asarray([reward(p, c) for p, c in zip(problems, completions)],
                    dtype=np.float32)


def _tier(name: str) -> Tier:
  try:
    return TIERS[name]
  except KeyError:
    raise ValueError(
        f"Unknown tier {name!r}; expected one of {TIER_NAMES}.") from None


def _prompt(operands: Sequence[int]) -> str:
  return "Q:" + "+".join(str(x) for x in operands) + "="


def _sample(rng: np.random.Generator, n: int, tiers: Sequence[str],
            split: str) -> list[tuple[base.Problem, list[int]]]:
  """Rejection-samples `n` problems of `split`, with their operands."""
  if split not in SPLITS:
    raise ValueError(f"Unknown split {split!r}; expected one of {SPLITS}.")
  if not tiers:
    raise ValueError("No tiers to sample from.")
  specs = [_tier(t) for t in tiers]
  out = []
  while len(out) < n:
    spec = specs[int(rng.integers(len(specs)))]
    lo, hi = 10**(spec.digits - 1), 10**spec.digits
    operands = [int(x) for x in rng.integers(lo, hi, size=spec.num_operands)]
    prompt = _prompt(operands)
    if split_of(prompt) == split:
      out.append((base.Problem(prompt, str(sum(operands)), spec.name),
                  operands))
  return out


def _slip(rng: np.random.Generator, total: int) -> int:
  """A plausible wrong sum: off by a dropped/extra carry or a unit."""
  deltas = (-20, -10, -2, -1, 1, 2, 10, 20)
  while True:
    wrong = total + deltas[int(rng.integers(len(deltas)))]
    if wrong > 0:
      return wrong
