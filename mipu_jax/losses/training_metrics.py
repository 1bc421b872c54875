"""Training metrics of docs/method.md §4: `actor/*` (PPO loss and clip
fractions, ratio statistics, entropy, KL loss) from the learner's per-update
sums, and `rollout/*` (reward, accuracy, lengths) from a step's responses."""

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from mipu_jax.losses import _masked


def actor_metrics(sums: Any) -> dict[str, jax.Array]:
  """Per-update sums of the loss terms (`policy.MicroTerms`, `[U]` each) → `actor/*`.

  Token fractions are over all updates' kept tokens; the ratio statistics over
  all updates and over the first one (which, fully on-policy, must be 1).
  """
  kept = jnp.sum(sums.kept)
  has = sums.kept > 0

  def ratio_stats(sl):
    k = jnp.sum(sums.kept[sl])
    return {
        "mean": _masked.safe_div(jnp.sum(sums.ratio_sum[sl]), k),
        "min": jnp.where(k > 0, jnp.min(jnp.where(has[sl], sums.ratio_min[sl], jnp.inf)), 1.0),
        "max": jnp.where(k > 0, jnp.max(jnp.where(has[sl], sums.ratio_max[sl], -jnp.inf)), 1.0),
    }

  metrics = {
      "actor/loss": jnp.mean(sums.loss),
      "actor/pg_loss": jnp.mean(sums.pg_loss),
      "actor/pg_clipfrac": _masked.safe_div(jnp.sum(sums.clipped), kept),
      "actor/pg_clipfrac_lower": _masked.safe_div(jnp.sum(sums.dual_clipped), kept),
      "actor/ppo_kl": _masked.safe_div(jnp.sum(sums.neg_log_ratio_sum), kept),
      "actor/entropy": _masked.safe_div(jnp.sum(sums.entropy_sum), jnp.sum(sums.tokens)),
      "actor/kl_loss": jnp.mean(sums.kl_sum),
      "actor/num_updates": jnp.asarray(sums.loss.shape[0], jnp.float32),
  }
  for name, value in ratio_stats(slice(None)).items():
    metrics[f"actor/ppo_ratio_{name}"] = value
  for name, value in ratio_stats(slice(0, 1)).items():
    metrics[f"actor/first_update_ratio_{name}"] = value
  return metrics


def rollout_metrics(rewards_R: np.ndarray, lengths_R: np.ndarray,
                    truncated_R: np.ndarray, batch_rewards_R: np.ndarray,
                    ) -> Mapping[str, float]:
  """Reward, accuracy and length over every response sampled in a step (host side)."""
  return {
      "rollout/reward_mean": float(np.mean(rewards_R)),
      "rollout/accuracy": float(np.mean(rewards_R >= 1.0)),
      "rollout/response_length_mean": float(np.mean(lengths_R)),
      "rollout/response_length_max": float(np.max(lengths_R)),
      "rollout/truncated_fraction": float(np.mean(truncated_R)),
      "rollout/batch_reward_mean": float(np.mean(batch_rewards_R)),
  }
