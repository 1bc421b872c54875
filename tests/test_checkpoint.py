"""Checkpointer: bitwise round trips, keep-last-N, shardings, partial and corrupt steps."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from mipu_jax.checkpoint import Checkpointer


def _state(seed: int = 0):
  rng = np.random.default_rng(seed)
  return {
      "params": {
          "w_7x3": jnp.asarray(rng.standard_normal((7, 3)), jnp.float32),
          "b_bf16_5": jnp.asarray(rng.standard_normal(5), jnp.bfloat16),
      },
      "count": jnp.asarray(rng.integers(-2**31, 2**31 - 1, (3,)), jnp.int32),
      "rng_data": jax.random.key_data(jax.random.key(seed)),
      "rng": jax.random.key(seed + 1),
      "step": jnp.asarray(seed, jnp.int32),
  }


def _assert_bitwise_equal(a, b):
  leaves_a, tree_a = jax.tree.flatten(a)
  leaves_b, tree_b = jax.tree.flatten(b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      assert jax.random.key_impl(x) == jax.random.key_impl(y)
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    x, y = np.asarray(x), np.asarray(y)
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("async_save", [True, False])
def test_round_trip_is_bitwise(tmp_path, async_save):
  state = _state(3)
  meta = {"config": {"lr": 1e-3, "name": "tiny"}, "data_position": 17,
          "sampler_version": 4, "mipu": {"accepted": 3, "rolled_back": 1}}
  with Checkpointer(tmp_path, async_save=async_save) as ckpt:
    assert ckpt.latest_step() is None
    assert ckpt.save(5, state, meta)
    ckpt.wait()
    assert ckpt.latest_step() == 5
  with Checkpointer(tmp_path) as ckpt:
    restored, restored_meta = ckpt.restore(target=_state(0))
  _assert_bitwise_equal(restored, state)
  assert restored_meta == meta


def test_restore_from_abstract_target(tmp_path):
  state = _state(1)
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, state, {})
    restored, _ = ckpt.restore(target=jax.eval_shape(lambda: state))
  _assert_bitwise_equal(restored, state)


def test_keeps_last_n(tmp_path):
  with Checkpointer(tmp_path, max_to_keep=2) as ckpt:
    for step in range(5):
      ckpt.save(step, _state(step), {"step": step})
    ckpt.wait()
    assert ckpt.all_steps() == [3, 4]
    restored, meta = ckpt.restore(3, target=_state(0))
  assert meta == {"step": 3}
  _assert_bitwise_equal(restored, _state(3))


def test_restore_with_shardings_on_mesh(tmp_path):
  mesh = jax.make_mesh((4, 2), ("data", "tensor"),
                       axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  sharding_a = NamedSharding(mesh, P("data", "tensor"))
  sharding_b = NamedSharding(mesh, P(None, "data"))
  value_a = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
  value_b = np.arange(2 * 12, dtype=np.int32).reshape(2, 12)
  state = {"a": jax.device_put(value_a, NamedSharding(mesh, P())),
           "b": jnp.asarray(value_b)}
  target = {"a": jax.ShapeDtypeStruct((8, 6), jnp.float32, sharding=sharding_a),
            "b": jax.ShapeDtypeStruct((2, 12), jnp.int32, sharding=sharding_b)}
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(0, state, {})
    restored, _ = ckpt.restore(target=target)
  assert restored["a"].sharding == sharding_a
  assert restored["b"].sharding == sharding_b
  np.testing.assert_array_equal(restored["a"], value_a)
  np.testing.assert_array_equal(restored["b"], value_b)


def test_restore_casts_to_target_dtype(tmp_path):
  state = {"w": jnp.asarray([1.5, -2.25, 3.0], jnp.float32)}
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(0, state, {})
    restored, _ = ckpt.restore(target={"w": jnp.zeros(3, jnp.bfloat16)})
  assert restored["w"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(restored["w"].astype(jnp.float32), state["w"])


def test_partial_tmp_step_is_ignored_and_cleaned(tmp_path):
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, _state(1), {"step": 1})
  # What a save killed before its final rename leaves behind.
  partial = tmp_path / "2.orbax-checkpoint-tmp-1234567"
  (partial / "state").mkdir(parents=True)
  (partial / "state" / "junk").write_bytes(b"\x00" * 10)
  with Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 1
    _, meta = ckpt.restore(target=_state(0))
    assert meta == {"step": 1}
    # Deleted in the background when the directory is opened; done by the next save.
    ckpt.save(2, _state(2), {"step": 2})
    ckpt.wait()
    assert not partial.exists()
    assert ckpt.all_steps() == [1, 2]


def test_corrupt_latest_step_is_skipped(tmp_path):
  with Checkpointer(tmp_path, max_to_keep=None) as ckpt:
    ckpt.save(1, _state(1), {"step": 1})
    ckpt.save(2, _state(2), {"step": 2})
  for root, _, files in os.walk(tmp_path / "2" / "state"):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")
  with Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 2
    restored, meta = ckpt.restore(target=_state(0))
    assert meta == {"step": 1}
    _assert_bitwise_equal(restored, _state(1))
    # Moved aside (kept, out of the step namespace): never picked again, and
    # the step number can be saved again.
    assert ckpt.all_steps() == [1]
    assert [p.split("-")[0] for p in os.listdir(f"{tmp_path}.unreadable")] == ["2"]
    ckpt.save(2, _state(5), {"step": 2})
    ckpt.wait()
    restored, meta = ckpt.restore(target=_state(0))
    assert meta == {"step": 2}
    _assert_bitwise_equal(restored, _state(5))


def test_flipped_bytes_in_array_data_are_caught_by_the_fingerprint(tmp_path):
  # Orbax stores array chunks without a checksum: without the fingerprint, a
  # flipped bit would restore silently as another number.
  with Checkpointer(tmp_path, max_to_keep=None) as ckpt:
    ckpt.save(1, {"w": jnp.arange(4096.0)}, {"step": 1})
    ckpt.save(2, {"w": jnp.arange(4096.0) * 2}, {"step": 2})
  flipped = 0
  for root, _, files in os.walk(tmp_path / "2" / "state"):
    for name in files:
      path = os.path.join(root, name)
      data = bytearray(open(path, "rb").read())
      if os.path.basename(root) == "d" and len(data) > 4000:  # the array chunk
        data[len(data) // 2] ^= 0x01
        flipped += 1
        open(path, "wb").write(data)
  assert flipped
  with Checkpointer(tmp_path) as ckpt:
    restored, meta = ckpt.restore(target={"w": jnp.zeros(4096)})
  assert meta == {"step": 1}
  np.testing.assert_array_equal(restored["w"], np.arange(4096.0))


def test_fingerprint_sees_every_word_and_its_position():
  from mipu_jax.checkpoint import fingerprint  # pylint: disable=g-import-not-at-top
  x = np.arange(64, dtype=np.float32)
  base = fingerprint({"x": x, "k": jax.random.key(0), "b": jnp.ones(3, jnp.bfloat16)})
  assert [e.split(":")[0] for e in base] == ["bfloat16", "uint32", "float32"]
  for i in range(64):
    y = x.copy()
    y.view(np.uint32)[i] ^= np.uint32(1 << (i % 32))
    assert fingerprint({"x": y, "k": jax.random.key(0),
                        "b": jnp.ones(3, jnp.bfloat16)}) != base
  swapped = x.copy()
  swapped[[3, 7]] = swapped[[7, 3]]
  assert fingerprint({"x": swapped, "k": jax.random.key(0),
                      "b": jnp.ones(3, jnp.bfloat16)}) != base


def test_errors(tmp_path):
  with Checkpointer(tmp_path) as ckpt:
    with pytest.raises(FileNotFoundError):
      ckpt.restore(target=_state(0))
    with pytest.raises(TypeError, match="JSON"):
      ckpt.save(0, _state(0), {"bad": np.float32(1.0)})
    with pytest.raises(ValueError):
      Checkpointer(tmp_path / "x", max_to_keep=0)
