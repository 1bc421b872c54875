"""The composed policy loss the learner calls inside jit (SPEC.md §2–3).

`policy_loss` = §3 correction (from lp_old, lp_mu) → PPO clip against the
mode's reference → aggregation → optional KL and entropy terms.
"""

import dataclasses

import jax

from mipu_jax.losses import _masked
from mipu_jax.losses import aggregation
from mipu_jax.losses import config as config_lib
from mipu_jax.losses import corrections
from mipu_jax.losses import ppo


def policy_loss(
    lp: jax.Array,
    lp_old: jax.Array | None,
    lp_mu: jax.Array,
    adv: jax.Array,
    mask: jax.Array,
    cfg: config_lib.LossConfig,
    *,
    lp_ref_model: jax.Array | None = None,
    entropy: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Scalar RL loss and its metrics (SPEC.md §2–3).

  `loss = agg(ℓ_t · w_t · m'_t) + kl_coef · agg(KL_t) - entropy_coef ·
  agg(H_t)`, all aggregated with `cfg.aggregation` over the final mask m', with
  normalisers from the original mask m when `cfg.rejected_in_denominator`
  (else from m'). The PPO reference is lp_old (`on_policy_recompute`) or lp_mu
  (`bypass`). w and m' come from `correction_weights(lp_old, lp_mu, mask,
  **cfg.correction)`; they are computed over the arrays passed in, so the
  SNIS mean and the veto see this (mini-)batch only. A caller that wants them
  over a larger batch calls `correction_weights` there and `ppo.ppo_loss` here.

  `cfg` must be static under jit (it is hashable); only `lp` is
  differentiated, everything else is stop-gradiented.

  Args:
    lp: current log-probs log π_θ, `[B, T]`.
    lp_old: learner log-probs at the synced weights, `[B, T]`; may be None in
      `bypass` mode.
    lp_mu: sampler log-probs, `[B, T]`.
    adv: advantages, `[B]` per response or `[B, T]`.
    mask: response mask m, `[B, T]`.
    cfg: a validated `LossConfig`.
    lp_ref_model: frozen reference model log-probs `[B, T]`; needed when
      `cfg.kl_coef > 0`.
    entropy: per-token policy entropy `[B, T]`; needed when
      `cfg.entropy_coef > 0`, logged as `actor/entropy` whenever given.

  Returns:
    `(loss, metrics)`: the scalar loss; `actor/*` PPO metrics (see
    `ppo.ppo_loss`) plus `actor/kl_loss` when the KL is on, `actor/entropy`
    when `entropy` is given, and the `rollout_corr/*` correction metrics.

  Raises:
    ValueError: at trace time, when an input the config needs is missing.
  """
  if cfg.mode == "on_policy_recompute" and lp_old is None:
    raise ValueError("mode='on_policy_recompute' needs lp_old.")
  if cfg.kl_coef > 0 and lp_ref_model is None:
    raise ValueError(f"kl_coef={cfg.kl_coef} needs lp_ref_model.")
  if cfg.entropy_coef > 0 and entropy is None:
    raise ValueError(f"entropy_coef={cfg.entropy_coef} needs entropy.")

  # In bypass mode the correction is off (LossConfig checks it), so its
  # weights are 1 whatever lp_old is; lp_mu stands in when lp_old is absent.
  weights_BT, keep_BT, corr_metrics = corrections.correction_weights(
      lp_mu if lp_old is None else lp_old, lp_mu, mask,
      **dataclasses.asdict(cfg.correction))
  m_BT = _masked.as_float_mask(mask)
  denom_BT = m_BT if cfg.rejected_in_denominator else keep_BT
  lp_ref_BT = lp_old if cfg.mode == "on_policy_recompute" else lp_mu

  loss, metrics = ppo.ppo_loss(
      lp, lp_ref_BT, adv, keep_BT,
      weights_BT=weights_BT, denom_mask_BT=denom_BT,
      eps_low=cfg.eps_low, eps_high=cfg.eps_high, dual_clip=cfg.dual_clip,
      aggregation_mode=cfg.aggregation, max_len=cfg.max_len)

  def agg(x_BT):
    return aggregation.aggregate(
        x_BT, keep_BT, cfg.aggregation, denom_mask_BT=denom_BT,
        max_len=cfg.max_len)

  if cfg.kl_coef > 0:
    kl = agg(ppo.kl_estimate(lp, lp_ref_model, keep_BT, cfg.kl_estimator))
    loss = loss + cfg.kl_coef * kl
    metrics["actor/kl_loss"] = jax.lax.stop_gradient(kl)
  if entropy is not None:
    ent = agg(entropy)
    if cfg.entropy_coef > 0:
      loss = loss - cfg.entropy_coef * ent
    metrics["actor/entropy"] = jax.lax.stop_gradient(ent)
  metrics.update(corr_metrics)
  return loss, metrics
