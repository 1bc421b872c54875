"""One RL step: rollouts → rewards → filter → recompute → update → sync → gate.

`rl_step` = `collect` → `learner_batch` → `update`:

1. prompts → sampler, `G` responses each with `lp_mu` → rewards, repeated
   until `N` groups with unequal rewards are found (dynamic sampling, §1);
2. `lp_old` recompute under the synced weights (`on_policy_recompute`; none in
   `bypass`), reference log-probs when a KL term is on;
3. advantages → `learner.step` (PPO epochs / mini-batches / micro-batches);
4. weight sync into the sampler, then the optional update gate (MIPU Step 2),
   which may roll the learner and the sampler back.

All randomness of step `k` derives from `(seed, k)`, so the data position of a
run is its step counter. Each phase is timed (`perf/*`, docs/method.md §4) and
marked for the job guard (`guard.phase`).
"""

import time
from typing import Optional

import jax
import numpy as np

from mipu_jax import distributed
from mipu_jax import losses
from mipu_jax.learner import LearnerState
from mipu_jax.rl import batching
from mipu_jax.rl import build
from mipu_jax.rl import gates
from mipu_jax.rl import guard as guard_lib
from mipu_jax.rl import rollout as rollout_lib
from mipu_jax.rl import seeds


def collect(run: build.Run, step: int):
  """Step `step`'s groups: sample, reward, dynamic-sampling filter (docs/method.md §1).

  Returns:
    `(chosen, everything, stats)` as `rollout.dynamic_sampling`.
  """
  cfg, task = run.cfg, run.task
  data, s = cfg.data, cfg.sampling

  def draw(round_index: int) -> rollout_lib.Rollout:
    problems = task.sample(data.prompts_per_step, seed=cfg.seed, step=step,
                           round=round_index)
    return rollout_lib.sample_groups(
        run.sampler, task, problems, group_size=data.group_size,
        max_new_tokens=s.max_new_tokens, temperature=s.temperature,
        top_k=s.top_k, top_p=s.top_p, seed=seeds.seed(cfg.seed, step, round_index))

  return rollout_lib.dynamic_sampling(
      draw, data.prompts_per_step, enabled=data.dynamic_sampling,
      max_rounds=data.max_sampling_rounds)


def learner_batch(run: build.Run, state: LearnerState,
                  chosen: rollout_lib.Rollout, response_length: float,
                  metrics: Optional[dict] = None):
  """The learner batch: packed rows, advantages, `lp_old` (docs/method.md §0–2).

  `lp_old` is recomputed under the synced weights in `on_policy_recompute`
  mode; `bypass` keeps `lp_old = lp_mu` (no recompute). Reference-model
  log-probs are added when a KL term is on. MoE (docs/method.md §7a): under
  R3 the recompute and the update replay the sampler's routing; under R2 the
  update replays the routing of the recompute (run for it in bypass mode too);
  with the sampler's routing recorded, `metrics` (if given) gets the
  routing-mismatch metrics of the learner's own routing against it.
  """
  cfg, learner = run.cfg, run.learner
  batch = batching.make_batch(chosen, run.seq_len, cfg.loss.advantage,
                              response_length=response_length)
  replay = cfg.moe.routing_replay
  mu_routing = batching.routing_rows(chosen, run.seq_len)
  if replay == "rollout" and mu_routing is None:
    raise ValueError("moe.routing_replay='rollout' needs the sampler's routing; the "
                     "rollout has none.")
  recompute = cfg.loss.mode == "on_policy_recompute"
  pi_routing = None
  if replay == "learner" or mu_routing is not None:  # an MoE (build refuses R2 when dense)
    # The learner's own (live) routing of the old policy: R2's replay, the metrics.
    lp, pi_routing = learner.logprobs(state.params, batch.tokens_BT, batch.input_mask_BT,
                                      with_routing=True)
    pi_routing = np.asarray(jax.device_get(pi_routing))
    if recompute and replay != "rollout":
      batch = batch._replace(lp_old_BT=lp)
      recompute = False
  if replay == "rollout":
    if recompute:
      batch = batch._replace(lp_old_BT=learner.logprobs(
          state.params, batch.tokens_BT, batch.input_mask_BT, routing_BTLk=mu_routing))
      recompute = False
    batch = batch._replace(routing_BTLk=mu_routing)
  elif replay == "learner":
    batch = batch._replace(routing_BTLk=pi_routing)
  if recompute:
    batch = batch._replace(lp_old_BT=learner.logprobs(
        state.params, batch.tokens_BT, batch.input_mask_BT))
  if metrics is not None and mu_routing is not None and pi_routing is not None:
    from mipu_jax.models import moe  # pylint: disable=g-import-not-at-top
    metrics.update(moe.routing_mismatch(mu_routing, pi_routing, batch.loss_mask_BT))
  if run.ref_params is not None:
    batch = batch._replace(lp_ref_model_BT=learner.logprobs(
        run.ref_params, batch.tokens_BT, batch.input_mask_BT))
  return batch


def update(run: build.Run, state: LearnerState, batch, step: int,
           gate: Optional[gates.UpdateGate] = None,
           ) -> tuple[LearnerState, dict[str, float]]:
  """Learner step → weight sync → optional gate, with sampler rollback."""
  sampler = run.sampler
  previous, previous_sampler_params = state, sampler.params
  with guard_lib.phase("learner step", step):
    t0 = time.perf_counter()
    candidate, device_metrics = run.learner.step(state, batch)
    # The next rollout needs the synced weights, so the loop waits for the
    # step here anyway; fetching its metrics now costs nothing extra.
    metrics = {k: float(v) for k, v in distributed.to_host(device_metrics).items()}
    metrics["perf/update_seconds"] = time.perf_counter() - t0
  with guard_lib.phase("weight sync", step):
    sampler.update_weights(candidate.params)
  if gate is None:
    return candidate, metrics
  with guard_lib.phase("Step 2 probe", step):
    decision = gate(run, candidate, previous, step)
  if not decision.accepted:
    sampler.params = previous_sampler_params
  metrics.update({k: float(v) for k, v in decision.metrics.items()})
  return decision.state, metrics


def rl_step(run: build.Run, state: LearnerState, step: int,
            gate: Optional[gates.UpdateGate] = None,
            ) -> tuple[LearnerState, dict[str, float]]:
  """One RL step (`collect` → `learner_batch` → `update`) and its metrics."""
  if gate is not None and run.learner.donate:
    raise ValueError("an update gate needs a learner built with donate=False.")
  t0 = time.perf_counter()
  with guard_lib.phase("rollout", step):
    chosen, everything, data_stats = collect(run, step)
  t1 = time.perf_counter()
  moe_metrics: dict[str, float] = {}
  with guard_lib.phase("recompute", step):
    batch = learner_batch(run, state, chosen, float(everything.lengths_R.mean()),
                          moe_metrics)
    jax.block_until_ready(batch)
  t_recompute = time.perf_counter() - t1
  state, metrics = update(run, state, batch, step, gate)
  metrics.update(moe_metrics)
  t2 = time.perf_counter()

  tokens = float(batch.input_mask_BT.sum())
  metrics.update(data_stats)
  metrics.update(losses.rollout_metrics(everything.rewards_R, everything.lengths_R,
                                        everything.truncated_R, chosen.rewards_R))
  metrics.update({
      "perf/step_seconds": t2 - t0,
      "perf/rollout_seconds": t1 - t0,  # sampling and rewards
      "perf/rewards_seconds": everything.score_seconds,
      "perf/recompute_seconds": t_recompute,
      "perf/learner_seconds": t2 - t1,  # recompute, update, sync and gate
      "perf/sync_seconds": run.sampler.last_sync_seconds,
      "perf/tokens_per_second": tokens / (t2 - t0),
      "perf/learner_tokens_per_second":
          tokens * run.cfg.learner.ppo_epochs / (t2 - t1),
      "perf/rollout_tokens_per_second":
          float(everything.lengths_R.sum()) / (t1 - t0),
  })
  return state, metrics
