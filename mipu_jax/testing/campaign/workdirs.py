"""Checkpoint and workdir cases, beyond the fault matrix's rows.

A workdir holding a real orbax checkpoint of the small arithmetic run (its
learner state and the metadata `rl.train` saves) is damaged one way: its
metadata comes from another version of the library (a field more or less, no
config, another version string), it holds another run's config (in the
checkpoint, or in `config.json` before any checkpoint), its checkpoint is of
another model under the same settings, or the workdir or its `checkpoints`
is a file. The run is pointed at it and goes through `rl.preflight.check`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import jax
import numpy as np
from hypothesis import strategies as st

from mipu_jax import checkpoint
from mipu_jax import config as config_lib
from mipu_jax import __version__
from mipu_jax.learner import state as state_lib
from mipu_jax.rl import preflight
from mipu_jax.tasks import arithmetic
from mipu_jax.testing.campaign import core
from mipu_jax.testing.campaign.world import World

KIND = "checkpoint / workdir"

# Settings of another run: (path, value) pairs that change what it computes,
# and ones that may change on resume (config.RESUME_NEUTRAL).
OTHER_RUN = (("seed", 7), ("optim.learning_rate", 5e-4), ("data.group_size", 2),
             ("loss.correction.is_upper", 3.0), ("model.init_seed", 3),
             ("sampling.max_new_tokens", 12), ("mipu.step2", True))
NEUTRAL = (("num_steps", 9), ("logging.plots", True), ("checkpoint.keep", 5),
           ("eval.every", 2))


def _set(cd: dict, path: str, value) -> None:
  *parents, leaf = path.split(".")
  for p in parents:
    cd = cd[p]
  cd[leaf] = value


def _save(directory: str, cfg: config_lib.TrainConfig, params_vocab: int | None = None,
          meta_extra: dict | None = None) -> None:
  """A step-1 checkpoint as `rl.train` saves it: the learner state of the
  run's structure (zero parameters, a fresh optimizer state) and its metadata."""
  shapes = preflight.param_shapes(cfg, arithmetic.make_tokenizer())
  params: dict = {}
  for path, shape in shapes.items():
    if params_vocab is not None and path == "embed":
      shape = (params_vocab,) + shape[1:]
    *parents, leaf = path.split("/")
    node = params
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = np.zeros(shape, np.float32)
  opt_state = state_lib.make_optimizer(cfg.optim, cfg.num_steps).init(params)
  state = state_lib.LearnerState(params, opt_state, np.ones([], np.int32), jax.random.key(0))
  meta = {"step": 1, "data_position": 1, "library_version": __version__,
          "config": dataclasses.asdict(cfg), "nonfinite_streak": 0, "best_eval": None,
          "sampler_sync_version": 1, **(meta_extra or {})}
  meta = json.loads(json.dumps(meta, default=str))
  with checkpoint.Checkpointer(directory, max_to_keep=2) as ckpt:
    ckpt.save(1, state, meta)


def make_templates(world: World) -> dict[str, str]:
  """The two checkpoints every case copies: this run's, and another model's."""
  cfg = config_lib.from_config_dict(world.arithmetic_config())
  out = {}
  for name, vocab in (("same", None), ("other_model", 97)):
    path = os.path.join(world.root, "workdirs", name)
    if not os.path.isdir(path):
      _save(os.path.join(path, "checkpoints"), cfg, params_vocab=vocab)
    out[name] = path
  return out


def _metadata_file(workdir: str) -> str:
  return os.path.join(workdir, "checkpoints", "1", "metadata", "metadata")


@st.composite
def cases(draw, world: World, templates: dict[str, str]) -> core.Case:
  """One checkpoint / workdir case (see the module docstring)."""
  n = draw(st.integers(0, 2**31))
  tmp = world.tmp(f"workdir{n}")
  workdir = os.path.join(tmp, "run")
  cd = world.arithmetic_config()
  damage = draw(st.sampled_from([
      "metadata of another version", "another run's checkpoint", "another run's config.json",
      "a checkpoint of another model", "workdir is a file", "checkpoints is a file",
      "config.json not JSON", "the same run (resume)"]))
  refuse, detail, names = True, damage, [workdir]
  allow = False
  if damage in ("workdir is a file",):
    open(workdir, "w").close()
  elif damage == "checkpoints is a file":
    os.makedirs(workdir)
    open(os.path.join(workdir, "checkpoints"), "w").close()
    names.append("checkpoints")
  elif damage in ("another run's config.json", "config.json not JSON"):
    os.makedirs(workdir)
    fn = os.path.join(workdir, "config.json")
    names.append(fn)
    if damage == "config.json not JSON":
      with open(fn, "wb") as f:
        f.write(draw(st.sampled_from([b"", b"{", b"\xff", b"[1]", b"3"])))
    else:
      other = json.loads(json.dumps(cd))
      neutral = draw(st.booleans())
      path, value = draw(st.sampled_from(NEUTRAL if neutral else OTHER_RUN))
      _set(other, path, value)
      json.dump(config_lib.as_json(config_lib.from_config_dict(other)), open(fn, "w"))
      refuse = not neutral
      allow = not neutral and draw(st.booleans())
      refuse = refuse and not allow
      names.append(path)
      detail = f"config.json with {path}={value!r}" + (" (--allow_config_change)" if allow else "")
  else:
    template = templates["other_model" if damage == "a checkpoint of another model" else "same"]
    shutil.copytree(template, workdir)
    fn = _metadata_file(workdir)
    meta = json.load(open(fn))
    names.append(os.path.join(workdir, "checkpoints"))
    if damage == "metadata of another version":
      how = draw(st.sampled_from(["no config", "no step", "a field it no longer has",
                                  "a section it no longer has", "a missing field",
                                  "another version string", "config as a string"]))
      detail = f"metadata: {how}"
      if how == "no config":
        del meta["config"]
      elif how == "no step":
        del meta["step"]
      elif how == "a field it no longer has":
        meta["config"]["data"]["old_field"] = 1
        names.append("old_field")
      elif how == "a section it no longer has":
        meta["config"]["old_section"] = {"x": 1}
        names.append("old_section")
      elif how == "a missing field":
        del meta["config"]["optim"]["b2"]
        names.append("b2")
      elif how == "config as a string":
        meta["config"] = json.dumps(meta["config"])
      else:
        meta["library_version"] = "0.0.1"
        refuse = False
    elif damage == "another run's checkpoint":
      path, value = draw(st.sampled_from(OTHER_RUN + NEUTRAL))
      _set(meta["config"], path, value)
      refuse = (path, value) in OTHER_RUN
      names.append(path)
      detail = f"checkpoint config with {path}={value!r}"
    elif damage == "a checkpoint of another model":
      names += ["another model", "embed"]
    elif damage == "the same run (resume)":
      refuse = False
    json.dump(meta, open(fn, "w"))

  def run():
    cfg = config_lib.from_config_dict(cd)
    preflight.check(cfg, workdir, allow_config_change=allow)
  return core.Case(KIND, detail, run, names, must_refuse=refuse)
