"""docs/method.md §1: advantages and the dynamic-sampling filter, hand-computed.

Rewards are `[num_groups, G] = [2, 3]`, the shape all loss tests share (each
new shape costs fresh XLA compilations on CPU).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mipu_jax import losses

_EPS = 1e-6  # docs/method.md §1 GRPO std offset.
R = np.array([[1.0, 0.0, 0.0], [3.0, 1.0, 2.0]], np.float32)


def test_grpo_hand_computed():
  # Row 0: mean 1/3, population std sqrt((4/9 + 1/9 + 1/9) / 3) = sqrt(2)/3.
  # Row 1: mean 2, std sqrt((1 + 1 + 0) / 3) = sqrt(2/3).
  s0, s1 = math.sqrt(2) / 3 + _EPS, math.sqrt(2 / 3) + _EPS
  expected = [[(2 / 3) / s0, (-1 / 3) / s0, (-1 / 3) / s0],
              [1 / s1, -1 / s1, 0.0]]
  np.testing.assert_allclose(losses.compute_advantages(R, "grpo"), expected,
                             rtol=1e-6)


def test_rloo_hand_computed():
  # Row 0: 1 - (0 + 0)/2 = 1, 0 - (1 + 0)/2 = -0.5 (twice).
  # Row 1: 3 - (1 + 2)/2 = 1.5, 1 - (3 + 2)/2 = -1.5, 2 - (3 + 1)/2 = 0.
  np.testing.assert_allclose(losses.compute_advantages(R, "rloo"),
                             [[1.0, -0.5, -0.5], [1.5, -1.5, 0.0]], rtol=1e-6)


def test_drgrpo_hand_computed():
  np.testing.assert_allclose(losses.compute_advantages(R, "drgrpo"),
                             [[2 / 3, -1 / 3, -1 / 3], [1.0, -1.0, 0.0]],
                             rtol=1e-6)


@pytest.mark.parametrize("estimator", losses.ADVANTAGE_ESTIMATORS)
def test_flat_rewards_match_grouped(estimator):
  flat = losses.compute_advantages(R.reshape(-1), estimator, group_size=3)
  assert flat.shape == (6,)
  np.testing.assert_allclose(
      flat, np.asarray(losses.compute_advantages(R, estimator)).reshape(-1))


@pytest.mark.parametrize("estimator", losses.ADVANTAGE_ESTIMATORS)
def test_all_equal_group_is_zero(estimator):
  # 0.1 is inexact in binary: a naive float32 mean of 0.1s need not be 0.1.
  adv = losses.compute_advantages(
      np.array([[0.1, 0.1, 0.1], [0.0, 0.0, 0.0]], np.float32), estimator)
  np.testing.assert_array_equal(adv, np.zeros((2, 3)))


def test_named_functions_match_compute_advantages():
  for fn, name in ((losses.grpo_advantages, "grpo"),
                   (losses.rloo_advantages, "rloo"),
                   (losses.drgrpo_advantages, "drgrpo")):
    np.testing.assert_allclose(fn(R), losses.compute_advantages(R, name),
                               rtol=1e-6)


def test_compute_advantages_errors():
  with pytest.raises(ValueError, match="unknown advantage estimator"):
    losses.compute_advantages(R, "ppo")
  with pytest.raises(ValueError, match="need group_size"):
    losses.compute_advantages(R.reshape(-1), "grpo")
  with pytest.raises(ValueError, match="do not split"):
    losses.compute_advantages(R.reshape(-1), "grpo", group_size=4)
  with pytest.raises(ValueError, match="disagrees"):
    losses.compute_advantages(R, "grpo", group_size=2)
  with pytest.raises(ValueError, match="at least 2"):
    losses.rloo_advantages(np.zeros((6, 1), np.float32))


def test_all_equal_groups_numpy_and_jax():
  rewards = [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]
  out = losses.all_equal_groups(np.array(rewards))
  assert isinstance(out, np.ndarray)
  np.testing.assert_array_equal(out, [True, False, True])
  np.testing.assert_array_equal(
      losses.all_equal_groups([1, 1, 0, 1, 0, 0], group_size=2),
      [True, False, True])
  out = jax.jit(losses.all_equal_groups)(jnp.array(rewards))
  assert isinstance(out, jax.Array)
  np.testing.assert_array_equal(out, [True, False, True])
