"""Pytree helpers of `mipu_jax.checkpoint` that do not touch orbax: per-leaf
fingerprints, typed PRNG keys as raw key data and back, abstract restore targets."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


def fingerprint(tree: PyTree) -> list[str]:
  """`"<dtype>:<32-bit hex>"` per leaf of `tree` (typed keys as key data).

  `sum_i f(word_i) · w_i mod 2^32` over each leaf's bits, with odd weights
  `w_i` that depend on the position: any change of a single word changes it,
  and so does a permutation. Computed where the arrays live (one jitted pass,
  sharded arrays included), so it costs little next to the save itself.
  """
  leaves = [jnp.asarray(x) for x in jax.tree.leaves(keys_to_data(tree))]
  sums = jax.device_get(_fingerprint_leaves(leaves))
  return [f"{x.dtype.name}:{int(v):08x}" for x, v in zip(leaves, sums)]


@jax.jit
def _fingerprint_leaves(leaves):
  out = []
  for x in leaves:
    if x.dtype == jnp.bool_:
      words = x.astype(jnp.uint32)
    elif x.dtype.itemsize == 4:
      words = jax.lax.bitcast_convert_type(x, jnp.uint32)
    elif x.dtype.itemsize in (1, 2):
      unsigned = jnp.uint8 if x.dtype.itemsize == 1 else jnp.uint16
      words = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
    else:  # 8-byte words: both halves (a new trailing axis).
      words = jax.lax.bitcast_convert_type(x, jnp.uint32)
    # Row-major positions, built per axis (no reshape: explicitly sharded
    # arrays keep their sharding).
    sharding = jax.typeof(words).sharding
    index, stride = jnp.zeros((), jnp.uint32), 1
    for axis in reversed(range(words.ndim)):
      index = index + jax.lax.broadcasted_iota(
          jnp.uint32, words.shape, axis, out_sharding=sharding) * jnp.uint32(stride % 2**32)
      stride *= words.shape[axis]
    weights = (index * jnp.uint32(0x9E3779B1) + jnp.uint32(0x7F4A7C15)) | jnp.uint32(1)
    mixed = words ^ (words >> jnp.uint32(15))
    out.append(jnp.sum(mixed * weights, dtype=jnp.uint32))
  return out


def is_typed_key(x: Any) -> bool:
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def keys_to_data(tree: PyTree) -> PyTree:
  return jax.tree.map(
      lambda x: jax.random.key_data(x) if is_typed_key(x) else x, tree)


def data_to_keys(tree: PyTree, target: PyTree) -> PyTree:
  def rewrap(x, t):
    if not is_typed_key(t):
      return x
    impl = (jax.random.key_impl(t) if isinstance(t, jax.Array)
            else _struct_key_impl(t))
    return jax.random.wrap_key_data(x, impl=impl)

  return jax.tree.map(rewrap, tree, target)


def _struct_key_impl(struct: jax.ShapeDtypeStruct):
  """The PRNG implementation of an abstract typed key, through public API only."""
  impls = []

  def probe(key):
    impls.append(jax.random.key_impl(key))
    return jax.random.key_data(key)

  jax.eval_shape(probe, struct)
  return impls[0]


def abstract_target(target: PyTree) -> PyTree:
  """Target leaves → `ShapeDtypeStruct`s with a sharding, keys → key data."""
  default = jax.sharding.SingleDeviceSharding(jax.devices()[0])

  def leaf(x):
    if isinstance(x, (int, float, np.number)) and not hasattr(x, "shape"):
      return x
    sharding = getattr(x, "sharding", None) or default
    if is_typed_key(x):
      data = jax.eval_shape(jax.random.key_data, x)
      return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  return jax.tree.map(leaf, target)
