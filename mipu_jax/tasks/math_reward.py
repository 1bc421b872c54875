"""The math task's reward: the final answer checked by math-verify, in a pool of
worker processes with a per-item time limit.

`RewardPool.grade(completions, golds)` sends each pair to an idle worker
(`_reward_worker`, one process each, running `mipu_jax.math_eval.grading.grade`:
the last `\\boxed{}` answer, math-verify equivalence, string fallback). An
item that takes longer than `timeout_s` has its worker killed and replaced and
scores as wrong; a grading error or a crashed worker scores as wrong too. Both
are counted (`timeouts`, `errors`), so a pathological answer can neither hang
nor crash the training loop.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np

DEFAULT_GRADE = "mipu_jax.math_eval.grading:grade"


class _Worker:

  def __init__(self, grade: str):
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "mipu_jax.tasks._reward_worker", grade],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, bufsize=1, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    self.item: int | None = None
    self.started = 0.0
    self.ready = False

  def send(self, item: int, completion: str, gold: str) -> None:
    self.item, self.started = item, time.monotonic()
    self.proc.stdin.write(json.dumps({"completion": completion, "gold": gold}) + "\n")
    self.proc.stdin.flush()

  def kill(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait()
    for f in (self.proc.stdin, self.proc.stdout):
      try:
        f.close()
      except OSError:
        pass


class RewardPool:
  """Worker processes that grade completions against gold answers.

  Args:
    num_workers: processes (each grades one item at a time).
    timeout_s: per-item limit, counted from when a worker receives the item
      (the grader's first, slow call is made at start-up, `_reward_worker`).
    grade: `"module:function"` of the grader, `(completion, gold) -> bool`.
    startup_timeout_s: how long a worker may take to start: to import the
      grader and make its first call.
  """

  def __init__(self, num_workers: int = 2, timeout_s: float = 5.0,
               grade: str = DEFAULT_GRADE, startup_timeout_s: float = 60.0):
    if num_workers < 1 or not timeout_s > 0:
      raise ValueError(f"need num_workers >= 1 and timeout_s > 0, got "
                       f"{num_workers}, {timeout_s}.")
    self.num_workers, self.timeout_s, self.grade_spec = num_workers, timeout_s, grade
    self.startup_timeout_s = startup_timeout_s
    self.timeouts = 0
    self.errors = 0
    self._workers: list[_Worker] = []

  def _start(self) -> _Worker:
    worker = _Worker(self.grade_spec)
    ready, _, _ = select.select([worker.proc.stdout], [], [], self.startup_timeout_s)
    line = worker.proc.stdout.readline() if ready else ""
    if not line or not json.loads(line).get("ready"):
      worker.kill()
      raise RuntimeError(f"a reward worker for {self.grade_spec!r} did not start (import "
                         f"the grader and grade one sample pair) within "
                         f"{self.startup_timeout_s} s.")
    return worker

  def grade(self, completions: Sequence[str], golds: Sequence[str]) -> np.ndarray:
    """Whether each completion's final answer equals its gold answer.

    Returns:
      bool `[len(completions)]`; timeouts and errors are False (and counted).
    """
    if len(completions) != len(golds):
      raise ValueError(f"{len(completions)} completions but {len(golds)} answers.")
    while len(self._workers) < self.num_workers:
      self._workers.append(self._start())
    correct = np.zeros(len(completions), bool)
    pending = list(range(len(completions)))[::-1]
    busy: list[_Worker] = []
    idle = list(self._workers)
    while pending or busy:
      while pending and idle:
        w = idle.pop()
        i = pending.pop()
        w.send(i, completions[i], str(golds[i]))
        busy.append(w)
      now = time.monotonic()
      wait = max(min(w.started + self.timeout_s for w in busy) - now, 0.0)
      ready, _, _ = select.select([w.proc.stdout for w in busy], [], [], wait)
      now = time.monotonic()
      for w in list(busy):
        if w.proc.stdout in ready:
          line = w.proc.stdout.readline()
          if line:
            reply = json.loads(line)
            correct[w.item] = bool(reply.get("correct", False))
            self.errors += "error" in reply
            busy.remove(w)
            idle.append(w)
            continue
          self.errors += 1  # the worker died
        elif now - w.started < self.timeout_s:
          continue
        else:
          self.timeouts += 1
        busy.remove(w)
        w.kill()
        replacement = self._start()
        self._workers[self._workers.index(w)] = replacement
        idle.append(replacement)
    return correct

  def close(self) -> None:
    for w in self._workers:
      w.kill()
    self._workers = []

  def __del__(self):
    try:
      self.close()
    except Exception:  # noqa: BLE001 - interpreter shutdown
      pass
