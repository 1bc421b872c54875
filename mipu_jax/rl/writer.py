"""Metric sinks: JSONL (always) and TensorBoard (tensorboardX)."""

import json
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


def read_jsonl(path: str) -> list[dict[str, float]]:
  """The rows of a `metrics.jsonl` (non-finite values as floats again)."""
  rows = []
  with open(path) as f:
    for line in f:
      row = json.loads(line)
      rows.append({k: float(v) for k, v in row.items()})
  return rows
