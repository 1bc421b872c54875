"""Several real JAX processes on localhost, for fault tests: start, watch, signal.

`Job(argv_of, n)` starts `argv_of(process_id, port)` for every process id,
reads every process's output in the background, and lets a test wait for a
line (`wait_for`), send a signal to one process (`signal`) and wait for all of
them to end (`wait`). No part of JAX's distributed runtime is replaced: the
processes find each other through a coordinator on a free local port.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import signal as signal_lib
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence


def read_results(workdir: str, nproc: int, arrays: str, key: str) -> list[dict]:
  """Each process's `result_<pid>.json`, with the arrays of its
  `<arrays>_<pid>.npz` under `key` (what the test targets write at their end)."""
  import json  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  out = []
  for pid in range(nproc):
    with open(os.path.join(workdir, f"result_{pid}.json")) as f:
      res = json.load(f)
    with np.load(os.path.join(workdir, f"{arrays}_{pid}.npz")) as z:
      res[key] = {k: z[k] for k in z.files}
    out.append(res)
  return out


def free_port() -> int:
  """A TCP port free on 127.0.0.1 now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@dataclasses.dataclass
class Ended:
  """How one process ended.

  Attributes:
    returncode: its exit status (negative: killed by that signal).
    at: `time.monotonic()` when it was seen ended.
    output: everything it printed (stdout and stderr).
  """
  returncode: int
  at: float
  output: str


class Job:
  """`n` processes of one JAX job.

  Args:
    argv_of: `(process_id, port) -> argv` of each process.
    n: number of processes.
    env: extra environment variables.
  """

  def __init__(self, argv_of: Callable[[int, int], Sequence[str]], n: int,
               env: dict[str, str] | None = None):
    port = free_port()
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    self._lines: queue.Queue[tuple[int, str]] = queue.Queue()
    self._logs: list[list[str]] = [[] for _ in range(n)]
    self.procs = [subprocess.Popen(list(argv_of(p, port)), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, env=full_env, text=True,
                                   bufsize=1) for p in range(n)]
    self._readers = [threading.Thread(target=self._read, args=(p,), daemon=True)
                     for p in range(n)]
    for t in self._readers:
      t.start()

  def _read(self, p: int) -> None:
    for line in self.procs[p].stdout:
      self._logs[p].append(line)
      self._lines.put((p, line))

  def output(self, p: int) -> str:
    return "".join(self._logs[p])

  def wait_for(self, predicate: Callable[[int, str], bool], timeout_s: float) -> str:
    """Blocks until some process prints a line with `predicate(pid, line)`.

    Raises:
      TimeoutError: no such line within `timeout_s` (every output attached).
    """
    deadline = time.monotonic() + timeout_s
    while True:
      left = deadline - time.monotonic()
      if left <= 0:
        raise TimeoutError(f"no matching line in {timeout_s} s:\n{self.describe()}")
      try:
        p, line = self._lines.get(timeout=min(left, 1.0))
      except queue.Empty:
        continue
      if predicate(p, line):
        return line

  def signal(self, p: int, sig: int = signal_lib.SIGKILL) -> float:
    """Sends `sig` to process `p`; returns when (`time.monotonic()`)."""
    self.procs[p].send_signal(sig)
    return time.monotonic()

  def wait(self, timeout_s: float) -> list[Ended]:
    """Waits for every process to end; kills what is left at `timeout_s`.

    Returns:
      How each process ended; one still running at the deadline is killed
      and reported with the returncode `None`.
    """
    deadline = time.monotonic() + timeout_s
    ended: dict[int, Ended] = {}
    while len(ended) < len(self.procs):
      for p, proc in enumerate(self.procs):
        if p not in ended and proc.poll() is not None:
          ended[p] = Ended(proc.returncode, time.monotonic(), "")
      if time.monotonic() > deadline:
        for p, proc in enumerate(self.procs):
          if p not in ended:
            proc.kill()
            proc.wait()
            ended[p] = Ended(None, time.monotonic(), "")
        break
      time.sleep(0.05)
    for t in self._readers:
      t.join(timeout=10)
    for p, e in ended.items():
      e.output = self.output(p)
    return [ended[p] for p in range(len(self.procs))]

  def describe(self) -> str:
    return "\n".join(f"--- process {p} ---\n{self.output(p)[-3000:]}"
                     for p in range(len(self.procs)))
