"""Host-side RL loop: dynamic sampling, packing, the update gate, and 3 real steps."""

import os
import types

import jax.numpy as jnp
import numpy as np
import pytest

from mipu_jax import config as config_lib
from mipu_jax import losses
from mipu_jax import rl
from mipu_jax import testing
from mipu_jax.learner import LearnerState
from mipu_jax.rl import build
from mipu_jax.rl import rollout as rollout_lib
from mipu_jax.tasks import Problem


def _rollout(rewards_PG, *, lengths=None, prompts=None):
  n, g = np.shape(rewards_PG)
  t = 5
  lengths = np.full(n * g, 3) if lengths is None else np.asarray(lengths)
  mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
  return rollout_lib.Rollout(
      problems=tuple(Problem(f"Q:{i}+1=", str(i + 1)) for i in range(n)),
      prompt_ids=tuple(prompts or [(2, 3 + i) for i in range(n)]),
      tokens_RT=(np.arange(n * g * t).reshape(n * g, t) % 17 + 3) * mask.astype(np.int32),
      lp_mu_RT=-np.ones((n * g, t), np.float32) * mask, mask_RT=mask,
      lengths_R=lengths.astype(np.int32), truncated_R=np.zeros(n * g, bool),
      rewards_R=np.asarray(rewards_PG, np.float32).reshape(-1), group_size=g)


def test_dynamic_sampling_drops_all_equal_groups_and_oversamples():
  rounds = [_rollout([[1, 1], [0, 1], [0, 0]]), _rollout([[0, 0], [1, 0], [1, 1]]),
            _rollout([[0, 1], [0, 1], [0, 1]])]
  batch, everything, stats = rl.dynamic_sampling(lambda r: rounds[r], 3, enabled=True,
                                                 max_rounds=5)
  assert stats == {"data/groups_sampled": 9.0, "data/groups_all_equal": 4.0,
                   "data/groups_dropped": 4.0, "data/groups_topped_up": 0.0,
                   "data/sampling_rounds": 3.0}
  assert everything.num_groups == 9 and batch.num_groups == 3
  assert not losses.all_equal_groups(batch.rewards_NG()).any()


def test_dynamic_sampling_tops_up_after_max_rounds_and_can_be_off():
  flat = _rollout([[0, 0], [1, 1]])
  batch, _, stats = rl.dynamic_sampling(lambda r: flat, 2, enabled=True, max_rounds=2)
  assert batch.num_groups == 2 and stats["data/groups_topped_up"] == 2.0
  assert stats["data/groups_dropped"] == 2.0  # 4 all-equal sampled, 2 reused
  batch, _, stats = rl.dynamic_sampling(lambda r: flat, 2, enabled=False, max_rounds=9)
  assert stats["data/sampling_rounds"] == 1.0 and stats["data/groups_dropped"] == 0.0


def test_pack_aligns_responses_after_their_prompts():
  r = _rollout([[1, 0]], lengths=[2, 4], prompts=[(2, 7, 8)])
  tokens, input_mask, loss_mask, lp_mu = rl.pad_and_concat(r, length=9)
  np.testing.assert_array_equal(tokens[1, :3], [2, 7, 8])
  np.testing.assert_array_equal(tokens[1, 3:7], r.tokens_RT[1, :4])
  np.testing.assert_array_equal(input_mask.sum(1), [5, 7])
  np.testing.assert_array_equal(loss_mask[0], [0, 0, 0, 1, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(lp_mu[1], -loss_mask[1])
  assert tokens[0, 5:].sum() == 0
  batch = rl.make_batch(r, 9, "rloo", response_length=3.0)
  np.testing.assert_allclose(batch.advantages_B, [1.0, -1.0])
  with pytest.raises(ValueError, match="exceed"):
    rl.pad_and_concat(r, length=7)


class _FakeSampler:
  """Answers `Q:a+b=` correctly on odd sample slots; records syncs."""

  def __init__(self, tokenizer):
    self.tok, self.params, self.last_sync_seconds, self.syncs = tokenizer, {"w": 0}, 0.0, 0

  def update_weights(self, params):
    self.params, self.syncs = {"w": params}, self.syncs + 1

  def generate(self, prompts, *, max_new_tokens, temperature, top_k, top_p, num_samples,
               seed, first_prompt_index=0):
    del temperature, top_k, top_p, seed, first_prompt_index
    rows = []
    for p in prompts:
      text = self.tok.decode(p[1:])
      answer = sum(int(x) for x in text[2:-1].split("+"))
      for j in range(num_samples):
        rows.append(self.tok.encode(f"A{answer + (j % 2 == 0)}.") + [self.tok.eos_id])
    s = len(rows)
    tokens = np.zeros((s, max_new_tokens), np.int32)
    mask = np.zeros((s, max_new_tokens), np.float32)
    for i, row in enumerate(rows):
      tokens[i, :len(row)], mask[i, :len(row)] = row, 1.0
    return types.SimpleNamespace(
        tokens=rows, lengths=mask.sum(1).astype(np.int32), finish_reasons=["stop"] * s,
        tokens_array=tokens, logprobs_array=-0.5 * mask, mask=mask,
        prompt_index=np.arange(s) // num_samples)


class _FakeLearner:
  donate = False

  def logprobs(self, params, tokens_BT, mask_BT):
    return jnp.zeros(np.shape(tokens_BT))

  def step(self, state, batch):
    assert batch.tokens_BT.shape == (8, 32)
    return state._replace(params=state.params + 1, step=state.step + 1), {"actor/x": 1.0}


def _reject(run, candidate, previous, step):
  del run, step
  return rl.GateDecision(candidate._replace(params=previous.params,
                                            opt_state=previous.opt_state), False,
                         {"mipu/accepted": 0.0})


def test_rl_step_with_a_rejecting_gate_rolls_back_learner_and_sampler():
  cfg = config_lib.TrainConfig(
      data=config_lib.DataConfig(prompts_per_step=4, group_size=2, train_tiers=("tier1",)),
      sampling=config_lib.SamplingConfig(max_new_tokens=16))
  task = build.make_task(cfg)
  sampler = _FakeSampler(task.tokenizer)
  run = build.Run(cfg=cfg, task=task, model=None, mesh=None, learner=_FakeLearner(),
                  sampler=sampler, seq_len=32)
  state = LearnerState(params=jnp.zeros(3), opt_state=(), step=jnp.int32(0), rng=None)
  before = sampler.params
  new, metrics = rl.rl_step(run, state, 1, gate=_reject)
  assert sampler.params is before and sampler.syncs == 1
  assert int(new.step) == 1 and float(new.params.sum()) == 0.0
  assert metrics["mipu/accepted"] == 0.0 and metrics["actor/x"] == 1.0
  assert metrics["rollout/reward_mean"] == 0.5 and metrics["data/groups_dropped"] == 0
  new, _ = rl.rl_step(run, state, 2)  # no gate: the candidate stands
  assert float(new.params.sum()) == 3.0 and sampler.params["w"] is new.params


def test_three_real_steps_log_everything(tmp_path):
  # The loop tests' tiny run (its programs compiled once per session, the entropy
  # pass off: tests/test_learner.py checks `actor/entropy`), with every logger on, a
  # second sampling round and a save every 2 steps.
  cfg = testing.tiny_run_config(
      3, data=dict(max_sampling_rounds=2),
      checkpoint=dict(every=2, keep=config_lib.CheckpointConfig().keep),
      logging=dict(backends=config_lib.LoggingConfig().backends,
                   plots=config_lib.LoggingConfig().plots))
  result = rl.train(cfg, str(tmp_path))
  steps = [r for r in result.rows if r["step"] > 0]
  assert [r["step"] for r in result.rows] == [0, 1, 2, 3]
  required = set(losses.MISMATCH_METRIC_NAMES) | set(losses.CORRECTION_METRIC_NAMES) | {
      "rollout/reward_mean", "rollout/accuracy", "rollout/response_length_mean",
      "rollout/response_length_max", "actor/grad_norm",
      "actor/pg_clipfrac", "actor/lr", "perf/tokens_per_second", "data/groups_dropped"}
  for row in steps:
    assert required <= set(row), required - set(row)
    # fp32 sampler == learner numerics: on-policy ratio 1, no mismatch.
    assert abs(row["actor/first_update_ratio_max"] - 1) < 1e-5
    assert row["rollout_corr/max_abs_logprob_diff"] < 1e-3
  assert "eval/tier1" in result.rows[0] and "eval/avg" in result.rows[-1]
  assert len(rl.read_jsonl(result.files["metrics"])) == 4
  assert "Avg" in result.table and os.path.getsize(result.files["plots"]) > 0
  assert os.listdir(tmp_path / "tensorboard")
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "3"]
  assert int(result.state.step) == 3
  # The code it ran from (the suite runs in a git checkout): one session, from step 0.
  (session,) = rl.resume.read_commits(str(tmp_path))
  assert session == dict(rl.resume.code_commit(), from_step=0)
  # The loop's own phase timers: rewards inside the rollout, recompute, update
  # and sync inside the learner's time, the step-2 save logged with step 3.
  for row in steps:
    assert 0 < row["perf/rewards_seconds"] < row["perf/rollout_seconds"]
    parts = [row[f"perf/{k}_seconds"] for k in ("recompute", "update", "sync")]
    assert min(parts) > 0 and sum(parts) <= row["perf/learner_seconds"]
  assert [("perf/checkpoint_seconds" in r) for r in steps] == [False, False, True]
