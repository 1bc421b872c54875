"""Each config value against its field's type, where the ConfigDict meets the dataclasses.

A config typed by hand (a notebook's mapping, a config file's assignment to a
field that had no value) reaches `from_config_dict` without ml_collections'
type checks: a string where a number belongs would fail later inside a
comparison, or not at all (a seed of "abc" hashes as a string), and a NaN
learning rate would reach the learner. Every value is checked here against its
field's annotation, and every number must be finite (docs/reliability.md,
"Bad inputs").
"""

import math
import types
import typing
from typing import Any

# Tuple fields that also take one comma-separated string (their class splits it).
_SPLIT_STRINGS = ("logging.wandb.tags",)


def check(path: str, hint: Any, value: Any) -> None:
  """Raises ValueError unless `value` fits `hint` (a config field's annotation).

  Ints stand for floats; bools are not numbers; None fits an optional field.
  """
  args = typing.get_args(hint)
  if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
    if value is None:
      return
    (hint,) = [a for a in args if a is not type(None)]
  if hint is Any:
    if isinstance(value, (str, bool)):
      return
    _refuse(path, "a string or a bool", value)
  if hint is bool:
    if not isinstance(value, bool):
      _refuse(path, "a bool", value)
  elif hint is int:
    if isinstance(value, bool) or not isinstance(value, int):
      _refuse(path, "an integer", value)
  elif hint is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      _refuse(path, "a number", value)
    if not math.isfinite(value):
      _refuse(path, "a finite number", value)
  elif hint is str:
    if not isinstance(value, str):
      _refuse(path, "a string", value)
  elif typing.get_origin(hint) is tuple:
    if isinstance(value, str) and path in _SPLIT_STRINGS:
      return
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
      _refuse(path, "a list of strings", value)


def _refuse(path: str, expected: str, value: Any) -> None:
  raise ValueError(f"config field {path} must be {expected}, got {value!r} "
                   f"({type(value).__name__}).")
