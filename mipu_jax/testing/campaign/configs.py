"""Config cases: every field of every section, bad values of every sort, three ways in.

A case sets one field (or a contradictory pair) of a base run (the small
arithmetic run or a math run of the tiny checkpoint) and hands it to the
library as a user would: a command-line override (`--config.a.b=...`
through absl and `config_flags`), a line in a config file, or a plain
mapping (`config.from_config_dict`, a notebook's way). Each then goes through
`rl.preflight.check`, what `rl.train` runs before building anything. Config
files that fail to import and unknown command-line keys are cases too.

The oracle (`must_refuse`) says which values no run may accept: a wrong type,
a non-finite number, an unknown or empty name where the field is a choice, a
value outside the field's documented range (`config._ranges.RANGES`, which
must hold every numeric field but `UNBOUNDED`), a contradictory pair.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import types
import typing
from typing import Any, Callable

from hypothesis import strategies as st

from mipu_jax import config as config_lib
from mipu_jax import losses
from mipu_jax.config import _ranges
from mipu_jax.rl import preflight
from mipu_jax.testing.campaign import core
from mipu_jax.testing.campaign.world import World

KIND = "config"

# Fields whose value is free text or a path (anything else of type str is a choice).
FREE_TEXT = {"model.init_from", "data.train_file", "data.instruction", "data.prompt_template",
             "data.reward_grader", "data.prompt_key", "data.answer_key", "eval.benchmark_dir",
             "logging.wandb.entity", "logging.wandb.name", "logging.wandb.group",
             "logging.wandb.project", "logging.wandb.tags", "loss.correction.rs_thresholds",
             "loss.correction.rs_criteria", "logging.backends"}
# Choices whose empty value means something ("" leaves W&B its own mode; no backend but JSONL).
EMPTY_OK = {"logging.wandb.mode", "logging.backends"}
# Fields only the math task reads, and only the arithmetic task.
MATH_ONLY = {"data.schema", "data.prompt_key", "data.answer_key", "data.prompt_template",
             "data.instruction", "data.max_prompt_tokens", "data.probe_holdout",
             "data.reward_correct", "data.reward_wrong", "data.truncated",
             "data.reward_workers", "data.reward_timeout_s", "data.reward_grader",
             "data.train_file", "eval.benchmark_dir", "eval.benchmarks", "eval.max_problems"}
ARITHMETIC_ONLY = {"data.train_tiers", "data.add_bos", "eval.tiers", "eval.n_per_tier"}


# Numeric fields without a range (`config._ranges`): a margin of either sign
# (docs/method.md §5) and the two reward values (only their order matters).
UNBOUNDED = {"mipu.c", "data.reward_correct", "data.reward_wrong"}


@dataclasses.dataclass(frozen=True)
class Field:
  path: str
  kind: str          # "int", "float", "bool", "choice", "text", "tuple", "any"
  optional: bool


def _fields_of(cls, prefix: str) -> list[Field]:
  hints = typing.get_type_hints(cls)
  out = []
  for f in dataclasses.fields(cls):
    hint, path = hints[f.name], prefix + f.name
    if hint is losses.LossConfig:
      out += [x for x in _fields_of(hint, path + ".") if x.path != path + ".correction"]
      out += _fields_of(losses.CorrectionConfig, path + ".correction.")
      out.append(Field(path + ".correction.preset", "choice", False))
      continue
    if dataclasses.is_dataclass(hint):
      out += _fields_of(hint, path + ".")
      continue
    optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(
        None) in typing.get_args(hint)
    if optional:
      (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    kind = {int: "int", float: "float", bool: "bool"}.get(hint)
    if kind is None and hint is str:
      kind = "text" if path in FREE_TEXT else "choice"
    if kind is None:
      kind = "tuple" if typing.get_origin(hint) is tuple else "any"
    out.append(Field(path, kind, optional))
  return out


FIELDS: tuple[Field, ...] = tuple(
    f for f in _fields_of(config_lib.TrainConfig, "") if f.path != "loss.correction")

_WRONG_TYPE = {
    "int": ["abc", 1.5, [1], {"a": 1}, True],
    "float": ["abc", [1.0], {"a": 1.0}, True, "1e-3x"],
    "bool": ["yes", 2, 0.5, [True]],
    "choice": [3, 1.5, ["a"], True],
    "text": [3, ["a"], {"a": "b"}],
    "tuple": [3, {"a": 1}, [3]],
    "any": [3.5, ["a"]],
}
_NON_FINITE = [math.nan, math.inf, -math.inf]
_OUT_OF_RANGE = {"int": [-1, 0, -(2**40), 2**40, 1],
                 "float": [-1.0, 0.0, 1e-30, 1e30, 1.5, -1e-9]}
_STRINGS = ["", "bogus", " padded ", "NONE", "Ünïcode", "a:b"]


def _category_values(field: Field):
  cats = [("wrong type", v) for v in _WRONG_TYPE[field.kind]]
  if not field.optional:
    cats.append(("wrong type", None))
  if field.kind in ("int", "float"):
    cats += [("non-finite", v) for v in _NON_FINITE]
    cats += [("out of range", v) for v in _OUT_OF_RANGE[field.kind]]
  if field.kind in ("choice", "text", "any"):
    cats += [("unknown string", v) for v in _STRINGS]
  if field.kind == "tuple":
    cats += [("unknown string", v) for v in (["bogus"], [], ["tier1", "tier1"], "tier1")]
  return cats


def _relevant(path: str, base: str) -> bool:
  return not ((base == "arithmetic" and path in MATH_ONLY)
              or (base == "math" and path in ARITHMETIC_ONLY))


def must_refuse(field: Field, category: str, value: Any, base: str, route: str) -> bool:
  """Whether no run may accept `value` in `field` by `route` (the campaign's oracle)."""
  if category == "wrong type":
    if value is None and (field.optional or (field.path.startswith("loss.correction.")
                                             and field.path != "loss.correction.preset")):
      return False   # a correction field left None keeps its preset's value
    if field.path == "model.remat" and isinstance(value, bool):
      return False
    if route == "file" and field.kind == "float" and isinstance(value, bool):
      return False   # a locked ConfigDict stores a bool assigned to a float field as 0.0 / 1.0
    if route == "command line" and field.kind in ("choice", "text"):
      # On a command line every value of a string field is a string.
      return must_refuse(field, "unknown string", str(value), base, route)
    return True
  if category == "non-finite":
    return True
  if not _relevant(field.path, base):
    return False
  if category == "out of range":
    if isinstance(value, float) and field.kind == "int":
      return True
    r = _ranges.RANGES.get(field.path)
    return r is not None and value not in r
  if category == "unknown string":
    if field.path.startswith("optim.length_surge."):
      return False   # read only by the length-surge schedule, which the bases do not use
    if field.kind == "choice":
      if field.path == "loss.correction.is_level" or field.path == "loss.correction.rs_level":
        return value not in ("NONE",)   # "none" (any case) switches the level off
      return not (value == "" and field.path in EMPTY_OK)
    if field.kind == "tuple":
      return field.path != "logging.wandb.tags"   # tags are free text
    if field.path == "model.remat":
      return value not in ("none", "layer", "dots")
    if field.path in ("data.instruction", "data.prompt_template"):
      # A template needs its {question} field ("chat": the checkpoint's template).
      return "{question}" not in value and value != "chat"
    return field.path in ("model.init_from", "data.train_file", "eval.benchmark_dir",
                          "data.reward_grader") and value != ""
  return False


# Contradictory combinations: each must be refused (docs/method.md §2, §5, §7).
COMBOS: dict[str, dict[str, Any]] = {
    "quantized sampler with the true on-policy mode": {
        "sampling.true_on_policy": True, "sampling.weight_quant": "int8"},
    "fp8 KV cache with the true on-policy mode": {
        "sampling.true_on_policy": True, "sampling.kv_cache_dtype": "fp8"},
    "true on-policy with a bf16 sampler and an fp32 learner": {
        "sampling.true_on_policy": True, "sampling.dtype": "bfloat16"},
    "true on-policy with top-k": {"sampling.true_on_policy": True, "sampling.top_k": 5},
    "true on-policy with tensor parallelism": {
        "sampling.true_on_policy": True, "learner.mesh.tensor": 2, "learner.mesh.fsdp": 1},
    "mesh larger than the devices": {"learner.mesh.data": 64},
    "mesh axes that do not divide the devices": {"learner.mesh.data": 3,
                                                "learner.mesh.fsdp": -1},
    "batch rows that do not split over the data axis": {
        "learner.mesh.data": 8, "learner.mesh.fsdp": 1, "data.prompts_per_step": 3},
    "batch that does not split into mini-batches": {"learner.num_minibatches": 3},
    "group_size 1 with GRPO": {"data.group_size": 1, "loss.advantage": "grpo"},
    "group_size 1 with RLOO": {"data.group_size": 1, "loss.advantage": "rloo"},
    "IS bounds inverted": {"loss.correction.is_lower": 3.0, "loss.correction.is_upper": 2.0},
    "RS bounds inverted": {"loss.correction.preset": "mis_miles",
                           "loss.correction.rs_lower": 2.5},
    "health IS-mean thresholds inverted": {"logging.health.is_mean_low": 3.0},
    "Step 2 with random rollback": {"mipu.step2": True, "mipu.random_rollback_p": 0.5},
    "noise margin with one probe prompt": {"mipu.c_noise_multiple": 2.0,
                                           "mipu.num_probe_prompts": 1},
    "bypass mode with an IS correction": {"loss.mode": "bypass"},
    "packing with mini-batches": {"learner.pack_length": 64, "learner.num_minibatches": 2},
    "packed rows shorter than prompt + response": {"learner.pack_length": 8},
    "rewards inverted (math)": {"data.reward_correct": 0.0, "data.reward_wrong": 1.0},
    "max_new_tokens beyond the checkpoint's context (math)": {
        "sampling.max_new_tokens": 50_000},
    "probe hold-out larger than the prompts (math)": {"data.probe_holdout": 500},
    "expert parallelism on a dense model": {"learner.mesh.expert": 2,
                                            "learner.mesh.fsdp": 1},
    "routing replay (R3) on a dense model": {"moe.routing_replay": "rollout"},
    "routing replay (R2) on a dense model": {"moe.routing_replay": "learner"},
    "surge window shorter than its minimum history": {
        "logging.health.k3_surge_window": 2, "logging.health.k3_surge_min_history": 5},
}


def _set(cd: dict, path: str, value: Any) -> None:
  *parents, leaf = path.split(".")
  for p in parents:
    cd = cd.setdefault(p, {})
  cd[leaf] = value


def _names(path: str) -> list[str]:
  parts = path.split(".")
  return [".".join(parts[i:]) for i in range(len(parts))] + (
      [parts[-2]] if len(parts) > 1 else [])


def _py(value: Any) -> str:
  """`value` as Python source (non-finite floats included)."""
  if isinstance(value, float) and not math.isfinite(value):
    return f"float({str(value)!r})"
  return repr(value)


def _flag_text(value: Any) -> str:
  return value if isinstance(value, str) else repr(value)


def _run(world: World, base: str, values: dict[str, Any], route: str, tmp: str):
  """The path of `route`: the config in, then `rl.preflight.check`."""
  cd = world.arithmetic_config() if base == "arithmetic" else world.math_config()
  workdir = os.path.join(tmp, "workdir")
  if route == "mapping":
    for path, value in values.items():
      _set(cd, path, value)
    cfg = config_lib.from_config_dict(cd)
  else:
    lines = "".join(f"  cd.{p} = {_py(v)}\n" for p, v in values.items()) if route == "file" else ""
    fn = _config_file(tmp, cd, lines)
    argv = ["train", f"--config={fn}"]
    if route == "command line":
      argv += [f"--config.{p}={_flag_text(v)}" for p, v in values.items()]
    cfg = config_lib.from_config_dict(_load(argv))
  preflight.check(cfg, workdir)


def _config_file(tmp: str, cd: dict, lines: str) -> str:
  fn = os.path.join(tmp, "run_config.py")
  with open(fn, "w", encoding="utf-8") as f:
    f.write("from ml_collections import config_dict\n"
            "from mipu_jax import config\n\n\n"
            "def get_config():\n"
            "  cd = config.default_config()\n"
            f"  cd.update_from_flattened_dict({_flat(cd)!r})\n" + lines + "  return cd\n")
  return fn


def _flat(cd: dict) -> dict:
  flat = config_lib.flatten(cd)
  return {k: tuple(v) if isinstance(v, list) else v for k, v in flat.items()
          if v is not None}


def _load(argv: list[str]):
  """Parses `argv` as `experiments/train.py` does (`config.load_flags`)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True)
  saved = sys.argv
  sys.argv = argv  # config_flags reads the overrides from sys.argv
  # config_flags loads every file as module `config_config`, into the module
  # left by the previous load if there is one: a file without get_config()
  # would find the previous file's. A launcher loads one file per process.
  sys.modules.pop("config_config", None)
  try:
    config_lib.load_flags(argv, flag_values=fv)
    return fv.config
  finally:
    sys.argv = saved


# Config files that fail to import, or import as something that is not a config.
BAD_FILES = {
    "syntax error": "def get_config(:\n  pass\n",
    "import of a missing module": "import no_such_module_xyz\n\ndef get_config():\n  pass\n",
    "get_config raises": "def get_config():\n  raise RuntimeError('half-edited')\n",
    "no get_config": "X = 1\n",
    "get_config returns a number": "def get_config():\n  return 3\n",
    "get_config returns None": "def get_config():\n  return None\n",
    "wrong type assigned to a locked field":
        "from mipu_jax import config\n\ndef get_config():\n  cd = config.default_config()\n"
        "  cd.num_steps = 'many'\n  return cd\n",
    "unknown field added": "from mipu_jax import config\n\ndef get_config():\n"
                           "  cd = config.default_config()\n  cd.bogus_field = 1\n  return cd\n",
    "non-UTF-8 bytes": b"def get_config():\n  return '\xff\xfe'\n",
    "an empty file": "",
}


@st.composite
def cases(draw, world: World) -> core.Case:
  """One config case (see the module docstring)."""
  route = draw(st.sampled_from(["command line", "file", "mapping"]))
  base = draw(st.sampled_from(["arithmetic", "math"]))
  shape = draw(st.sampled_from(["field"] * 8 + ["combo", "unknown key", "bad file"]))
  n = draw(st.integers(0, 2**31))
  tmp = world.tmp(f"config{n}")
  if shape == "bad file":
    name = draw(st.sampled_from(sorted(BAD_FILES) + ["missing file", "a directory"]))
    fn = os.path.join(tmp, "run_config.py")
    if name == "a directory":
      os.makedirs(fn)
    elif name != "missing file":
      text = BAD_FILES[name]
      with open(fn, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode())

    def run_file():
      cfg = config_lib.from_config_dict(_load(["train", f"--config={fn}"]))
      preflight.check(cfg, os.path.join(tmp, "workdir"))
    return core.Case(KIND, f"config file: {name}", run_file,
                     [fn, "run_config.py", "bogus_field", "num_steps"],
                     must_refuse=True, command_line=True)
  if shape == "unknown key":
    section = draw(st.sampled_from(["", "data.", "loss.correction.", "optim.", "learner.mesh."]))
    key = section + draw(st.sampled_from(["bogus", "lr", "learning_rte", "group_sizes"]))
    value = draw(st.sampled_from([1, "x", 0.5]))
    return core.Case(KIND, f"unknown key {key} ({route})",
                     lambda: _run(world, base, {key: value}, route, tmp),
                     _names(key), must_refuse=True, command_line=route != "mapping")
  if shape == "combo":
    name = draw(st.sampled_from(sorted(COMBOS)))
    values = COMBOS[name]
    refuse = base == "math" or "(math)" not in name
    names = [n for p in values for n in _names(p)] + ["mesh", "true_on_policy", "rows"]
    return core.Case(KIND, f"{name} ({base}, {route})",
                     lambda: _run(world, base, values, route, tmp), names,
                     must_refuse=refuse, command_line=route != "mapping")
  field = draw(st.sampled_from(FIELDS))
  category, value = draw(st.sampled_from(_category_values(field)))
  if route == "command line" and (isinstance(value, (dict, list)) or value is None):
    route = "file"   # no command-line spelling of these; a config file can hold them
  return core.Case(
      KIND, f"{field.path} = {value!r} ({category}, {base}, {route})",
      lambda: _run(world, base, {field.path: value}, route, tmp),
      _names(field.path), must_refuse=must_refuse(field, category, value, base, route),
      command_line=route != "mapping")
