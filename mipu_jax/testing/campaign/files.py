"""Prompt-data and evaluation-set cases: damaged JSONL, JSON and parquet files.

A valid file (training prompts in the DAPO or MATH schema, or one of the five
benchmark files) is damaged one way — cut at an offset, bytes that are not
UTF-8, another schema, a missing, empty or mistyped column, a stray line,
prompts longer than the budget, no rows, no bytes, a directory or nothing in
its place, another extension — and a math run of the tiny checkpoint is
pointed at it. The real readers (`json`, pyarrow) read it inside
`rl.preflight.check`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from typing import Any

from hypothesis import strategies as st

from mipu_jax import config as config_lib
from mipu_jax.rl import preflight
from mipu_jax.testing.campaign import core
from mipu_jax.testing.campaign import world as world_lib
from mipu_jax.testing.campaign.world import World

PROMPT_KIND = "prompt data"
EVAL_KIND = "evaluation sets"

# Damages to the bytes of a file, and to its rows before writing.
BYTE_DAMAGE = ("truncated", "non-UTF-8 bytes", "flipped bytes", "empty file")
ROW_DAMAGE = ("wrong schema", "missing column", "empty column", "mistyped column",
              "stray line", "over-long prompts", "no rows")
PATH_DAMAGE = ("directory", "missing", "another extension")

_LONG = " ".join(["a very long problem statement"] * 60)


def _columns(rows: list[dict[str, Any]], kind: str) -> tuple[str, str]:
  """The (prompt, answer) columns of `rows`."""
  row = rows[0]
  if kind == PROMPT_KIND:
    return ("prompt", "reward_model") if "prompt" in row else ("problem", "answer")
  question = next(k for k in ("problem", "Problem", "question") if k in row)
  answer = next(k for k in ("answer", "Answer", "final_answer") if k in row)
  return question, answer


def _damage_rows(draw, rows, kind, damage) -> tuple[list[Any], bool, str]:
  """(rows, must_refuse, detail)."""
  prompt, answer = _columns(rows, kind)
  which = draw(st.sampled_from(["all rows", "one row"]))
  picks = range(len(rows)) if which == "all rows" else [draw(st.integers(0, len(rows) - 1))]
  rows = json.loads(json.dumps(rows))
  col = draw(st.sampled_from([prompt, answer]))
  if damage == "wrong schema":
    renamed = {prompt: draw(st.sampled_from(["text", "query", "Question", "input"])),
               answer: draw(st.sampled_from(["solution_text", "label", "gold"]))}
    rows = [{renamed.get(k, k): v for k, v in r.items()} for r in rows]
    return rows, True, "columns renamed"
  if damage == "missing column":
    for i in picks:
      rows[i].pop(col)
    if col == "answer" and "solution" in rows[0]:
      for i in picks:   # MATH-style rows fall back to the boxed answer of `solution`
        rows[i].pop("solution", None)
    return rows, True, f"{col} missing in {which}"
  if damage == "empty column":
    empty = draw(st.sampled_from(["", "   ", None, [], {}]))
    for i in picks:
      if col == "reward_model":
        rows[i][col] = {"ground_truth": empty}
      else:
        rows[i][col] = empty
    # A MATH-style row without an answer takes the boxed answer of its solution.
    fallback = col == "answer" and empty is None and "solution" in rows[0]
    return rows, not fallback, f"{col} = {empty!r} in {which}"
  if damage == "mistyped column":
    bad = draw(st.sampled_from([3, 2.5, True, ["x", "y"], {"k": "v"}, math.nan]))
    for i in picks:
      rows[i][col] = bad
    # A number in a text column is taken as its text; a prompt must be text (or
    # messages); an answer must be a finite number or text.
    refuse = (col in ("prompt", "problem", "Problem", "question") or isinstance(bad, dict)
              or (isinstance(bad, float) and math.isnan(bad)))
    return rows, refuse, f"{col} = {bad!r} in {which}"
  if damage == "over-long prompts":
    for i in picks:
      if col == "prompt" or prompt == "prompt":
        rows[i]["prompt"] = [{"role": "user", "content": _LONG}]
      else:
        rows[i][prompt] = _LONG
    return rows, which == "all rows", f"prompts over the budget in {which}"
  if damage == "no rows":
    return [], True, "no rows"
  return rows, True, "stray line"


@st.composite
def _file_case(draw, world: World, kind: str) -> core.Case:
  n = draw(st.integers(0, 2**31))
  tmp = world.tmp(f"file{n}")
  fmt = draw(st.sampled_from(world_lib.FORMATS))
  if kind == PROMPT_KIND:
    schema = draw(st.sampled_from(["math", "dapo"]))
    rows = world_lib.math_rows() if schema == "math" else world_lib.dapo_rows()
    name, what = f"train.{fmt}", f"{schema} schema"
  else:
    bench = draw(st.sampled_from(world_lib.BENCHMARKS))
    rows = world_lib.benchmark_rows(bench)
    name, what = f"{bench}.{fmt}", bench
  damage = draw(st.sampled_from(BYTE_DAMAGE + ROW_DAMAGE + PATH_DAMAGE))
  path = os.path.join(tmp, name)
  refuse, detail = True, damage
  if damage in ROW_DAMAGE:
    rows, refuse, detail = _damage_rows(draw, rows, kind, damage)
    if damage == "stray line":
      if fmt == "jsonl":
        world_lib.write_rows(path, rows, fmt)
        lines = open(path, encoding="utf-8").read().splitlines(True)
        at = draw(st.integers(0, len(lines)))
        stray = draw(st.sampled_from(["oops\n", "[1, 2]\n", "{\"a\": \n", "3\n", "null\n"]))
        lines.insert(at, stray)
        with open(path, "w", encoding="utf-8") as f:
          f.writelines(lines)
        detail = f"stray line {stray.strip()!r} at line {at + 1}"
      else:
        rows.insert(draw(st.integers(0, len(rows))), draw(st.sampled_from([3, "x", [1]])))
        if fmt == "parquet":   # a parquet file has no stray rows: a null row instead
          rows = [r if isinstance(r, dict) else {} for r in rows]
        world_lib.write_rows(path, rows, fmt)
    elif fmt == "parquet" and damage in ("mistyped column", "empty column"):
      try:
        world_lib.write_rows(path, rows, fmt)
      except Exception:  # pylint: disable=broad-except
        # pyarrow will not mix types in a column: the damage goes in as text.
        rows = [{k: (json.dumps(v) if k in r and not isinstance(v, str) else v)
                 for k, v in r.items()} for r in rows]
        world_lib.write_rows(path, rows, fmt)
        refuse = False
        detail += " (stored as JSON text)"
    else:
      world_lib.write_rows(path, rows, fmt)
  elif damage in BYTE_DAMAGE:
    world_lib.write_rows(path, rows, fmt)
    data = open(path, "rb").read()
    if damage == "truncated":
      at = draw(st.integers(0, len(data) - 1))
      detail = f"truncated at byte {at} of {len(data)}"
      data = data[:at]
      # A JSONL cut at a line end (or after a whole last object) is a shorter valid file.
      refuse = fmt != "jsonl" or at == 0 or not _whole_lines(data)
    elif damage == "non-UTF-8 bytes":
      at = draw(st.integers(0, len(data)))
      data = data[:at] + b"\xff\xfe\xc3" + data[at:]
      refuse = fmt != "parquet"
      detail = f"bytes ff fe c3 inserted at {at}"
    elif damage == "flipped bytes":
      at = draw(st.integers(0, len(data) - 1))
      data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]
      refuse = False   # a flip inside a string can leave a valid file
      detail = f"byte {at} flipped"
    else:
      data = b""
    with open(path, "wb") as f:
      f.write(data)
  elif damage == "directory":
    os.makedirs(path)
  elif damage == "another extension":
    path = os.path.join(tmp, name.rsplit(".", 1)[0] + draw(st.sampled_from([".csv", ".txt", ""])))
    world_lib.write_rows(path, rows, "jsonl")
    detail = f"named {os.path.basename(path)}"
  names = [path, os.path.basename(path)]
  if kind == PROMPT_KIND:
    cd = world.math_config(train_file=path)
    names.append("train_file")
  else:
    for other in world_lib.BENCHMARKS:
      if other != bench:
        for fn in os.listdir(world.benchmarks):
          if fn.startswith(other + "."):
            shutil.copy(os.path.join(world.benchmarks, fn), tmp)
    cd = world.math_config(benchmark_dir=tmp)
    names.append(bench)
    if damage in ("another extension", "missing"):
      refuse = False   # the benchmark is not there: skipped, with a warning
  if damage == "over-long prompts" and detail.endswith("all rows") and kind == EVAL_KIND:
    refuse = True
  workdir = os.path.join(tmp, "workdir")

  def run():
    preflight.check(config_lib.from_config_dict(cd), workdir)
  return core.Case(kind, f"{what} {fmt}: {detail}", run, names, must_refuse=refuse)


def _whole_lines(data: bytes) -> bool:
  last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
  try:
    return isinstance(json.loads(last), dict)
  except ValueError:
    return False


def prompt_cases(world: World):
  return _file_case(world, PROMPT_KIND)


def eval_cases(world: World):
  return _file_case(world, EVAL_KIND)
