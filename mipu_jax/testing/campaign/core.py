"""The bad-input campaign's machinery: a case, its run and its verdict.

A case is one input a user could hand a run (a config, a prompt file, a model
directory, a workdir), built on disk, and a function that takes it through
the library's own path up to where the run would take its first step. Its
verdict (docs/reliability.md, "Bad inputs"):

- *accepted*: the path returned; a defect instead when the case must be
  refused (a run that starts on input it should refuse);
- *refused clearly*: one exception of a documented type (`ValueError`,
  `FileNotFoundError`; absl's flag errors on the command line), raised by
  mipu_jax's own code (the innermost frame; an exception class of the
  library or the standard library), before any compile, whose message names
  the field or the file;
- *defect*: anything else, a hang past the case's bound included.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import signal
import threading
import traceback
from typing import Any, Callable, Sequence

import jax

ACCEPTED, REFUSED, DEFECT = "accepted", "refused clearly", "defect"

_PACKAGE = os.sep + "mipu_jax" + os.sep
_TESTING = os.sep + "mipu_jax" + os.sep + "testing" + os.sep


@dataclasses.dataclass
class Case:
  """One generated bad (or good) input.

  Attributes:
    kind: the input kind (a row of the table).
    what: the damage, in a few words (a defect's report).
    run: takes the input to where the run would take its first step.
    names: a clear refusal names one of these (the field, the file).
    must_refuse: accepting it is a defect.
    command_line: absl's flag errors count as documented (they are printed
      as one line by `absl.app`).
  """
  kind: str
  what: str
  run: Callable[[], Any]
  names: Sequence[str]
  must_refuse: bool = False
  command_line: bool = False


@dataclasses.dataclass(frozen=True)
class Outcome:
  kind: str
  what: str
  verdict: str
  detail: str = ""


class _Hang(BaseException):
  """Raised into a case that ran past its bound."""


_compiles = [0]


def _on_event(event: str, *args, **kwargs) -> None:
  del args, kwargs
  if "backend_compile" in event:
    _compiles[0] += 1


jax.monitoring.register_event_duration_secs_listener(_on_event)


def _raised_in_library(e: BaseException) -> bool:
  """The innermost frame is mipu_jax's own (not its test doubles), or absl's."""
  tb = e.__traceback__
  if tb is None:
    return False
  while tb.tb_next is not None:
    tb = tb.tb_next
  fn = tb.tb_frame.f_code.co_filename
  return _PACKAGE in fn and _TESTING not in fn


def _documented(e: BaseException, command_line: bool) -> bool:
  module = type(e).__module__
  if command_line:
    from absl import flags  # pylint: disable=g-import-not-at-top
    if isinstance(e, flags.Error):
      return True
  return (isinstance(e, (ValueError, FileNotFoundError))
          and (module == "builtins" or module.startswith("mipu_jax."))
          and _raised_in_library(e))


def run_case(case: Case, timeout_s: float = 60.0) -> Outcome:
  """Runs `case` and classifies what happened (see the module docstring)."""
  before = _compiles[0]
  alarm = threading.current_thread() is threading.main_thread()
  if alarm:
    def on_alarm(signum, frame):
      del signum, frame
      raise _Hang()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
  try:
    case.run()
  except _Hang:
    return Outcome(case.kind, case.what, DEFECT, f"still running after {timeout_s} s")
  except BaseException as e:  # pylint: disable=broad-except
    if isinstance(e, KeyboardInterrupt):
      raise
    return _judge_error(case, e, _compiles[0] - before)
  else:
    if case.must_refuse:
      return Outcome(case.kind, case.what, DEFECT, "accepted an input it should refuse")
    return Outcome(case.kind, case.what, ACCEPTED)
  finally:
    if alarm:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, previous)


def _judge_error(case: Case, e: BaseException, compiles: int) -> Outcome:
  message = str(e)
  where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
  raised = f"{type(e).__module__}.{type(e).__name__}: {message[:300]}" + (
      f" (raised at {where.filename}:{where.lineno})" if where else "")
  if not _documented(e, case.command_line):
    return Outcome(case.kind, case.what, DEFECT, "undocumented error " + raised)
  if compiles:
    return Outcome(case.kind, case.what, DEFECT, f"refused after {compiles} compiles: {raised}")
  if not any(n and n in message for n in case.names):
    return Outcome(case.kind, case.what, DEFECT,
                   f"the message names none of {list(case.names)}: {raised}")
  return Outcome(case.kind, case.what, REFUSED, raised)


def table(outcomes: Sequence[Outcome], fixed: dict[str, int] | None = None) -> str:
  """The markdown table of docs/reliability.md: cases per kind and verdict.

  Args:
    outcomes: every case's outcome.
    fixed: per kind, the defects the campaign found that are now fixed (each
      with its own regular test).
  """
  fixed = fixed or {}
  counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for o in outcomes:
    counts[o.kind][o.verdict] += 1
  rows = ["| input kind | cases | accepted | refused clearly | defects left | defects found and fixed |",
          "| --- | ---: | ---: | ---: | ---: | ---: |"]
  total = collections.Counter()
  for kind in sorted(counts):
    c = counts[kind]
    total.update(c)
    rows.append(f"| {kind} | {sum(c.values())} | {c[ACCEPTED]} | {c[REFUSED]} | "
                f"{c[DEFECT]} | {fixed.get(kind, 0)} |")
  rows.append(f"| **all** | {sum(total.values())} | {total[ACCEPTED]} | {total[REFUSED]} | "
              f"{total[DEFECT]} | {sum(fixed.values())} |")
  return "\n".join(rows)
