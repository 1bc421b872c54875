"""Group-relative advantages and the dynamic-sampling filter (docs/method.md §1).

Rewards come either as `[P, G]` (one row per prompt, its `G` responses; P is
`num_groups`) or flat `[B]` with `group_size=G`, responses of a group contiguous
(`B = P * G`). The advantage has the shape of the rewards; it is one
value per response, which the policy loss broadcasts over the response's tokens.
"""

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "drgrpo")

# docs/method.md §1: the GRPO normaliser is `std + 1e-6`.
_GRPO_STD_EPS = 1e-6


def _centered(rewards_PG: jax.Array) -> jax.Array:
  """Rewards minus each group's first reward, in float32.

  Every estimator is shift-invariant, and the shift makes an all-equal group
  exactly zero before any mean is taken, so its advantage is exactly 0 (a float
  mean of G equal values need not round back to that value).
  """
  r_PG = jnp.asarray(rewards_PG, jnp.float32)
  return r_PG - r_PG[:, :1]


def grpo_advantages(rewards_PG: jax.Array) -> jax.Array:
  """`A_i = (R_i - mean_j R_j) / (std_j R_j + 1e-6)` per group (docs/method.md §1).

  `std` is the population standard deviation (ddof=0) over the group's `G`
  responses. verl and TRL use the unbiased one (ddof=1); the two differ by the
  factor `sqrt(G / (G - 1))`. docs/method.md writes `std_j R_j` and this follows the
  plain reading. An all-equal group gets exactly 0.

  Args:
    rewards_PG: `[P, G]` rewards.

  Returns:
    `[P, G]` float32 advantages.
  """
  r_PG = _centered(rewards_PG)
  mean_P1 = jnp.mean(r_PG, axis=-1, keepdims=True)
  std_P1 = jnp.std(r_PG, axis=-1, keepdims=True)
  return (r_PG - mean_P1) / (std_P1 + _GRPO_STD_EPS)


def rloo_advantages(rewards_PG: jax.Array) -> jax.Array:
  """`A_i = R_i - (1/(G-1)) Σ_{j≠i} R_j` per group (docs/method.md §1, the LR-paper's).

  Args:
    rewards_PG: `[P, G]` rewards, `G >= 2`.

  Returns:
    `[P, G]` float32 advantages.

  Raises:
    ValueError: if `G < 2` (the leave-one-out baseline needs another response).
  """
  g = jnp.shape(rewards_PG)[-1]
  if g < 2:
    raise ValueError(f"rloo needs at least 2 responses per group, got G={g}.")
  r_PG = _centered(rewards_PG)
  others_PG = jnp.sum(r_PG, axis=-1, keepdims=True) - r_PG
  return r_PG - others_PG / (g - 1)


def drgrpo_advantages(rewards_PG: jax.Array) -> jax.Array:
  """`A_i = R_i - mean_j R_j` per group (docs/method.md §1, Dr. GRPO: no std division).

  Args:
    rewards_PG: `[P, G]` rewards.

  Returns:
    `[P, G]` float32 advantages.
  """
  r_PG = _centered(rewards_PG)
  return r_PG - jnp.mean(r_PG, axis=-1, keepdims=True)


_ESTIMATORS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "drgrpo": drgrpo_advantages,
}


def _as_groups(rewards, group_size: int | None):
  """Reshapes flat `[B]` rewards to `[B // G, G]`; passes `[P, G]` through."""
  if rewards.ndim == 2:
    if group_size is not None and group_size != rewards.shape[1]:
      raise ValueError(
          f"group_size={group_size} disagrees with rewards of shape "
          f"{rewards.shape} (expected [num_groups, {group_size}]).")
    return rewards
  if rewards.ndim != 1:
    raise ValueError(
        f"rewards must be [num_groups, G] or flat [B], got {rewards.shape}.")
  if group_size is None:
    raise ValueError("flat [B] rewards need group_size.")
  if group_size < 1 or rewards.shape[0] % group_size:
    raise ValueError(
        f"flat rewards of length {rewards.shape[0]} do not split into groups "
        f"of {group_size}.")
  return rewards.reshape(-1, group_size)


def compute_advantages(
    rewards: jax.Array,
    estimator: str = "grpo",
    *,
    group_size: int | None = None,
) -> jax.Array:
  """Advantages by name, for grouped or flat rewards (docs/method.md §1).

  Args:
    rewards: `[P, G]`, or flat `[B]` with responses of a group
      contiguous.
    estimator: one of `ADVANTAGE_ESTIMATORS`.
    group_size: `G`; required for flat rewards, checked against 2-D ones.

  Returns:
    float32 advantages with the shape of `rewards`.

  Raises:
    ValueError: unknown estimator or shapes that do not form groups.
  """
  if estimator not in _ESTIMATORS:
    raise ValueError(
        f"unknown advantage estimator {estimator!r}; "
        f"choose one of {ADVANTAGE_ESTIMATORS}.")
  r = jnp.asarray(rewards)
  adv_PG = _ESTIMATORS[estimator](_as_groups(r, group_size))
  return adv_PG.reshape(r.shape)


def all_equal_groups(rewards, *, group_size: int | None = None):
  """Groups whose rewards are all equal: the dynamic-sampling filter (§1).

  Such groups (all 0 or all 1 for a verifiable reward) carry no group-relative
  signal and are dropped; the caller over-samples prompts to keep the batch
  size. Pure and array-library agnostic: numpy in gives numpy out (host side),
  a jax array gives a jax array (usable under jit).

  Args:
    rewards: `[P, G]`, or flat `[B]` with `group_size`.
    group_size: `G`, for flat rewards.

  Returns:
    `[num_groups]` bool, True where every reward in the group equals the first
    (exact comparison). Keep the groups where it is False.
  """
  if not isinstance(rewards, jax.Array):
    rewards = np.asarray(rewards)
  r_PG = _as_groups(rewards, group_size)
  return (r_PG == r_PG[:, :1]).all(axis=-1)
