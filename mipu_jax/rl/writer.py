"""Metric sinks: JSONL (always) and TensorBoard (tensorboardX)."""

import json
import logging
import math
import os
from typing import Mapping

import tensorboardX


class MetricWriter:
  """Writes `{name: float}` per step to `metrics.jsonl` and TensorBoard.

  Args:
    workdir: run directory; files go to `workdir/metrics.jsonl` and
      `workdir/tensorboard/`.
    tensorboard: also write TensorBoard event files.
  """

  def __init__(self, workdir: str, *, tensorboard: bool = True):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._jsonl = open(self.path, "a")
    self._tb = (tensorboardX.SummaryWriter(os.path.join(workdir, "tensorboard"))
                if tensorboard else None)

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    row = {"step": int(step)}
    for name, value in sorted(metrics.items()):
      value = float(value)
      row[name] = value if math.isfinite(value) else str(value)
      if self._tb is not None:
        self._tb.add_scalar(name, value, int(step))
    self._jsonl.write(json.dumps(row) + "\n")
    self._jsonl.flush()

  def close(self) -> None:
    self._jsonl.close()
    if self._tb is not None:
      self._tb.close()


class NullWriter:
  """The writer of a process that does not write (every process but the main one)."""

  def write(self, step: int, metrics: Mapping[str, float]) -> None:
    del step, metrics

  def close(self) -> None:
    pass


def read_jsonl(path: str, *, repair: bool = False) -> list[dict[str, float]]:
  """The rows of a `metrics.jsonl` (non-finite values as floats again).

  Args:
    path: the file.
    repair: drop a last line that a kill cut short (not valid JSON, or no
      newline at its end), with a warning, instead of raising.

  Raises:
    ValueError: a line that is not a JSON row (the last one too, unless
      `repair`), naming the file and the line.
  """
  rows = []
  with open(path) as f:
    lines = f.read().split("\n")
  # A complete file ends with a newline: its last element is "".
  torn = lines.pop() if lines else ""
  for i, line in enumerate(lines, start=1):
    rows.append(_parse_row(line, path, i))
  if torn.strip():
    try:
      row = _parse_row(torn, path, len(lines) + 1)
    except ValueError:
      if not repair:
        raise
      logging.getLogger(__name__).warning(
          "%s: dropped its last line, cut short by an interruption: %r", path, torn[:80])
    else:
      rows.append(row)
  return rows


def _parse_row(line: str, path: str, number: int) -> dict[str, float]:
  try:
    row = json.loads(line)
    return {k: float(v) for k, v in row.items()}
  except (ValueError, TypeError, AttributeError) as e:
    raise ValueError(f"{path}, line {number}: not a metrics row ({e}): {line[:80]!r}") from e
