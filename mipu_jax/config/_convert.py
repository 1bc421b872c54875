"""ConfigDict ↔ `TrainConfig`: `default_config` and `from_config_dict`."""

import dataclasses
import types
import typing
from typing import Any, Mapping

from ml_collections import config_dict

from mipu_jax import losses
from mipu_jax.config import _types
from mipu_jax.config.training import TrainConfig


_LEVEL_FIELDS = ("is_level", "rs_level")


def _optional_type(hint) -> type | None:
  """`T` for an `Optional[T]` / `T | None` hint, else None."""
  args = typing.get_args(hint)
  if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
    (inner,) = [a for a in args if a is not type(None)]
    return inner
  return None


def _placeholder(hint) -> config_dict.FieldReference:
  return config_dict.placeholder(_optional_type(hint) or hint)


def _to_cd(obj) -> config_dict.ConfigDict:
  """ConfigDict of a config dataclass; None fields become typed placeholders."""
  hints = typing.get_type_hints(type(obj))
  out = {}
  for f in dataclasses.fields(obj):
    value = getattr(obj, f.name)
    if isinstance(value, losses.LossConfig):
      out[f.name] = _loss_to_cd(value)
    elif dataclasses.is_dataclass(value):
      out[f.name] = _to_cd(value)
    elif value is None:
      out[f.name] = _placeholder(hints[f.name])
    else:
      out[f.name] = value
  return config_dict.ConfigDict(out)


def _loss_to_cd(loss: losses.LossConfig) -> config_dict.ConfigDict:
  """`loss` without its correction, plus `correction = {preset, overrides}`.

  Every override is a placeholder: the section means "the preset as is".
  """
  out = _to_cd(dataclasses.replace(loss, correction=losses.CorrectionConfig()))
  del out["correction"]
  corr_hints = typing.get_type_hints(losses.CorrectionConfig)
  correction = {"preset": "token_tis"}
  for f in dataclasses.fields(losses.CorrectionConfig):
    correction[f.name] = _placeholder(corr_hints[f.name])
  out["correction"] = correction
  return out


def default_config() -> config_dict.ConfigDict:
  """The full ConfigDict of `TrainConfig()`: the defaults of docs/method.md.

  The loss correction is the `token_tis` preset (docs/method.md §3, U = 2).
  """
  return _to_cd(TrainConfig())


def _from_mapping(cls, d: Mapping[str, Any], where: str):
  hints = typing.get_type_hints(cls)
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - names)
  if unknown:
    raise ValueError(f"unknown config field(s) {[f'{where}{k}' for k in unknown]}; "
                     f"{where or 'top level'} has {sorted(names)}.")
  kwargs = {}
  for name, value in d.items():
    hint = hints[name]
    if hint is losses.LossConfig or dataclasses.is_dataclass(hint):
      if not isinstance(value, Mapping):
        raise ValueError(f"config section {where}{name} must be a mapping of its "
                         f"fields, got {value!r}.")
    if hint is losses.LossConfig:
      kwargs[name] = _in_section(f"{where}{name}", _loss_from_mapping, value)
    elif dataclasses.is_dataclass(hint):
      kwargs[name] = _from_mapping(hint, value, f"{where}{name}.")
    else:
      _types.check(f"{where}{name}", hint, value)
      kwargs[name] = value
  return _in_section(where.rstrip("."), lambda: cls(**kwargs))


def _in_section(section: str, make, *args):
  """`make(*args)`, a ValueError that does not name `section` prefixed with it."""
  try:
    return make(*args)
  except ValueError as e:
    if not section or section in str(e):
      raise
    raise type(e)(f"{section}: {e}") from e


def _loss_from_mapping(d: Mapping[str, Any]) -> losses.LossConfig:
  d = dict(d)
  corr = d.pop("correction", None)
  hints = typing.get_type_hints(losses.LossConfig)
  for name, value in d.items():
    if name in hints:
      _types.check(f"loss.{name}", hints[name], value)
  if isinstance(corr, Mapping):
    corr_hints = {**typing.get_type_hints(losses.CorrectionConfig), "preset": str}
    for name, value in corr.items():  # None: the preset's value (a preset of None is no preset)
      if name in corr_hints and (value is not None or name == "preset"):
        _types.check(f"loss.correction.{name}", corr_hints[name], value)
    corr = {k: v for k, v in corr.items() if v is not None}
    for name in _LEVEL_FIELDS:
      if isinstance(corr.get(name), str) and corr[name].lower() == "none":
        corr[name] = None
    corr = _in_section("loss.correction", lambda: losses.CorrectionConfig.from_preset(
        corr.pop("preset", "token_tis"), **corr))
  elif isinstance(corr, str):
    corr = losses.CorrectionConfig.from_preset(corr)
  if corr is not None:
    d["correction"] = corr
  return losses.LossConfig.from_dict(d)


def from_config_dict(cd: config_dict.ConfigDict | Mapping[str, Any]) -> TrainConfig:
  """Validated `TrainConfig` from a ConfigDict (or plain nested mapping).

  Missing fields keep their defaults; unknown fields, presets and impossible
  combinations raise `ValueError`.
  """
  if isinstance(cd, config_dict.ConfigDict):
    cd = cd.to_dict()
  return _from_mapping(TrainConfig, cd, "")
