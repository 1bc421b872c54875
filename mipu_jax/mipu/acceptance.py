"""MIPU Step 2's decision and the rollback it implies (SPEC.md §5).

Rollback is a *functional select over the learner state*, not an optax
wrapper: the caller keeps the pre-update trees (parameters, optimizer state
with the schedule state inside it, sampler weights), computes the candidate
ones, and keeps either with `select_tree`. One primitive then rolls back every
piece of state alike, including the sampler's quantized weights, which no
optimizer wrapper would see. The caller must not donate the pre-update buffers
to the update step, since a rollback needs them. Step counter, data position
and RNG are not passed through the select: they advance either way.
"""

from typing import Any

import jax
import jax.numpy as jnp

DEFAULT_C = 1e-4
"""Default acceptance margin ``c``. The source shows curves for c ∈ {0, ±1e-4}
but does not publish the value it used (SPEC.md §5); it is a config value."""


def accept(t_post: jax.Array, c: float = DEFAULT_C) -> jax.Array:
  """Accept the candidate iff ``T̂_post ≥ -c`` (SPEC.md §5).

  A NaN ``T̂_post`` compares false and so rolls back, the safe side.

  Returns:
    A boolean scalar array.
  """
  return jnp.asarray(t_post) >= -c


def random_accept(key: jax.Array, p: float | jax.Array) -> jax.Array:
  """Random-rollback baseline: reject with probability ``p`` (SPEC.md §5).

  Args:
    key: a PRNG key, used once.
    p: rejection probability, e.g. the rollback rate MIPU measured on the same
      run.

  Returns:
    A boolean scalar, ``True`` (accept) with probability ``1 - p``.
  """
  return jnp.logical_not(jax.random.bernoulli(key, p))


def select_tree(accepted: jax.Array, new_tree: Any, old_tree: Any) -> Any:
  """``new_tree`` if ``accepted`` else ``old_tree``, leaf by leaf, bitwise.

  ``jnp.where`` on equal dtypes is a bitwise select (NaN payloads, signed
  zeros and typed PRNG keys come through unchanged), so a rollback returns the
  state exactly to its pre-update bits.

  Args:
    accepted: boolean scalar.
    new_tree: the candidate state.
    old_tree: the state before the update; same structure, shapes and dtypes.

  Returns:
    A tree with the structure of ``new_tree``.
  """
  accepted = jnp.asarray(accepted)
  if accepted.shape or accepted.dtype != jnp.bool_:
    raise ValueError(f"accepted must be a boolean scalar, got "
                     f"{accepted.dtype}{list(accepted.shape)}")

  def select(new, old):
    new, old = jnp.asarray(new), jnp.asarray(old)
    if new.shape != old.shape or new.dtype != old.dtype:
      raise ValueError(f"leaf mismatch: {new.dtype}{list(new.shape)} vs "
                       f"{old.dtype}{list(old.shape)}")
    return jnp.where(accepted, new, old)

  return jax.tree.map(select, new_tree, old_tree)
