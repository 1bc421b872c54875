"""Length-surge learning-rate schedule as an optax transformation (docs/method.md §6).

The length-decay LR scheduler of "Beyond Precision" (its §3.3, Algorithm 1): the rate stays at
``η_0`` until decay starts, then halves at every multiple of ``T_decay`` down to
``min_ratio · η_0``. ``T_decay`` is given (``fixed``; ``decay_period_from_surge`` makes it
``≈ 1.8 × t_surge`` from a measured surge step) or set online when the mean response length
first surges (``auto``, §6's detection, against the length ``surge_window`` steps earlier or
an EMA; a zero baseline never surges). Steps are RL steps counted from 1, the rate of step
``t`` set before it scales that step's updates; a rolled-back step still advances the state
(§6). The state is logged (``schedule_metrics``) and checkpointed with the optimizer's.
"""

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mipu_jax.schedules._scale import hold_unless_new_step
from mipu_jax.schedules._scale import scale_updates

_MODES = ("auto", "fixed")
_BASELINES = ("window", "ema")


def measured_surge_step(lengths: Sequence[float],
                        surge_ratio: float = 2.0) -> Optional[int]:
  """The RL step (counted from 1) at which a measured length curve surged.

  The paper reads the surge step off the uncorrected run's mean response
  length by eye (docs/method.md §6); made exact: the first step whose mean
  length is at least ``surge_ratio`` × the first step's. None if it never is
  (or the first length is not positive).

  Args:
    lengths: ``rollout/response_length_mean`` of steps 1, 2, ...
    surge_ratio: the surge factor (the ``auto`` detector's default, 2).
  """
  if not lengths or not lengths[0] > 0:
    return None
  for t, length in enumerate(lengths, start=1):
    if length >= surge_ratio * lengths[0]:
      return t
  return None


def decay_period_from_surge(surge_step: int, period_factor: float = 1.8) -> int:
  """``T_decay = max(round(period_factor · t_surge), 1)`` (docs/method.md §6),
  rounded like the ``auto`` detector (half to even)."""
  return max(int(np.round(period_factor * surge_step)), 1)


def fixed_rates(learning_rate: float, decay_period: int, num_steps: int,
                min_ratio: float = 0.1) -> np.ndarray:
  """The rate of each RL step 1 … ``num_steps`` in ``fixed`` mode, in closed form.

  Step ``t`` runs at ``max(η_0 · 2^-⌊t / T_decay⌋, min_ratio · η_0)``: the
  first halved step is ``T_decay`` itself (module docstring). What a
  constant-rate run must use to match the schedule's mean or floor
  (studies/configs/rows.py); tests/test_schedules.py checks it against the
  transformation's own rates.
  """
  if decay_period < 1 or num_steps < 1:
    raise ValueError(f"decay_period and num_steps must be >= 1, got {decay_period} "
                     f"and {num_steps}.")
  t = np.arange(1, num_steps + 1)
  return np.maximum(learning_rate * 0.5 ** (t // decay_period), min_ratio * learning_rate)


class LengthSurgeState(NamedTuple):
  """State of `length_surge` (docs/method.md §6); all leaves are scalars but one.

  Attributes:
    count: int32, RL steps so far; the next step is ``count + 1``.
    length_ema: float32, EMA of the mean response length (first step: its
      length).
    length_history_W: float32 ``[surge_window]`` ring buffer; slot
      ``(t - 1) % surge_window`` holds the length of step ``t``.
    surge_step: int32, step at which the surge was declared, -1 if none yet (in
      ``fixed`` mode: always -1).
    decay_period: int32, ``T_decay``; -1 while unknown (``auto`` before a
      surge).
    learning_rate: float32, the rate used by the last update (``η_0`` before
      any).
  """
  count: jax.Array
  length_ema: jax.Array
  length_history_W: jax.Array
  surge_step: jax.Array
  decay_period: jax.Array
  learning_rate: jax.Array


def _validate(learning_rate, mode, decay_period, surge_ratio, surge_window,
              min_steps, period_factor, min_ratio, ema_decay, baseline):
  if mode not in _MODES:
    raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
  if baseline not in _BASELINES:
    raise ValueError(f"baseline must be one of {_BASELINES}, got {baseline!r}")
  if mode == "fixed":
    if decay_period is None or int(decay_period) != decay_period:
      raise ValueError("mode='fixed' needs an integer decay_period, "
                       f"got {decay_period!r}")
    if decay_period < 1:
      raise ValueError(f"decay_period must be >= 1, got {decay_period}")
  elif decay_period is not None:
    raise ValueError("decay_period is only used with mode='fixed'; in 'auto' "
                     "mode it is period_factor * surge step")
  if not learning_rate > 0:
    raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
  if not 0 <= min_ratio <= 1:
    raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
  if not surge_ratio > 1:
    raise ValueError(f"surge_ratio must be > 1, got {surge_ratio}")
  if surge_window < 1 or min_steps < 1:
    raise ValueError("surge_window and min_steps must be >= 1, got "
                     f"{surge_window} and {min_steps}")
  if not period_factor > 0:
    raise ValueError(f"period_factor must be > 0, got {period_factor}")
  if not 0 <= ema_decay < 1:
    raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay}")


def length_surge(
    learning_rate: float,
    *,
    mode: str = "auto",
    decay_period: int | None = None,
    surge_ratio: float = 2.0,
    surge_window: int = 5,
    min_steps: int = 10,
    period_factor: float = 1.8,
    min_ratio: float = 0.1,
    ema_decay: float = 0.9,
    baseline: str = "window",
) -> optax.GradientTransformationExtraArgs:
  """Scales updates by the length-surge learning rate (docs/method.md §6).

  ``update(updates, state, params=None, *, response_length=None,
  new_step=True)`` takes the step's mean response length (a scalar) as an extra
  argument, and whether this update starts a new RL step (the schedule counts
  RL steps, docs/method.md §6; later updates of a step reuse its rate);
  ``optax.chain`` forwards both, so ``optax.chain(optax.scale_by_adam(), length_surge(lr),
  optax.scale(-1.0))`` is Adam under this schedule.

  Args:
    learning_rate: ``η_0``.
    mode: ``"auto"`` (detect the surge online; ``response_length`` required) or
      ``"fixed"`` (Algorithm 1 with the given ``decay_period``; the length is
      optional and only tracked for logging).
    decay_period: ``T_decay`` for ``fixed`` mode.
    surge_ratio: a length ``≥ surge_ratio ×`` the baseline is a surge.
    surge_window: how many steps back the ``"window"`` baseline looks.
    min_steps: no surge is declared before this step.
    period_factor: ``T_decay = round(period_factor · t_surge)`` (paper: 1.8).
    min_ratio: the floor ``η_∞ = min_ratio · η_0`` (paper: 0.1).
    ema_decay: decay of the length EMA.
    baseline: ``"window"`` or ``"ema"``, see the module docstring.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` with a `LengthSurgeState`.
  """
  _validate(learning_rate, mode, decay_period, surge_ratio, surge_window,
            min_steps, period_factor, min_ratio, ema_decay, baseline)
  floor = min_ratio * learning_rate

  def init_fn(params):
    del params
    return LengthSurgeState(
        count=jnp.zeros([], jnp.int32),
        length_ema=jnp.zeros([], jnp.float32),
        length_history_W=jnp.zeros([surge_window], jnp.float32),
        surge_step=jnp.full([], -1, jnp.int32),
        decay_period=jnp.full(
            [], decay_period if mode == "fixed" else -1, jnp.int32),
        learning_rate=jnp.asarray(learning_rate, jnp.float32),
    )

  def update_fn(updates, state, params=None, *, response_length=None,
                new_step=True, **extra_args):
    del params, extra_args
    if response_length is None and mode == "auto":
      raise ValueError(
          "length_surge(mode='auto') needs update(..., response_length=...)")
    step = state.count + 1  # Algorithm 1 counts steps from 1.
    surge_step, period = state.surge_step, state.decay_period

    if response_length is None:
      length_ema, history_W = state.length_ema, state.length_history_W
    else:
      length = jnp.asarray(response_length, jnp.float32).reshape([])
      length_ema = jnp.where(
          state.count == 0, length,
          ema_decay * state.length_ema + (1.0 - ema_decay) * length)
      slot = (step - 1) % surge_window
      if baseline == "window":
        base = state.length_history_W[slot]  # the length of step - window
        has_base = step > surge_window
      else:
        base = state.length_ema  # EMA of the steps before this one
        has_base = step > 1
      history_W = state.length_history_W.at[slot].set(length)
      if mode == "auto":
        is_surge = ((surge_step < 0) & (step >= min_steps) & has_base
                    & (base > 0) & (length >= surge_ratio * base))
        new_period = jnp.maximum(
            jnp.round(period_factor * step.astype(jnp.float32)), 1.0)
        surge_step = jnp.where(is_surge, step, surge_step)
        period = jnp.where(is_surge, new_period.astype(jnp.int32), period)

    at_boundary = (period > 0) & (step % jnp.maximum(period, 1) == 0)
    lr = jnp.where(at_boundary,
                   jnp.maximum(state.learning_rate / 2, floor),
                   state.learning_rate)
    new_state = LengthSurgeState(
        count=step,
        length_ema=length_ema,
        length_history_W=history_W,
        surge_step=surge_step,
        decay_period=period,
        learning_rate=lr,
    )
    return hold_unless_new_step(new_step, (scale_updates(updates, lr), new_state),
                                updates, state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
