"""Tests for mipu_jax.math_eval on hand-written fixtures in the benchmarks' HF schemas."""

import json
import pathlib
import sys

import numpy as np
import pytest

from mipu_jax import math_eval as ev
from mipu_jax import tasks

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "benchmarks"

# benchmark -> (rows, first id, answers)
_EXPECTED = {
    "math500": (4, "test/prealgebra/9001.json",
                ["\\frac{1}{2}", "6", "2, 3", "3\\sqrt{2}"]),
    "aime24": (3, "2024-X-1", ["14", "24", "208"]),
    "amc23": (3, "0", ["50", "720", "32"]),
    "minerva_math": (3, "0", ["60", "\\frac{1}{4}", "0.001"]),
    "olympiadbench": (3, "3001", ["15", "\\frac{1}{4}", "-3, 3"]),
}

# Correct answers written the way a model might, in a different but equal form.
_EQUIVALENT_FORMS = {
    "math500": ["0.5", "6", "3,2", "\\sqrt{18}"],
    "aime24": ["014", "24", "208"],
    "amc23": ["50", "720.0", "2^5"],
    "minerva_math": ["60 \\text{ km/h}", "0.25", "10^{-3}"],
    "olympiadbench": ["15", "\\dfrac{1}{4}", "3, -3"],
}


@pytest.mark.parametrize("name", ev.BENCHMARKS)
def test_load_fixture(name):
  rows, first_id, answers = _EXPECTED[name]
  problems = ev.load_benchmark(name, FIXTURES / f"{name}.jsonl")
  assert len(problems) == rows
  assert problems[0].id == first_id
  assert [p.answer for p in problems] == answers
  for p in problems:
    assert p.benchmark == name and p.question
    assert isinstance(p, tasks.ProblemLike)
    assert p.prompt.startswith(p.question) and "\\boxed{}" in p.prompt


def test_schema_columns_are_kept_as_metadata():
  math500 = ev.load_benchmark("MATH-500", FIXTURES / "math500.jsonl")
  assert math500[0].metadata["level"] == 1
  assert math500[0].metadata["subject"] == "Prealgebra"
  assert "\\boxed" in math500[0].metadata["solution"]
  olympiad = ev.load_benchmark("OlympiadBench", FIXTURES / "olympiadbench.jsonl")
  assert olympiad[2].metadata["is_multiple_answer"] is True
  assert "final_answer" not in olympiad[2].metadata


@pytest.mark.parametrize("alias, key", [
    ("MATH-500", "math500"), ("AIME24", "aime24"), ("amc_23", "amc23"),
    ("Minerva Math", "minerva_math"), ("minervamath", "minerva_math"),
    ("olympiad_bench", "olympiadbench")])
def test_canonical_name(alias, key):
  assert ev.canonical_name(alias) == key


def test_errors_name_the_problem(tmp_path):
  with pytest.raises(ValueError, match="gsm8k"):
    ev.load_benchmark("gsm8k", FIXTURES / "math500.jsonl")
  missing = tmp_path / "nope.jsonl"
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    ev.load_benchmark("math500", missing)
  with pytest.raises(FileNotFoundError, match="directory"):
    ev.load_benchmark("math500", tmp_path)
  bad = tmp_path / "aime.jsonl"
  bad.write_text(json.dumps({"ID": "1", "Problem": "p", "answer": 3}) + "\n")
  with pytest.raises(ValueError, match="'Answer'") as err:
    ev.load_benchmark("aime24", bad)
  assert "aime.jsonl" in str(err.value) and "row 0" in str(err.value)
  broken = tmp_path / "broken.jsonl"
  broken.write_text('{"question": "q", "answer": "1"}\n{oops\n')
  with pytest.raises(ValueError, match="broken.jsonl:2"):
    ev.load_benchmark("minerva_math", broken)
  with pytest.raises(ValueError, match=".csv"):
    ev.load_benchmark("minerva_math", _touch(tmp_path / "x.csv"))


def test_json_array_file(tmp_path):
  rows = [json.loads(l) for l in (FIXTURES / "amc23.jsonl").read_text().split(
      "\n") if l.strip()]
  path = tmp_path / "amc23.json"
  path.write_text(json.dumps(rows))
  assert ev.load_benchmark("amc23", path) == ev.load_benchmark(
      "amc23", FIXTURES / "amc23.jsonl")


def test_parquet_matches_jsonl(tmp_path):
  pa = pytest.importorskip(
      "pyarrow", reason="pyarrow is not installed; parquet loading untested.")
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  for name in ev.BENCHMARKS:
    jsonl = FIXTURES / f"{name}.jsonl"
    rows = [json.loads(l) for l in jsonl.read_text().splitlines() if l.strip()]
    path = tmp_path / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert ev.load_benchmark(name, path) == ev.load_benchmark(name, jsonl)


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path, monkeypatch):
  # pyarrow is a dependency; a None entry in sys.modules makes importing it
  # raise ImportError, as on a machine without it.
  monkeypatch.setitem(sys.modules, "pyarrow", None)
  monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
  with pytest.raises(ImportError, match="needs pyarrow"):
    ev.load_benchmark("aime24", _touch(tmp_path / "aime.parquet"))


@pytest.mark.parametrize("text, expected", [
    ("so the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{3} no wait \\boxed{\\frac{a}{b^{2}}}", "\\frac{a}{b^{2}}"),
    ("\\boxed{ {1,2} }", "{1,2}"),
    ("\\fbox{7}", "7"),
    ("$\\boxed 5$", "5"),
    ("\\boxed{1} then \\boxed{2", "1"),   # An unclosed last box is skipped.
    ("the answer is 5", None),
    ("\\boxedx{3}", None),
    ("\\boxed{", None),
])
def test_extract_boxed(text, expected):
  assert ev.extract_boxed(text) == expected


@pytest.mark.parametrize("predicted, gold, expected", [
    ("\\frac{1}{2}", "0.5", True),
    ("0.5", "\\frac{1}{2}", True),
    ("\\dfrac12", "$\\frac{1}{2}$", True),
    ("\\left(1, 2\\right)", "(1,2)", True),
    ("x^2+1", "1+x^2", True),
    ("3", "4", False),
    ("\\frac{1}{3}", "0.33", False),
    ("", "4", False),
])
def test_is_equivalent(predicted, gold, expected):
  assert ev.is_equivalent(predicted, gold) is expected


def test_string_fallback_when_math_verify_cannot_parse(monkeypatch):
  import math_verify  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(math_verify, "parse", lambda *a, **k: [])
  assert ev.is_equivalent("\\dfrac{1}{2}", "$\\frac{1}{2}$")
  assert ev.is_equivalent("0.50", ".5")
  assert ev.is_equivalent("\\text{Monday}", "monday")
  assert ev.is_equivalent("x = 5", "5")
  assert not ev.is_equivalent("\\frac{1}{2}", "0.5")  # Needs math-verify.
  assert not ev.is_equivalent("6", "7")


@pytest.mark.parametrize("name", ev.BENCHMARKS)
def test_grade_fixture_completions(name):
  problems = ev.load_benchmark(name, FIXTURES / f"{name}.jsonl")
  right = [f"Working... so the answer is $\\boxed{{{form}}}$."
           for form in _EQUIVALENT_FORMS[name]]
  wrong = ["Hmm, \\boxed{1000001}."] * len(problems)
  no_box = [f"The answer is {p.answer}." for p in problems]
  late_fix = [f"\\boxed{{999}} wait, no: \\boxed{{{p.answer}}}"
              for p in problems]
  for completions, expected in [(right, 1.0), (wrong, 0.0), (no_box, 0.0),
                                (late_fix, 1.0)]:
    rewards = ev.boxed_reward(problems, completions)
    assert rewards.dtype == np.float32
    np.testing.assert_array_equal(rewards, [expected] * len(problems))
  assert isinstance(ev.boxed_reward, tasks.RewardFn)


def test_pass_at_1():
  correct = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=bool)
  assert ev.pass_at_1(correct) == pytest.approx((0.5 + 1.0 + 0.0) / 3)
  assert ev.pass_at_1([[1.0], [0.0]]) == 0.5
  with pytest.raises(ValueError, match="num_problems, k"):
    ev.pass_at_1(np.ones(4))
  with pytest.raises(ValueError, match="num_problems, k"):
    ev.pass_at_1(np.ones((0, 4)))


def test_pass_at_1_standard_error_is_over_problems():
  correct = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=bool)
  # Per-problem means 0.5, 1, 0: sample sd 0.5, over sqrt(3) problems.
  assert ev.pass_at_1_se(correct) == pytest.approx(0.5 / np.sqrt(3))
  assert ev.pass_at_1_se([[1.0, 0.0]]) == 0.0  # one problem: no spread
  assert ev.pass_at_1_se(np.ones((5, 3))) == 0.0
  with pytest.raises(ValueError, match="num_problems, k"):
    ev.pass_at_1_se(np.ones(4))


def _touch(path: pathlib.Path) -> pathlib.Path:
  path.write_text("")
  return path
