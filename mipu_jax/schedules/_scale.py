"""Shared by the schedules: scaling updates by the current rate, and the step rule.

Every schedule counts **RL steps** (one batch of rollouts), not optimizer
updates (docs/method.md §6): with several mini-batches or PPO epochs per step,
the learner passes ``new_step=True`` with the first update of a step and
``False`` with the others, which reuse the rate in force and leave the state
alone. ``new_step`` defaults to True, so a plain optax loop (one update per
step) needs no extra argument.
"""

from typing import Any

import jax
import jax.numpy as jnp


def scale_updates(updates: Any, learning_rate: jax.Array) -> Any:
  """Multiplies every update leaf by ``learning_rate`` in the leaf's dtype."""
  return jax.tree.map(
      lambda u: jnp.asarray(learning_rate, dtype=u.dtype) * u, updates)


def hold_unless_new_step(new_step: Any, advanced: tuple[Any, Any],
                         updates: Any, state: Any) -> tuple[Any, Any]:
  """``advanced`` (the step's scaled updates and new state) on a new RL step.

  Otherwise the updates scaled by the rate in force (``state.learning_rate``)
  and the unchanged state: the rate changes only between RL steps.

  Args:
    new_step: bool (Python or traced scalar), this update starts an RL step.
    advanced: ``(scaled_updates, new_state)`` as if a step started here.
    updates: the incoming (unscaled) updates.
    state: the schedule state before this update.
  """
  if new_step is True:
    return advanced
  held = (scale_updates(updates, state.learning_rate), state)
  if new_step is False:
    return held
  new_step = jnp.asarray(new_step, bool)
  return jax.tree.map(lambda a, h: jnp.where(new_step, a, h), advanced, held)
