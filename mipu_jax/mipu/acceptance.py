"""MIPU Step 2's decision and the rollback it implies (docs/method.md §5).

Rollback is a *functional select over the learner state*, not an optax
wrapper: the caller keeps the pre-update trees (parameters, optimizer state,
sampler weights), computes the candidate ones, and keeps either with
`select_tree`. One primitive then rolls back every piece of state alike,
including the sampler's quantized weights, which no optimizer wrapper would
see. The caller must not donate the pre-update buffers to the update step,
since a rollback needs them. `resolve_update` applies it to a learner state:
parameters and optimizer moments roll back, while the update counter, the RNG
and the learning-rate schedule's state advance either way (docs/method.md
§5–6: the sampler did produce the rejected step's responses).
"""

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from mipu_jax import schedules

DEFAULT_C = 1e-4
"""Default acceptance margin ``c``. The source shows curves for c ∈ {0, ±1e-4}
but does not publish the value it used (docs/method.md §5); it is a config
value."""


def margin(c: float = DEFAULT_C, gap_se: Optional[jax.Array] = None,
           noise_multiple: Optional[float] = None) -> jax.Array:
  """The acceptance margin: ``c``, or ``noise_multiple · SE(T̂_post)``.

  At small scale the probe's noise dwarfs any fixed ``c`` (a fixed margin then
  decides on the sign of noise); scaling the margin by the standard error
  measured on the same probe makes Step 2 reject only gaps that are
  significantly negative.

  Args:
    c: the fixed margin, used when ``noise_multiple`` is None.
    gap_se: the standard error of ``T̂_post`` (`gap_post`'s
      ``mipu/gap_post_se``); needed with ``noise_multiple``.
    noise_multiple: ``k`` in ``c = k · SE``, or None for the fixed ``c``.

  Returns:
    A float32 scalar.
  """
  if noise_multiple is None:
    return jnp.asarray(c, jnp.float32)
  if gap_se is None:
    raise ValueError("a noise-scaled margin needs gap_se.")
  return noise_multiple * jnp.asarray(gap_se, jnp.float32)


def accept(t_post: jax.Array, c: float | jax.Array = DEFAULT_C) -> jax.Array:
  """Accept the candidate iff ``T̂_post ≥ -c`` (docs/method.md §5).

  A NaN ``T̂_post`` compares false and so rolls back, the safe side.

  Returns:
    A boolean scalar array.
  """
  return jnp.asarray(t_post) >= -jnp.asarray(c)


def random_accept(key: jax.Array, p: float | jax.Array) -> jax.Array:
  """Random-rollback baseline: reject with probability ``p`` (docs/method.md §5).

  Args:
    key: a PRNG key, used once.
    p: rejection probability, e.g. the rollback rate MIPU measured on the same
      run.

  Returns:
    A boolean scalar, ``True`` (accept) with probability ``1 - p``.
  """
  return jnp.logical_not(jax.random.bernoulli(key, p))


def select_tree(accepted: bool | jax.Array, new_tree: Any, old_tree: Any) -> Any:
  """``new_tree`` if ``accepted`` else ``old_tree``, leaf by leaf, bitwise.

  A host decision (a Python bool) returns the chosen tree itself, so a rollback
  costs no copy (the state of a 4B model is tens of GB). A traced decision
  uses ``jnp.where``, which on equal dtypes is a bitwise select (NaN payloads,
  signed zeros and typed PRNG keys come through unchanged).

  Args:
    accepted: a Python bool or a boolean scalar array.
    new_tree: the candidate state.
    old_tree: the state before the update; same structure, shapes and dtypes.

  Returns:
    A tree with the structure of ``new_tree``.
  """
  if jax.tree.structure(new_tree) != jax.tree.structure(old_tree):
    raise ValueError("new_tree and old_tree have different structures.")

  def check(new, old):
    if jnp.shape(new) != jnp.shape(old) or jnp.result_type(new) != jnp.result_type(old):
      raise ValueError(f"leaf mismatch: {jnp.result_type(new)}{list(jnp.shape(new))} "
                       f"vs {jnp.result_type(old)}{list(jnp.shape(old))}")

  jax.tree.map(check, new_tree, old_tree)
  if isinstance(accepted, bool):
    return new_tree if accepted else old_tree
  accepted = jnp.asarray(accepted)
  if accepted.shape or accepted.dtype != jnp.bool_:
    raise ValueError(f"accepted must be a boolean scalar, got "
                     f"{accepted.dtype}{list(accepted.shape)}")
  return jax.tree.map(lambda new, old: jnp.where(accepted, new, old),
                      new_tree, old_tree)


class _State(NamedTuple):
  """What `resolve_update` needs of a learner state (`LearnerState` fits)."""
  params: Any
  opt_state: Any
  step: Any
  rng: Any


def resolve_update(accepted: bool | jax.Array, candidate: _State,
                   previous: _State) -> _State:
  """The state to continue from after Step 2's (or a coin's) decision.

  Accepted: the candidate. Rejected: the previous parameters and optimizer
  moments, bitwise (`select_tree`), with the candidate's update counter, RNG
  and learning-rate schedule state (docs/method.md §5–6).

  Args:
    accepted: a Python bool or a boolean scalar.
    candidate: the state after the update (a `LearnerState`).
    previous: the state before it (its buffers not donated).

  Returns:
    A state of the candidate's type.
  """
  params = select_tree(accepted, candidate.params, previous.params)
  opt_state = resolve_opt_state(accepted, candidate.opt_state, previous.opt_state)
  return candidate._replace(params=params, opt_state=opt_state)


def resolve_opt_state(accepted: bool | jax.Array, candidate: Any, previous: Any) -> Any:
  """The optimizer state after a decision on an update: the candidate's if
  accepted; otherwise the previous moments and counts (bitwise) with the
  candidate's learning-rate schedule state, which counts every RL step the
  sampler saw, rejected ones included (docs/method.md §6).

  Used by Step 2's rollback (`resolve_update`); the learner's skip of a
  non-finite update keeps the schedule's state the same way
  (`schedules.keep_schedule_state`, docs/reliability.md).
  """
  return schedules.keep_schedule_state(select_tree(accepted, candidate, previous), candidate)
