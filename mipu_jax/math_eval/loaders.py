"""Loaders for the five math benchmarks of the source tables, from local files.

Nothing is downloaded: point `load_benchmark` at a `.jsonl`, `.json` or
`.parquet` file with the columns of the public Hugging Face dataset named below.

| name            | dataset files it reads            | question | answer               | id        |
| --------------- | --------------------------------- | -------- | -------------------- | --------- |
| `math500`       | HuggingFaceH4/MATH-500 test.jsonl | problem  | answer (str)         | unique_id |
| `aime24`        | Maxwell-Jia/AIME_2024 parquet     | Problem  | Answer (int)         | ID        |
| `amc23`         | math-ai/amc23 test parquet        | question | answer (float / str) | id        |
| `minerva_math`  | math-ai/minervamath test.jsonl    | question | answer (str)         | (row)     |
| `olympiadbench` | Hothan/OlympiadBench (OE_TO_*)    | question | final_answer (list)  | id        |

Other columns are kept in `BenchmarkProblem.metadata` (MATH-500: solution,
subject, level; AIME24: Solution; OlympiadBench: solution, is_multiple_answer,
unit, answer_type, subfield, ...). A missing id column falls back to the row
index. Numeric answers are written as integers when integral (AMC23 stores
`27.0`); OlympiadBench's `final_answer` list (entries like `"$\\frac{1}{2}$"`)
is stripped of `$` and joined with `", "`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from mipu_jax.math_eval import _io

# The instruction the sources' models (Qwen-Math / DeepSeek-R1 style) are
# evaluated with; the chat template, if any, is applied by the caller.
PROMPT_TEMPLATE = (
    "{question}\nPlease reason step by step, and put your final answer within "
    "\\boxed{{}}.")


@dataclasses.dataclass(frozen=True)
class BenchmarkProblem:
  """One benchmark problem (satisfies `mipu_jax.tasks.ProblemLike`).

  Attributes:
    benchmark: canonical benchmark name, e.g. `"math500"`.
    id: problem id from the file (or the row index as a string).
    question: the problem statement as stored.
    answer: the reference final answer as a string.
    metadata: every other column of the row.
  """

  benchmark: str
  id: str
  question: str
  answer: str
  metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def prompt(self) -> str:
    """The question with the step-by-step, boxed-answer instruction."""
    return PROMPT_TEMPLATE.format(question=self.question)


@dataclasses.dataclass(frozen=True)
class _Schema:
  question: str
  answer: str
  id: str | None
  source: str


_SCHEMAS: Mapping[str, _Schema] = {
    "math500": _Schema("problem", "answer", "unique_id",
                       "HuggingFaceH4/MATH-500"),
    "aime24": _Schema("Problem", "Answer", "ID", "Maxwell-Jia/AIME_2024"),
    "amc23": _Schema("question", "answer", "id", "math-ai/amc23"),
    "minerva_math": _Schema("question", "answer", None, "math-ai/minervamath"),
    "olympiadbench": _Schema("question", "final_answer", "id",
                             "Hothan/OlympiadBench"),
}
BENCHMARKS: tuple[str, ...] = tuple(_SCHEMAS)


def canonical_name(name: str) -> str:
  """`"MATH-500"`, `"Minerva Math"`, `"aime24"`, ... to a key of `BENCHMARKS`."""
  squashed = re.sub(r"[^a-z0-9]", "", name.lower())
  for key in _SCHEMAS:
    if squashed == key.replace("_", ""):
      return key
  raise ValueError(f"Unknown benchmark {name!r}; expected one of {BENCHMARKS}.")


def load_benchmark(name: str,
                   path: str | os.PathLike[str]) -> list[BenchmarkProblem]:
  """Loads a benchmark from a local file in its Hugging Face schema.

  Args:
    name: one of `BENCHMARKS` (case, `-`, `_` and spaces are ignored).
    path: `.jsonl`, `.json` (array of objects) or `.parquet` file.

  Returns:
    The problems, in file order.

  Raises:
    FileNotFoundError: `path` does not exist.
    ValueError: unknown benchmark, or a row lacks a required column (named in
      the message with the row number and the file).
  """
  key = canonical_name(name)
  schema = _SCHEMAS[key]
  rows = _io.read_rows(path)
  if not rows:
    raise ValueError(f"{key}: {os.fspath(path)!r} holds no problems.")
  problems = []
  for index, row in enumerate(rows):
    for field in (schema.question, schema.answer):
      if row.get(field) is None:
        raise ValueError(
            f"{key}: row {index} of {os.fspath(path)!r} has no {field!r} field "
            f"(expected the {schema.source} schema; fields present: "
            f"{sorted(row)}).")
    question, answer = row[schema.question], row[schema.answer]
    if not isinstance(question, str) or not question.strip():
      raise ValueError(f"{key}: row {index} of {os.fspath(path)!r}: {schema.question!r} "
                       f"should be the problem's text, got {question!r}.")
    if not _answer_ok(answer):
      raise ValueError(f"{key}: row {index} of {os.fspath(path)!r}: {schema.answer!r} "
                       f"should be a non-empty string, a number or a list of them, "
                       f"got {answer!r}.")
    row_id = row.get(schema.id) if schema.id else None
    used = {schema.question, schema.answer, schema.id}
    problems.append(BenchmarkProblem(
        benchmark=key,
        id=str(index if row_id is None else row_id),
        question=str(row[schema.question]),
        answer=_answer_text(row[schema.answer]),
        metadata={k: v for k, v in row.items() if k not in used},
    ))
  return problems


def _answer_ok(value: Any) -> bool:
  """A stored answer that grades: text, a finite number, or a list of them."""
  if isinstance(value, (list, tuple)):
    return bool(value) and all(_answer_ok(v) for v in value)
  if isinstance(value, bool):
    return False
  if isinstance(value, (int, float)):
    return math.isfinite(value)
  return isinstance(value, str) and bool(value.strip().strip("$").strip())


def _answer_text(value: Any) -> str:
  """A stored answer (string, number, or OlympiadBench list) as one string."""
  if isinstance(value, (list, tuple)):
    return ", ".join(_answer_text(v) for v in value)
  if isinstance(value, float) and value.is_integer():
    return str(int(value))
  text = str(value).strip()
  if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
    text = text.strip("$").strip()
  return text
