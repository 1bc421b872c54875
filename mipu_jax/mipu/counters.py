"""Running MIPU counters and their metrics (docs/method.md §5)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp


class MipuCounters(NamedTuple):
  """int32 scalars, checkpointed with the run.

  Attributes:
    num_candidates: candidate updates judged so far.
    num_accepted: of those, accepted.
    num_rollbacks: of those, rolled back.
  """
  num_candidates: jax.Array
  num_accepted: jax.Array
  num_rollbacks: jax.Array


def init_counters() -> MipuCounters:
  """All counters at zero."""
  zero = jnp.zeros([], jnp.int32)
  return MipuCounters(zero, zero, zero)


def update_counters(counters: MipuCounters,
                    accepted: jax.Array) -> MipuCounters:
  """Counts one candidate, accepted or rolled back."""
  accepted = jnp.asarray(accepted, jnp.int32)
  return MipuCounters(
      num_candidates=counters.num_candidates + 1,
      num_accepted=counters.num_accepted + accepted,
      num_rollbacks=counters.num_rollbacks + (1 - accepted),
  )


def rollback_rate(counters: MipuCounters) -> jax.Array:
  """Running fraction of candidates rolled back (0 before any)."""
  return (counters.num_rollbacks.astype(jnp.float32)
          / jnp.maximum(counters.num_candidates, 1).astype(jnp.float32))


def counter_metrics(counters: MipuCounters,
                    accepted: jax.Array) -> dict[str, jax.Array]:
  """``mipu/accepted`` (this step, 0/1) and ``mipu/rollback_rate`` (running)."""
  return {
      "mipu/accepted": jnp.asarray(accepted, jnp.float32),
      "mipu/rollback_rate": rollback_rate(counters),
  }
