"""Shared by the schedules: scaling updates by the current rate."""

from typing import Any

import jax
import jax.numpy as jnp


def scale_updates(updates: Any, learning_rate: jax.Array) -> Any:
  """Multiplies every update leaf by ``learning_rate`` in the leaf's dtype."""
  return jax.tree.map(
      lambda u: jnp.asarray(learning_rate, dtype=u.dtype) * u, updates)
