"""The config files' argument parser (big_vision's `parse_arg` pattern).

`--config studies/configs/table.py:mipu,seed=2,quick` hands `get_config` the string
`"mipu,seed=2,quick"`. Each config declares its options once, with their
defaults (whose types are the options' types)::

  arg = common.parse_arg(arg, row="baseline", seed=0, steps=20, p=float,
                         quick=False)
  arg.row, arg.seed, arg.quick   # "mipu", 2, True

An option given as a type (`p=float`) has no default (None until set). A bare
item sets a bool option to True; the first bare item that is not a bool option
fills the positional option (`positional=`, default "row"). Unknown options,
values of the wrong type and a second positional item are `ValueError`s.
"""

from typing import Any

from ml_collections import config_dict

_TRUE = ("", "1", "true", "yes")
_FALSE = ("0", "false", "no")


def _typed(name: str, kind: type, text: str) -> Any:
  if kind is bool:
    if text.lower() in _TRUE:
      return True
    if text.lower() in _FALSE:
      return False
    raise ValueError(f"option {name}={text!r} is not a bool.")
  try:
    return kind(text)
  except ValueError:
    raise ValueError(f"option {name}={text!r} is not a {kind.__name__}.") from None


def parse_arg(arg: str | None, *, positional: str = "row",
              **spec: Any) -> config_dict.ConfigDict:
  """Parses `"value,key=value,flag"` against the declared options `spec`.

  Args:
    arg: the text after `:` in `--config file.py:ARG`, or None.
    positional: the option a leading bare item fills (if declared in `spec`).
    **spec: option name -> default value, or a type for an option without
      default.

  Returns:
    A locked ConfigDict with every declared option.

  Raises:
    ValueError: unknown option, bad value, or more than one positional item.
  """
  kinds = {k: (v if isinstance(v, type) else type(v)) for k, v in spec.items()}
  values = {k: (None if isinstance(v, type) else v) for k, v in spec.items()}
  seen_positional = False
  for item in (s.strip() for s in (arg or "").split(",")):
    if not item:
      continue
    key, has_value, text = item.partition("=")
    key = key.strip()
    if not has_value and kinds.get(key) is not bool:
      if positional in kinds and not seen_positional:
        values[positional] = _typed(positional, kinds[positional], key)
        seen_positional = True
        continue
    if key not in kinds:
      raise ValueError(f"unknown option {key!r} in {arg!r}; known: "
                       f"{', '.join(sorted(kinds))}.")
    values[key] = _typed(key, kinds[key], text.strip())
  out = config_dict.ConfigDict(values)
  out.lock()
  return out
