"""The policy objective: the one composition the learner runs and the tests check.

docs/method.md §2–3, in three pieces the learner calls per step:

1. `correct_batch`: the §3 correction (weights, final mask) and the §4
   rollout-correction metrics over the whole RL batch, once (the SNIS mean and
   the veto see the whole batch, not a mini-batch);
2. `token_coefficients`: the aggregation mode as per-token coefficients
   `c_bt` with `aggregate(x) = Σ c_bt x_bt` over a mini-batch. Every mode is
   linear in the per-token values, so `c = ∂ aggregate / ∂ x` (one `jax.grad`
   of `aggregation.aggregate` at zero: no second implementation of the modes)
   depends on the masks only; a micro-batch then contributes `Σ c · x` over
   its own rows and the micro-batches sum to the mini-batch loss exactly;
3. `micro_loss`: one micro-batch's `Σ c · (ℓ w + kl_coef KL - entropy_coef H)`
   and its metric sums (`MicroTerms`).

`policy_loss` is these three over one batch taken as one mini-batch of one
micro-batch: the function tests hand-compute. The two rules of §2 live here
once: the PPO ratio's reference (`reference_logprobs`) and the normaliser
mask (`denominator_mask`).
"""

import dataclasses
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from mipu_jax.losses import _masked
from mipu_jax.losses import aggregation
from mipu_jax.losses import config as config_lib
from mipu_jax.losses import corrections
from mipu_jax.losses import metrics as metrics_lib
from mipu_jax.losses import ppo
from mipu_jax.losses import training_metrics


def reference_logprobs(cfg: config_lib.LossConfig, lp_old: Optional[jax.Array],
                       lp_mu: jax.Array) -> jax.Array:
  """The PPO ratio's reference (§2): lp_old when decoupled
  (`on_policy_recompute`), lp_mu in `bypass` (which has no recompute)."""
  return lp_old if cfg.mode == "on_policy_recompute" else lp_mu


def denominator_mask(cfg: config_lib.LossConfig, mask: jax.Array,
                     keep: jax.Array) -> jax.Array:
  """The normalisers' mask (§2): the response mask m when rejected tokens stay
  in the denominator (Miles, the default), else the final mask m' (verl)."""
  m = _masked.as_float_mask(mask)
  return m if cfg.rejected_in_denominator else keep


class Corrected(NamedTuple):
  """The §3 correction of a whole batch (all stop-gradient).

  Attributes:
    weights_BT: w, zero outside the final mask.
    keep_BT: m', the response mask after rejection and veto.
    denom_BT: the normaliser mask (`denominator_mask`).
  """
  weights_BT: jax.Array
  keep_BT: jax.Array
  denom_BT: jax.Array


def correct_batch(lp_old_BT: jax.Array, lp_mu_BT: jax.Array, loss_mask_BT: jax.Array,
                  cfg: config_lib.LossConfig) -> tuple[Corrected, dict[str, jax.Array]]:
  """§3 weights and masks over the full batch, and the §4 `rollout_corr/` metrics.

  The mismatch metrics (`metrics.mismatch_metrics`, `metrics.probability_metrics`)
  are left out in `bypass` mode, where no learner recompute exists.
  """
  weights, keep, metrics = corrections.correction_weights(
      lp_old_BT, lp_mu_BT, loss_mask_BT, **dataclasses.asdict(cfg.correction))
  if cfg.mode == "on_policy_recompute":
    metrics.update(metrics_lib.mismatch_metrics(lp_old_BT, lp_mu_BT, loss_mask_BT))
    metrics.update(metrics_lib.probability_metrics(lp_old_BT, lp_mu_BT, loss_mask_BT))
  return Corrected(weights, keep, denominator_mask(cfg, loss_mask_BT, keep)), metrics


def token_coefficients(keep_BT: jax.Array, denom_BT: jax.Array,
                       cfg: config_lib.LossConfig, max_len: int) -> jax.Array:
  """`c_bt` with `aggregate(x) = Σ c_bt x_bt` over this (mini-)batch.

  Args:
    keep_BT: m', the tokens that are summed.
    denom_BT: the normaliser mask.
    cfg: the loss config (its aggregation mode).
    max_len: the `seq_mean_token_sum_norm` length when `cfg.max_len` is None.

  Returns:
    float32 `[B, T]` coefficients, zero outside `keep_BT`.
  """
  def agg(x_BT):
    return aggregation.aggregate(x_BT, keep_BT, cfg.aggregation,
                                 denom_mask_BT=denom_BT, max_len=cfg.max_len or max_len)

  return jax.lax.stop_gradient(jax.grad(agg)(jnp.zeros_like(keep_BT)))


class MicroTerms(NamedTuple):
  """Sums over one micro-batch; divided by token counts after accumulation
  (`training_metrics.actor_metrics`)."""
  loss: jax.Array
  pg_loss: jax.Array
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


def micro_loss(lp_BT: jax.Array, entropy_BT: Optional[jax.Array],
               lp_ref_BT: jax.Array, adv: jax.Array, weights_BT: jax.Array,
               keep_BT: jax.Array, coef_BT: jax.Array, loss_mask_BT: jax.Array,
               lp_ref_model_BT: Optional[jax.Array], cfg: config_lib.LossConfig):
  """This micro-batch's share of the mini-batch loss, and its metric sums.

  `Σ c · (ℓ w + kl_coef · KL - entropy_coef · H)`, with the PPO token loss ℓ
  against `lp_ref_BT` (`reference_logprobs`).

  Returns:
    `(loss, MicroTerms)`; only `lp_BT` (and `entropy_BT` for an entropy bonus)
    is differentiated.
  """
  terms = ppo.ppo_token_loss(lp_BT, lp_ref_BT, adv, keep_BT, eps_low=cfg.eps_low,
                             eps_high=cfg.eps_high, dual_clip=cfg.dual_clip)
  per_token_BT = terms.loss_BT * weights_BT
  pg_loss = jnp.sum(coef_BT * per_token_BT)
  kl_sum = jnp.zeros([], jnp.float32)
  if cfg.kl_coef > 0:
    kl_BT = ppo.kl_estimate(lp_BT, lp_ref_model_BT, keep_BT, cfg.kl_estimator)
    per_token_BT = per_token_BT + cfg.kl_coef * kl_BT
    kl_sum = jnp.sum(coef_BT * jax.lax.stop_gradient(kl_BT))
  m_BT = (loss_mask_BT != 0).astype(jnp.float32)
  entropy_sum = jnp.zeros([], jnp.float32)
  if entropy_BT is not None:
    if cfg.entropy_coef > 0:
      per_token_BT = per_token_BT - cfg.entropy_coef * entropy_BT
    entropy_sum = jnp.sum(jax.lax.stop_gradient(entropy_BT) * m_BT)
  loss = jnp.sum(coef_BT * per_token_BT)

  on_BT = keep_BT > 0
  ratio_BT = jax.lax.stop_gradient(terms.ratio_BT)
  sums = MicroTerms(
      loss=jax.lax.stop_gradient(loss),
      pg_loss=jax.lax.stop_gradient(pg_loss),
      clipped=jnp.sum(terms.clipped_BT * keep_BT),
      dual_clipped=jnp.sum(terms.dual_clipped_BT * keep_BT),
      ratio_sum=jnp.sum(jnp.where(on_BT, ratio_BT, 0.0)),
      ratio_min=jnp.min(jnp.where(on_BT, ratio_BT, jnp.inf)),
      ratio_max=jnp.max(jnp.where(on_BT, ratio_BT, -jnp.inf)),
      neg_log_ratio_sum=jnp.sum(jnp.where(on_BT, -jnp.log(ratio_BT), 0.0)),
      kept=jnp.sum(keep_BT),
      entropy_sum=entropy_sum,
      tokens=jnp.sum(m_BT),
      kl_sum=kl_sum)
  return loss, sums


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
  """Scalar RL loss and its metrics over one batch (docs/method.md §2–3).

  `loss = agg(ℓ_t · w_t · m'_t) + kl_coef · agg(KL_t) - entropy_coef ·
  agg(H_t)`, aggregated with `cfg.aggregation` over the final mask m', with
  normalisers from `denominator_mask`; the PPO reference is
  `reference_logprobs`; w and m' come from `correct_batch`. The learner runs
  the same three pieces over mini- and micro-batches.

  `cfg` must be static under jit (it is hashable); only `lp` (and `entropy`
  with an entropy bonus) is differentiated, everything else is stop-gradiented.

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
    `(loss, metrics)`: the scalar loss; the learner's `actor/*` metrics of one
    update (`training_metrics.actor_metrics`; `actor/kl_loss` only with a KL term,
    `actor/entropy` only when `entropy` is given) and the `rollout_corr/*`
    metrics.

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
  corrected, corr_metrics = correct_batch(lp_mu if lp_old is None else lp_old, lp_mu,
                                          mask, cfg)
  coef = token_coefficients(corrected.keep_BT, corrected.denom_BT, cfg,
                            max_len=jnp.shape(mask)[-1])
  loss, sums = micro_loss(lp, entropy, reference_logprobs(cfg, lp_old, lp_mu), adv,
                          corrected.weights_BT, corrected.keep_BT, coef, mask,
                          lp_ref_model, cfg)
  metrics = training_metrics.actor_metrics(jax.tree.map(lambda x: x[None], sums))
  if entropy is None:
    del metrics["actor/entropy"]
  if cfg.kl_coef == 0:
    del metrics["actor/kl_loss"]
  metrics.update(corr_metrics)
  return loss, metrics
