"""Constant and cosine learning rates, the baselines of docs/method.md §6.

They are the same kind of transformation as `length_surge`: they multiply the
incoming updates by the current rate, keep it in their state (logged and
checkpointed), count RL steps from 1 (``new_step=``, see `_scale`), and accept
(and ignore) the ``response_length=`` extra argument, so a config can swap schedules without
touching the training step.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from mipu_jax.schedules._scale import hold_unless_new_step
from mipu_jax.schedules._scale import scale_updates


class ScheduleState(NamedTuple):
  """State of `constant` and `cosine`.

  Attributes:
    count: int32, RL steps so far; the next step is ``count + 1``.
    learning_rate: float32, the rate used by the last update (the step-1 rate
      before any).
  """
  count: jax.Array
  learning_rate: jax.Array


def _from_rate_fn(rate_fn) -> optax.GradientTransformationExtraArgs:
  """Wraps ``rate_fn(step) -> rate`` (step from 1) as a transformation."""

  def init_fn(params):
    del params
    return ScheduleState(count=jnp.zeros([], jnp.int32),
                         learning_rate=rate_fn(jnp.ones([], jnp.int32)))

  def update_fn(updates, state, params=None, *, response_length=None,
                new_step=True, **extra_args):
    del params, response_length, extra_args
    step = state.count + 1
    lr = rate_fn(step)
    advanced = (scale_updates(updates, lr),
                ScheduleState(count=step, learning_rate=lr))
    return hold_unless_new_step(new_step, advanced, updates, state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def constant(learning_rate: float) -> optax.GradientTransformationExtraArgs:
  """Scales updates by a constant ``learning_rate``."""
  if not learning_rate > 0:
    raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
  return _from_rate_fn(
      lambda step: jnp.asarray(learning_rate, jnp.float32))


def cosine(
    learning_rate: float,
    total_steps: int,
    warmup: int = 0,
    min_ratio: float = 0.1,
) -> optax.GradientTransformationExtraArgs:
  """Linear warmup then cosine decay to ``min_ratio · learning_rate``.

  Step ``t`` (from 1) gets ``η_0 · t / warmup`` for ``t ≤ warmup``, then
  ``η_∞ + (η_0 - η_∞) · (1 + cos(π · f)) / 2`` with
  ``f = min((t - warmup) / (total_steps - warmup), 1)``: the floor
  ``η_∞ = min_ratio · η_0`` is reached at ``total_steps`` and kept.

  Args:
    learning_rate: peak rate ``η_0``.
    total_steps: step at which the floor is reached.
    warmup: number of warmup steps (0: none).
    min_ratio: ``η_∞ / η_0``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` with a `ScheduleState`.
  """
  if not learning_rate > 0:
    raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
  if not 0 <= warmup < total_steps:
    raise ValueError(f"need 0 <= warmup < total_steps, got {warmup}, "
                     f"{total_steps}")
  if not 0 <= min_ratio <= 1:
    raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
  floor = min_ratio * learning_rate

  def rate_fn(step):
    t = step.astype(jnp.float32)
    warm = learning_rate * t / max(warmup, 1)
    frac = jnp.clip((t - warmup) / (total_steps - warmup), 0.0, 1.0)
    decayed = floor + (learning_rate - floor) * 0.5 * (
        1 + jnp.cos(jnp.pi * frac))
    return jnp.where(t <= warmup, warm, decayed).astype(jnp.float32)

  return _from_rate_fn(rate_fn)
