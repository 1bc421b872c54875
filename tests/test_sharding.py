"""Sharding: 8 fake devices equal 1 device; Qwen3-4B lowers on an 8-device mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mipu_jax import models
from mipu_jax.models import sharding


def _loss(model, tokens_BT):
  logits = model(tokens_BT).logits
  lp = models.token_logprobs(logits[:, :-1], tokens_BT[:, 1:])
  return -jnp.mean(lp)


@pytest.mark.parametrize("mesh_shape", [(1, 8, 1), (2, 2, 2), (1, 2, 4)])
def test_eight_devices_equal_one(mesh_shape):
  assert jax.device_count() == 8
  # One layer: each layer is sharded alike (the stacked axis is not split).
  cfg = models.get_config("tiny", vocab_size=96, num_heads=8, num_kv_heads=4, num_layers=1)
  mesh = models.make_mesh(*mesh_shape)
  m8 = models.init_sharded(lambda: models.Qwen3(cfg, rngs=nnx.Rngs(3)), mesh)
  m1 = models.Qwen3(cfg, rngs=nnx.Rngs(3))
  assert m8.layers.gate[...].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  # Initialising sharded gives the same parameters as unsharded (up to jit's
  # fusion of the init scale, ~1 ulp).
  for a, b in zip(jax.tree.leaves(nnx.state(m8)), jax.tree.leaves(nnx.state(m1))):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-8)
  # Use identical parameters for the forward/backward comparison.
  nnx.update(m1, jax.device_get(nnx.state(m8)))
  tokens = jax.random.randint(jax.random.key(0), (8, 11), 0, 96)
  grad_fn = nnx.jit(nnx.value_and_grad(_loss))
  l8, g8 = grad_fn(m8, jax.device_put(tokens, models.batch_sharding(mesh)))
  l1, g1 = grad_fn(m1, tokens)
  np.testing.assert_allclose(float(l8), float(l1), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g8), jax.tree.leaves(g1)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_sampling_layout_has_no_fsdp():
  mesh = models.make_mesh(1, 4, 2)
  spec = sharding.spec_for("layers/q", (2, 64, 8, 16), mesh, "sampling")
  assert spec == jax.sharding.PartitionSpec(None, None, "tensor", None)
  # A dimension the mesh axis does not divide stays unsharded.
  assert sharding.spec_for("layers/k", (2, 64, 3, 16), mesh) == jax.sharding.PartitionSpec(
      None, "fsdp", None, None)
  with pytest.raises(ValueError, match="Unknown layout"):
    sharding.spec_for("embed", (8, 8), mesh, "serve")
  with pytest.raises(ValueError, match="needs 6 devices"):
    models.make_mesh(1, 3, 2)


def test_qwen3_4b_forward_backward_lowers_on_fake_mesh():
  cfg = models.get_config("qwen3_4b", remat=True)
  mesh = models.make_mesh(data=1, fsdp=4, tensor=2)
  graphdef, abstract = sharding.abstract_model(lambda: models.Qwen3(cfg, rngs=nnx.Rngs(0)), mesh)
  per_device = sharding.per_device_bytes(abstract)
  total = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(abstract))
  print(f"\nqwen3_4b fp32 params: {total / 2**30:.2f} GiB total, "
        f"{per_device / 2**30:.2f} GiB per device on mesh {dict(mesh.shape)}")
  assert per_device < total / 7

  def loss(params, tokens):
    model = nnx.merge(graphdef, params)
    return _loss(model, tokens)

  tokens = jax.ShapeDtypeStruct((8, 64), jnp.int32, sharding=models.batch_sharding(mesh))
  lowered = jax.jit(jax.value_and_grad(loss)).lower(abstract, tokens)
  text = lowered.as_text()
  assert "dot_general" in text and "sharding" in text
