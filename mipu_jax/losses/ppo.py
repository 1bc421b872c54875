"""PPO clipped surrogate, KL-to-reference estimators (docs/method.md §2).

Sign convention: these are *losses* (minimised). Per token
`ℓ_t = max(-r_t A, -clip(r_t, 1-ε_low, 1+ε_high) A)`, `r_t = exp(lp - lp_ref)`.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from mipu_jax.losses import _masked

KL_ESTIMATORS = ("k1", "k2", "k3")


class PPOTokenLoss(NamedTuple):
  """Per-token PPO terms, all `[B, T]`.

  Attributes:
    loss_BT: ℓ_t, unweighted and unmasked (zero where `mask_BT` is 0).
    ratio_BT: r_t = exp(clamp(lp - lp_ref)) (1 where masked).
    clipped_BT: 1.0 where the clipped branch is the larger one (the gradient
      through r_t is cut).
    dual_clipped_BT: 1.0 where the dual clip bounded the loss (A < 0 only).
  """
  loss_BT: jax.Array
  ratio_BT: jax.Array
  clipped_BT: jax.Array
  dual_clipped_BT: jax.Array


def _broadcast_adv(adv: jax.Array, like_BT: jax.Array) -> jax.Array:
  """`[B]` per-response advantages → `[B, T]`; `[B, T]` passes through."""
  adv = jnp.asarray(adv, jnp.float32)
  if adv.ndim == 1:
    adv = adv[:, None]
  return jnp.broadcast_to(adv, like_BT.shape)


def ppo_token_loss(
    lp_BT: jax.Array,
    lp_ref_BT: jax.Array,
    adv: jax.Array,
    mask_BT: jax.Array,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
) -> PPOTokenLoss:
  """Per-token asymmetric (and optionally dual) clipped loss (docs/method.md §2).

  `ℓ_t = max(-r A, -clip(r, 1-ε_low, 1+ε_high) A)`; with dual clip `c` and
  `A < 0`: `ℓ_t = min(ℓ_t, -c A)`. The log-ratio is clamped to [-20, 20]
  (docs/method.md §0) and set to 0 on masked tokens first, so padding garbage (even
  ±inf) cannot reach the value or the gradient. `lp_ref_BT` is stop-gradiented.

  Args:
    lp_BT: current log-probs log π_θ, `[B, T]` (differentiated).
    lp_ref_BT: reference of the ratio (lp_old or lp_mu by mode), `[B, T]`.
    adv: advantages `[B]` (per response) or `[B, T]`.
    mask_BT: tokens that count, `[B, T]`.
    eps_low: lower clip ε_low.
    eps_high: upper clip ε_high.
    dual_clip: c_dual > 1, or None for off.

  Returns:
    A `PPOTokenLoss`.
  """
  m_BT = _masked.as_float_mask(mask_BT) > 0
  lp_BT = jnp.asarray(lp_BT, jnp.float32)
  lp_ref_BT = jax.lax.stop_gradient(jnp.asarray(lp_ref_BT, jnp.float32))
  adv_BT = jnp.where(m_BT, _broadcast_adv(adv, lp_BT), 0.0)
  # Double `where`: the masked branch never sees padding values.
  lp_BT = jnp.where(m_BT, lp_BT, 0.0)
  lp_ref_BT = jnp.where(m_BT, lp_ref_BT, 0.0)
  ratio_BT = jnp.exp(_masked.clamp_log_ratio(lp_BT - lp_ref_BT))

  unclipped_BT = -adv_BT * ratio_BT
  clipped_obj_BT = -adv_BT * jnp.clip(ratio_BT, 1.0 - eps_low, 1.0 + eps_high)
  loss_BT = jnp.maximum(unclipped_BT, clipped_obj_BT)
  clipped_BT = (clipped_obj_BT > unclipped_BT) & m_BT

  dual_BT = jnp.zeros_like(m_BT)
  if dual_clip is not None:
    bound_BT = -dual_clip * adv_BT
    dual_BT = (adv_BT < 0) & (loss_BT > bound_BT) & m_BT
    loss_BT = jnp.where(adv_BT < 0, jnp.minimum(loss_BT, bound_BT), loss_BT)

  return PPOTokenLoss(
      loss_BT=jnp.where(m_BT, loss_BT, 0.0),
      ratio_BT=ratio_BT,
      clipped_BT=clipped_BT.astype(jnp.float32),
      dual_clipped_BT=dual_BT.astype(jnp.float32),
  )


def kl_estimate(
    lp_BT: jax.Array,
    lp_ref_model_BT: jax.Array,
    mask_BT: jax.Array,
    estimator: str = "k3",
) -> jax.Array:
  """Per-token estimate of KL(π_θ ‖ π_ref) from samples of π_θ (docs/method.md §2).

  Schulman's estimators (http://joschu.net/blog/kl-approx.html) with
  `log ρ = clamp(lp_ref - lp, ±20)` (docs/method.md §0):
  `k1 = -log ρ`, `k2 = (log ρ)^2 / 2`, `k3 = ρ - 1 - log ρ`.

  Args:
    lp_BT: current log-probs `[B, T]` (differentiated).
    lp_ref_model_BT: frozen reference model log-probs `[B, T]` (stop-gradient).
    mask_BT: tokens that count; the estimate is 0 elsewhere.
    estimator: one of `KL_ESTIMATORS`.

  Returns:
    `[B, T]` per-token KL estimates.

  Raises:
    ValueError: unknown estimator.
  """
  if estimator not in KL_ESTIMATORS:
    raise ValueError(
        f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}.")
  m_BT = _masked.as_float_mask(mask_BT) > 0
  lp_BT = jnp.where(m_BT, jnp.asarray(lp_BT, jnp.float32), 0.0)
  lp_ref_BT = jax.lax.stop_gradient(
      jnp.where(m_BT, jnp.asarray(lp_ref_model_BT, jnp.float32), 0.0))
  log_rho_BT = _masked.clamp_log_ratio(lp_ref_BT - lp_BT)
  if estimator == "k1":
    kl_BT = -log_rho_BT
  elif estimator == "k2":
    kl_BT = 0.5 * jnp.square(log_rho_BT)
  else:
    kl_BT = jnp.exp(log_rho_BT) - 1.0 - log_rho_BT
  return jnp.where(m_BT, kl_BT, 0.0)
