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
name but unreadable (a disk fault, a hand-edited file) is skipped by
`restore(step=None)`, which falls back to the newest step that restores.

Typed PRNG keys (`jax.random.key`) are stored as their raw `key_data` and
rewrapped on restore with the target's key implementation, so a state with a
typed `rng` leaf round-trips bitwise.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

PyTree = Any

_STATE = "state"
_METADATA = "metadata"


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
    args = ocp.args.Composite(**{
        _STATE: ocp.args.StandardSave(_keys_to_data(state)),
        _METADATA: ocp.args.JsonSave(metadata),
    })
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
        # files); any of them means "try the previous step".
        logging.warning("Skipping unreadable checkpoint step %d in %s: %r",
                        candidate, self._directory, e)
        newest_error = newest_error or e
    raise ValueError(
        f"No checkpoint in {self._directory} could be restored (steps {steps})."
    ) from newest_error

  def wait(self) -> None:
    """Blocks until the in-flight asynchronous save, if any, has committed."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for in-flight saves and releases orbax's resources."""
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def _restore_step(self, step: int, target: PyTree | None):
    state_args = ocp.args.StandardRestore(
        None if target is None else _abstract(target))
    restored = self._manager.restore(step, args=ocp.args.Composite(**{
        _STATE: state_args, _METADATA: ocp.args.JsonRestore()}))
    state = restored[_STATE]
    if target is not None:
      state = _data_to_keys(state, target)
    return state, dict(restored[_METADATA])


def _is_typed_key(x: Any) -> bool:
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _keys_to_data(tree: PyTree) -> PyTree:
  return jax.tree.map(
      lambda x: jax.random.key_data(x) if _is_typed_key(x) else x, tree)


def _data_to_keys(tree: PyTree, target: PyTree) -> PyTree:
  def rewrap(x, t):
    if not _is_typed_key(t):
      return x
    impl = (jax.random.key_impl(t) if isinstance(t, jax.Array)
            else _struct_key_impl(t))
    return jax.random.wrap_key_data(x, impl=impl)

  return jax.tree.map(rewrap, tree, target)


def _struct_key_impl(struct: jax.ShapeDtypeStruct):
  """The PRNG implementation of an abstract typed key, through public API only."""
  impls = []

  def probe(key):
    impls.append(jax.random.key_impl(key))
    return jax.random.key_data(key)

  jax.eval_shape(probe, struct)
  return impls[0]


def _abstract(target: PyTree) -> PyTree:
  """Target leaves → `ShapeDtypeStruct`s with a sharding, keys → key data."""
  default = jax.sharding.SingleDeviceSharding(jax.devices()[0])

  def leaf(x):
    if isinstance(x, (int, float, np.number)) and not hasattr(x, "shape"):
      return x
    sharding = getattr(x, "sharding", None) or default
    if _is_typed_key(x):
      data = jax.eval_shape(jax.random.key_data, x)
      return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  return jax.tree.map(leaf, target)
