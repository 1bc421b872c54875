"""MIPU Step 2's estimate of the inference gap ``T̂_post`` (docs/method.md §5).

After the candidate ``θ_{k+1}`` is synced into the sampler (giving ``μ_{k+1}``),
probe responses drawn from ``μ_{k+1}`` give, by the performance-difference
lemma, ``J(π_{k+1}) - J(μ_{k+1}) ≈ E_μ[ρ A^μ]`` with ``ρ = π_{k+1} / μ_{k+1}``;
so ``T̂_post = -mean_i(ρ_i Â_i)`` estimates term ① of docs/method.md §5,
``J(μ_{k+1}) - J(π_{k+1})``.
"""

import jax
import jax.numpy as jnp

from mipu_jax import losses


def gap_post(
    lp_new_BT: jax.Array,
    lp_mu_new_BT: jax.Array,
    mask_BT: jax.Array,
    rewards_B: jax.Array,
    group_size: int,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """``T̂_post = -mean_i(ρ_i Â_i)`` over the probe responses (docs/method.md §5).

  ``ρ_i = exp((1/T_i) Σ_t m_t clamp(lp_new[t] - lp_mu_new[t], ±20))`` is the
  geometric-mean ratio of response ``i`` (§3, ``geometric`` level, with
  ``T_i = max(Σ_t m_t, 1)``); ``Â_i`` are the grpo advantages of §1
  (`losses.grpo_advantages`). Masked-out positions are zeroed *before* the
  sum, so padding holding ``-inf`` or NaN log-probs is harmless. A response
  with no counted token gets ``ρ_i = 1`` (the ratio of an empty product);
  since grpo advantages sum to zero within each group, ``ρ_i Â_i`` of such a
  response cancels against the ``E[Â] = 0`` term and it contributes nothing
  to the gap, while the mean stays over all ``B`` responses.

  The standard error is taken over prompt groups, the independent units of the
  probe (responses of one group share its advantage normaliser):
  ``SE = sd_g(-mean_{i∈g} ρ_i Â_i) / sqrt(N)`` (sample sd, 0 for one group).
  `mipu.margin` can scale the acceptance margin by it.

  Everything is ``stop_gradient``-ed: this is a decision statistic, not a loss.

  Args:
    lp_new_BT: ``[B, T]`` learner log-probs under ``θ_{k+1}``.
    lp_mu_new_BT: ``[B, T]`` sampler log-probs under ``μ_{k+1}``.
    mask_BT: ``[B, T]`` response mask (1 on counted tokens).
    rewards_B: ``[B]`` probe rewards, contiguous groups of ``group_size``.
    group_size: ``G``.

  Returns:
    ``(t_post, metrics)``: the float32 scalar ``T̂_post`` and
    ``{"mipu/gap_post", "mipu/gap_post_se", "mipu/probe_reward",
    "mipu/probe_rho_mean"}`` (the last is the mean ``ρ_i`` over responses with
    at least one counted token).
  """
  if lp_new_BT.shape != lp_mu_new_BT.shape or lp_new_BT.shape != mask_BT.shape:
    raise ValueError(f"shape mismatch: {lp_new_BT.shape}, "
                     f"{lp_mu_new_BT.shape}, {mask_BT.shape}")
  if rewards_B.shape != lp_new_BT.shape[:1]:
    raise ValueError(f"rewards {rewards_B.shape} vs batch {lp_new_BT.shape}")
  (batch,) = rewards_B.shape
  if group_size < 1 or batch % group_size:
    raise ValueError(f"batch {batch} is not a multiple of group_size "
                     f"{group_size}")
  lp_new_BT, lp_mu_new_BT, mask_BT, rewards_B = jax.lax.stop_gradient(
      (lp_new_BT, lp_mu_new_BT, mask_BT, rewards_B))
  counted_BT = mask_BT.astype(bool)
  delta_BT = losses.clamp_log_ratio(
      lp_new_BT.astype(jnp.float32) - lp_mu_new_BT.astype(jnp.float32))
  delta_BT = jnp.where(counted_BT, delta_BT, 0.0)
  num_tokens_B = counted_BT.sum(axis=1).astype(jnp.float32)
  log_rho_B = losses.clamp_log_ratio(
      delta_BT.sum(axis=1) / jnp.maximum(num_tokens_B, 1.0))
  rho_B = jnp.exp(log_rho_B)
  adv_B = losses.grpo_advantages(
      rewards_B.astype(jnp.float32).reshape(-1, group_size)).reshape(batch)
  gap_PG = -(rho_B * adv_B).reshape(-1, group_size)
  t_post = jnp.mean(gap_PG)
  num_groups = gap_PG.shape[0]
  gap_P = jnp.mean(gap_PG, axis=1)
  se = (jnp.std(gap_P, ddof=1) / jnp.sqrt(num_groups) if num_groups > 1
        else jnp.zeros([], jnp.float32))

  has_tokens_B = (num_tokens_B > 0).astype(jnp.float32)
  rho_mean = (rho_B * has_tokens_B).sum() / jnp.maximum(has_tokens_B.sum(), 1.0)
  metrics = {
      "mipu/gap_post": t_post,
      "mipu/gap_post_se": se,
      "mipu/probe_reward": rewards_B.astype(jnp.float32).mean(),
      "mipu/probe_rho_mean": rho_mean,
  }
  return t_post, metrics
