"""Rollout → learner `Batch`: concatenation, alignment, advantages (docs/method.md §0–1).

Row `i` is `prompt_ids[i // G] + response_i`, right-padded to a fixed
`length` (prompt budget + response budget), so the learner compiles once.
The response's sampler log-probs and mask move to the response's positions.
"""

import numpy as np

from mipu_jax import losses
from mipu_jax.learner import batch as batch_lib
from mipu_jax.rl.rollout import Rollout


def pad_and_concat(rollout: Rollout, length: int):
  """Token rows and aligned masks / log-probs.

  Returns:
    `(tokens_BT, input_mask_BT, loss_mask_BT, lp_mu_BT)` numpy arrays.
  """
  g = rollout.group_size
  b, t = rollout.tokens_RT.shape
  tokens_BT = np.zeros((b, length), np.int32)
  input_mask_BT = np.zeros((b, length), np.float32)
  loss_mask_BT = np.zeros((b, length), np.float32)
  lp_mu_BT = np.zeros((b, length), np.float32)
  for i in range(b):
    prompt = rollout.prompt_ids[i // g]
    p = len(prompt)
    if p + t > length:
      raise ValueError(f"prompt of {p} tokens + response budget {t} exceed the "
                       f"learner length {length}.")
    tokens_BT[i, :p] = prompt
    tokens_BT[i, p:p + t] = rollout.tokens_RT[i]
    input_mask_BT[i, :p] = 1.0
    input_mask_BT[i, p:p + t] = rollout.mask_RT[i]
    loss_mask_BT[i, p:p + t] = rollout.mask_RT[i] * rollout.keep_R[i]
    lp_mu_BT[i, p:p + t] = rollout.lp_mu_RT[i] * rollout.mask_RT[i]
  tokens_BT *= input_mask_BT.astype(np.int32)  # pad id 0 after each response
  return tokens_BT, input_mask_BT, loss_mask_BT, lp_mu_BT


def routing_rows(rollout: Rollout, length: int) -> np.ndarray | None:
  """The sampler's routing in the learner's rows: `[B, length, L_moe, k]`, each
  row's prompt tokens' then response tokens' experts, -1 elsewhere (the learner
  routes those live); None when the rollout has no routing (docs/method.md §7a)."""
  if rollout.routing_RT is None:
    return None
  g = rollout.group_size
  b, t = rollout.routing_RT.shape[:2]
  out = np.full((b, length) + rollout.routing_RT.shape[2:], -1, np.int32)
  for i in range(b):
    p = len(rollout.prompt_ids[i // g])
    out[i, :p] = rollout.prompt_routing_NP[i // g, :p]
    out[i, p:p + t] = np.where(rollout.mask_RT[i][:, None, None] > 0, rollout.routing_RT[i], -1)
  return out


def advantages(rollout: Rollout, estimator: str) -> np.ndarray:
  """Per-response advantages `[N*G]` (docs/method.md §1)."""
  return np.asarray(losses.compute_advantages(
      rollout.rewards_R, estimator, group_size=rollout.group_size), np.float32)


def make_batch(rollout: Rollout, length: int, estimator: str, *,
               response_length: float) -> batch_lib.Batch:
  """A host `Batch` with `lp_old = lp_mu` (the loop replaces it after recompute).

  Args:
    rollout: the groups to train on.
    length: learner row length `T`.
    estimator: advantage estimator name.
    response_length: the step's mean response length, for the schedule.
  """
  tokens_BT, input_mask_BT, loss_mask_BT, lp_mu_BT = pad_and_concat(rollout, length)
  return batch_lib.host_batch(tokens_BT, input_mask_BT, loss_mask_BT, lp_mu_BT,
                              advantages(rollout, estimator),
                              response_length=response_length)
