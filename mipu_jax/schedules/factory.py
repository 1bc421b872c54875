"""Picking a schedule by name and reading it back for logging (docs/method.md §6)."""

from typing import Any

import jax
import optax

from mipu_jax.schedules.baselines import constant
from mipu_jax.schedules.baselines import cosine
from mipu_jax.schedules.baselines import ScheduleState
from mipu_jax.schedules.length_surge import length_surge
from mipu_jax.schedules.length_surge import LengthSurgeState

_FACTORIES = {
    "constant": constant,
    "cosine": cosine,
    "length_surge": length_surge,
}
_STATE_TYPES = (LengthSurgeState, ScheduleState)


def make_schedule(name: str, learning_rate: float,
                  **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """Builds the schedule ``name`` (``constant``, ``cosine``, ``length_surge``).

  Args:
    name: schedule name.
    learning_rate: ``η_0``.
    **kwargs: the schedule's own keyword arguments (e.g. ``mode``,
      ``decay_period`` for ``length_surge``; ``total_steps``, ``warmup``,
      ``min_ratio`` for ``cosine``).

  Returns:
    The schedule transformation; place it in an ``optax.chain`` after the
    preconditioner and before ``optax.scale(-1.0)``.
  """
  if name not in _FACTORIES:
    raise ValueError(f"unknown schedule {name!r}; known: {sorted(_FACTORIES)}")
  return _FACTORIES[name](learning_rate, **kwargs)


def find_schedule_state(opt_state: Any) -> LengthSurgeState | ScheduleState:
  """Returns the (single) schedule state inside an optimizer state.

  Args:
    opt_state: a schedule state itself or any pytree holding exactly one (e.g.
      the state of an ``optax.chain``).

  Raises:
    ValueError: if there is no schedule state or more than one.
  """
  found = [x for x in jax.tree.leaves(opt_state, is_leaf=_is_schedule_state)
           if _is_schedule_state(x)]
  if len(found) != 1:
    raise ValueError(f"expected one schedule state, found {len(found)}")
  return found[0]


def _is_schedule_state(x: Any) -> bool:
  return isinstance(x, _STATE_TYPES)


def has_schedule_state(opt_state: Any) -> bool:
  """Whether ``opt_state`` holds a schedule state (see `find_schedule_state`)."""
  return any(_is_schedule_state(x)
             for x in jax.tree.leaves(opt_state, is_leaf=_is_schedule_state))


def replace_schedule_state(opt_state: Any, schedule_state: Any) -> Any:
  """``opt_state`` with its (single) schedule state replaced by ``schedule_state``.

  A MIPU / random rollback restores the optimizer's moments but keeps the
  schedule state of the rejected step (docs/method.md §5–6).

  Raises:
    ValueError: as `find_schedule_state`, or a replacement of another type.
  """
  old = find_schedule_state(opt_state)
  if type(schedule_state) is not type(old):
    raise ValueError(f"schedule state type {type(schedule_state).__name__} "
                     f"does not match {type(old).__name__}")
  return jax.tree.map(lambda x: schedule_state if _is_schedule_state(x) else x,
                      opt_state, is_leaf=_is_schedule_state)


def keep_schedule_state(opt_state: Any, candidate: Any) -> Any:
  """`opt_state` with `candidate`'s learning-rate schedule state: the schedule
  counts every RL step, an update rolled back or skipped included
  (docs/method.md §6)."""
  if has_schedule_state(candidate):
    return replace_schedule_state(opt_state, find_schedule_state(candidate))
  return opt_state


def current_learning_rate(opt_state: Any) -> jax.Array:
  """The rate in force: the one the schedule used for its last RL step."""
  return find_schedule_state(opt_state).learning_rate


def schedule_metrics(opt_state: Any) -> dict[str, jax.Array]:
  """Scalars to log under ``schedule/`` (rate; length EMA, surge, period)."""
  state = find_schedule_state(opt_state)
  metrics = {"schedule/learning_rate": state.learning_rate}
  if isinstance(state, LengthSurgeState):
    metrics.update({
        "schedule/length_ema": state.length_ema,
        "schedule/surge_step": state.surge_step,
        "schedule/decay_period": state.decay_period,
    })
  return metrics
