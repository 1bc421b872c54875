"""Training–inference mismatch metrics, `rollout_corr/` prefix (SPEC.md §4).

Each metric is computed per response over its counted tokens, then averaged
over the responses that have at least one counted token (so `log_ppl_abs_diff`
is a mean of absolute values, and `kl` equals `log_ppl_diff`). Note that verl
takes `kl`, `k3_kl` and `chi2_token` as token means over the whole batch
instead; SPEC.md's per-response rule is followed here.

With δ_t = clamp(lp_old - lp_mu, ±20): every `exp` argument is clamped to
[-20, 20] (SPEC.md §0) so the metrics stay finite for any input;
`max_abs_logprob_diff` uses the unclamped difference (it is never
exponentiated). The response-level max is averaged like the rest.
"""

import jax
import jax.numpy as jnp

from mipu_jax.losses import _masked

_P = "rollout_corr/"
MISMATCH_METRIC_NAMES = tuple(_P + k for k in (
    "training_log_ppl",
    "rollout_log_ppl",
    "training_ppl",
    "rollout_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "ppl_ratio",
    "kl",
    "k3_kl",
    "chi2_token",
    "chi2_seq",
    "max_abs_logprob_diff",
))


def _exp(x: jax.Array) -> jax.Array:
  return jnp.exp(_masked.clamp_log_ratio(x))


def mismatch_metrics(
    lp_old: jax.Array,
    lp_mu: jax.Array,
    mask: jax.Array,
) -> dict[str, jax.Array]:
  """Mismatch diagnostics between learner π (lp_old) and sampler μ (lp_mu).

  Per response b (SPEC.md §4), with means over its counted tokens:
  `training_log_ppl = -mean lp_old`, `rollout_log_ppl = -mean lp_mu`,
  `training_ppl = exp(training_log_ppl)`, `rollout_ppl = exp(rollout_log_ppl)`,
  `log_ppl_diff = mean lp_mu - mean lp_old`,
  `log_ppl_abs_diff = |log_ppl_diff|`,
  `ppl_ratio = exp(log_ppl_diff)`, `kl = mean(lp_mu - lp_old)`,
  `k3_kl = mean(exp(δ) - δ - 1)`, `chi2_token = mean exp(2δ) - 1`,
  `chi2_seq = exp(2 clamp(Σδ, ±20)) - 1`, `max_abs_logprob_diff = max |lp_old -
  lp_mu|`; each then averaged over responses with a counted token (0 if none).
  Jit-able: no Python control flow on values. Inputs are stop-gradiented.

  Args:
    lp_old: learner log-probs `[B, T]`.
    lp_mu: sampler log-probs `[B, T]`.
    mask: response mask `[B, T]`, bool or {0, 1}.

  Returns:
    float32 scalars keyed by `MISMATCH_METRIC_NAMES`.
  """
  m_BT = _masked.as_float_mask(mask)
  on_BT = m_BT > 0
  lp_old = jnp.where(
      on_BT, jax.lax.stop_gradient(jnp.asarray(lp_old, jnp.float32)), 0.0)
  lp_mu = jnp.where(
      on_BT, jax.lax.stop_gradient(jnp.asarray(lp_mu, jnp.float32)), 0.0)
  raw_diff_BT = lp_old - lp_mu
  delta_BT = _masked.clamp_log_ratio(raw_diff_BT)
  has_B = (jnp.sum(m_BT, axis=-1) > 0).astype(jnp.float32)

  mean_old_B = _masked.row_mean(lp_old, m_BT)
  mean_mu_B = _masked.row_mean(lp_mu, m_BT)
  log_ppl_diff_B = mean_mu_B - mean_old_B
  per_response = {
      "training_log_ppl": -mean_old_B,
      "rollout_log_ppl": -mean_mu_B,
      "training_ppl": _exp(-mean_old_B),
      "rollout_ppl": _exp(-mean_mu_B),
      "log_ppl_diff": log_ppl_diff_B,
      "log_ppl_abs_diff": jnp.abs(log_ppl_diff_B),
      "ppl_ratio": _exp(log_ppl_diff_B),
      "kl": _masked.row_mean(-raw_diff_BT, m_BT),
      "k3_kl": _masked.row_mean(jnp.exp(delta_BT) - delta_BT - 1.0, m_BT),
      "chi2_token": _masked.row_mean(jnp.exp(2.0 * delta_BT), m_BT) - 1.0,
      "chi2_seq": _exp(_masked.row_sum(delta_BT, m_BT)) ** 2 - 1.0,
      "max_abs_logprob_diff": jnp.max(
          jnp.where(on_BT, jnp.abs(raw_diff_BT), 0.0), axis=-1),
  }
  return {_P + k: _masked.masked_mean(v_B, has_B)
          for k, v_B in per_response.items()}
