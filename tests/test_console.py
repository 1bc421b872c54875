"""Warnings printed through the progress bar (mipu_jax/rl/console.py)."""

import logging
import logging.handlers
import multiprocessing
import sys

import tqdm

from mipu_jax.rl import console


def _capture(monkeypatch):
  lines = []
  monkeypatch.setattr(tqdm.tqdm, "write", lambda s, file=None, **kw: lines.append(s))
  return lines


def test_terminal_handlers_are_swapped_for_the_bar_and_back(monkeypatch):
  lines = _capture(monkeypatch)
  root = logging.getLogger()
  terminal = logging.StreamHandler(sys.stderr)
  terminal.setFormatter(logging.Formatter("T %(levelname)s %(message)s"))
  other = logging.NullHandler()  # not a terminal: kept as it is
  monkeypatch.setattr(root, "handlers", [terminal, other])
  emitted = []
  monkeypatch.setattr(terminal, "emit", emitted.append)
  with console.through_bar():
    assert other in root.handlers and terminal not in root.handlers
    logging.getLogger("mipu_jax.rl.health").warning("step %d: surge", 33)
  assert lines == ["T WARNING step 33: surge"] and not emitted
  assert root.handlers == [terminal, other]


def test_without_handlers_the_bar_prints_warnings_in_the_default_format(monkeypatch):
  lines = _capture(monkeypatch)
  monkeypatch.setattr(logging.getLogger(), "handlers", [])
  with console.through_bar():
    logging.getLogger("x").info("not shown")
    logging.getLogger("x").warning("shown")
  assert lines == ["WARNING:x:shown"]


def _worker_warns(queue):
  console.queue_records(queue)
  logging.getLogger("mipu_jax.rl.health").warning("[baseline seed 0] step %d: surge", 7)


def test_a_worker_warning_reaches_the_parent_bar(monkeypatch):
  lines = _capture(monkeypatch)
  monkeypatch.setattr(logging.getLogger(), "handlers", [])
  context = multiprocessing.get_context("spawn")
  queue = context.Queue()
  with console.through_bar() as printer:
    listener = logging.handlers.QueueListener(queue, printer)
    listener.start()
    p = context.Process(target=_worker_warns, args=(queue,))
    p.start()
    p.join(60)
    listener.stop()
  assert p.exitcode == 0
  assert lines == ["WARNING:mipu_jax.rl.health:[baseline seed 0] step 7: surge"]
