"""Parity with verl 0.9.1's rollout correction, run side by side.

verl's `rollout_corr_helper.py` (weights, rejection masks and every
`rollout_corr/` metric) is loaded from the installed `verl==0.9.1` wheel
(`pip install --no-deps verl==0.9.1`; the README's test command installs it)
with only the imports it needs for these pure functions replaced by small
stand-ins (`DataProto` holds the weights dict; nothing distributed), so no part
of the computation compared is ours. `correction_weights` on the same log-probs
must give verl's weights, masks and metrics.

Every batch is ragged and every response has at least one counted token (verl
counts an empty response in its per-response means; this project leaves it
out, docs/method.md §4).
"""

import importlib.metadata
import importlib.util
import pathlib
import sys
import types
import zlib

import numpy as np
import pytest

from mipu_jax import losses

torch = pytest.importorskip("torch")
_SPEC = importlib.util.find_spec("verl")
if _SPEC is None:
  pytest.skip("verl==0.9.1 not installed (pip install --no-deps verl==0.9.1)",
              allow_module_level=True)
_VERL_DIR = pathlib.Path(_SPEC.submodule_search_locations[0])
_VERSION = importlib.metadata.version("verl")


def _stub(name, **attrs):
  module = types.ModuleType(name)
  module.__dict__.update(attrs)
  return module


def _load_helper():
  """verl's helper module, with stand-ins for its heavy package imports."""

  class DataProto:  # Only `from_dict(tensors=...)` is used on this path.
    def __init__(self, tensors):
      self.batch = tensors

    @classmethod
    def from_dict(cls, tensors):
      return cls(tensors)

  stubs = {
      "tensordict": _stub("tensordict", TensorDict=dict),
      "verl": _stub("verl", __path__=[]),
      "verl.utils": _stub("verl.utils", __path__=[]),
      "verl.utils.device": _stub("verl.utils.device",
                                 get_device_name=lambda: "cpu",
                                 get_torch_device=lambda: torch.cpu),
      "verl.protocol": _stub("verl.protocol", DataProto=DataProto),
      "verl.trainer": _stub("verl.trainer", __path__=[]),
      "verl.trainer.ppo": _stub("verl.trainer.ppo", __path__=[]),
      "verl.trainer.config": _stub("verl.trainer.config", __path__=[]),
      "verl.trainer.config.algorithm": _stub(
          "verl.trainer.config.algorithm", RolloutCorrectionConfig=object),
      "verl.workers": _stub("verl.workers", __path__=[]),
      "verl.workers.config": _stub("verl.workers.config", __path__=[]),
      "verl.workers.config.actor": _stub("verl.workers.config.actor",
                                         PolicyLossConfig=object),
  }
  saved = {k: sys.modules.get(k) for k in
           [*stubs, "verl.utils.torch_functional", "verl.trainer.ppo.helper"]}
  try:
    sys.modules.update(stubs)
    loaded = {}
    for name, rel in (("verl.utils.torch_functional", "utils/torch_functional.py"),
                      ("verl.trainer.ppo.helper", "trainer/ppo/rollout_corr_helper.py")):
      spec = importlib.util.spec_from_file_location(name, _VERL_DIR / rel)
      module = importlib.util.module_from_spec(spec)
      sys.modules[name] = module
      if name == "verl.utils.torch_functional":
        stubs["verl.utils"].torch_functional = module
      spec.loader.exec_module(module)
      loaded[name] = module
    return loaded["verl.trainer.ppo.helper"]
  finally:
    for k, v in saved.items():
      if v is None:
        sys.modules.pop(k, None)
      else:
        sys.modules[k] = v


VERL = _load_helper()


def test_verl_version():
  assert _VERSION == "0.9.1", "parity is pinned to verl 0.9.1's definitions"


def _batch(seed, scale):
  """Ragged [6, 9] batch: lengths 1..9, δ ~ N(0, scale), garbage padding."""
  rng = np.random.default_rng(seed)
  b, t = 6, 9
  lengths = rng.permutation(np.r_[1, t, rng.integers(1, t + 1, b - 2)])
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
  lp_mu = -rng.uniform(0.01, 4.0, (b, t)).astype(np.float32)
  lp_old = (lp_mu + rng.normal(0, scale, (b, t))).astype(np.float32)
  return lp_old, lp_mu, mask


def _verl(lp_old, lp_mu, mask, **kw):
  proto, keep, metrics = VERL.compute_rollout_correction_and_rejection_mask(
      torch.from_numpy(lp_old), torch.from_numpy(lp_mu), torch.from_numpy(mask), **kw)
  w = None if proto is None else proto.batch["rollout_is_weights"].numpy()
  return w, keep.numpy(), metrics


# Trust-region thresholds that keep most of a δ ~ N(0, 0.05) batch and reject
# much of a δ ~ N(0, 0.5) one.
THRESHOLDS = {
    "token_k1": "0.7_1.4", "token_k2": "0.02", "token_k3": "0.02",
    "seq_sum_k1": "1.5", "seq_sum_k2": "0.1", "seq_sum_k3": "0.1",
    "seq_mean_k1": "0.9_1.1", "seq_mean_k2": "0.01", "seq_mean_k3": "0.01",
    "seq_max_k2": "0.05", "seq_max_k3": "0.05",
}
SCALES = (0.05, 0.5)

# (ours, verl) pairs: CorrectionConfig fields, and verl's arguments.
CASES = {
    "token_tis": (dict(is_level="token", is_upper=2.0),
                  dict(rollout_is="token", rollout_is_threshold=2.0)),
    "seq_tis": (dict(is_level="sequence", is_upper=2.0),
                dict(rollout_is="sequence", rollout_is_threshold=2.0)),
    "token_icepop": (dict(is_level="token", is_mode="icepop", is_lower=0.5,
                          is_upper=5.0),
                     dict(rollout_is="token", rollout_is_threshold="0.5_5.0")),
    "seq_icepop": (dict(is_level="sequence", is_mode="icepop", is_lower=0.5,
                        is_upper=5.0),
                   dict(rollout_is="sequence", rollout_is_threshold="0.5_5.0")),
    "token_tis_snis": (dict(is_level="token", is_upper=2.0, self_normalize=True),
                       dict(rollout_is="token", rollout_is_threshold=2.0,
                            rollout_is_batch_normalize=True)),
    "seq_tis_snis": (dict(is_level="sequence", is_upper=2.0, self_normalize=True),
                     dict(rollout_is="sequence", rollout_is_threshold=2.0,
                          rollout_is_batch_normalize=True)),
    "seq_is_rs": (dict(is_level="sequence", is_upper=2.0,
                       rs_criteria="seq_sum_k1", rs_thresholds="0.5_2.0"),
                  dict(rollout_is="sequence", rollout_is_threshold=2.0,
                       rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0")),
    "geo_rs_token_tis": (dict(is_level="token", is_upper=2.0,
                              rs_criteria="seq_mean_k1", rs_thresholds="0.9_1.1"),
                         dict(rollout_is="token", rollout_is_threshold=2.0,
                              rollout_rs="seq_mean_k1",
                              rollout_rs_threshold="0.9_1.1")),
    "k3_rs": (dict(is_level=None, rs_criteria="seq_mean_k3", rs_thresholds="0.01"),
              dict(rollout_is=None, rollout_rs="seq_mean_k3",
                   rollout_rs_threshold=0.01)),
    # Every criterion at once (thresholds below, k1 both ways of writing it).
    "all_criteria": (
        dict(is_level="token", is_upper=2.0, rs_criteria=",".join(losses.CRITERIA),
             rs_thresholds=",".join(THRESHOLDS[c] for c in losses.CRITERIA)),
        dict(rollout_is="token", rollout_is_threshold=2.0,
             rollout_rs=",".join(losses.CRITERIA),
             rollout_rs_threshold=",".join(THRESHOLDS[c] for c in losses.CRITERIA))),
    # Each criterion alone, without IS.
    **{c: (dict(is_level=None, rs_criteria=c, rs_thresholds=THRESHOLDS[c]),
           dict(rollout_is=None, rollout_rs=c, rollout_rs_threshold=THRESHOLDS[c]))
       for c in losses.CRITERIA},
}


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_weights_masks_and_metrics_match_verl(case, scale):
  ours_kw, verl_kw = CASES[case]
  lp_old, lp_mu, mask = _batch(zlib.crc32(case.encode()), scale)
  w_ref, keep_ref, m_ref = _verl(lp_old, lp_mu, mask, **verl_kw)
  w, keep, m = losses.correction_weights(lp_old, lp_mu, mask, **ours_kw)
  m = {**m, **losses.mismatch_metrics(lp_old, lp_mu, mask)}

  np.testing.assert_array_equal(np.asarray(keep), keep_ref)
  # verl applies its mask in the loss; ours is already in the weights.
  w_ref = keep_ref if w_ref is None else w_ref * keep_ref
  np.testing.assert_allclose(np.asarray(w), w_ref, rtol=2e-5, atol=1e-6)
  assert set(m_ref) <= set(m), sorted(set(m_ref) - set(m))
  # Both compute in float32; a std as sqrt(E w² - (E w)²) cancels digits.
  # k3 (k3_kl and the k3 criteria): verl's float32 exp(δ) - δ - 1 reads exactly 0
  # for |δ| up to about 3e-4, ours (losses._masked.k3) does not cancel
  # (docs/method.md §4); at these batches' scales the two agree within rounding.
  for name, ref in m_ref.items():
    np.testing.assert_allclose(float(m[name]), ref, rtol=5e-5, atol=2e-5,
                               err_msg=name)


@pytest.mark.parametrize("case", [*losses.CRITERIA, "all_criteria"])
def test_rejection_cases_are_not_trivial(case):
  # Each rejection case keeps and rejects tokens at one scale or another, so
  # the mask comparison above can fail.
  kept = []
  for scale in SCALES:
    lp_old, lp_mu, mask = _batch(zlib.crc32(case.encode()), scale)
    _, keep, _ = _verl(lp_old, lp_mu, mask, **CASES[case][1])
    kept.append(keep.sum() / mask.sum())
  assert max(kept) > 0.5 and min(kept) < 0.9, kept


def test_criteria_thresholds_parse_as_verl():
  options = list(losses.CRITERIA)
  spec = ",".join(THRESHOLDS[c] for c in options)
  ref = VERL._parse_rollout_rs_thresholds(options, spec)
  for c in losses.parse_criteria(",".join(options), spec):
    k1 = c.name.endswith("k1")
    upper = np.exp(c.upper) if k1 else c.upper
    np.testing.assert_allclose(upper, ref[c.name]["upper"], rtol=1e-12)
    if k1:
      np.testing.assert_allclose(np.exp(c.lower), ref[c.name]["lower"], rtol=1e-12)
    else:
      assert c.lower is None and ref[c.name]["lower"] is None


@pytest.mark.parametrize("criteria,thresholds", [
    ("token_k1", "2.0_0.5"),  # lower > upper
    ("token_k2", "0.1_0.2"),  # k2 takes one bound
    ("seq_mean_k3", "-0.1"),
    ("token_k1,token_k2,token_k3", "1.5,0.1"),  # neither one nor one each
    ("seq_max_k1", "2.0"),  # no such criterion
])
def test_bad_thresholds_fail_in_both(criteria, thresholds):
  with pytest.raises(ValueError):
    losses.parse_criteria(criteria, thresholds)
  with pytest.raises(ValueError):
    VERL._parse_rollout_rs_thresholds(criteria.split(","), thresholds) \
        if "max_k1" not in criteria else VERL.compute_rollout_rejection_mask(
            torch.zeros(1, 1), torch.ones(1, 1), criteria, thresholds)
