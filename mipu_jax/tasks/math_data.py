"""Math training prompts from local files, and their deterministic epoch order.

Two public schemas (JSONL, JSON or parquet; nothing is downloaded):

| schema | prompt | answer | id |
| --- | --- | --- | --- |
| `dapo` (BytedTsinghua-SIA/DAPO-Math-17k) | `prompt`: list of chat messages `{role, content}`, used as given | `reward_model.ground_truth` | `extra_info.index` |
| `math` (MATH-style) | `problem`: a bare problem; the task adds an instruction | `answer`, or the last `\\boxed{}` of `solution` | `unique_id` / `id` |

`schema="auto"` picks `dapo` for rows with a message-list `prompt` and `math`
for rows with a `problem`. Field names are configurable (dotted paths reach
into nested columns, e.g. `reward_model.ground_truth`); a missing field is an
error naming the row, the file and the fields present.

Order (`PromptOrder`): the prompts are visited in epochs, each a permutation
drawn from `(seed, epoch)`; position `p` of the stream is prompt
`perm_{p // P}[p % P]`. Step `k`'s prompts are a pure function of
`(seed, k)`, so a resumed run continues the same data order.
"""

from __future__ import annotations

import dataclasses
import math
import os
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mipu_jax.math_eval import _io
from mipu_jax.math_eval import grading

SCHEMAS = ("auto", "dapo", "math")
_DEFAULT_FIELDS = {
    "dapo": ("prompt", "reward_model.ground_truth", "extra_info.index"),
    "math": ("problem", "answer", "unique_id"),
}


@dataclasses.dataclass(frozen=True)
class MathProblem:
  """One training prompt (satisfies `mipu_jax.tasks.ProblemLike`).

  Attributes:
    id: the row's id (or its index).
    answer: the ground-truth final answer.
    question: a bare problem (MATH-style), or "" for chat messages.
    messages: the chat messages (DAPO-style), used as given, or ().
  """
  id: str
  answer: str
  question: str = ""
  messages: tuple[Mapping[str, Any], ...] = ()

  @property
  def prompt(self) -> str:
    """The problem text: the question, or the last user message."""
    if self.question:
      return self.question
    users = [m["content"] for m in self.messages if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def _get(row: Mapping[str, Any], path: str) -> Any:
  value: Any = row
  for part in path.split("."):
    if not isinstance(value, Mapping) or part not in value:
      return None
    value = value[part]
  return value


def _detect(row: Mapping[str, Any]) -> str:
  if isinstance(row.get("prompt"), (list, tuple)):
    return "dapo"
  if "problem" in row:
    return "math"
  raise ValueError(f"cannot tell the schema of a row with fields {sorted(row)}: "
                   "expected DAPO's `prompt` (chat messages) or MATH's `problem`; "
                   "set data.schema and the field names.")


def load_problems(path: str, *, schema: str = "auto", prompt_key: str | None = None,
                  answer_key: str | None = None,
                  id_key: str | None = None) -> list[MathProblem]:
  """Reads training prompts from a local JSONL / JSON / parquet file.

  Args:
    path: the file.
    schema: one of `SCHEMAS`.
    prompt_key: the prompt field (default: the schema's).
    answer_key: the answer field (default: the schema's; MATH-style rows
      without it fall back to the boxed answer of `solution`).
    id_key: the id field (default: the schema's; the row index if absent).

  Returns:
    The problems, in file order.

  Raises:
    FileNotFoundError, ValueError: a missing file, an unknown schema, a row
      without its fields, or an empty file.
  """
  if schema not in SCHEMAS:
    raise ValueError(f"unknown data.schema {schema!r}; choose one of {SCHEMAS}.")
  rows = _io.read_rows(path)
  if not rows:
    raise ValueError(f"{path!r} holds no rows.")
  try:
    kind = _detect(rows[0]) if schema == "auto" else schema
  except ValueError as e:
    raise ValueError(f"row 0 of {os.fspath(path)!r} (data.train_file): {e}") from e
  default_prompt, default_answer, default_id = _DEFAULT_FIELDS[kind]
  prompt_key = prompt_key or default_prompt
  answer_key = answer_key or default_answer
  id_key = id_key or default_id
  problems = []
  for index, row in enumerate(rows):
    where = f"row {index} of {os.fspath(path)!r} ({kind} schema; fields present: {sorted(row)})"
    prompt = _get(row, prompt_key)
    answer = _get(row, answer_key)
    if answer is None and kind == "math" and answer_key == default_answer:
      solution = row.get("solution")
      answer = grading.extract_boxed(solution) if isinstance(solution, str) else None
    if prompt is None or (isinstance(prompt, str) and not prompt.strip()):
      raise ValueError(f"{where} has no prompt field {prompt_key!r} (data.prompt_key).")
    if answer is None or (isinstance(answer, str) and not answer.strip()):
      raise ValueError(f"{where} has no answer field {answer_key!r} (data.answer_key)"
                       + (" (nor a \\boxed{} answer in `solution`)" if kind == "math" else "")
                       + ".")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or (
        isinstance(answer, float) and not math.isfinite(answer)):
      raise ValueError(f"{where}: answer field {answer_key!r} (data.answer_key) should be "
                       f"a string or a finite number, got {answer!r}.")
    row_id = _get(row, id_key)
    row_id = str(index if row_id is None else row_id)
    if isinstance(prompt, str):
      problems.append(MathProblem(id=row_id, answer=str(answer).strip(), question=prompt))
    elif isinstance(prompt, (list, tuple)) and all(
        isinstance(m, Mapping) and "role" in m and isinstance(m.get("content"), str)
        for m in prompt) and any(
            m["role"] == "user" and m["content"].strip() for m in prompt):
      problems.append(MathProblem(id=row_id, answer=str(answer).strip(),
                                  messages=tuple(dict(m) for m in prompt)))
    else:
      raise ValueError(f"{where}: field {prompt_key!r} (data.prompt_key) is neither a "
                       "string nor a list of {role, content} messages with a user turn.")
  return problems


def split_probe(problems: Sequence[MathProblem],
                num_probe: int) -> tuple[list[MathProblem], list[MathProblem]]:
  """`(train, probe)`: the `num_probe` problems of lowest CRC32 of their text
  are held out as MIPU Step 2's probe prompts (a fixed split, whatever the seed).
  """
  if num_probe < 0 or num_probe >= len(problems):
    raise ValueError(f"cannot hold out {num_probe} probe prompts of {len(problems)}.")
  order = sorted(range(len(problems)),
                 key=lambda i: (zlib.crc32(problems[i].prompt.encode()), i))
  probe = set(order[:num_probe])
  return ([p for i, p in enumerate(problems) if i not in probe],
          [p for i, p in enumerate(problems) if i in probe])


class PromptOrder:
  """The epoch-shuffled stream of prompt indices: a pure function of (seed, position)."""

  def __init__(self, num_prompts: int, seed: int | Sequence[int]):
    if num_prompts < 1:
      raise ValueError("no prompts to order.")
    self.num_prompts = num_prompts
    self.seed = tuple(int(x) for x in (seed if isinstance(seed, Sequence) else (seed,)))
    self._perms: dict[int, np.ndarray] = {}

  def _perm(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      if len(self._perms) > 4:
        self._perms.clear()
      self._perms[epoch] = np.random.default_rng(
          [*self.seed, epoch]).permutation(self.num_prompts)
    return self._perms[epoch]

  def indices(self, start: int, n: int) -> list[int]:
    """Indices of stream positions `[start, start + n)`."""
    p = self.num_prompts
    return [int(self._perm(q // p)[q % p]) for q in range(start, start + n)]

  def epoch(self, position: int) -> int:
    return position // self.num_prompts
