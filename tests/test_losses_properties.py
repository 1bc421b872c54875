"""Property tests: finiteness under extreme inputs, and no recompilation.

Shapes are fixed ([B, T] = [2, 3], as in the other loss tests) and hypothesis
only varies values, so after the first example every call hits the compiled-op
caches: eager mode is cheaper on CPU than compiling a program per
configuration.
"""

import dataclasses
import functools

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import jax
import numpy as np

from mipu_jax import losses

B, T = 2, 3
_SETTINGS = settings(max_examples=25, deadline=None)

# Extreme log-probs (±1e4) mixed with ordinary ones.
_lp = hnp.arrays(
    np.float32, (B, T),
    elements=st.one_of(st.sampled_from([-1e4, 1e4, 0.0]),
                       st.floats(-1e4, 1e4, width=32)))
_adv = hnp.arrays(np.float32, (B,), elements=st.floats(-10, 10, width=32))


@st.composite
def _masks(draw):
  """Random masks that always contain at least one all-zero row."""
  mask = draw(hnp.arrays(np.bool_, (B, T)))
  mask[draw(st.integers(0, B - 1))] = False
  return mask.astype(np.float32)


_CONFIGS = (
    losses.LossConfig(correction=losses.CorrectionConfig.from_preset(
        "mis_miles")),
    losses.LossConfig(
        aggregation="seq_mean_token_mean", dual_clip=3.0, kl_coef=0.1,
        entropy_coef=0.01, rejected_in_denominator=False,
        correction=losses.CorrectionConfig.from_preset("seq_mis",
                                                       self_normalize=True)),
    losses.LossConfig(
        aggregation="seq_mean_token_sum_norm", max_len=7, kl_estimator="k1",
        kl_coef=0.1, correction=losses.CorrectionConfig.from_preset(
            "geo_tis", rs_level="geometric", rs_upper=1.5)),
    losses.LossConfig(
        mode="bypass", aggregation="seq_mean_token_sum", kl_estimator="k2",
        kl_coef=0.1, correction=losses.CorrectionConfig.from_preset("none")),
)


def _loss_and_grad(cfg):
  def f(lp, lp_old, lp_mu, adv, mask, lp_ref_model, entropy):
    return losses.policy_loss(lp, lp_old, lp_mu, adv, mask, cfg,
                              lp_ref_model=lp_ref_model, entropy=entropy)
  return jax.value_and_grad(f, has_aux=True)


def _corrections(preset):
  kw = dataclasses.asdict(losses.CorrectionConfig.from_preset(preset))
  return functools.partial(losses.correction_weights, **kw)


def _all_finite(tree):
  return all(bool(np.all(np.isfinite(x))) for x in jax.tree.leaves(tree))


@_SETTINGS
@given(lp=_lp, lp_old=_lp, lp_mu=_lp, lp_ref=_lp, adv=_adv, mask=_masks(),
       cfg_index=st.integers(0, len(_CONFIGS) - 1))
def test_policy_loss_and_grad_stay_finite(lp, lp_old, lp_mu, lp_ref, adv, mask,
                                          cfg_index):
  entropy = np.abs(lp_ref)
  (loss, metrics), grad = _loss_and_grad(_CONFIGS[cfg_index])(
      lp, lp_old, lp_mu, adv, mask, lp_ref, entropy)
  assert _all_finite((loss, metrics, grad))
  # No gradient reaches tokens that do not count.
  assert np.all(np.asarray(grad)[mask == 0] == 0)


@_SETTINGS
@given(lp_old=_lp, lp_mu=_lp, mask=_masks(),
       preset=st.sampled_from(sorted(losses.CORRECTION_PRESETS)))
def test_corrections_and_metrics_stay_finite(lp_old, lp_mu, mask, preset):
  w, m, metrics = _corrections(preset)(lp_old, lp_mu, mask)
  assert _all_finite((w, m, metrics))
  assert np.all(np.asarray(w) >= 0)
  # Rejection only removes tokens, and an empty row stays empty.
  assert np.all(np.asarray(m) <= mask)
  assert np.all(np.asarray(w)[mask == 0] == 0)
  assert _all_finite(losses.mismatch_metrics(lp_old, lp_mu, mask))


@_SETTINGS
@given(rewards=hnp.arrays(np.float32, (B, T),
                          elements=st.floats(-1e3, 1e3, width=32)),
       equal_rows=hnp.arrays(np.bool_, (B,)),
       estimator=st.sampled_from(losses.ADVANTAGE_ESTIMATORS))
def test_all_equal_rewards_give_zero_advantage(rewards, equal_rows, estimator):
  rewards[equal_rows] = rewards[equal_rows, :1]
  adv = np.asarray(losses.compute_advantages(rewards, estimator))
  assert np.all(np.isfinite(adv))
  np.testing.assert_array_equal(adv[equal_rows], 0.0)
  np.testing.assert_array_equal(losses.all_equal_groups(rewards)[equal_rows],
                                True)


def test_second_call_does_not_recompile():
  traces = []
  cfg = _CONFIGS[0]

  @jax.jit
  def step(lp, lp_old, lp_mu, adv, mask):
    traces.append(None)  # Python side effect: runs only while tracing.
    return losses.policy_loss(lp, lp_old, lp_mu, adv, mask, cfg)

  rng = np.random.default_rng(0)
  def batch():
    lps = [rng.normal(size=(B, T)).astype(np.float32) - 2 for _ in range(3)]
    return (*lps, rng.normal(size=(B,)).astype(np.float32),
            (rng.random((B, T)) > 0.3).astype(np.float32))

  step(*batch())
  step(*batch())
  assert len(traces) == 1
  assert step._cache_size() == 1  # pylint: disable=protected-access
