"""Log records printed through the progress bar: a warning gets a line of its own
above the bar instead of landing inside the bar's line.

`through_bar()` swaps the root logger's terminal handlers (a stream handler on
stderr / stdout, absl's handler) for one `BarHandler` that writes with
`tqdm.write`, keeping the replaced handler's format, and puts them back on exit.
Worker processes send their records to the parent (`queue_records`), whose
listener prints them the same way (`harness.train_in_workers`).
"""

import contextlib
import logging
import logging.handlers
import sys
from typing import Iterator

import tqdm

DEFAULT_FORMAT = "%(levelname)s:%(name)s:%(message)s"


class BarHandler(logging.Handler):
  """Writes each record on its own line above any active tqdm bar."""

  def emit(self, record: logging.LogRecord) -> None:
    try:
      tqdm.tqdm.write(self.format(record), file=sys.stderr)
    except Exception:  # pylint: disable=broad-except
      self.handleError(record)


def _is_terminal(handler: logging.Handler) -> bool:
  handler = getattr(handler, "python_handler", handler)  # absl's ABSLHandler
  return (isinstance(handler, logging.StreamHandler)
          and getattr(handler, "stream", None) in (sys.stderr, sys.stdout))


@contextlib.contextmanager
def through_bar() -> Iterator[BarHandler]:
  """Routes the root logger's terminal output through `tqdm.write` while inside."""
  root = logging.getLogger()
  before = list(root.handlers)
  terminal = [h for h in before if _is_terminal(h)]
  bar = BarHandler(level=min((h.level for h in terminal), default=logging.WARNING))
  source = getattr(terminal[0], "python_handler", terminal[0]) if terminal else None
  bar.setFormatter(source.formatter if source is not None and source.formatter
                   else logging.Formatter(DEFAULT_FORMAT))
  root.handlers = [h for h in before if h not in terminal] + [bar]
  try:
    yield bar
  finally:
    root.handlers = before


def queue_records(queue) -> None:
  """In a worker process: every record of WARNING and above goes to `queue`
  (a `multiprocessing` queue the parent listens to) instead of the terminal."""
  root = logging.getLogger()
  root.handlers = [logging.handlers.QueueHandler(queue)]
  root.setLevel(logging.WARNING)
