"""The rollout-correction metrics of docs/method.md §4 (the training metrics,
`actor/*` and `rollout/*`, are `training_metrics`).

Rollout correction (`rollout_corr/` prefix) with verl 0.9's names **and**
definitions (`verl/trainer/ppo/rollout_corr_helper.py`), so a number logged
here reads like the same-named number of a verl run:

- `mismatch_metrics`: `kl`, `k3_kl`, `chi2_token` are token means over every
  counted token of the batch; the perplexity family (`training_ppl`,
  `rollout_ppl`, their logs, `log_ppl_diff` / `_abs_diff` / `_max` / `_min`,
  `ppl_ratio`) and `chi2_seq` are per response, then over responses.
- `is_metrics`: the IS weights' `rollout_is_mean/std/min/max`,
  `rollout_is_eff_sample_size`, `rollout_is_ratio_fraction_high/low`,
  `rollout_is_seq_mean/std/min/max/max_deviation`,
  `rollout_is_seq_fraction_high/low` (and `rollout_is_oob_ratio` for icepop):
  of the weights after the IS mode, before rejection and self-normalisation,
  over the response mask, as verl.
- `probability_metrics`: verl's per-token probability diagnostics
  (`training/rollout_probs_diff_*`, `training/rollout_actor_probs_pearson_corr`,
  `verl/utils/debug/metrics.py`) and Miles's `train/train_rollout_logprob_abs_diff`,
  under their own names.
- `rs_metrics`: per trust-region criterion `rollout_rs_<criterion>_*`; the
  combined `rollout_rs_masked_fraction` and `rollout_rs_seq_masked_fraction`.

Ours beyond verl keep their names: `max_abs_logprob_diff`,
`rollout_is_truncated_fraction`, `rollout_is_clipped_low_fraction`,
`rollout_is_clipped_high_fraction`, `rollout_is_masked_fraction`,
`rollout_is_veto_fraction`, `rollout_is_batch_norm_factor` (also verl's, set
only with self-normalisation there; 1 otherwise here), and
`rejected_token_fraction`.

Where verl and this module differ, on purpose: responses without a counted
token are left out of per-response means here (verl counts them with value 0
or 1); every `exp` argument is clamped to ±20 (docs/method.md §0; verl leaves
`k3_kl` and `ppl_ratio` unclamped, equal below |δ| = 20).
"""

import math
from typing import Mapping, Optional

import jax
import jax.numpy as jnp

from mipu_jax.losses import _masked

P = "rollout_corr/"
MISMATCH_METRIC_NAMES = tuple(P + k for k in (
    "training_log_ppl", "rollout_log_ppl", "training_ppl", "rollout_ppl",
    "log_ppl_diff", "log_ppl_abs_diff", "log_ppl_diff_max", "log_ppl_diff_min",
    "ppl_ratio", "kl", "k3_kl", "chi2_token", "chi2_seq", "max_abs_logprob_diff",
))
IS_METRIC_NAMES = tuple(P + k for k in (
    "rollout_is_mean", "rollout_is_std", "rollout_is_min", "rollout_is_max",
    "rollout_is_eff_sample_size", "rollout_is_ratio_fraction_high",
    "rollout_is_ratio_fraction_low", "rollout_is_seq_mean", "rollout_is_seq_std",
    "rollout_is_seq_min", "rollout_is_seq_max", "rollout_is_seq_max_deviation",
    "rollout_is_seq_fraction_high", "rollout_is_seq_fraction_low",
))
CORRECTION_METRIC_NAMES = IS_METRIC_NAMES + tuple(P + k for k in (
    "rollout_is_truncated_fraction", "rollout_is_clipped_low_fraction",
    "rollout_is_clipped_high_fraction", "rollout_is_masked_fraction",
    "rollout_rs_masked_fraction", "rollout_rs_seq_masked_fraction",
    "rollout_is_veto_fraction", "rollout_is_batch_norm_factor",
    "rejected_token_fraction",
))
_EPS = 1e-8  # verl's masked-mean epsilon


def _mm(x, m, axis=None):
  """verl's masked mean: Σ x m / (Σ m + 1e-8) (masked-out NaN / inf ignored)."""
  return jnp.sum(jnp.where(m > 0, x * m, 0.0), axis=axis) / (jnp.sum(m, axis=axis) + _EPS)


def _over(x_B, has_B, op):
  """`op` (min / max / mean) of `x_B` over responses with a counted token (0 if none)."""
  if op == "mean":
    return _masked.masked_mean(x_B, has_B)
  return (_masked.masked_max if op == "max" else _masked.masked_min)(x_B, has_B)


def _seq_std(x_B, has_B):
  """Sample standard deviation (ddof 1, as torch's `std`) over counted responses."""
  n = jnp.sum(has_B)
  mean = _masked.masked_mean(x_B, has_B)
  var = _masked.safe_div(jnp.sum(jnp.square(x_B - mean) * has_B), n - 1.0)
  return jnp.where(n > 1, jnp.sqrt(jnp.maximum(var, 0.0)), 0.0)


def mismatch_metrics(lp_old: jax.Array, lp_mu: jax.Array,
                     mask: jax.Array) -> dict[str, jax.Array]:
  """Off-policy diagnostics between the learner π (lp_old) and the sampler μ (lp_mu).

  With δ = lp_old - lp_mu over counted tokens (docs/method.md §4):
  token means over the batch `kl = mean(lp_mu - lp_old)`,
  `k3_kl = mean(exp δ - δ - 1)`, `chi2_token = mean(exp 2δ) - 1`; per
  response `training_log_ppl = -mean_t lp_old` (and `rollout_…`),
  `training_ppl = exp(…)`, `log_ppl_diff = mean_t lp_mu - mean_t lp_old`
  (mean, mean of |·|, max, min over responses), `ppl_ratio = mean exp(…)`,
  `chi2_seq = mean exp(2 Σ_t δ) - 1`; `max_abs_logprob_diff` (ours) the mean
  over responses of each response's largest |δ|.

  Args:
    lp_old: learner log-probs `[B, T]`.
    lp_mu: sampler log-probs `[B, T]`.
    mask: response mask `[B, T]`, bool or {0, 1}.

  Returns:
    float32 scalars keyed by `MISMATCH_METRIC_NAMES` (0 for an empty mask).
  """
  m_BT = _masked.as_float_mask(mask)
  on_BT = m_BT > 0
  lp_old = jnp.where(on_BT, jax.lax.stop_gradient(jnp.asarray(lp_old, jnp.float32)), 0.0)
  lp_mu = jnp.where(on_BT, jax.lax.stop_gradient(jnp.asarray(lp_mu, jnp.float32)), 0.0)
  raw_BT = lp_old - lp_mu
  delta_BT = _masked.clamp_log_ratio(raw_BT)
  has_B = (jnp.sum(m_BT, axis=-1) > 0).astype(jnp.float32)
  exp = lambda x: jnp.exp(_masked.clamp_log_ratio(x))

  mean_old_B = _masked.row_mean(lp_old, m_BT)
  mean_mu_B = _masked.row_mean(lp_mu, m_BT)
  diff_B = mean_mu_B - mean_old_B
  metrics = {
      "kl": _mm(-raw_BT, m_BT),
      "k3_kl": _mm(_masked.k3(delta_BT), m_BT),
      "chi2_token": _mm(jnp.exp(2.0 * delta_BT), m_BT) - 1.0,
      "training_log_ppl": _over(-mean_old_B, has_B, "mean"),
      "rollout_log_ppl": _over(-mean_mu_B, has_B, "mean"),
      "training_ppl": _over(exp(-mean_old_B), has_B, "mean"),
      "rollout_ppl": _over(exp(-mean_mu_B), has_B, "mean"),
      "log_ppl_diff": _over(diff_B, has_B, "mean"),
      "log_ppl_abs_diff": _over(jnp.abs(diff_B), has_B, "mean"),
      "log_ppl_diff_max": _over(diff_B, has_B, "max"),
      "log_ppl_diff_min": _over(diff_B, has_B, "min"),
      "ppl_ratio": _over(exp(diff_B), has_B, "mean"),
      # Σδ clamped before doubling, as verl (so up to exp(40)).
      "chi2_seq": _over(jnp.exp(2.0 * _masked.clamp_log_ratio(_masked.row_sum(raw_BT, m_BT))),
                        has_B, "mean") - 1.0,
      "max_abs_logprob_diff": _over(
          jnp.max(jnp.where(on_BT, jnp.abs(raw_BT), 0.0), axis=-1), has_B, "mean"),
  }
  empty = jnp.sum(m_BT) == 0
  return {P + k: jnp.where(empty, 0.0, v).astype(jnp.float32) for k, v in metrics.items()}


PROBABILITY_METRIC_NAMES = (
    "training/rollout_probs_diff_valid", "training/rollout_probs_diff_max",
    "training/rollout_probs_diff_mean", "training/rollout_probs_diff_std",
    "training/rollout_actor_probs_pearson_corr", "train/train_rollout_logprob_abs_diff",
)


def probability_metrics(lp_old: jax.Array, lp_mu: jax.Array,
                        mask: jax.Array) -> dict[str, jax.Array]:
  """Per-token probability diagnostics of verl and Miles (docs/method.md §4).

  With p = exp(lp_old) (the learner's recompute) and q = exp(lp_mu) (the
  sampler's) over the counted tokens, as verl's `calculate_debug_metrics`:
  `training/rollout_probs_diff_{max,mean,std}` of |p - q| (std with ddof 1,
  as torch's), `training/rollout_actor_probs_pearson_corr` the Pearson
  correlation of p and q, `training/rollout_probs_diff_valid` 1 when there is
  a counted token. As Miles's loss: `train/train_rollout_logprob_abs_diff`, the
  mean over responses of each response's token mean of |lp_old - lp_mu|.

  Where verl would give NaN (no counted token, one token for the std, a
  constant p or q for the correlation) these are 0 here; `_valid` tells an
  empty batch apart. Log-probs above 0 (not log-probs) are clipped to 0 for
  p and q, so the metrics stay finite.

  Args:
    lp_old: learner log-probs `[B, T]`.
    lp_mu: sampler log-probs `[B, T]`.
    mask: response mask `[B, T]`, bool or {0, 1}.

  Returns:
    float32 scalars keyed by `PROBABILITY_METRIC_NAMES`.
  """
  m_BT = _masked.as_float_mask(mask)
  on_BT = m_BT > 0
  lp_old = jnp.where(on_BT, jax.lax.stop_gradient(jnp.asarray(lp_old, jnp.float32)), 0.0)
  lp_mu = jnp.where(on_BT, jax.lax.stop_gradient(jnp.asarray(lp_mu, jnp.float32)), 0.0)
  # A log-prob is ≤ 0; clip at 0 so that a corrupt value cannot overflow p.
  p_BT, q_BT = jnp.exp(jnp.minimum(lp_old, 0.0)), jnp.exp(jnp.minimum(lp_mu, 0.0))
  n = jnp.sum(m_BT)
  diff_BT = jnp.abs(p_BT - q_BT)
  mean = _masked.masked_mean(diff_BT, m_BT)
  var = _masked.safe_div(jnp.sum(jnp.square(diff_BT - mean) * m_BT), n - 1.0)
  p_c = jnp.where(on_BT, p_BT - _masked.masked_mean(p_BT, m_BT), 0.0)
  q_c = jnp.where(on_BT, q_BT - _masked.masked_mean(q_BT, m_BT), 0.0)
  corr = _masked.safe_div(jnp.sum(p_c * q_c),
                          jnp.sqrt(jnp.sum(jnp.square(p_c)) * jnp.sum(jnp.square(q_c))))
  has_B = (jnp.sum(m_BT, axis=-1) > 0).astype(jnp.float32)
  abs_lp_B = _masked.row_mean(jnp.abs(lp_old - lp_mu), m_BT)
  out = {
      "training/rollout_probs_diff_valid": (n > 0).astype(jnp.float32),
      "training/rollout_probs_diff_max": _masked.masked_max(diff_BT, m_BT),
      "training/rollout_probs_diff_mean": mean,
      "training/rollout_probs_diff_std": jnp.where(n > 1, jnp.sqrt(jnp.maximum(var, 0.0)), 0.0),
      # torch.corrcoef clips to [-1, 1] as well.
      "training/rollout_actor_probs_pearson_corr": jnp.clip(corr, -1.0, 1.0),
      "train/train_rollout_logprob_abs_diff": _over(abs_lp_B, has_B, "mean"),
  }
  return {k: v.astype(jnp.float32) for k, v in out.items()}


def is_metrics(weights_BT: jax.Array, raw_BT: jax.Array, log_ratio_B: Optional[jax.Array],
               mask_BT: jax.Array, *, upper: float,
               lower: Optional[float] = None) -> dict[str, jax.Array]:
  """The IS weights' statistics, verl's `compute_is_metrics`.

  Args:
    weights_BT: the applied weights after the IS mode (truncation / icepop /
      mask), before rejection and self-normalisation; 0 off the mask.
    raw_BT: the raw weights `exp(ℓ)` before the mode (0 off the mask).
    log_ratio_B: the per-response log-ratio of a sequence-level IS (Σ δ, or
      the mean for the geometric level), None at token level.
    mask_BT: the response mask m.
    upper: the upper bound U.
    lower: the lower bound (None: 1/U).

  Returns:
    float32 scalars keyed by `IS_METRIC_NAMES`.
  """
  m = _masked.as_float_mask(mask_BT)
  has_B = (jnp.sum(m, axis=-1) > 0).astype(jnp.float32)
  lower = 1.0 / upper if lower is None else lower
  out = {"rollout_is_mean": _mm(weights_BT, m)}
  if log_ratio_B is None:
    out["rollout_is_ratio_fraction_high"] = _mm((raw_BT > upper).astype(jnp.float32), m)
    out["rollout_is_ratio_fraction_low"] = _mm((raw_BT < lower).astype(jnp.float32), m)
    out["rollout_is_max"] = _masked.masked_max(weights_BT, m)
    out["rollout_is_min"] = _masked.masked_min(weights_BT, m)
  else:
    out["rollout_is_max"] = jnp.exp(jnp.minimum(_over(log_ratio_B, has_B, "max"),
                                                _masked.LOG_RATIO_BOUND))
    # verl leaves the minimum unclamped; clamping it too keeps it finite when
    # every response's ratio overflows (verl then reports inf).
    out["rollout_is_min"] = jnp.exp(jnp.minimum(_over(log_ratio_B, has_B, "min"),
                                                _masked.LOG_RATIO_BOUND))
    out["rollout_is_ratio_fraction_high"] = _over(
        (log_ratio_B > math.log(upper)).astype(jnp.float32), has_B, "mean")
    out["rollout_is_ratio_fraction_low"] = _over(
        (log_ratio_B < (math.log(lower) if lower > 0 else -math.inf)).astype(jnp.float32),
        has_B, "mean")
  w = jnp.clip(weights_BT, 0.0, upper)
  mean_w = _mm(w, m)
  count = jnp.sum(m)
  out["rollout_is_std"] = jnp.where(
      count > 1, jnp.sqrt(jnp.maximum(_mm(jnp.square(w), m) - jnp.square(mean_w), 0.0)), 0.0)
  out["rollout_is_eff_sample_size"] = _masked.safe_div(
      1.0, _mm(jnp.square(w / (mean_w + _EPS)), m))
  seq_B = _mm(weights_BT, m, axis=-1)
  raw_seq_B = _mm(raw_BT, m, axis=-1)
  out.update({
      "rollout_is_seq_mean": _over(seq_B, has_B, "mean"),
      "rollout_is_seq_std": _seq_std(seq_B, has_B),
      "rollout_is_seq_max": _over(seq_B, has_B, "max"),
      "rollout_is_seq_min": _over(seq_B, has_B, "min"),
      "rollout_is_seq_max_deviation": _over(jnp.abs(seq_B - 1.0), has_B, "max"),
      "rollout_is_seq_fraction_high": _over((raw_seq_B > upper).astype(jnp.float32),
                                            has_B, "mean"),
      "rollout_is_seq_fraction_low": _over((raw_seq_B < lower).astype(jnp.float32),
                                           has_B, "mean"),
  })
  return {P + k: v.astype(jnp.float32) for k, v in out.items()}


def rs_metrics(name: str, stat_BT: jax.Array, seq_stat_B: Optional[jax.Array],
               mask_BT: jax.Array, keep_BT: jax.Array, *, upper: float,
               lower: Optional[float]) -> dict[str, jax.Array]:
  """One trust-region criterion's statistics, verl's `compute_rs_metrics` plus its
  `rollout_rs_<criterion>_masked_fraction` / `_seq_masked_fraction`.

  Args:
    name: the criterion, e.g. "seq_max_k3".
    stat_BT: its per-token statistic (a per-response one broadcast).
    seq_stat_B: the per-response statistic (None at token level: the row mean).
    mask_BT: the response mask m.
    keep_BT: the tokens this criterion keeps.
    upper: the upper threshold (for k1 criteria: log of the ratio bound).
    lower: the lower threshold (k1 criteria only: log of the ratio bound).
  """
  m = _masked.as_float_mask(mask_BT)
  has_B = (jnp.sum(m, axis=-1) > 0).astype(jnp.float32)
  seq_level = seq_stat_B is not None
  seq_B = seq_stat_B if seq_level else _mm(stat_BT, m, axis=-1)
  low = 0.0 if lower is None else lower
  out = {"mean": _mm(stat_BT, m)}
  if seq_level:
    out["max"], out["min"] = _over(seq_B, has_B, "max"), _over(seq_B, has_B, "min")
    out["fraction_high"] = _over((seq_B > upper).astype(jnp.float32), has_B, "mean")
    out["fraction_low"] = (_over((seq_B < low).astype(jnp.float32), has_B, "mean")
                           if lower is not None else jnp.zeros([], jnp.float32))
  else:
    out["max"], out["min"] = _masked.masked_max(stat_BT, m), _masked.masked_min(stat_BT, m)
    out["fraction_high"] = _mm((stat_BT > upper).astype(jnp.float32), m)
    out["fraction_low"] = (_mm((stat_BT < low).astype(jnp.float32), m)
                           if lower is not None else jnp.zeros([], jnp.float32))
  clamped = jnp.clip(stat_BT, low, upper)
  mean_c = _mm(clamped, m)
  out["std"] = jnp.where(jnp.sum(m) > 1, jnp.sqrt(jnp.maximum(
      _mm(jnp.square(clamped), m) - jnp.square(mean_c), 0.0)), 0.0)
  out.update({
      "seq_mean": _over(seq_B, has_B, "mean"),
      "seq_std": _seq_std(seq_B, has_B),
      "seq_max": _over(seq_B, has_B, "max"),
      "seq_min": _over(seq_B, has_B, "min"),
      "seq_max_deviation": _over(jnp.abs(seq_B), has_B, "max"),
      "seq_fraction_high": _over((seq_B > upper).astype(jnp.float32), has_B, "mean"),
  })
  if lower is not None:
    out["seq_fraction_low"] = _over((seq_B < low).astype(jnp.float32), has_B, "mean")
  keep = keep_BT.astype(jnp.float32)
  out["masked_fraction"] = _mm(1.0 - keep, m)
  rejected_B = jnp.any((keep == 0) & (m > 0), axis=-1).astype(jnp.float32)
  out["seq_masked_fraction"] = _over(rejected_B, has_B, "mean")
  return {f"{P}rollout_rs_{name}_{k}": v.astype(jnp.float32) for k, v in out.items()}


def rs_combined_metrics(mask_BT: jax.Array, rs_keep_BT: jax.Array) -> dict[str, jax.Array]:
  """`rollout_rs_masked_fraction` (tokens) and `rollout_rs_seq_masked_fraction`
  (responses with a rejected token) of all rejection criteria together."""
  m = _masked.as_float_mask(mask_BT)
  has_B = (jnp.sum(m, axis=-1) > 0).astype(jnp.float32)
  rejected_B = jnp.any((rs_keep_BT == 0) & (m > 0), axis=-1).astype(jnp.float32)
  return {P + "rollout_rs_masked_fraction": _mm(1.0 - rs_keep_BT, m).astype(jnp.float32),
          P + "rollout_rs_seq_masked_fraction": _over(rejected_B, has_B, "mean")}


def correction_metrics(frac: Mapping[str, jax.Array], norm: jax.Array,
                       keep_BT: jax.Array, mask_BT: jax.Array) -> dict[str, jax.Array]:
  """What the correction did, once its final mask is known (docs/method.md §4).

  Args:
    frac: token fractions of the IS mode and veto (`truncated`, `clipped_low`,
      `clipped_high`, `is_masked`, `veto`; `oob` for IcePop only).
    norm: the self-normalisation factor (1 when off).
    keep_BT: the final keep mask (rejection, IS mask, veto).
    mask_BT: the response mask.

  Returns:
    `rollout_is_{truncated,clipped_low,clipped_high,masked,veto}_fraction`,
    `rollout_is_batch_norm_factor`, `rejected_token_fraction` (of the response
    tokens, 0 for an empty batch) and, for IcePop, `rollout_is_oob_ratio`.
  """
  m = _masked.as_float_mask(mask_BT)
  rejected = 1.0 - _masked.safe_div(jnp.sum(keep_BT), jnp.sum(m))
  out = {P + f"rollout_is_{k}_fraction": frac[k]
         for k in ("truncated", "clipped_low", "clipped_high")}
  out[P + "rollout_is_masked_fraction"] = frac["is_masked"]
  out[P + "rollout_is_veto_fraction"] = frac["veto"]
  out[P + "rollout_is_batch_norm_factor"] = norm
  out[P + "rejected_token_fraction"] = jnp.where(jnp.sum(m) > 0, rejected, 0.0)
  if "oob" in frac:
    out[P + "rollout_is_oob_ratio"] = frac["oob"]
  return out
