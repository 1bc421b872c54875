"""The config boundary: ConfigDict → validated frozen dataclasses."""

import dataclasses
import os
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from mipu_jax import config as config_lib
from studies.configs import base as base_config
from studies.configs import small_cpu


def _cd(**sections):
  """The default ConfigDict with `section={field: value}` overrides applied."""
  cd = config_lib.default_config()
  for section, values in sections.items():
    node = cd
    for part in section.split("__"):
      node = node[part]
    for k, v in values.items():
      node[k] = v
  return cd


def test_default_config_round_trips_to_the_dataclass_defaults():
  assert config_lib.from_config_dict(config_lib.default_config()) == config_lib.TrainConfig()


def test_configdict_is_frozen_and_lockable():
  cd = config_lib.default_config()
  cd.lock()
  cd.loss.correction.preset = "seq_tis"  # existing fields stay overridable
  cd.sampling.weight_quant = "fp8_e4m3"
  with pytest.raises(AttributeError):
    cd.loss.not_a_field = 1
  cfg = config_lib.from_config_dict(cd)
  assert cfg.loss.correction.is_level == "sequence"
  assert cfg.sampling.precision_kwargs()["weight_quant"] == "fp8_e4m3"
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.num_steps = 3


def test_correction_preset_with_overrides_and_none_level():
  cd = _cd(loss__correction={"preset": "mis_miles", "is_upper": 3.0})
  corr = config_lib.from_config_dict(cd).loss.correction
  assert (corr.is_upper, corr.rs_level, corr.veto_threshold, corr.self_normalize) == (
      3.0, "token", 1e-4, True)
  cd = _cd(loss__correction={"preset": "mis_miles", "is_level": "none"})
  assert config_lib.from_config_dict(cd).loss.correction.is_level is None


@pytest.mark.parametrize("sections, match", [
    (dict(loss={"mode": "bypass"}), "bypass"),
    (dict(loss={"mode": "bypass"}, loss__correction={"preset": "seq_tis"}), "bypass"),
    (dict(loss__correction={"preset": "no_such_preset"}), "unknown correction preset"),
    (dict(loss__correction={"is_lower": 3.0, "is_upper": 2.0}), "lower"),
    (dict(loss__correction={"rs_level": "token", "rs_lower": 2.5, "rs_upper": 2.0}), "lower"),
    (dict(loss={"aggregation": "token_sum"}), "aggregation"),
    (dict(loss={"advantage": "ppo"}), "advantage"),
    (dict(data={"prompts_per_step": 3, "group_size": 3}, learner={"num_minibatches": 2}),
     "does not split"),
    (dict(sampling={"weight_quant": "int2"}), "int2"),
    (dict(sampling={"temperature": 0.0}), "temperature"),
    (dict(optim={"schedule": "length_surge"}, optim__length_surge={"mode": "fixed"}),
     "decay_period"),
    (dict(optim={"schedule": "linear"}), "unknown schedule"),
    (dict(model={"preset": "qwen3_99b"}), "preset"),
    (dict(model={"init_from": "/no/such/dir"}), "not a directory"),
    (dict(data={"train_tiers": ("tier9",)}), "tier"),
    (dict(learner__mesh={"data": -1, "fsdp": -1}), "mesh"),
])
def test_impossible_configs_fail_at_config_time(sections, match):
  with pytest.raises(ValueError, match=match):
    config_lib.from_config_dict(_cd(**sections))


def test_bypass_with_preset_none_is_valid():
  cfg = config_lib.from_config_dict(
      _cd(loss={"mode": "bypass"}, loss__correction={"preset": "none"}))
  assert cfg.loss.mode == "bypass" and not cfg.loss.correction.enabled


def test_unknown_field_is_an_error():
  with pytest.raises(ValueError, match="unknown config field"):
    config_lib.from_config_dict({"data": {"prompts": 3}})


def test_truncated_sampling_warns_that_the_ratio_is_biased():
  with pytest.warns(UserWarning, match="biased"):
    config_lib.from_config_dict(_cd(sampling={"top_k": 5}))


def test_schedule_kwargs():
  cfg = config_lib.from_config_dict(_cd(
      optim={"schedule": "length_surge"},
      optim__length_surge={"mode": "fixed", "decay_period": 204}))
  assert cfg.optim.schedule_kwargs(10) == {"mode": "fixed", "decay_period": 204}
  cfg = config_lib.from_config_dict(_cd(optim={"schedule": "cosine"}))
  assert cfg.optim.schedule_kwargs(77)["total_steps"] == 77


@pytest.mark.parametrize("module", [base_config, small_cpu])
def test_shipped_configs_validate(module):
  cd = module.get_config()
  cfg = config_lib.from_config_dict(cd)
  assert cfg.data.batch_size % (cfg.learner.num_minibatches * cfg.learner.num_microbatches) == 0
  # A table row is a small function of the base.
  cd.loss.correction.preset = "geo_rs"
  assert config_lib.from_config_dict(cd).loss.correction.rs_level == "geometric"


def test_command_line_overrides_reach_nested_and_placeholder_fields(monkeypatch):
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True)
  path = os.path.join(os.path.dirname(__file__), os.pardir, "studies", "configs", "small_cpu.py")
  argv = ["train", f"--config={path}", "--config.loss.correction.preset=mis_miles",
          "--config.loss.correction.is_upper=3.0", "--config.sampling.weight_quant=fp8_e4m3",
          "--config.data.train_tiers=('tier1','tier4')", "--config.num_steps=7"]
  monkeypatch.setattr(sys, "argv", argv)  # config_flags reads overrides from sys.argv
  fv(argv)
  cfg = config_lib.from_config_dict(fv.config)
  assert cfg.loss.correction.is_upper == 3.0 and cfg.loss.correction.veto_threshold == 1e-4
  assert cfg.sampling.weight_quant == "fp8_e4m3"
  assert cfg.data.train_tiers == ("tier1", "tier4") and cfg.num_steps == 7


def test_init_perturb_ulps_moves_every_weight_by_exactly_that():
  """`model.init_perturb_ulps`: the base policy with every
  float weight one (two) ulps up, nothing else changed; negative refused."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from mipu_jax.rl import build  # pylint: disable=g-import-not-at-top
  from mipu_jax.tasks import arithmetic  # pylint: disable=g-import-not-at-top
  tok = arithmetic.make_tokenizer()
  leaves = lambda n: jax.tree.leaves(nnx.state(build.make_policy(
      config_lib.ModelConfig(preset="tiny", init_perturb_ulps=n), tok), nnx.Param))
  base, one, two = leaves(0), leaves(1), leaves(2)
  for b, o, t in zip(base, one, two):
    b = np.asarray(b)
    want = np.nextafter(b, np.inf, dtype=b.dtype)
    np.testing.assert_array_equal(np.asarray(o), want)
    np.testing.assert_array_equal(np.asarray(t), np.nextafter(want, np.inf, dtype=b.dtype))
  with pytest.raises(ValueError, match="init_perturb_ulps"):
    config_lib.ModelConfig(init_perturb_ulps=-1)


def test_eval_flags_and_the_old_eval_package_name(monkeypatch):
  """The package `mipu_jax.eval` is `mipu_jax.math_eval` now: the config's `eval`
  section and its flags are unchanged; a grader named in the old package fails
  with the new spelling; a saved run naming it reads back as the same config."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True)
  path = os.path.join(os.path.dirname(__file__), os.pardir, "studies", "configs", "small_cpu.py")
  argv = ["train", f"--config={path}", "--config.eval.every=5", "--config.eval.n_per_tier=3",
          "--config.eval.pi=True"]
  monkeypatch.setattr(sys, "argv", argv)
  fv(argv)
  cfg = config_lib.from_config_dict(fv.config)
  assert (cfg.eval.every, cfg.eval.n_per_tier, cfg.eval.pi) == (5, 3, True)
  assert cfg.data.reward_grader == "mipu_jax.math_eval.grading:grade"
  with pytest.raises(ValueError, match=r"'mipu_jax\.math_eval\.grading:grade'"):
    config_lib.from_config_dict(_cd(data={"reward_grader": "mipu_jax.eval.grading:grade"}))
  saved = config_lib.as_json(cfg)
  saved["data"]["reward_grader"] = "mipu_jax.eval.grading:grade"
  assert config_lib.resume_differences(saved, cfg) == {}


def test_a_run_saved_before_a_setting_existed_resumes_as_it_ran():
  """A saved config without a setting added since (the expert axis, the MoE section,
  Adam's first-moment dtype) reads back with the value that computes what it computed:
  no resume difference; a changed value still is one."""
  cfg = config_lib.TrainConfig()
  saved = config_lib.as_json(cfg)
  del saved["learner"]["mesh"]["expert"], saved["moe"], saved["optim"]["mu_dtype"]
  assert config_lib.resume_differences(saved, cfg) == {}
  bf16_mu = config_lib.TrainConfig(optim=config_lib.OptimConfig(mu_dtype="bfloat16"))
  assert set(config_lib.resume_differences(saved, bf16_mu)) == {"optim.mu_dtype"}
  replay = config_lib.as_json(config_lib.TrainConfig(
      model=config_lib.ModelConfig(preset="tiny_moe"),
      moe=config_lib.MoEConfig(routing_replay="rollout")))
  del replay["moe"]
  assert "moe.routing_replay" in config_lib.resume_differences(
      replay, config_lib.TrainConfig(model=config_lib.ModelConfig(preset="tiny_moe"),
                                     moe=config_lib.MoEConfig(routing_replay="rollout")))


def test_attention_is_auto_by_default_and_dense_where_committed_runs_need_its_sums():
  """`auto` (the fused CPU kernel on a CPU in float32) for a new run; the studies' base
  and the base policies' pretraining pin `dense`, with which their runs were made; a
  memory plan made on a CPU for an accelerator plans what `auto` runs there, `dense`."""
  from mipu_jax import memory_plan  # pylint: disable=g-import-not-at-top
  from mipu_jax.pretrain import sft  # pylint: disable=g-import-not-at-top
  assert config_lib.TrainConfig().model.attention == "auto"
  assert config_lib.from_config_dict(base_config.get_config()).model.attention == "dense"
  assert sft.PretrainConfig().model_config().attention == "dense"
  assert memory_plan._attention("auto", cpu_artifacts=False) == "dense"  # pylint: disable=protected-access
  assert memory_plan._attention("auto", cpu_artifacts=True) == "auto"  # pylint: disable=protected-access
  assert memory_plan._attention("blockwise", cpu_artifacts=False) == "blockwise"  # pylint: disable=protected-access
