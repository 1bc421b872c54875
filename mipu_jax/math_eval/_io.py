"""Reading benchmark rows from local JSONL, JSON or parquet files (the only pyarrow use)."""

from __future__ import annotations

import json
import os
from typing import Any


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
  """Rows of a `.jsonl`, `.json` (array of objects) or `.parquet` file.

  Raises:
    FileNotFoundError: `path` does not exist or is a directory.
    ImportError: a parquet file without `pyarrow` installed.
    ValueError: an unknown extension, an empty file, bytes that are not UTF-8,
      or a line or file that is not JSON objects (or not parquet), named with
      the file (docs/reliability.md, "Bad inputs").
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    what = "a directory, not a file" if os.path.isdir(path) else "missing"
    raise FileNotFoundError(f"Benchmark file {path!r} is {what}.")
  ext = os.path.splitext(path)[1].lower()
  if ext not in (".jsonl", ".json", ".parquet"):
    raise ValueError(
        f"Cannot read {path!r}: expected a .jsonl, .json or .parquet file.")
  try:
    if ext == ".jsonl":
      return _read_jsonl(path)
    if ext == ".json":
      return _read_json(path)
    return _read_parquet(path)
  except UnicodeDecodeError as e:
    raise ValueError(f"{path!r} is not UTF-8 text (byte {e.start}: {e.reason}).") from e


def _check_size(path: str) -> None:
  if os.path.getsize(path) == 0:
    raise ValueError(f"{path!r} is empty (0 bytes).")


def _read_json(path: str) -> list[dict[str, Any]]:
  _check_size(path)
  with open(path, encoding="utf-8") as f:
    try:
      data = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path!r} is not valid JSON ({e}).") from e
  if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
    raise ValueError(f"{path!r} should hold a JSON array of objects.")
  return data


def _read_jsonl(path: str) -> list[dict[str, Any]]:
  _check_size(path)
  rows = []
  with open(path, encoding="utf-8") as f:
    for line_no, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{line_no}: not valid JSON ({e}).") from e
      if not isinstance(row, dict):
        raise ValueError(f"{path}:{line_no}: expected a JSON object.")
      rows.append(row)
  return rows


def _read_parquet(path: str) -> list[dict[str, Any]]:
  try:
    import pyarrow  # pylint: disable=g-import-not-at-top
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        f"Reading {path!r} needs pyarrow (pip install pyarrow), or convert the "
        "file to JSONL.") from e
  _check_size(path)
  try:
    return pq.read_table(path).to_pylist()
  except (pyarrow.ArrowException, OSError) as e:
    # A damaged file surfaces as ArrowInvalid, ArrowIOError or a plain OSError
    # (a thrift or page error) from pyarrow's C++.
    raise ValueError(f"{path!r} is not a readable parquet file "
                     f"({type(e).__name__}: {e}).") from e
