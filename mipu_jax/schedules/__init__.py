"""Learning-rate schedules as optax transformations (docs/method.md §6).

Each one multiplies incoming updates by its current rate and accepts the
step's mean response length as the extra argument ``response_length=``; they
count RL steps, so a learner making several updates per step passes
``new_step=`` (True on the step's first update)::

  tx = optax.chain(optax.scale_by_adam(), length_surge(1e-6),
                   optax.scale(-1.0))
  updates, state = tx.update(grads, state, params, response_length=length)
"""

from mipu_jax.schedules.baselines import constant
from mipu_jax.schedules.baselines import cosine
from mipu_jax.schedules.baselines import ScheduleState
from mipu_jax.schedules.factory import current_learning_rate
from mipu_jax.schedules.factory import find_schedule_state
from mipu_jax.schedules.factory import has_schedule_state
from mipu_jax.schedules.factory import keep_schedule_state
from mipu_jax.schedules.factory import make_schedule
from mipu_jax.schedules.factory import replace_schedule_state
from mipu_jax.schedules.factory import schedule_metrics
from mipu_jax.schedules.length_surge import decay_period_from_surge
from mipu_jax.schedules.length_surge import length_surge
from mipu_jax.schedules.length_surge import fixed_rates
from mipu_jax.schedules.length_surge import measured_surge_step
from mipu_jax.schedules.length_surge import LengthSurgeState

__all__ = [
    "LengthSurgeState",
    "ScheduleState",
    "constant",
    "cosine",
    "current_learning_rate",
    "decay_period_from_surge",
    "find_schedule_state",
    "has_schedule_state",
    "keep_schedule_state",
    "length_surge",
    "make_schedule",
    "measured_surge_step",
    "replace_schedule_state",
    "schedule_metrics",
]
