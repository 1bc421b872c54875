"""Metric sinks: JSONL (always), TensorBoard (tensorboardX) and W&B, by config.

`metrics.jsonl` is the run's record: every row is written and flushed there
first, and a failure to write it is an error (a full disk, docs/reliability.md).
The other backends (`logging.backends`) are views of it: one that cannot start
is an error at start, before any step runs; one that fails later is a warning
(the first failure, then every `_WARN_EVERY`-th) and the run goes on.

On resume, the loop replays the kept rows (`replay=True`): JSONL rewrites them,
TensorBoard skips them (its writer purges the events past the checkpoint
from view, tensorboardX's `purge_step`), W&B logs those it does not hold
(`mipu_jax.rl.wandb_run`).
"""

import gzip
import json
import logging
import math
import os
import shutil
from typing import Any, Mapping, Optional, Sequence

_log = logging.getLogger(__name__)
_WARN_EVERY = 100


class BackendStartError(RuntimeError):
  """A metric backend named in `logging.backends` could not start."""


class _TensorBoard:

  def __init__(self, workdir: str, start_step: int):
    # Imported here: tensorboardX imports torch (seconds), which a run that
    # does not log to TensorBoard never needs.
    import tensorboardX  # pylint: disable=g-import-not-at-top
    # Events of steps past the checkpoint (logged before a kill) are hidden.
    self._tb = tensorboardX.SummaryWriter(os.path.join(workdir, "tensorboard"),
                                          purge_step=start_step + 1 if start_step else None)

  def write(self, step: int, metrics: Mapping[str, float], replay: bool) -> None:
    if replay:
      return  # already in the event files before the resume
    for name, value in metrics.items():
      self._tb.add_scalar(name, value, step)

  def close(self) -> None:
    self._tb.close()


class _Wandb:

  def __init__(self, workdir: str, wandb_cfg: Any, run_config: Optional[Mapping[str, Any]]):
    from mipu_jax.rl import wandb_run  # pylint: disable=g-import-not-at-top
    self._sink = wandb_run.WandbSink(workdir, wandb_cfg, run_config)

  def write(self, step: int, metrics: Mapping[str, float], replay: bool) -> None:
    del replay  # W&B skips the steps it holds itself
    self._sink.write(step, metrics)

  def close(self) -> None:
    self._sink.close()


_HINTS = {
    "tensorboard": "tensorboardX is a core dependency: reinstall mipu_jax",
    "wandb": 'install it with pip install "mipu_jax[wandb]", log in (wandb login) '
             "or set WANDB_MODE=offline",
}


def check_backends(backends: Sequence[str]) -> None:
  """Raises `BackendStartError` now if a backend's package is missing, before a
  long model load; the backends start for real in `MetricWriter`."""
  if "wandb" in backends:
    try:
      import wandb  # pylint: disable=g-import-not-at-top,unused-import
    except ImportError as e:
      raise BackendStartError(
          f"logging backend 'wandb' could not start: {e}. {_HINTS['wandb']}; or leave "
          f"it out of logging.backends (now {','.join(backends)}).") from e


class MetricWriter:
  """Writes `{name: float}` per step to `metrics.jsonl` and the configured backends.

  Args:
    workdir: run directory; `workdir/metrics.jsonl`, `workdir/tensorboard/`,
      `workdir/wandb/`.
    backends: names from `mipu_jax.config.LOGGING_BACKENDS`; JSONL is always on.
    wandb_cfg: `mipu_jax.config.WandbConfig`, for "wandb".
    run_config: the run's config as JSON, recorded by W&B.
    start_step: the step the run resumes after (0: a fresh run).

  Raises:
    BackendStartError: a backend could not start (the message says which and
      how to fix it or leave it out).
  """

  def __init__(self, workdir: str, *, backends: Sequence[str] = ("jsonl", "tensorboard"),
               wandb_cfg: Any = None, run_config: Optional[Mapping[str, Any]] = None,
               start_step: int = 0):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._sinks, self._failures = {}, {}
    try:
      for name in backends:
        try:
          if name == "tensorboard":
            self._sinks[name] = _TensorBoard(workdir, start_step)
          elif name == "wandb":
            self._sinks[name] = _Wandb(workdir, wandb_cfg, run_config)
          elif name != "jsonl":
            raise ValueError(f"unknown backend {name!r}")
        except Exception as e:  # pylint: disable=broad-except
          raise BackendStartError(
              f"logging backend {name!r} could not start: {type(e).__name__}: {e}. "
              f"{_HINTS.get(name, '')}; or leave it out of logging.backends "
              f"(now {','.join(backends)}). metrics.jsonl is always written.") from e
    except BackendStartError:
      self._close_sinks()
      raise
    self._jsonl = None  # opened at the first row (a resume moves the old file first)

  @property
  def backends(self) -> tuple[str, ...]:
    return ("jsonl", *self._sinks)

  def write(self, step: int, metrics: Mapping[str, float], *, replay: bool = False) -> None:
    """Writes one row: JSONL first (errors raise), then every backend (errors warn).

    Args:
      step: the RL step.
      metrics: its metrics.
      replay: a row of the log kept on resume, not a new step.
    """
    row, values = {"step": int(step)}, {}
    for name, value in sorted(metrics.items()):
      value = float(value)
      values[name] = value
      row[name] = value if math.isfinite(value) else str(value)
    if self._jsonl is None:
      self._jsonl = open(self.path, "a")
    self._jsonl.write(json.dumps(row) + "\n")
    self._jsonl.flush()
    for name, sink in self._sinks.items():
      try:
        sink.write(int(step), values, replay)
      except Exception as e:  # pylint: disable=broad-except
        self._failed(name, step, e)

  def _failed(self, name: str, step: int, e: Exception) -> None:
    n = self._failures[name] = self._failures.get(name, 0) + 1
    if n == 1 or n % _WARN_EVERY == 0:
      _log.warning("Step %d: logging backend %r failed (%s: %s; %d failure(s) so "
                   "far); training goes on, metrics.jsonl has the row.",
                   step, name, type(e).__name__, e, n)

  @property
  def failures(self) -> dict[str, int]:
    """Failed writes per backend."""
    return dict(self._failures)

  def _close_sinks(self) -> None:
    for name, sink in self._sinks.items():
      try:
        sink.close()
      except Exception as e:  # pylint: disable=broad-except
        _log.warning("Logging backend %r failed to close: %s: %s", name,
                     type(e).__name__, e)

  def close(self) -> None:
    try:
      if self._jsonl is not None:
        self._jsonl.close()
    finally:
      self._close_sinks()


class NullWriter:
  """The writer of a process that does not write (every process but the main one)."""

  def write(self, step: int, metrics: Mapping[str, float], *, replay: bool = False) -> None:
    del step, metrics, replay

  def close(self) -> None:
    pass


GZ = ".gz"


def compress_jsonl(path: str) -> str:
  """Replaces a finished run's `path` by `path.gz` (the committed results are
  kept so: `read_jsonl` reads either); returns the new path. The gzip header
  holds no time or name, so the same rows give the same bytes."""
  with open(path, "rb") as src, open(path + GZ, "wb") as raw:
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as dst:
      shutil.copyfileobj(src, dst)
  os.remove(path)
  return path + GZ


def decompress_jsonl(path: str) -> bool:
  """Brings back `path` from `path.gz` if only the compressed file exists (a
  committed run resumed or extended); whether it did."""
  if os.path.exists(path) or not os.path.exists(path + GZ):
    return False
  with gzip.open(path + GZ, "rb") as src, open(path, "wb") as dst:
    shutil.copyfileobj(src, dst)
  os.remove(path + GZ)
  return True


def jsonl_exists(path: str) -> bool:
  """Whether `path` or its compressed `path.gz` exists."""
  return os.path.exists(path) or os.path.exists(path + GZ)


def read_jsonl(path: str, *, repair: bool = False) -> list[dict[str, float]]:
  """The rows of a `metrics.jsonl` (non-finite values as floats again).

  Reads `path`, or `path.gz` when only that exists (`compress_jsonl`).

  Args:
    path: the file.
    repair: drop a last line that a kill cut short (not valid JSON, or no
      newline at its end), with a warning, instead of raising.

  Raises:
    ValueError: a line that is not a JSON row (the last one too, unless
      `repair`), naming the file and the line.
  """
  rows = []
  if not os.path.exists(path) and os.path.exists(path + GZ):
    with gzip.open(path + GZ, "rt") as f:
      lines = f.read().split("\n")
  else:
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
