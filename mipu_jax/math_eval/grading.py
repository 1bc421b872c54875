"""Grading math answers: boxed-answer extraction, equivalence, pass@1.

Equivalence is decided by `math-verify` (the only module that imports it), with a
string-normalisation fallback when it cannot parse either side.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Answered(Protocol):
  """A problem with a reference answer (`tasks.ProblemLike` is one; the tasks
  import this package, not the reverse)."""

  @property
  def answer(self) -> str: ...


_BOX_COMMANDS = ("\\boxed", "\\fbox")


def extract_boxed(text: str) -> str | None:
  """Content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, or None.

  Nested braces are matched (`\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`); the
  brace-less form `\\boxed 5` gives `5`. A box whose braces never close is
  skipped in favour of an earlier complete one.
  """
  starts = sorted(
      (m.start(), m.end()) for cmd in _BOX_COMMANDS
      for m in re.finditer(re.escape(cmd) + r"(?![A-Za-z])", text))
  for _, end in reversed(starts):
    content = _box_content(text, end)
    if content is not None:
      return content
  return None


def normalize_answer(answer: str) -> str:
  """A canonical string for the fallback comparison (spacing, `$`, `\\left`, ...)."""
  s = answer.strip()
  boxed = extract_boxed(s)
  if boxed is not None:
    s = boxed
  s = s.strip().strip("$").strip()
  s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
  s = re.sub(r"\\(?:d|t)frac", r"\\frac", s)
  s = re.sub(r"\\left|\\right|\\!|\\,|\\;|\\:|\\ ", "", s)
  s = re.sub(r"\^\{?\\circ\}?|\\%|%|\\\$", "", s)
  s = re.sub(r"\s+", "", s).rstrip(".").lower()
  s = re.sub(r"^[a-z]\s*=", "", s)  # "x=5" -> "5"
  return s


def is_equivalent(predicted: str, gold: str) -> bool:
  """Whether a predicted answer equals the gold one.

  Both are parsed by `math_verify.parse` as boxed LaTeX and compared with
  `math_verify.verify` (so `\\frac{1}{2}` equals `0.5`, `x^2+1` equals `1+x^2`).
  If either fails to parse, or verify says no, the normalised strings (and,
  if both are plain numbers, their values) are compared.
  """
  from math_verify import parse, verify  # pylint: disable=g-import-not-at-top

  # math-verify's timeouts use SIGALRM, which only the main thread may set.
  timeout = 5 if threading.current_thread() is threading.main_thread() else None
  gold_parsed = parse(_as_boxed(gold), parsing_timeout=timeout)
  pred_parsed = parse(_as_boxed(predicted), parsing_timeout=timeout)
  if gold_parsed and pred_parsed and verify(gold_parsed, pred_parsed,
                                            timeout_seconds=timeout):
    return True
  return _fallback_equal(predicted, gold)


_ANSWER_LINE = re.compile(r"Answer\s*:\s*(.+?)\s*$", re.MULTILINE)


def extract_final_answer(text: str) -> str | None:
  """The final answer of a completion: its last `\\boxed{}`, else the text
  after its last `Answer:` (the format DAPO-Math-17k's prompts ask for), else
  None. Surrounding `$` are stripped from an `Answer:` line."""
  boxed = extract_boxed(text)
  if boxed is not None:
    return boxed
  lines = _ANSWER_LINE.findall(text)
  if not lines:
    return None
  answer = lines[-1].strip()
  if len(answer) >= 2 and answer.startswith("$") and answer.endswith("$"):
    answer = answer[1:-1].strip()
  return answer or None


def grade(completion: str, gold: str) -> bool:
  """True iff the completion's final answer (`extract_final_answer`) is
  equivalent to `gold`. A completion with no final answer is wrong."""
  predicted = extract_final_answer(completion)
  return predicted is not None and is_equivalent(predicted, gold)


def boxed_reward(problems: Sequence[Answered],
                 completions: Sequence[str]) -> np.ndarray:
  """1.0 per correct boxed answer, float32 `[len(problems)]`. A `RewardFn`."""
  if len(problems) != len(completions):
    raise ValueError(
        f"{len(problems)} problems but {len(completions)} completions.")
  return np.asarray([grade(c, p.answer) for p, c in zip(problems, completions)],
                    dtype=np.float32)


def pass_at_1(correct: np.ndarray | Sequence[Sequence[float]]) -> float:
  """pass@1 estimated from k samples per problem.

  Args:
    correct: `[num_problems, k]` booleans or 0/1 floats.

  Returns:
    Mean over problems of the fraction of each problem's k samples that are
    correct (the unbiased pass@1 estimator, averaged over k samples).
  """
  c_PxK = np.asarray(correct, dtype=np.float64)
  if c_PxK.ndim != 2 or c_PxK.size == 0:
    raise ValueError(
        f"pass_at_1 expects a non-empty [num_problems, k] array, got shape "
        f"{c_PxK.shape}.")
  return float(c_PxK.mean(axis=1).mean())


def pass_at_1_se(correct: np.ndarray | Sequence[Sequence[float]]) -> float:
  """Standard error of `pass_at_1`: the sampling noise over the problems.

  The problems are the independent units: `sd_p(c̄_p) / sqrt(P)` with `c̄_p`
  the fraction of problem p's k samples that are correct (sample sd; 0 for a
  single problem). Two evaluations of the same policy on the same problems
  differ by about this much.
  """
  c_PxK = np.asarray(correct, dtype=np.float64)
  pass_at_1(c_PxK)  # validates the shape
  per_problem_P = c_PxK.mean(axis=1)
  if per_problem_P.size < 2:
    return 0.0
  return float(per_problem_P.std(ddof=1) / np.sqrt(per_problem_P.size))


def _box_content(text: str, start: int) -> str | None:
  """The argument of a box command whose name ends at `start`."""
  i = start
  while i < len(text) and text[i] == " ":
    i += 1
  if i >= len(text):
    return None
  if text[i] != "{":
    match = re.match(r"[^\s$]+", text[i:])  # \boxed 5
    return match.group(0) if start < i and match else None
  depth = 0
  for j in range(i, len(text)):
    if text[j] == "{":
      depth += 1
    elif text[j] == "}":
      depth -= 1
      if depth == 0:
        return text[i + 1:j].strip()
  return None


def _as_boxed(answer: str) -> str:
  """Wraps a bare answer in `\\boxed{}` so math-verify reads it as LaTeX."""
  s = answer.strip()
  if extract_boxed(s) is not None:
    return s
  if len(s) >= 2 and s.startswith("$") and s.endswith("$"):
    s = s.strip("$").strip()
  return "\\boxed{" + s + "}"


def _fallback_equal(predicted: str, gold: str) -> bool:
  a, b = normalize_answer(predicted), normalize_answer(gold)
  if not a or not b:
    return False
  if a == b:
    return True
  try:
    x, y = float(a.replace(",", "")), float(b.replace(",", ""))
  except ValueError:
    return False
  return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)
