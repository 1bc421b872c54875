"""Comparing run configs: which settings differ, and which may differ on resume.

A config is compared as its saved JSON (`config.json`, checkpoint metadata):
`flatten` turns it into `{"loss.correction.is_level": ..., ...}`, so a
`TrainConfig` and a config read back from disk compare alike (tuples as lists,
`None` as `null`).

Resuming a run with another config changes what its record describes. Only
`RESUME_NEUTRAL` settings may change on resume without saying so: how long the
run lasts and what it writes, never what a step computes (docs/reliability.md).
"""

import dataclasses
import json
import os
from typing import Any, Mapping

# Settings that change neither the parameters a step produces nor the data it
# sees: the run's length (unless it sets the cosine schedule's horizon), what
# is logged, evaluated, checkpointed and exported, and the non-finite patience.
# Prefixes end with "." (a whole section); others are exact paths.
RESUME_NEUTRAL = ("num_steps", "logging.", "eval.every", "eval.pi",
                  "checkpoint.every", "checkpoint.keep", "export.",
                  "learner.max_nonfinite_steps")


def as_json(cfg: Any) -> dict[str, Any]:
  """A `TrainConfig` as its saved JSON (`config.json`): tuples as lists, other
  non-JSON values as strings, `model.init_from` as `record_path` names it."""
  out = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
  model = out.get("model")
  if isinstance(model, dict) and isinstance(model.get("init_from"), str):
    model["init_from"] = record_path(model["init_from"])
  return out


# The base policies shipped in the package, whose absolute path differs between
# clones (and worktrees) of the same repository and installs of the package.
_PACKAGED = "/mipu_jax/tasks/assets/"
# The checkout the package is imported from (its parent directory, when that is
# a git checkout: an editable install; a wheel's site-packages is not one).
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def record_path(path: str) -> str:
  """`path` as a run's record names it, so that records read the same in every
  clone: a base policy shipped in the package from the package on
  (`mipu_jax/tasks/assets/...`), a path inside this checkout relative to it
  (`results/...`), any other path (a user's checkpoint) as it is."""
  if _PACKAGED in path:
    return "mipu_jax/tasks/assets/" + path.split(_PACKAGED, 1)[1]
  if os.path.isabs(path) and os.path.exists(os.path.join(_CHECKOUT, ".git")):
    inside = os.path.relpath(os.path.abspath(path), _CHECKOUT)
    if inside != ".." and not inside.startswith(".." + os.sep):
      return inside
  return path


# Values that name library code which has since moved: a saved run reads back
# as the same config under the new name.
RENAMED = {"data.reward_grader": {"mipu_jax.eval.grading:grade":
                                  "mipu_jax.math_eval.grading:grade"}}


def flatten(cfg: Any) -> dict[str, Any]:
  """A config (`TrainConfig`, or its saved JSON mapping) as `{dotted.path: value}`.

  `model.init_from` is compared as `record_path` names it (records written
  before it named absolute paths), so a committed run reads back in any clone.
  `RENAMED` values are read under their new names.
  """
  if dataclasses.is_dataclass(cfg):
    cfg = as_json(cfg)
  flat = _flatten(cfg)
  path = flat.get("model.init_from")
  if isinstance(path, str):
    flat["model.init_from"] = record_path(path)
  for key, names in RENAMED.items():
    if flat.get(key) in names:
      flat[key] = names[flat[key]]
  for key, value in ADDED.items():
    flat.setdefault(key, value)
  return flat


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    key = f"{prefix}.{k}" if prefix else k
    out.update(_flatten(v, key) if isinstance(v, Mapping) else {key: v})
  return out


def config_diff(a: Any, b: Any) -> dict[str, tuple[Any, Any]]:
  """`{path: (a's value, b's value)}` for every setting that differs.

  Args:
    a, b: `TrainConfig`s, saved JSON mappings, or already flat mappings.
  """
  fa, fb = flatten(a), flatten(b)
  return {k: (fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb))
          if fa.get(k) != fb.get(k)}


# Settings added to the config after runs were saved: a saved config without one
# reads back with the value that computes what the run computed before it existed.
ADDED = {"learner.mesh.expert": 1, "moe.routing_replay": "none", "moe.record_routing": True,
         "moe.aux_loss": False, "optim.mu_dtype": "float32"}


def resume_differences(saved: Any, new: Any) -> dict[str, tuple[Any, Any]]:
  """The differences between a run's saved config and a resuming one that change
  what the run computes (`config_diff` less `RESUME_NEUTRAL`).

  `num_steps` counts too when the cosine schedule takes its horizon from it.

  Args:
    saved: the config the run's checkpoint was written with.
    new: the config it is resumed with.

  Returns:
    `{path: (saved value, new value)}`; empty when the resume is like the run.
  """
  diff = config_diff(saved, new)
  flat = flatten(new)
  horizon_from_steps = (flat.get("optim.schedule") == "cosine"
                        and not flat.get("optim.cosine.total_steps"))

  def neutral(path):
    if path == "num_steps" and horizon_from_steps:
      return False
    return any(path == p or (p.endswith(".") and path.startswith(p))
               for p in RESUME_NEUTRAL)

  return {k: v for k, v in diff.items() if not neutral(k)}
