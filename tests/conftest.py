"""Test-wide setup: 8 fake CPU devices (before JAX initialises) and strict rank promotion."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402  (must follow the XLA_FLAGS above)

jax.config.update("jax_numpy_rank_promotion", "raise")
