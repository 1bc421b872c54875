"""The math task: RL of a Hugging Face checkpoint on math prompts (DAPO / MATH style).

Training prompts come from a local file (`math_data`), in an epoch-shuffled
order that is a pure function of `(seed, step)`: step `k`'s first sampling
round takes stream positions `[(k-1)N, kN)`; dynamic sampling's extra rounds
`r ≥ 1` take positions of a second, independently shuffled stream
(`[((k-1)(R-1) + r-1)N, ...)`, `R` = `max_sampling_rounds`), so neither
depends on how many rounds earlier steps needed and a resumed run draws what
an uninterrupted one would. A fixed set of prompts (`split_probe`) is held out
as MIPU Step 2's probe prompts.

Prompts are rendered with the checkpoint's chat template (`chat.render_chat`,
as `transformers` renders it, generation prompt appended) or a raw template for
base models; DAPO messages are used as given, bare MATH-style problems get an
instruction asking for the final answer in `\\boxed{}`. Prompts longer than
the budget are dropped, and counted (`dropped_long`; benchmark problems:
`eval_dropped_long`; both as metrics: `data_stats`).

Rewards: the last `\\boxed{}` answer against the ground truth with
math-verify, in a pool of worker processes with a per-item time limit
(`math_reward.RewardPool`); configurable values for right / wrong; a response
cut at the token budget can be graded as usual (`keep`), scored as wrong
(`wrong`) or left out of the loss (`filter`), and is counted.

Evaluation: the benchmark files (`mipu_jax.math_eval`) found in a directory, named
`<benchmark>.jsonl` / `.json` / `.parquet` (`math500`, `aime24`, `amc23`,
`minerva_math`, `olympiadbench`); a missing one is skipped and said so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

import numpy as np

from mipu_jax import math_eval
from mipu_jax.tasks import base
from mipu_jax.tasks import chat
from mipu_jax.tasks import math_data
from mipu_jax.tasks import math_reward

_log = logging.getLogger(__name__)

TRUNCATED_POLICIES = ("keep", "wrong", "filter")
# The extra-rounds stream of dynamic sampling (see the module docstring).
_EXTRA_STREAM = 0x6578  # "ex"
_EXTENSIONS = (".jsonl", ".json", ".parquet")


def find_benchmarks(directory: str, names: Sequence[str]) -> dict[str, str]:
  """`{benchmark: file}` for the benchmark files present in `directory`.

  Raises:
    ValueError: the directory does not exist, or holds none of `names`.
  """
  if not os.path.isdir(directory):
    raise ValueError(f"eval.benchmark_dir={directory!r} is not a directory.")
  found = {}
  for name in names:
    key = math_eval.canonical_name(name)
    paths = [os.path.join(directory, key + ext) for ext in _EXTENSIONS]
    present = [p for p in paths if os.path.exists(p)]
    if present and not os.path.isfile(present[0]):
      raise ValueError(f"Benchmark {key}: {present[0]!r} is not a file.")
    if present:
      found[key] = present[0]
    else:
      _log.warning("Benchmark %s: no %s in %s, skipped.", key,
                   "/".join(key + e for e in _EXTENSIONS), directory)
  if not found:
    raise ValueError(f"{directory!r} holds none of the benchmark files "
                     f"{[math_eval.canonical_name(n) + '.jsonl' for n in names]} "
                     f"(or .json / .parquet).")
  return found


class MathTask:
  """Math RL prompts, the checkpoint's tokenizer, math-verify rewards, benchmarks.

  Args:
    tokenizer: the checkpoint's `HFTokenizer`.
    train_file: the training prompts (JSONL / JSON / parquet).
    schema, prompt_key, answer_key: see `math_data.load_problems`.
    prompt_template: "chat" (the tokenizer's chat template) or a raw template
      with a `{question}` field.
    instruction: the text a bare problem becomes, with a `{question}` field.
    max_prompt_tokens: the prompt budget; longer prompts are dropped.
    seed: the data order's seed.
    max_rounds: dynamic sampling's rounds per step.
    num_probe: prompts held out as MIPU Step 2's probe.
    reward_correct, reward_wrong: reward values.
    truncated: one of `TRUNCATED_POLICIES`.
    pool: the grading pool.
    benchmark_dir: the evaluation files' directory ("" for none).
    benchmarks: benchmark names to look for.
    max_eval_problems: first problems of each benchmark (0: all).
  """

  name = "math"

  def __init__(self, tokenizer, train_file: str, *, schema: str = "auto",
               prompt_key: str | None = None, answer_key: str | None = None,
               prompt_template: str = "chat",
               instruction: str = math_eval.PROMPT_TEMPLATE,
               max_prompt_tokens: int = 1024, seed: int = 0, max_rounds: int = 1,
               num_probe: int = 16, reward_correct: float = 1.0,
               reward_wrong: float = 0.0, truncated: str = "keep",
               pool: math_reward.RewardPool | None = None,
               benchmark_dir: str = "", benchmarks: Sequence[str] = math_eval.BENCHMARKS,
               max_eval_problems: int = 0):
    if truncated not in TRUNCATED_POLICIES:
      raise ValueError(f"unknown truncated policy {truncated!r}; choose one of "
                       f"{TRUNCATED_POLICIES}.")
    if prompt_template == "chat" and not tokenizer.chat_template:
      raise ValueError("prompt_template='chat' but the checkpoint's "
                       "tokenizer_config.json has no chat_template: give a raw "
                       "template with a {question} field (a base model's prompt).")
    if prompt_template != "chat":
      chat.render_raw(prompt_template, "")  # validates the template
    if "{question}" not in instruction:
      raise ValueError(f"the instruction needs a {{question}} field, got {instruction!r}.")
    self.tokenizer, self.prompt_budget = tokenizer, int(max_prompt_tokens)
    self.prompt_template, self.instruction = prompt_template, instruction
    self.reward_correct, self.reward_wrong = float(reward_correct), float(reward_wrong)
    self.truncated = truncated
    self.pool = pool or math_reward.RewardPool()
    self._ids: dict[int, tuple[object, tuple[int, ...]]] = {}  # see `encode`

    problems = math_data.load_problems(train_file, schema=schema,
                                       prompt_key=prompt_key, answer_key=answer_key)
    kept = [p for p in problems if len(self.encode(p)) <= self.prompt_budget]
    self.dropped_long = len(problems) - len(kept)
    if self.dropped_long:
      _log.warning("Dropped %d of %d training prompts longer than %d tokens.",
                   self.dropped_long, len(problems), self.prompt_budget)
    if len(kept) <= num_probe:
      raise ValueError(f"{len(kept)} training prompts of {train_file} fit the budget of "
                       f"{self.prompt_budget} tokens (data.max_prompt_tokens): too few "
                       f"to hold out {num_probe} probe prompts and train on the rest.")
    self.train, self.probe = math_data.split_probe(kept, num_probe)
    self.max_rounds = max(int(max_rounds), 1)
    self._order = math_data.PromptOrder(len(self.train), seed)
    self._extra = math_data.PromptOrder(len(self.train), (seed, _EXTRA_STREAM))

    self._eval: dict[str, list] = {}
    self.eval_dropped_long = 0
    if benchmark_dir:
      for key, path in find_benchmarks(benchmark_dir, benchmarks).items():
        items = math_eval.load_benchmark(key, path)
        if max_eval_problems:
          items = items[:max_eval_problems]
        fit = [p for p in items if len(self.encode(p)) <= self.prompt_budget]
        if not fit:   # its score would be a mean over nothing
          raise ValueError(f"Benchmark {key} ({path}): none of its {len(items)} problems "
                           f"fits the prompt budget (data.max_prompt_tokens="
                           f"{self.prompt_budget}).")
        if len(fit) < len(items):
          _log.warning("Benchmark %s: left out %d of %d problems longer than %d "
                       "tokens; its score is over the other %d.", key,
                       len(items) - len(fit), len(items), self.prompt_budget, len(fit))
        self.eval_dropped_long += len(items) - len(fit)
        self._eval[key] = fit
    self.eval_names = tuple(self._eval)

  def data_stats(self) -> dict[str, float]:
    """The prompts left out for length, as metrics (a run's step-0 row).

    Returns:
      `{"data/dropped_long": training prompts dropped, "data/eval_dropped_long":
      benchmark problems left out}`.
    """
    return {"data/dropped_long": float(self.dropped_long),
            "data/eval_dropped_long": float(self.eval_dropped_long)}

  def sample(self, n: int, *, seed: int, step: int, round: int = 0,  # pylint: disable=redefined-builtin
             split: str = "train") -> list[math_data.MathProblem]:
    """Training prompts from the epoch streams, or probe prompts (see module)."""
    if split == "probe":
      rng = np.random.default_rng([seed, base.PROBE_STREAM, step])
      return [self.probe[i] for i in rng.choice(len(self.probe), n,
                                                replace=n > len(self.probe))]
    if split != "train":
      raise ValueError(f"unknown split {split!r}.")
    if round == 0:
      return [self.train[i] for i in self._order.indices((step - 1) * n, n)]
    start = ((step - 1) * (self.max_rounds - 1) + round - 1) * n
    return [self.train[i] for i in self._extra.indices(start, n)]

  def epoch(self, step: int, n: int) -> int:
    """The training epoch step `step` (of `n` prompts) is in."""
    return self._order.epoch((step - 1) * n)

  def question(self, problem) -> str:
    """The user's text: a DAPO prompt's last user message, or the instruction
    applied to a bare problem (MATH-style training prompt or benchmark)."""
    if getattr(problem, "messages", ()):
      return problem.prompt
    return self.instruction.format(question=getattr(problem, "question", problem.prompt))

  def render(self, problem) -> str:
    """The prompt text the model continues."""
    if self.prompt_template != "chat":
      return chat.render_raw(self.prompt_template, self.question(problem))
    messages = getattr(problem, "messages", ()) or (
        {"role": "user", "content": self.question(problem)},)
    return chat.render_chat(self.tokenizer.chat_template, messages,
                            self.tokenizer.special_tokens)

  def encode(self, problem) -> tuple[int, ...]:
    """The prompt's token ids, cached per problem object.

    The problems (frozen, but holding dicts) are not hashable: the cache is
    keyed by `id` and keeps the problem alive beside its ids, so the id cannot
    be reused by another object while the entry stands.
    """
    entry = self._ids.get(id(problem))
    if entry is None:
      bos = [] if self.tokenizer.bos_id is None else [self.tokenizer.bos_id]
      ids = self.tokenizer.encode(self.render(problem))
      if bos and ids[:1] == bos:  # the template wrote the BOS already
        bos = []
      entry = self._ids[id(problem)] = (problem, tuple(bos + ids))
    return entry[1]

  def correct(self, problems, completions) -> np.ndarray:
    return self.pool.grade(list(completions), [p.answer for p in problems])

  def reward(self, problems, completions, truncated):
    timeouts, errors = self.pool.timeouts, self.pool.errors
    right = self.correct(problems, completions)
    rewards = np.where(right, self.reward_correct, self.reward_wrong).astype(np.float32)
    truncated = np.asarray(truncated, bool)
    keep = np.ones(len(rewards), bool)
    if self.truncated == "wrong":
      rewards[truncated] = self.reward_wrong
    elif self.truncated == "filter":
      keep = ~truncated
    stats = {
        "reward/timeouts": float(self.pool.timeouts - timeouts),
        "reward/errors": float(self.pool.errors - errors),
        "reward/truncated": float(truncated.sum()),
    }
    if self.truncated == "filter":
      stats["reward/truncated_filtered"] = float(truncated.sum())
    return rewards, keep, stats

  def eval_sets(self, seed: int) -> Mapping[str, list]:
    del seed  # the benchmarks are fixed files
    return dict(self._eval)
