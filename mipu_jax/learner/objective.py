"""The policy objective split into exact micro-batch terms (SPEC.md §2–3).

`mipu_jax.losses.policy_loss` computes the §3 correction and the §2
aggregation over the arrays it is given. The learner needs two things it
cannot do from inside one call:

- the correction (SNIS mean, veto) over the whole RL batch, once, not per
  mini-batch — `policy_loss`'s docstring points such callers to
  `correction_weights` + the PPO pieces;
- gradient accumulation whose sum over micro-batches *equals* the mini-batch
  loss for every aggregation mode (a `token_mean` over a mini-batch is not the
  mean of its micro-batch token means).

Every aggregation mode is linear in the per-token values, so the mini-batch
loss is `Σ_bt c_bt · x_bt` with coefficients `c = ∂ aggregate / ∂ x` that depend
only on the masks. `token_coefficients` takes them from `losses.aggregate`
itself (one `jax.grad` at zero, no reimplementation of the modes); each
micro-batch then contributes `Σ c · x` over its own rows, and the sum over
micro-batches is the mini-batch loss exactly. With one micro-batch and one
mini-batch this is `policy_loss` (tested).
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from mipu_jax import losses
from mipu_jax.losses import ppo


class Corrected(NamedTuple):
  """The §3 correction of a whole batch (all stop-gradient).

  Attributes:
    weights_BL: w, zero outside the final mask.
    keep_BL: m', the response mask after rejection and veto.
    denom_BL: normaliser mask: m (rejected tokens stay in the denominator) or m'.
  """
  weights_BL: jax.Array
  keep_BL: jax.Array
  denom_BL: jax.Array


def correct_batch(lp_old_BL: jax.Array, lp_mu_BL: jax.Array,
                  loss_mask_BL: jax.Array, cfg: losses.LossConfig):
  """SPEC.md §3 weights and masks over the full batch, and all §4 metrics.

  Returns:
    `(Corrected, metrics)`: `rollout_corr/*` correction metrics (fractions,
    IS weight statistics, ESS) and, except in `bypass` mode where no `lp_old`
    exists, the mismatch metrics of `losses.mismatch_metrics`.
  """
  c = cfg.correction
  weights_BL, keep_BL, metrics = losses.correction_weights(
      lp_old_BL, lp_mu_BL, loss_mask_BL, is_level=c.is_level,
      is_mode=c.is_mode, is_lower=c.is_lower, is_upper=c.is_upper,
      rs_level=c.rs_level, rs_lower=c.rs_lower, rs_upper=c.rs_upper,
      veto_threshold=c.veto_threshold, self_normalize=c.self_normalize)
  if cfg.mode == "on_policy_recompute":
    metrics.update(losses.mismatch_metrics(lp_old_BL, lp_mu_BL, loss_mask_BL))
  m_BL = (loss_mask_BL != 0).astype(jnp.float32)
  denom_BL = m_BL if cfg.rejected_in_denominator else keep_BL
  return Corrected(weights_BL, keep_BL, denom_BL), metrics


def token_coefficients(keep_BL: jax.Array, denom_BL: jax.Array,
                       cfg: losses.LossConfig, max_len: int) -> jax.Array:
  """`c_bt` with `aggregate(x) = Σ c_bt x_bt` over this (mini-)batch.

  Args:
    keep_BL: m', the tokens that are summed.
    denom_BL: the normaliser mask.
    cfg: the loss config (its aggregation mode).
    max_len: the `seq_mean_token_sum_norm` length when `cfg.max_len` is None
      (the response budget; `L` here also counts the prompt).

  Returns:
    float32 `[B, L]` coefficients, zero outside `keep_BL`.
  """
  def agg(x_BL):
    return losses.aggregate(x_BL, keep_BL, cfg.aggregation,
                            denom_mask_BT=denom_BL,
                            max_len=cfg.max_len or max_len)

  return jax.lax.stop_gradient(jax.grad(agg)(jnp.zeros_like(keep_BL)))


class MicroTerms(NamedTuple):
  """Sums over one micro-batch; divided by token counts after accumulation."""
  loss: jax.Array
  clipped: jax.Array
  dual_clipped: jax.Array
  ratio_sum: jax.Array
  ratio_min: jax.Array
  ratio_max: jax.Array
  neg_log_ratio_sum: jax.Array
  kept: jax.Array
  entropy_sum: jax.Array
  tokens: jax.Array
  kl_sum: jax.Array


def micro_loss(lp_BL: jax.Array, entropy_BL: Optional[jax.Array],
               lp_ref_BL: jax.Array, adv_B: jax.Array, weights_BL: jax.Array,
               keep_BL: jax.Array, coef_BL: jax.Array, loss_mask_BL: jax.Array,
               lp_ref_model_BL: Optional[jax.Array], cfg: losses.LossConfig):
  """This micro-batch's share of the mini-batch loss, and its metric sums.

  `Σ c · (ℓ w + kl_coef · KL - entropy_coef · H)`, with the PPO token loss ℓ
  against `lp_ref` (lp_old or lp_mu by mode; SPEC.md §2), as `policy_loss`.
  """
  terms = ppo.ppo_token_loss(lp_BL, lp_ref_BL, adv_B, keep_BL,
                             eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                             dual_clip=cfg.dual_clip)
  per_token_BL = terms.loss_BT * weights_BL
  kl_sum = jnp.zeros([], jnp.float32)
  if cfg.kl_coef > 0:
    kl_BL = ppo.kl_estimate(lp_BL, lp_ref_model_BL, keep_BL, cfg.kl_estimator)
    per_token_BL = per_token_BL + cfg.kl_coef * kl_BL
    kl_sum = jnp.sum(coef_BL * jax.lax.stop_gradient(kl_BL))
  m_BL = (loss_mask_BL != 0).astype(jnp.float32)
  entropy_sum = jnp.zeros([], jnp.float32)
  if entropy_BL is not None:
    if cfg.entropy_coef > 0:
      per_token_BL = per_token_BL - cfg.entropy_coef * entropy_BL
    entropy_sum = jnp.sum(jax.lax.stop_gradient(entropy_BL) * m_BL)
  loss = jnp.sum(coef_BL * per_token_BL)

  on_BL = keep_BL > 0
  ratio_BL = jax.lax.stop_gradient(terms.ratio_BT)
  sums = MicroTerms(
      loss=jax.lax.stop_gradient(loss),
      clipped=jnp.sum(terms.clipped_BT * keep_BL),
      dual_clipped=jnp.sum(terms.dual_clipped_BT * keep_BL),
      ratio_sum=jnp.sum(jnp.where(on_BL, ratio_BL, 0.0)),
      ratio_min=jnp.min(jnp.where(on_BL, ratio_BL, jnp.inf)),
      ratio_max=jnp.max(jnp.where(on_BL, ratio_BL, -jnp.inf)),
      neg_log_ratio_sum=jnp.sum(jnp.where(on_BL, -jnp.log(ratio_BL), 0.0)),
      kept=jnp.sum(keep_BL),
      entropy_sum=entropy_sum,
      tokens=jnp.sum(m_BL),
      kl_sum=kl_sum)
  return loss, sums
