"""Loss and correction configs: presets, validation, conversion."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from mipu_jax import losses

CC = losses.CorrectionConfig
LC = losses.LossConfig

# docs/method.md §3 presets as documented (fields not listed keep the defaults).
DOCUMENTED = {
    "none": dict(is_level=None, rs_level=None, veto_threshold=None,
                 self_normalize=False),
    "token_tis": dict(is_level="token", is_mode="truncate", is_upper=2.0),
    "seq_tis": dict(is_level="sequence", is_mode="truncate", is_upper=2.0),
    "geo_tis": dict(is_level="geometric", is_mode="truncate", is_upper=2.0),
    "token_mis": dict(is_level="token", is_mode="mask", is_lower=0.5,
                      is_upper=2.0),
    "seq_mis": dict(is_level="sequence", is_mode="mask", is_lower=0.5,
                    is_upper=2.0),
    "geo_rs": dict(is_level=None, rs_level="geometric", rs_lower=0.999,
                   rs_upper=1.001),
    "icepop": dict(is_level="token", is_mode="icepop", is_lower=0.5,
                   is_upper=5.0),
    "mis_miles": dict(is_level="token", is_mode="truncate", is_lower=0.5,
                      is_upper=2.0, rs_level="token", rs_lower=0.5,
                      rs_upper=2.0, veto_threshold=1e-4, self_normalize=True),
    "mipu_step1": dict(is_level="token", is_mode="truncate", is_upper=2.0,
                       rs_level=None, veto_threshold=None,
                       self_normalize=False),
    # verl's RolloutCorrectionConfig presets of the same names.
    "seq_is_rs": dict(is_level="sequence", is_mode="truncate", is_upper=2.0,
                      rs_criteria="seq_sum_k1", rs_thresholds="0.5_2.0"),
    "geo_rs_token_tis": dict(is_level="token", is_mode="truncate",
                             is_upper=2.0, rs_criteria="seq_mean_k1",
                             rs_thresholds="0.999_1.001"),
    "geo_rs_seq_tis": dict(is_level="sequence", is_mode="truncate",
                           is_upper=2.0, rs_criteria="seq_mean_k1",
                           rs_thresholds="0.999_1.001"),
    "k3_rs": dict(is_level=None, rs_criteria="seq_mean_k3",
                  rs_thresholds="0.01"),
}


def test_every_preset_is_documented():
  assert set(losses.CORRECTION_PRESETS) == set(DOCUMENTED)


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_preset_settings(name):
  cfg = CC.from_preset(name)
  for field, value in DOCUMENTED[name].items():
    assert getattr(cfg, field) == value, (name, field)


def test_preset_overrides():
  cfg = CC.from_preset("mipu_step1", is_level="geometric")
  assert cfg.is_level == "geometric" and cfg.is_upper == 2.0
  with pytest.raises(ValueError, match="unknown CorrectionConfig field"):
    CC.from_preset("token_tis", upper=3.0)
  with pytest.raises(ValueError, match="unknown correction preset"):
    CC.from_preset("tis")


def test_defaults():
  cfg = LC()
  assert (cfg.eps_low, cfg.eps_high, cfg.dual_clip) == (0.2, 0.28, None)
  assert cfg.aggregation == "token_mean" and cfg.rejected_in_denominator
  assert cfg.kl_coef == 0.0 and cfg.entropy_coef == 0.0
  assert cfg.mode == "on_policy_recompute" and cfg.advantage == "grpo"
  assert cfg.correction == CC.from_preset("token_tis")


def test_frozen_and_hashable():
  cfg = LC()
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.eps_low = 0.1  # type: ignore[misc]
  assert hash(cfg) == hash(LC())
  f = jax.jit(lambda x, c: x * c.eps_high, static_argnums=1)
  assert f(jnp.ones(()), cfg) == jnp.float32(0.28)


@pytest.mark.parametrize("correction", [
    "token_tis", "seq_mis", "geo_rs", "mis_miles", "icepop", "mipu_step1"])
def test_bypass_rejects_corrections(correction):
  with pytest.raises(ValueError, match="bypass"):
    LC(mode="bypass", correction=CC.from_preset(correction))


def test_bypass_rejects_veto_alone():
  with pytest.raises(ValueError, match="bypass"):
    LC(mode="bypass", correction=CC(is_level=None, veto_threshold=1e-4))


def test_bypass_with_no_correction_is_fine():
  cfg = LC(mode="bypass", correction=CC.from_preset("none"))
  assert not cfg.correction.enabled


@pytest.mark.parametrize("kw,match", [
    (dict(advantage="ppo"), "unknown advantage estimator"),
    (dict(aggregation="sum"), "unknown aggregation"),
    (dict(kl_estimator="k4"), "unknown kl_estimator"),
    (dict(mode="async"), "unknown mode"),
    (dict(eps_low=1.0), "eps_low"),
    (dict(eps_low=-0.1), "eps_low"),
    (dict(eps_high=-0.1), "eps_high"),
    (dict(dual_clip=1.0), "dual_clip"),
    (dict(max_len=0), "max_len"),
    (dict(max_len=2.5), "max_len"),
    (dict(kl_coef=-1.0), "kl_coef"),
    (dict(entropy_coef=-1.0), "entropy_coef"),
    (dict(correction="token_tis"), "must be a CorrectionConfig"),
])
def test_loss_config_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    LC(**kw)


@pytest.mark.parametrize("kw,match", [
    (dict(is_level="tok"), "unknown is_level"),
    (dict(rs_level="row"), "unknown rs_level"),
    (dict(is_mode="cap"), "unknown is_mode"),
    (dict(is_upper=-2.0), "is_upper must be finite and >= 0"),
    (dict(is_lower=-0.5), "is_lower must be finite and >= 0"),
    (dict(is_lower=3.0), "lower bound 3.0 > upper bound 2.0"),
    (dict(rs_level="token", rs_lower=1.5, rs_upper=1.2), "RS lower bound"),
    (dict(veto_threshold=-1.0), "veto_threshold"),
])
def test_correction_config_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    CC(**kw)
  with pytest.raises(ValueError, match=match):
    CC.from_preset("token_tis", **kw)


def test_from_dict():
  cfg = LC.from_dict({"aggregation": "seq_mean_token_sum",
                      "correction": {"preset": "mipu_step1",
                                     "is_level": "geometric"}})
  assert cfg.aggregation == "seq_mean_token_sum"
  assert cfg.correction == CC.from_preset("mipu_step1", is_level="geometric")
  assert LC.from_dict({"correction": "mis_miles"}).correction == (
      CC.from_preset("mis_miles"))
  assert LC.from_dict({"mode": "bypass"}).correction == CC.from_preset("none")
  with pytest.raises(ValueError, match="unknown LossConfig field"):
    LC.from_dict({"eps": 0.1})
  with pytest.raises(ValueError, match="bypass"):
    LC.from_dict({"mode": "bypass", "correction": "token_tis"})
