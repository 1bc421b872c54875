"""The host-side RL loop: rollouts → rewards → filter → recompute → update → sync.

One step (`rl_step` = `collect` → `learner_batch` → `update`):

1. prompts → sampler, `G` responses each with `lp_mu` → rewards, repeated
   until `N` groups with unequal rewards are found (dynamic sampling, §1);
2. `lp_old` recompute under the synced weights (`on_policy_recompute`; none in
   `bypass`), reference log-probs when a KL term is on;
3. advantages → `learner.step` (PPO epochs / mini-batches / micro-batches);
4. weight sync into the sampler, then the optional update gate (MIPU Step 2),
   which may roll the learner and the sampler back.

All randomness of step `k` derives from `(seed, k)`, so the data position of a
run is its step counter. Side effects (logging, progress bar, evaluation,
checkpoints, plots) live in `train` only.
"""

import dataclasses
import logging
import math
import os
import time
from typing import Optional

import jax
import tqdm
from flax import nnx

from mipu_jax import checkpoint
from mipu_jax import config as config_lib
from mipu_jax import distributed
from mipu_jax import losses
from mipu_jax.config import TrainConfig
from mipu_jax.learner import LearnerState
from mipu_jax.rl import batching
from mipu_jax.rl import evaluation
from mipu_jax.rl import export
from mipu_jax.rl import gates as gates_lib
from mipu_jax.rl import guard as guard_lib
from mipu_jax.rl import health
from mipu_jax.rl import hooks
from mipu_jax.rl import report
from mipu_jax.rl import resume
from mipu_jax.rl import rollout as rollout_lib
from mipu_jax.rl import seeds
from mipu_jax.rl import setup
from mipu_jax.rl import writer as writer_lib

_log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunResult:
  """What `train` returns.

  Attributes:
    state: the final learner state.
    rows: every logged row (`{"step": k, metric: value}`), in order.
    table: the markdown results table.
    files: paths written (`metrics`, `table`, `plots`, `config`, and the
      Hugging Face exports `export_final` / `export_best`).
    stopped_at: the step after which the job stopped on a preemption notice,
      checkpointed (None: it ran all its steps).
  """
  state: LearnerState
  rows: list[dict[str, float]]
  table: str
  files: dict[str, str]
  stopped_at: Optional[int] = None


def collect(run: setup.Run, step: int):
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


def learner_batch(run: setup.Run, state: LearnerState,
                  chosen: rollout_lib.Rollout, response_length: float):
  """The learner batch: packed rows, advantages, `lp_old` (docs/method.md §0–2).

  `lp_old` is recomputed under the synced weights in `on_policy_recompute`
  mode; `bypass` keeps `lp_old = lp_mu` (no recompute). Reference-model
  log-probs are added when a KL term is on.
  """
  cfg, learner = run.cfg, run.learner
  batch = batching.make_batch(chosen, run.seq_len, cfg.loss.advantage,
                              response_length=response_length)
  if cfg.loss.mode == "on_policy_recompute":
    batch = batch._replace(lp_old_BT=learner.logprobs(
        state.params, batch.tokens_BT, batch.input_mask_BT))
  if run.ref_params is not None:
    batch = batch._replace(lp_ref_model_BT=learner.logprobs(
        run.ref_params, batch.tokens_BT, batch.input_mask_BT))
  return batch


def update(run: setup.Run, state: LearnerState, batch, step: int,
           gate: Optional[hooks.UpdateGate] = None,
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


def rl_step(run: setup.Run, state: LearnerState, step: int,
            gate: Optional[hooks.UpdateGate] = None,
            ) -> tuple[LearnerState, dict[str, float]]:
  """One RL step (`collect` → `learner_batch` → `update`) and its metrics."""
  if gate is not None and run.learner.donate:
    raise ValueError("an update gate needs a learner built with donate=False.")
  t0 = time.perf_counter()
  with guard_lib.phase("rollout", step):
    chosen, everything, data_stats = collect(run, step)
  t1 = time.perf_counter()
  with guard_lib.phase("recompute", step):
    batch = learner_batch(run, state, chosen, float(everything.lengths_R.mean()))
    jax.block_until_ready(batch)
  t_recompute = time.perf_counter() - t1
  state, metrics = update(run, state, batch, step, gate)
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


def _evaluate(run: setup.Run, sets, step: int, params) -> dict[str, float]:
  cfg = run.cfg
  if not sets:
    return {}
  with guard_lib.phase("evaluation", step):
    return evaluation.evaluate_policies(  # μ, and π with eval.pi
        run.sampler, run.pi_sampler, params, run.task, sets,
        num_samples=cfg.eval.num_samples, temperature=cfg.eval.temperature,
        max_new_tokens=cfg.sampling.max_new_tokens, seed=cfg.eval.seed)


def _restore(ckpt, run: setup.Run, state: LearnerState,
             gate: Optional[hooks.UpdateGate] = None):
  """(state, step, metadata) from the newest readable checkpoint, or the fresh start."""
  if ckpt is None or ckpt.latest_step() is None:
    return state, 0, {}
  state, meta = ckpt.restore(target=run.learner.abstract_state())
  if gate is not None:
    gate.load_state_dict(meta["gate_state"])  # MIPU counters (docs/method.md §5)
  step = int(meta["step"])
  run.sampler.update_weights(state.params)
  _log.info("Resumed from the checkpoint of step %d", step)
  return state, step, meta


def _train_steps(cfg, workdir, run, state, start, rows, writer, ckpt, gate,
                 streak, files, best_eval, guard):
  """Steps `start + 1 … num_steps` with evaluation, logging, health checks and
  checkpoints; stops early, checkpointed, on a preemption notice.

  Returns:
    `(state, rows, stopped_at)`: `stopped_at` is the step after which the
    processes agreed to stop (None: all steps ran).
  """
  main = distributed.is_main()
  monitor = health.HealthMonitor(cfg.logging.health, rows)
  eval_sets = run.task.eval_sets(cfg.eval.seed)

  def log(step, metrics):
    writer.write(step, metrics)
    rows.append({"step": float(step), **metrics})

  if start == 0:
    log(0, {**_evaluate(run, eval_sets, 0, state.params), **run.task.data_stats()})
  evals = [r["eval/avg"] for r in rows if "eval/avg" in r]
  last_eval = evals[-1] if evals else float("nan")
  # Every process decides on the best export alike (it gathers parameters),
  # so the best score so far travels in the checkpoint, not in the log.
  if best_eval is None:
    best_eval = max(evals, default=float("-inf"))
  bar = tqdm.trange(start + 1, cfg.num_steps + 1, desc="rl", unit="step",
                    initial=start, total=cfg.num_steps,
                    disable=not (cfg.logging.progress_bar and main))
  saved_seconds = None  # the loop's time in the previous step's checkpoint save
  for step in bar:
    state, metrics = rl_step(run, state, step, gate)
    if saved_seconds is not None:
      metrics["perf/checkpoint_seconds"] = saved_seconds
      saved_seconds = None
    if step == cfg.num_steps or (cfg.eval.every and step % cfg.eval.every == 0):
      metrics.update(_evaluate(run, eval_sets, step, state.params))
      last_eval = metrics.get("eval/avg", last_eval)
      if cfg.export.best and last_eval > best_eval:
        best_eval = last_eval
        files["export_best"] = export.export_policy(
            run, state.params, os.path.join(workdir, "export", "best"))
    report = monitor.check(step, metrics)  # docs/method.md §8
    metrics.update(report.metrics)
    log(step, metrics)
    if main:
      health.warn(report)
    postfix = dict(reward=f"{metrics['rollout/reward_mean']:.3f}",
                   len=f"{metrics['rollout/response_length_mean']:.1f}",
                   eval=f"{last_eval:.3f}")
    if cfg.logging.health.enabled:
      postfix["health"] = report.mark
    bar.set_postfix(**postfix)
    # Skipped updates leave the parameters as they were, so the checkpoint
    # of the last step before the error is still a good one.
    streak.update(step, metrics, lambda: _newest(ckpt))
    # Every process learns whether any got a preemption notice (SIGTERM):
    # all of them stop after this step, with a checkpoint of it.
    stop = guard.stop_requested(step) and step < cfg.num_steps
    if ckpt is not None and (stop or hooks.should_save(step, cfg.num_steps,
                                                       cfg.checkpoint)):
      meta = {"step": step, "data_position": step,
              "config": dataclasses.asdict(cfg), "nonfinite_streak": streak.count,
              "best_eval": best_eval if math.isfinite(best_eval) else None}
      rollbacks = 0
      if gate is not None:  # MIPU counters (docs/method.md §5)
        meta["gate_state"] = gate.state_dict()
        rollbacks = int(meta["gate_state"].get("num_rollbacks", 0))
      # Syncs that stand: the sampler holds the weights of this many updates.
      meta["sampler_sync_version"] = step - rollbacks
      with guard_lib.phase("checkpoint save", step):
        t0 = time.perf_counter()
        ckpt.save(step, state, meta)
        saved_seconds = time.perf_counter() - t0
    if stop:
      _log.warning("Preemption notice: stopped after step %d, checkpointed.", step)
      return state, rows, step
  return state, rows, None


def _newest(ckpt) -> str:
  if ckpt is None:
    return "none (checkpoint.enabled=False)"
  ckpt.wait()
  step = ckpt.latest_step()
  return (f"step {step} in {ckpt.directory}" if step is not None
          else f"none yet in {ckpt.directory}")


def _committed(directory: Optional[str]) -> str:
  """The newest committed step, by listing (the guard's messages: no orbax call)."""
  if directory is None:
    return "none (checkpoint.enabled=False)"
  steps = checkpoint.committed_steps(directory)
  return f"step {steps[-1]} in {directory}" if steps else f"none yet in {directory}"


def _write_error(e: OSError, workdir: str, ckpt) -> OSError:
  """A write failure as an error that says what is intact and what to do."""
  if isinstance(e, checkpoint.CheckpointWriteError):
    return e
  try:
    newest = _newest(ckpt)
  except OSError:
    newest = "unknown (the checkpoint directory cannot be read)"
  what = getattr(e, "filename", None) or "a log file"
  return OSError(e.errno, f"Could not write to {workdir} ({what}): "
                 f"{checkpoint.write_error_reason(e)}. The newest intact checkpoint is "
                 f"{newest}: free space (or fix the directory) and rerun the same "
                 "command to resume from it.")


def train(cfg: TrainConfig, workdir: str, *,
          gate: Optional[hooks.UpdateGate] = None,
          allow_config_change: bool = False,
          limits: Optional[guard_lib.JobLimits] = None) -> RunResult:
  """Runs `cfg.num_steps` RL steps; writes metrics, table, plots, checkpoints.

  Resumes from the newest readable checkpoint in `workdir/checkpoints` if
  there is one; what a resume checks and repairs, and what every fault leaves
  behind, is docs/reliability.md.

  Args:
    cfg: a validated run config.
    workdir: output directory.
    gate: optional update gate (MIPU Step 2); the learner then keeps (does not
      donate) the pre-update state.
    allow_config_change: resuming with a config that changes what the run
      computes is intended (otherwise `resume.ConfigChangedError`); both
      configs are kept and the step of the change recorded.
    limits: the job guard's timeouts (`guard.JobLimits`: a lost process, a
      stuck step, the preemption grace time). A SIGTERM stops the run at the
      next step boundary, checkpointed (`RunResult.stopped_at`). With several
      processes, any error ends the process at once after its message
      (`guard.JobGuard.fail`) instead of raising.

  Returns:
    A `RunResult`.

  Raises:
    resume.ConfigChangedError: see `allow_config_change`.
    FloatingPointError: `learner.max_nonfinite_steps` consecutive steps had a
      non-finite update.
    OSError: a log or checkpoint could not be written (a full disk, an
      unwritable workdir); the message names the newest intact checkpoint.
    writer.BackendStartError: a backend of `logging.backends` could not start.
  """
  ckpt_dir = os.path.join(workdir, "checkpoints")
  newest = lambda: _committed(ckpt_dir if cfg.checkpoint.enabled else None)
  with guard_lib.JobGuard(limits or guard_lib.JobLimits(), newest) as guard:
    try:
      return _train(cfg, workdir, gate, allow_config_change, guard)
    except Exception as e:
      guard.fail(e)  # several processes: ends this one now
      raise


def _train(cfg, workdir, gate, allow_config_change, guard) -> RunResult:
  main = distributed.is_main()  # only process 0 writes files
  if main:  # a missing backend package is an error before the model loads
    writer_lib.check_backends(cfg.logging.backend_names)
  os.makedirs(workdir, exist_ok=True)
  files = {"config": os.path.join(workdir, "config.json"),
           "metrics": os.path.join(workdir, "metrics.jsonl"),
           "table": os.path.join(workdir, "results.md")}
  if gate is None:  # MIPU Step 2 / random rollback from `cfg.mipu` (docs/method.md §5)
    gate = gates_lib.from_config(cfg)
  run = setup.build_run(cfg, donate=gate is None)
  params = nnx.to_pure_dict(nnx.state(run.model, nnx.Param))
  state = run.learner.init_state(params, cfg.seed)
  # Sync the sharded learner copy now: the sampler then compiles once, for
  # the parameter shardings that every later sync produces.
  run.sampler.update_weights(state.params)
  ckpt = hooks.open_checkpoints(workdir, cfg.checkpoint)
  with guard_lib.phase("restore", 0):
    state, start, meta = _restore(ckpt, run, state, gate)
  diff = {}
  if start:
    diff = resume.check_config(meta["config"], cfg, allow_change=allow_config_change,
                               workdir=workdir)
  streak = resume.NonFiniteStreak(cfg.learner.max_nonfinite_steps,
                                  int(meta.get("nonfinite_streak", 0)))
  writer = writer_lib.NullWriter()
  rows = []
  try:
    if main:
      # The backends start before the log is touched: one that cannot start
      # stops the run with its files as they were.
      writer = writer_lib.MetricWriter(
          workdir, backends=cfg.logging.backend_names, wandb_cfg=cfg.logging.wandb,
          run_config=config_lib.as_json(cfg), start_step=start)
      files["config"] = resume.record_config(workdir, cfg, start, diff)
      rows = resume.metrics_rows(files["metrics"], start)
    for r in rows:
      writer.write(int(r["step"]), {k: v for k, v in r.items() if k != "step"},
                   replay=True)
    state, rows, stopped_at = _train_steps(
        cfg, workdir, run, state, start, rows, writer, ckpt, gate, streak, files,
        meta.get("best_eval"), guard)
    if ckpt is not None:
      with guard_lib.phase("checkpoint save", stopped_at or cfg.num_steps):
        ckpt.wait()  # the last save's write error, if any, surfaces here
  except Exception as e:
    guard.fail(e)  # several processes: ends this one now, before any barrier
    if isinstance(e, OSError):
      raise _write_error(e, workdir, ckpt) from e
    raise
  finally:
    writer.close()
    if ckpt is not None:
      try:
        ckpt.close()
      except OSError:
        pass  # already raised by `wait` above, or superseded by the error in flight

  if stopped_at is not None:  # preempted: the rerun finishes the run
    return RunResult(state=state, rows=rows, table="", files=files if main else {},
                     stopped_at=stopped_at)
  if cfg.export.final:
    files["export_final"] = export.export_policy(
        run, state.params, os.path.join(workdir, "export", "final"))
  table = report.results_table(rows, run.task.eval_names)
  if not main:
    return RunResult(state=state, rows=rows, table=table, files={})
  with open(files["table"], "w") as f:
    f.write(table + "\n")
  if cfg.logging.plots:
    files["plots"] = report.plot_run(rows, os.path.join(workdir, "plots.png"),
                                     title=os.path.basename(os.path.abspath(workdir)))
  return RunResult(state=state, rows=rows, table=table, files=files)
