"""The RL loop on an MoE policy: routing replay R2 / R3 through the recompute and
the update, the routing-mismatch metrics, and the errors of a missing or
misplaced routing (docs/method.md §7a)."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mipu_jax import config as config_lib
from mipu_jax.models import moe
from mipu_jax.rl import batching
from mipu_jax.rl import build
from mipu_jax.rl import step as step_lib


def _cfg(replay: str, **overrides) -> config_lib.TrainConfig:
  kw = dict(
      num_steps=2, model=config_lib.ModelConfig(preset="tiny_moe"),
      data=config_lib.DataConfig(prompts_per_step=4, group_size=4, train_tiers=("tier1",),
                                 max_sampling_rounds=1, dynamic_sampling=False),
      sampling=config_lib.SamplingConfig(max_new_tokens=12, weight_quant="int4",
                                         act_quant="fp8"),
      optim=config_lib.OptimConfig(learning_rate=1e-3),
      learner=config_lib.LearnerConfig(mesh=config_lib.MeshConfig(1, 1, 1)),
      eval=config_lib.EvalConfig(tiers=("tier1",), n_per_tier=4, num_samples=2),
      checkpoint=config_lib.CheckpointConfig(enabled=False),
      logging=config_lib.LoggingConfig(progress_bar=False, backends="jsonl", plots=False),
      moe=config_lib.MoEConfig(routing_replay=replay))
  kw.update(overrides)
  return config_lib.TrainConfig(**kw)


@pytest.fixture(scope="module")
def r3_run():
  run = build.build_run(_cfg("rollout"), donate=False)
  params = nnx.to_pure_dict(nnx.state(run.model, nnx.Param))
  state = run.learner.init_state(params, 0)
  chosen, _, _ = step_lib.collect(run, 1)
  return run, state, chosen


@pytest.mark.long
def test_rollout_routing_is_replayed_in_recompute_and_update(r3_run):
  run, state, chosen = r3_run
  metrics = {}
  batch = step_lib.learner_batch(run, state, chosen, 5.0, metrics)
  mu = batching.routing_rows(chosen, run.seq_len)
  np.testing.assert_array_equal(batch.routing_BTLk, mu)
  # Prompt tokens and every fed-back response token carry the sampler's experts.
  real = batch.input_mask_BT > 0
  assert (mu[real] >= 0).all(-1).all(-1).mean() > 0.8
  assert (mu[~real] == -1).all()
  # lp_old is the learner's under the sampler's routing: the replayed recompute.
  forced = run.learner.logprobs(state.params, batch.tokens_BT, batch.input_mask_BT,
                                routing_BTLk=mu)
  np.testing.assert_array_equal(np.asarray(batch.lp_old_BT), np.asarray(forced))
  free = run.learner.logprobs(state.params, batch.tokens_BT, batch.input_mask_BT)
  assert np.abs(np.asarray(free) - np.asarray(forced)).max() > 0
  # The int4 sampler routes some tokens elsewhere than the fp32 learner would.
  assert 0 < metrics["moe/routing_flip_rate"] <= metrics["moe/token_flip_rate"] < 1
  assert {"moe/routing_flip_rate_layer0", "moe/routing_flip_rate_layer1",
          "moe/expert_load_max_over_mean"} <= set(metrics)
  new, step_metrics = run.learner.step(state, batch)
  assert np.isfinite(step_metrics["actor/loss"])
  # A batch without its routing is refused, never routed live in silence.
  with pytest.raises(ValueError, match="no routing_BTLk to replay"):
    run.learner.step(state, batch._replace(routing_BTLk=None))
  with pytest.raises(ValueError, match=r"routing_BTLk has shape"):
    run.learner.step(state, batch._replace(routing_BTLk=mu[:, :-1]))
  with pytest.raises(ValueError, match=r"expert ids outside \[-1, 8\)"):
    run.learner.step(state, batch._replace(routing_BTLk=np.where(mu >= 0, 8, -1)))
  del new


def test_learner_routing_replay_in_bypass_mode(r3_run):
  """R2 (in bypass mode: the recompute runs for the routing only): the update replays
  the learner's own routing of the old policy, lp_old stays lp_mu, and the step takes
  it (the same learner: any replay mode's batch carries routing)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from mipu_jax import losses  # pylint: disable=g-import-not-at-top
  run, state, chosen = r3_run
  cfg = dataclasses.replace(run.cfg, moe=config_lib.MoEConfig(routing_replay="learner"),
                            loss=losses.LossConfig.from_dict({"mode": "bypass"}))
  r2 = dataclasses.replace(run, cfg=cfg)
  metrics = {}
  batch = step_lib.learner_batch(r2, state, chosen, 5.0, metrics)
  np.testing.assert_array_equal(batch.lp_old_BT, batch.lp_mu_BT)
  _, own = run.learner.logprobs(state.params, batch.tokens_BT, batch.input_mask_BT,
                                with_routing=True)
  np.testing.assert_array_equal(batch.routing_BTLk, np.asarray(own))
  assert not np.array_equal(batch.routing_BTLk, batching.routing_rows(chosen, run.seq_len))
  assert 0 < metrics["moe/routing_flip_rate"] <= metrics["moe/token_flip_rate"] <= 1
  _, step_metrics = run.learner.step(state, batch)
  assert np.isfinite(step_metrics["actor/loss"])


def test_routing_replay_on_a_dense_model_is_refused():
  with pytest.raises(ValueError, match="dense model"):
    config_lib.TrainConfig(moe=config_lib.MoEConfig(routing_replay="rollout"))
  with pytest.raises(ValueError, match="unknown moe.routing_replay"):
    config_lib.MoEConfig(routing_replay="R3")


def test_routing_mismatch_metrics_by_hand():
  mu = np.array([[[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[1, 0], [3, 2]]]])  # [1, 3, 2, 2]
  pi = np.array([[[[1, 0], [2, 3]], [[4, 6], [6, 7]], [[1, 0], [3, 1]]]])
  m = moe.routing_mismatch(mu, pi, np.array([[1, 1, 1]]))
  # Pairs (token, layer): t0 same/same, t1 differs/same, t2 same/differs.
  assert m["moe/routing_flip_rate"] == pytest.approx(2 / 6)
  assert m["moe/token_flip_rate"] == pytest.approx(2 / 3)
  assert m["moe/routing_flip_rate_layer0"] == pytest.approx(1 / 3)
  masked = moe.routing_mismatch(mu, pi, np.array([[1, 0, 0]]))
  assert masked["moe/routing_flip_rate"] == 0.0
  none = moe.routing_mismatch(np.full_like(mu, -1), pi, np.array([[1, 1, 1]]))
  assert none == {}


def test_packed_rows_replay_as_unpacked():
  """Routing travels with its tokens into packed rows (gather / scatter with -1)."""
  from mipu_jax.learner import packing  # pylint: disable=g-import-not-at-top
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
  plan = packing.plan(mask, 8, 1)
  routing = jnp.asarray(np.arange(2 * 4 * 3).reshape(2, 4, 3, 1), jnp.int32)
  packed = packing.gather(routing, plan.src_RP, fill=-1)
  back = packing.scatter(packed, plan.src_RP, (2, 4), fill=-1)
  np.testing.assert_array_equal(np.asarray(back)[mask > 0], np.asarray(routing)[mask > 0])
  assert (np.asarray(back)[mask == 0] == -1).all()
