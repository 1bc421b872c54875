"""The run's checkpoints: where and when they are saved, and what a resumed run
checks and repairs before its first step (docs/reliability.md).

- **Saving**: through `mipu_jax.checkpoint` (orbax) into `<workdir>/checkpoints`
  (`open_checkpoints`), every `checkpoint.every` steps and at the last
  (`should_save`): the learner state plus JSON metadata (data position,
  sampler-sync count, config). The sampler's weights are not saved: they are a
  function of the parameters and are re-synced.

- **Its config**: the checkpoint's saved config against the new one
  (`check_config`); a difference that changes what the run computes is an
  error unless the caller says it is intended, in which case both configs are
  kept on disk and the step of the change is recorded (`record_config`).
- **Its metrics log**: rows after the checkpoint's step (steps that will run
  again) and a last line torn by a kill are dropped, the file rewritten
  (`metrics_rows`); a fresh start moves an earlier attempt's log aside.
- **The non-finite guard's patience** (`NonFiniteStreak`): consecutive RL steps
  with a skipped update, checkpointed with the run.
- **Its code** (`record_commit`): each session of the run (the first and every
  resume) appends the git commit it ran from, whether that tree had uncommitted
  changes, and the step it started after, so a result names the code that made it.
"""

import json
import logging
import os
import subprocess
from typing import Any, Callable, Mapping, Optional

import mipu_jax
from mipu_jax import checkpoint
from mipu_jax import config as config_lib
from mipu_jax.rl import writer as writer_lib

_log = logging.getLogger(__name__)

CHANGES_FILE = "config_changes.json"
COMMITS_FILE = "commits.jsonl"


def code_commit() -> Optional[dict[str, Any]]:
  """The git commit of the checkout this process imports mipu_jax from, and
  whether its tracked files differ from it; None outside a git checkout (an
  installed wheel, even one inside another repository's tree) or without git."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(mipu_jax.__file__)))

  def git(*args):
    return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()
  try:
    if os.path.realpath(git("rev-parse", "--show-toplevel")) != os.path.realpath(root):
      return None  # the package sits in some repository's tree, not at its root
    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
  except (OSError, subprocess.SubprocessError):
    return None
  return {"commit": commit, "dirty": dirty}


def record_commit(workdir: str, start: int) -> None:
  """Appends `{commit, dirty, from_step}` for this session to `commits.jsonl`."""
  code = code_commit()
  if code is not None:
    with open(os.path.join(workdir, COMMITS_FILE), "a") as f:
      f.write(json.dumps(dict(code, from_step=int(start))) + "\n")


def read_commits(workdir: str) -> list[dict[str, Any]]:
  """The sessions `record_commit` logged in `workdir`, oldest first."""
  path = os.path.join(workdir, COMMITS_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def open_checkpoints(workdir: str, cfg: config_lib.CheckpointConfig,
                     ) -> Optional[checkpoint.Checkpointer]:
  """The run's `mipu_jax.checkpoint.Checkpointer`, or None when disabled."""
  if not cfg.enabled:
    _log.info("Checkpoints are disabled (checkpoint.enabled=False).")
    return None
  return checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"),
                                 max_to_keep=cfg.keep)


def should_save(step: int, num_steps: int, cfg: config_lib.CheckpointConfig) -> bool:
  """Every `cfg.every` steps (if > 0) and at the last step."""
  return step == num_steps or (cfg.every > 0 and step % cfg.every == 0)


class ConfigChangedError(ValueError):
  """A run was resumed with a config that changes what it computes."""


def check_config(saved: Mapping[str, Any], cfg: config_lib.TrainConfig, *,
                 allow_change: bool, workdir: str) -> dict[str, tuple]:
  """The differences between the checkpoint's config and `cfg` that matter.

  Args:
    saved: the config saved in the checkpoint (JSON).
    cfg: the config the run is resumed with.
    allow_change: differences are intended (`--allow_config_change`).
    workdir: the run directory (for the message).

  Returns:
    `{path: (saved, new)}`, empty if the resume is like the run.

  Raises:
    ConfigChangedError: there are differences and `allow_change` is False.
  """
  diff = config_lib.resume_differences(saved, cfg)
  if diff and not allow_change:
    lines = "\n".join(f"  {k}: {a!r} (saved) -> {b!r} (now)" for k, (a, b) in diff.items())
    raise ConfigChangedError(
        f"{workdir} holds a run with another config; resuming it with this one "
        f"would change what the run computes:\n{lines}\nUse the same config, "
        "another --workdir, or --allow_config_change to continue this run with "
        "the new settings (both configs are then kept and the step of the "
        "change recorded). Settings that may change on resume: "
        f"{', '.join(config_lib.RESUME_NEUTRAL)}.")
  return diff


def check_workdir(workdir: str, cfg: config_lib.TrainConfig, *, allow_change: bool,
                  param_shapes: Optional[Mapping[str, tuple[int, ...]]] = None) -> None:
  """Refuses a workdir that holds another run, before anything is built.

  The run it holds is read from its newest committed checkpoint (metadata and
  array shapes, no array data) or, before the first checkpoint, from its
  `config.json`. Refused: a config that differs in what the run computes
  (`check_config`), metadata without a config (another version of the
  library), and a checkpoint whose parameters have other shapes than
  `param_shapes` (another model under the same settings). A step that cannot
  be read at all is left to the restore, which moves it aside
  (docs/reliability.md).

  Raises:
    ConfigChangedError: another run's config (unless `allow_change`).
    ValueError: a workdir that is not a directory, an unreadable
      `config.json`, metadata of another version, parameters of other shapes.
  """
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"--workdir {workdir!r} is a file, not a directory.")
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if os.path.exists(ckpt_dir) and not os.path.isdir(ckpt_dir):
    raise ValueError(f"{ckpt_dir!r} is a file; a run keeps its checkpoints in a "
                     "directory of that name.")
  steps = checkpoint.committed_steps(ckpt_dir) if cfg.checkpoint.enabled else []
  for step in reversed(steps):
    try:
      meta, shapes = checkpoint.step_contents(ckpt_dir, step)
    except ValueError:
      continue  # damaged: the restore moves it aside and falls back
    where = f"checkpoint step {step} in {ckpt_dir}"
    version = meta.get("library_version", "an earlier one")
    if not isinstance(meta.get("config"), Mapping) or not isinstance(meta.get("step"), int):
      raise ValueError(
          f"{where} was written by another version of mipu_jax ({version}; this is "
          f"{mipu_jax.__version__}): its metadata has no run config or step "
          f"(keys: {sorted(meta)}). Use another --workdir, or that version to resume it.")
    try:
      check_config(meta["config"], cfg, allow_change=allow_change, workdir=workdir)
    except ConfigChangedError as e:
      if version != mipu_jax.__version__:
        raise ConfigChangedError(f"{e} (The checkpoint was written by mipu_jax "
                                 f"{version}; this is {mipu_jax.__version__}.)") from None
      raise
    if param_shapes is not None:
      saved = {k.split("/", 1)[1]: v for k, v in shapes.items() if k.startswith("params/")}
      if saved and saved != dict(param_shapes):
        diff = sorted(k for k in set(saved) | set(param_shapes)
                      if saved.get(k) != param_shapes.get(k))
        raise ValueError(
            f"{where} holds another model: its parameters differ from this run's in "
            f"{len(diff)} arrays, e.g. " + ", ".join(
                f"{k} {saved.get(k)} (saved) vs {param_shapes.get(k)} (now)"
                for k in diff[:3])
            + f". The config is the same: was model.init_from={cfg.model.init_from!r} "
            "replaced? Use another --workdir for this model.")
    return
  path = os.path.join(workdir, "config.json")
  if steps or not os.path.isfile(path):
    return
  try:
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{path} is not a run's config (not valid JSON: {e}); move it "
                     "away or use another --workdir.") from e
  if not isinstance(saved, Mapping):
    raise ValueError(f"{path} is not a run's config (a JSON {type(saved).__name__}, "
                     "not an object); move it away or use another --workdir.")
  check_config(saved, cfg, allow_change=allow_change, workdir=workdir)


def record_config(workdir: str, cfg: config_lib.TrainConfig, start: int,
                  diff: Mapping[str, tuple]) -> str:
  """Writes the run's config record; returns the path of the config in force.

  A fresh run (or a resume that changes nothing that matters) writes
  `config.json`. An intended change keeps `config.json` (the config of the
  run's first steps) and writes `config.from_step_<k+1>.json`, appending
  `{step, file, differences}` to `config_changes.json`.
  """
  text = json.dumps(config_lib.as_json(cfg), indent=2)
  path = os.path.join(workdir, "config.json")
  if diff:
    path = os.path.join(workdir, f"config.from_step_{start + 1}.json")
    changes_path = os.path.join(workdir, CHANGES_FILE)
    changes = []
    if os.path.exists(changes_path):
      with open(changes_path) as f:
        changes = json.load(f)
    changes.append({"step": start + 1, "file": os.path.basename(path),
                    "differences": {k: {"before": a, "after": b}
                                    for k, (a, b) in diff.items()}})
    with open(changes_path, "w") as f:
      json.dump(changes, f, indent=2)
    _log.warning("Config changed at step %d (intended): %s; both configs kept.",
                 start + 1, sorted(diff))
  with open(path, "w") as f:
    f.write(text)
  return path


def metrics_rows(path: str, start: int) -> list[dict[str, float]]:
  """The logged rows a run starting after step `start` keeps; repairs the file.

  Resume (`start > 0`): rows of steps `<= start` are kept; later ones (steps
  that run again) and a torn last line are dropped; the old file is kept as
  `metrics.jsonl.before_resume` and the caller rewrites the kept rows. Fresh
  start: an earlier attempt's file (killed before its first checkpoint) is
  moved to `metrics.jsonl.before_restart`; nothing is kept.
  """
  writer_lib.decompress_jsonl(path)  # a committed (compressed) run resumed
  if not os.path.exists(path):
    if start:
      _log.warning("Resuming at step %d without %s: earlier rows are lost.", start, path)
    return []
  if not start:
    os.replace(path, path + ".before_restart")
    _log.warning("Moved an earlier attempt's %s aside (.before_restart).", path)
    return []
  rows = [r for r in writer_lib.read_jsonl(path, repair=True) if r["step"] <= start]
  os.replace(path, path + ".before_resume")
  return rows


class NonFiniteStreak:
  """Counts consecutive RL steps with a skipped (non-finite) update.

  Args:
    limit: the streak at which the run stops (`learner.max_nonfinite_steps`).
    count: the streak so far (from the checkpoint on resume).
  """

  def __init__(self, limit: int, count: int = 0):
    self.limit, self.count = limit, count

  def update(self, step: int, metrics: Mapping[str, float],
             newest_checkpoint: Callable[[], str]) -> None:
    """Advances the streak with step `step`'s metrics.

    Args:
      step: the RL step.
      metrics: its metrics (`actor/nonfinite_skipped`).
      newest_checkpoint: describes the newest checkpoint (called only for
        the error message).

    Raises:
      FloatingPointError: the streak reached the limit.
    """
    skipped = metrics.get("actor/nonfinite_skipped", 0.0)
    self.count = self.count + 1 if skipped > 0 else 0
    if self.count >= self.limit:
      raise FloatingPointError(
          f"Step {step}: {self.count} consecutive RL steps had a non-finite loss "
          f"or gradient (learner.max_nonfinite_steps={self.limit}); their updates "
          "were skipped, so the parameters are those of the last finite update. "
          f"Stopping. The newest checkpoint is {newest_checkpoint()}. Look at "
          "rollout_corr/* (extreme IS weights), actor/grad_norm and the learning "
          "rate before resuming.")
