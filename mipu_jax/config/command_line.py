"""The launchers' flag parsing: a config file that cannot be loaded is a flag error.

absl prints a flag error as one line (`FATAL Flags parsing error: ...`) and
exits 1; `ml_collections.config_flags` lets anything a config file raises on
import (a syntax error, a missing module, a wrong type assigned to a locked
field) escape as a traceback from its own internals, and hands on a missing
file as a value that fails later. `load_flags` turns each into a flag error
naming the file (docs/reliability.md, "Bad inputs").
"""

import sys
from collections.abc import Mapping, Sequence

from absl import flags
from ml_collections import config_dict
from ml_collections import config_flags


def load_flags(argv: Sequence[str], *, flag_values: flags.FlagValues = flags.FLAGS,
               config_flag: str = "config") -> list[str]:
  """Parses `argv` into `flag_values`; returns the arguments left over.

  Raises:
    flags.Error: a bad flag, or a config file (`--<config_flag>`) that does
      not load as a `get_config()` returning a ConfigDict or mapping.
  """
  try:
    rest = flag_values(list(argv))
  except flags.Error:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise flags.IllegalFlagValueError(
        f"--{config_flag}={_given(argv, config_flag)}: the config file could not be "
        f"loaded: {type(e).__name__}: {e}") from e
  if config_flag in flag_values and flag_values[config_flag].present:
    value = flag_values[config_flag].value
    if not isinstance(value, (Mapping, config_dict.ConfigDict)):
      path = config_flags.get_config_filename(flag_values[config_flag])
      raise flags.IllegalFlagValueError(
          f"--{config_flag}={path}: expected a Python file whose get_config() returns "
          f"an ml_collections ConfigDict; it could not be read ({_reason(value)}).")
  return rest


def parse_flags(argv: Sequence[str]) -> list[str]:
  """`absl.app.run`'s `flags_parser`: `load_flags`, a flag error printed as
  absl prints one, then exit status 1."""
  try:
    return load_flags(argv)
  except flags.Error as e:
    sys.stderr.write(f"FATAL Flags parsing error: {e}\n"
                     "Pass --helpshort or --helpfull to see help on flags.\n")
    sys.exit(1)


def _given(argv: Sequence[str], name: str) -> str:
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{name}="):
      return arg.split("=", 1)[1]
    if arg == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return "?"


def _reason(value) -> str:
  if value is None:
    return "its get_config() returned None"
  error = getattr(value, "_error", None)
  return f"{type(error).__name__}: {error}" if error is not None else type(value).__name__
