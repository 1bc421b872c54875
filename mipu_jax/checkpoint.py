"""Resumable training checkpoints: the one module that calls orbax.

A checkpoint of step `n` holds two items: `state`, any pytree of arrays (learner
params, optimizer and schedule state, RNG keys, sampler weights, ...), and
`metadata`, a JSON object (config, data position, sampler-sync version, MIPU
counters, ...).

Atomicity: orbax writes step `n` into `n.orbax-checkpoint-tmp-*` and renames it
to `n` only after every file (and a commit marker) is written, so a process
killed at any point, mid-save included, leaves either a complete step or a tmp
directory. Tmp directories are never listed as steps; the next `Checkpointer`
on the directory deletes them in the background (done before its first save). A step directory that is complete by
name but unreadable (a disk fault, a torn copy, flipped bytes) is moved aside
by `restore(step=None)` into `<directory>.unreadable/<step>-<time>` (kept for
inspection, never listed as a step again, said in the log), which then falls
back to the newest step that restores; later saves of that step number work
as usual. Faults and what survives them: docs/reliability.md.

An `OSError` while saving (a full disk, an unwritable directory), raised by
`save` or by the background write (surfacing in `wait`, `close` or the next
`save`), becomes a `CheckpointWriteError` that names the newest intact step:
a failed save never touches the committed steps.

Typed PRNG keys (`jax.random.key`) are stored as their raw `key_data` and
rewrapped on restore with the target's key implementation, so a state with a
typed `rng` leaf round-trips bitwise (`_checkpoint_trees`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from mipu_jax._checkpoint_trees import abstract_target
from mipu_jax._checkpoint_trees import data_to_keys
from mipu_jax._checkpoint_trees import fingerprint
from mipu_jax._checkpoint_trees import keys_to_data

PyTree = Any

_STATE = "state"
_METADATA = "metadata"
_FINGERPRINT = "_state_fingerprint"


class CheckpointWriteError(OSError):
  """A checkpoint could not be written; the committed steps are untouched.

  Attributes:
    step: the step whose save failed (None when unknown: a background write).
    intact_step: the newest committed step, the one a rerun resumes from.
  """

  def __init__(self, message: str, *, err: int | None = None,
               step: int | None = None, intact_step: int | None = None):
    super().__init__(err, message)
    self.step = step
    self.intact_step = intact_step

  def __str__(self) -> str:
    return self.strerror


class FingerprintMismatch(ValueError):
  """Restored arrays differ from the fingerprint saved with them.

  The fingerprint is computed over the global arrays, so with several
  processes every process sees the same mismatch and they fall back together.
  """


class UnreadableCheckpointError(ValueError):
  """With several processes: a step that this process could not read.

  The step has been moved aside; every process's rerun skips it.
  """


def committed_steps(directory: str | os.PathLike[str]) -> list[int]:
  """The committed steps under `directory`, oldest first, by listing it.

  Orbax renames `<step>.orbax-checkpoint-tmp-*` to `<step>` only once the
  step is complete, so a step-named directory is committed. No orbax call and
  no collective: safe from a watchdog thread while another process is lost.
  """
  try:
    names = os.listdir(directory)
  except FileNotFoundError:
    return []
  return sorted(int(n) for n in names
                if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


class Checkpointer:
  """Saves and restores `(state, metadata)` per training step.

  Example:
    ckpt = Checkpointer(workdir + "/checkpoints", max_to_keep=3)
    if ckpt.latest_step() is not None:
      state, meta = ckpt.restore(target=abstract_state)
    ...
    ckpt.save(step, state, {"data_position": pos, "config": cfg.to_dict()})
    ...
    ckpt.close()  # waits for the last asynchronous save

  Args:
    directory: where step directories live; created if missing.
    max_to_keep: number of newest complete steps kept; older ones are deleted
      after a newer save commits. None keeps all.
    async_save: `save` returns once the jax arrays are copied to host memory
      and writes them in a background thread, so the next training step may
      donate the state's buffers. Numpy leaves are not copied: do not mutate
      them in place until `wait()`.
  """

  def __init__(self, directory: str | os.PathLike[str], *,
               max_to_keep: int | None = 3, async_save: bool = True):
    if max_to_keep is not None and max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}.")
    self._directory = os.path.abspath(os.fspath(directory))
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep,
        enable_async_checkpointing=async_save,
        # Deletes (in the background, awaited by the next save) tmp directories
        # that a killed save left behind.
        cleanup_tmp_directories=True,
        create=True,
    )
    self._manager = ocp.CheckpointManager(
        self._directory, options=options, item_names=(_STATE, _METADATA))

  @property
  def directory(self) -> str:
    return self._directory

  def all_steps(self) -> list[int]:
    """Committed steps, oldest first (in-flight and partial saves excluded)."""
    self._manager.reload()
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest committed step, or None if there is none."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: PyTree, metadata: Mapping[str, Any], *,
           force: bool = True) -> bool:
    """Starts saving `state` and `metadata` as step `step`.

    Args:
      step: training step; must be larger than every saved step.
      state: pytree of jax/numpy arrays and scalars (typed PRNG keys allowed).
      metadata: JSON-serialisable mapping.
      force: save even if a save of this step would otherwise be skipped by
        orbax's save-interval policy (we keep the default policy: every step).

    Returns:
      Whether a save was started.

    Raises:
      TypeError: `metadata` is not JSON-serialisable (checked now rather than
        in the background thread).
    """
    metadata = dict(metadata)
    try:
      json.dumps(metadata)
    except (TypeError, ValueError) as e:
      raise TypeError(f"Checkpoint metadata must be JSON-serialisable: {e}") from e
    data = keys_to_data(state)
    # Orbax stores array chunks without a checksum, so flipped bytes would
    # restore silently as other numbers: the fingerprint catches them.
    metadata[_FINGERPRINT] = fingerprint(data)
    args = ocp.args.Composite(**{
        _STATE: ocp.args.StandardSave(data),
        _METADATA: ocp.args.JsonSave(metadata),
    })
    with self._write_errors(int(step)):
      return self._manager.save(int(step), args=args, force=force)

  def restore(self, step: int | None = None, *,
              target: PyTree | None = None) -> tuple[PyTree, dict[str, Any]]:
    """Restores `(state, metadata)`.

    Args:
      step: step to restore; None restores the newest step that can be read,
        skipping (with a warning) committed steps that fail to restore.
      target: a pytree with the saved structure whose leaves are arrays or
        `jax.ShapeDtypeStruct`s; restored leaves take their dtype and
        sharding (a struct without a sharding lands on the default device).
        None restores the saved arrays as saved, typed keys as raw key data.

    Returns:
      The state and the metadata dict.

    Raises:
      FileNotFoundError: no committed step (or not `step`).
      ValueError: no committed step could be restored; chains the newest error.
    """
    self.wait()
    steps = self.all_steps()
    if step is not None:
      if step not in steps:
        raise FileNotFoundError(
            f"No committed checkpoint of step {step} in {self._directory}; "
            f"steps: {steps}.")
      return self._restore_step(step, target)
    if not steps:
      raise FileNotFoundError(f"No committed checkpoint in {self._directory}.")
    newest_error = None
    for candidate in reversed(steps):
      try:
        return self._restore_step(candidate, target)
      except Exception as e:  # pylint: disable=broad-except
        # Corruption surfaces as many error types (tensorstore, JSON, missing
        # files); any of them means "try the previous step". The step is moved
        # aside so that it is never picked again and a later save of the same
        # step number does not collide with it.
        if jax.process_count() > 1 and not isinstance(e, FingerprintMismatch):
          # A read error may be this process's alone (its own shards): falling
          # back here would leave the others restoring another step. Move the
          # step aside for every process's next attempt and stop the job.
          moved = self._move_aside(candidate, any_process=True)
          raise UnreadableCheckpointError(
              f"Checkpoint step {candidate} in {self._directory} cannot be read by "
              f"process {jax.process_index()} ({e!r}); moved it to {moved}. "
              "Stopping the job: rerun the same command on every process to "
              "resume from the newest step that remains.") from e
        newest_error = newest_error or e
        moved = self._move_aside(candidate)
        logging.warning(
            "Checkpoint step %d in %s cannot be restored (%r); moved it to %s "
            "and falling back to the previous step.", candidate, self._directory,
            e, moved)
    raise ValueError(
        f"No checkpoint in {self._directory} could be restored (steps {steps}; "
        f"moved to {self._directory}.unreadable)."
    ) from newest_error

  def wait(self) -> None:
    """Blocks until the in-flight asynchronous save, if any, has committed.

    Raises:
      CheckpointWriteError: the background write failed with an `OSError`.
    """
    with self._write_errors(None):
      self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for in-flight saves and releases orbax's resources.

    Resources are released even when the last write failed (then
    `CheckpointWriteError` is raised afterwards).
    """
    try:
      self.wait()
    finally:
      self._manager.close()

  @contextlib.contextmanager
  def _write_errors(self, step: int | None):
    """`OSError` (full disk, read-only directory, ...) → `CheckpointWriteError`."""
    try:
      yield
    except CheckpointWriteError:
      raise
    except OSError as e:
      intact = self._committed_steps_safe()
      what = f"step {step}" if step is not None else "the last checkpoint"
      raise CheckpointWriteError(
          f"Could not write {what} to {self._directory}: {write_error_reason(e)}. "
          + (f"The newest intact checkpoint is step {intact[-1]}: free space (or "
             f"fix the directory) and rerun the same command to resume from it."
             if intact else "No checkpoint of this run is committed yet."),
          err=e.errno, step=step, intact_step=intact[-1] if intact else None,
      ) from e

  def _committed_steps_safe(self) -> list[int]:
    try:
      return self.all_steps()
    except Exception:  # pylint: disable=broad-except
      return []

  def _move_aside(self, step: int, *, any_process: bool = False) -> str | None:
    """Renames unreadable step `step` out of the step namespace; its new path.

    With several processes (one shared directory) only process 0 renames,
    unless `any_process` (a fault only this process sees).
    """
    src = os.path.join(self._directory, str(step))
    aside = self._directory.rstrip(os.sep) + ".unreadable"
    if jax.process_count() > 1 and not any_process:
      # Every process found the step unreadable (a global fingerprint): process
      # 0 moves it, and no process goes on (to save that step number again)
      # before the move is done and its manager has forgotten the step.
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      dst = self._move(src, aside, step) if jax.process_index() == 0 else aside
      multihost_utils.sync_global_devices(f"mipu_jax_move_aside_{step}")
      self._manager.reload()
      return dst
    if not os.path.exists(src):
      return None
    dst = self._move(src, aside, step)
    self._manager.reload()
    return dst

  @staticmethod
  def _move(src: str, aside: str, step: int) -> str | None:
    if not os.path.exists(src):
      return None
    os.makedirs(aside, exist_ok=True)
    dst = os.path.join(aside, f"{step}-{time.strftime('%Y%m%dT%H%M%S')}")
    suffix = 0
    while os.path.exists(dst + (f".{suffix}" if suffix else "")):
      suffix += 1
    dst += f".{suffix}" if suffix else ""
    try:
      os.replace(src, dst)
    except FileNotFoundError:  # another process moved it first
      pass
    return dst

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def _restore_step(self, step: int, target: PyTree | None):
    metadata = dict(self._manager.restore(step, args=ocp.args.Composite(**{
        _METADATA: ocp.args.JsonRestore()}))[_METADATA])
    expected = metadata.pop(_FINGERPRINT, None)
    wanted = None if target is None else abstract_target(target)
    abstract = wanted
    if abstract is not None and expected is not None:
      # Restored as saved, checked, then cast to the target's dtypes.
      leaves, treedef = jax.tree.flatten(abstract)
      if len(leaves) == len(expected):
        abstract = jax.tree.unflatten(treedef, [
            jax.ShapeDtypeStruct(a.shape, jnp.dtype(e.split(":")[0]), sharding=a.sharding)
            if isinstance(a, jax.ShapeDtypeStruct) else a
            for a, e in zip(leaves, expected)])
    state = self._manager.restore(step, args=ocp.args.Composite(**{
        _STATE: ocp.args.StandardRestore(abstract)}))[_STATE]
    if expected is not None and fingerprint(state) != expected:
      raise FingerprintMismatch(f"checkpoint step {step}: the restored arrays do not match "
                       f"the fingerprint saved with them (corrupted data).")
    if target is not None:
      state = jax.tree.map(
          lambda x, w: x.astype(w.dtype) if hasattr(w, "dtype") and x.dtype != w.dtype
          else x, state, wanted)
      state = data_to_keys(state, target)
    return state, metadata


def step_contents(directory: str | os.PathLike[str], step: int,
                  ) -> tuple[dict[str, Any], dict[str, tuple[int, ...]]]:
  """`(metadata, {array path: shape})` of a committed step, no array read.

  What a resume checks before it builds anything (`mipu_jax.rl.resume`):
  which run and which model wrote the step. Paths join the state's keys with
  "/" (`params/embed`).

  Raises:
    ValueError: the step's metadata or array index cannot be read (a damaged
      step: the restore moves it aside).
  """
  # Not creating the directory: no barrier among processes.
  manager = ocp.CheckpointManager(
      os.fspath(directory), options=ocp.CheckpointManagerOptions(create=False),
      item_handlers={_STATE: ocp.StandardCheckpointHandler(),
                     _METADATA: ocp.JsonCheckpointHandler()})
  try:
    metadata = dict(manager.restore(step, args=ocp.args.Composite(**{
        _METADATA: ocp.args.JsonRestore()}))[_METADATA])
    tree = manager.item_metadata(step)[_STATE]
    flat = jax.tree_util.tree_flatten_with_path(getattr(tree, "tree", tree))[0]
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"checkpoint step {step} in {directory} cannot be read ({e!r}).") from e
  finally:
    manager.close()
  metadata.pop(_FINGERPRINT, None)
  shapes = {"/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in p): tuple(m.shape)
            for p, m in flat if hasattr(m, "shape")}
  return metadata, shapes


def write_error_reason(e: OSError) -> str:
  """Why a write failed, in words ("no space left on the device" for ENOSPC)."""
  if e.errno == errno.ENOSPC:
    return "no space left on the device"
  return e.strerror or str(e) or type(e).__name__
