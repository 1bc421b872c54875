"""The host-side RL loop: `rl.step.rl_step` every step, with evaluation, logging,
health checks, checkpoints, preemption and resume around it.

Side effects (logging, progress bar, evaluation, checkpoints, plots) live here
only; what a resume checks and repairs is docs/reliability.md.
"""

import contextlib
import dataclasses
import logging
import math
import os
import time
from typing import Optional

import tqdm
from flax import nnx

import mipu_jax
from mipu_jax import checkpoint
from mipu_jax import config as config_lib
from mipu_jax import distributed
from mipu_jax.config import TrainConfig
from mipu_jax.learner import LearnerState
from mipu_jax.rl import build
from mipu_jax.rl import console
from mipu_jax.rl import evaluation
from mipu_jax.rl import export
from mipu_jax.rl import gates as gates_lib
from mipu_jax.rl import guard as guard_lib
from mipu_jax.rl import health
from mipu_jax.rl import preflight
from mipu_jax.rl import resume
from mipu_jax.rl import run_report
from mipu_jax.rl import step as step_lib
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


def _evaluate(run: build.Run, sets, step: int, params) -> dict[str, float]:
  cfg = run.cfg
  if not sets:
    return {}
  with guard_lib.phase("evaluation", step):
    return evaluation.evaluate_policies(  # μ, and π with eval.pi
        run.sampler, run.pi_sampler, params, run.task, sets,
        num_samples=cfg.eval.num_samples, temperature=cfg.eval.temperature,
        max_new_tokens=cfg.sampling.max_new_tokens, seed=cfg.eval.seed)


def _restore(ckpt, run: build.Run, state: LearnerState,
             gate: Optional[gates_lib.UpdateGate] = None):
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


@dataclasses.dataclass
class _Loop:
  """What the steps share: the run, its outputs and the state the loop carries
  from step to step (rows logged, the best evaluation, the pending save time)."""
  cfg: TrainConfig
  workdir: str
  run: build.Run
  writer: writer_lib.MetricWriter | writer_lib.NullWriter
  ckpt: Optional[checkpoint.Checkpointer]
  gate: Optional[gates_lib.UpdateGate]
  streak: resume.NonFiniteStreak
  guard: guard_lib.JobGuard
  files: dict[str, str]
  rows: list[dict[str, float]]
  best_eval: Optional[float] = None
  saved_seconds: Optional[float] = None  # the previous step's checkpoint save

  def log(self, step: int, metrics: dict[str, float]) -> None:
    self.writer.write(step, metrics)
    self.rows.append({"step": float(step), **metrics})

  def steps(self, state: LearnerState, start: int) -> tuple[LearnerState, Optional[int]]:
    """Steps `start + 1 … num_steps`; stops early, checkpointed, on a
    preemption notice. Returns `(state, stopped_at)` (None: all steps ran)."""
    cfg, run = self.cfg, self.run
    main = distributed.is_main()
    monitor = health.HealthMonitor(cfg.logging.health, self.rows)
    eval_sets = run.task.eval_sets(cfg.eval.seed)
    if start == 0:
      self.log(0, {**_evaluate(run, eval_sets, 0, state.params), **run.task.data_stats()})
    evals = [r["eval/avg"] for r in self.rows if "eval/avg" in r]
    last_eval = evals[-1] if evals else float("nan")
    # Every process decides on the best export alike (it gathers parameters),
    # so the best score so far travels in the checkpoint, not in the log.
    if self.best_eval is None:
      self.best_eval = max(evals, default=float("-inf"))
    show = cfg.logging.progress_bar and main
    bar = tqdm.trange(start + 1, cfg.num_steps + 1, desc="rl", unit="step",
                      initial=start, total=cfg.num_steps, disable=not show)
    with console.through_bar() if show else contextlib.nullcontext():
      return self._steps(state, bar, monitor, eval_sets, last_eval, main)

  def _steps(self, state, bar, monitor, eval_sets, last_eval, main):
    cfg, run = self.cfg, self.run
    for step in bar:
      state, metrics = step_lib.rl_step(run, state, step, self.gate)
      if self.saved_seconds is not None:
        metrics["perf/checkpoint_seconds"] = self.saved_seconds
        self.saved_seconds = None
      if step == cfg.num_steps or (cfg.eval.every and step % cfg.eval.every == 0):
        metrics.update(_evaluate(run, eval_sets, step, state.params))
        last_eval = metrics.get("eval/avg", last_eval)
        if cfg.export.best and last_eval > self.best_eval:
          self.best_eval = last_eval
          self.files["export_best"] = export.export_policy(
              run, state.params, os.path.join(self.workdir, "export", "best"))
      report_ = monitor.check(step, metrics)  # docs/method.md §8
      metrics.update(report_.metrics)
      self.log(step, metrics)
      if main:
        health.warn(report_)
      postfix = dict(reward=f"{metrics['rollout/reward_mean']:.3f}",
                     len=f"{metrics['rollout/response_length_mean']:.1f}",
                     eval=f"{last_eval:.3f}")
      if cfg.logging.health.enabled:
        postfix["health"] = report_.mark
      bar.set_postfix(**postfix)
      # Skipped updates leave the parameters as they were, so the checkpoint
      # of the last step before the error is still a good one.
      self.streak.update(step, metrics, lambda: _newest(self.ckpt))
      # Every process learns whether any got a preemption notice (SIGTERM):
      # all of them stop after this step, with a checkpoint of it.
      stop = self.guard.stop_requested(step) and step < cfg.num_steps
      if self.ckpt is not None and (stop or resume.should_save(step, cfg.num_steps,
                                                              cfg.checkpoint)):
        self.save(step, state)
      if stop:
        _log.warning("Preemption notice: stopped after step %d, checkpointed.", step)
        return state, step
    return state, None

  def save(self, step: int, state: LearnerState) -> None:
    """Checkpoints step `step` with what a resume needs to continue alike."""
    meta = {"step": step, "data_position": step, "library_version": mipu_jax.__version__,
            "config": dataclasses.asdict(self.cfg), "nonfinite_streak": self.streak.count,
            "best_eval": self.best_eval if math.isfinite(self.best_eval) else None}
    rollbacks = 0
    if self.gate is not None:  # MIPU counters (docs/method.md §5)
      meta["gate_state"] = self.gate.state_dict()
      rollbacks = int(meta["gate_state"].get("num_rollbacks", 0))
    # Syncs that stand: the sampler holds the weights of this many updates.
    meta["sampler_sync_version"] = step - rollbacks
    with guard_lib.phase("checkpoint save", step):
      t0 = time.perf_counter()
      self.ckpt.save(step, state, meta)
      self.saved_seconds = time.perf_counter() - t0


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
          gate: Optional[gates_lib.UpdateGate] = None,
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
    ValueError, FileNotFoundError: a bad input — data files, the model
      directory, the devices for the mesh, a workdir holding another run or
      model — before anything is built or compiled (`rl.preflight.check`).
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
  # Bad inputs (data, model files, another run in the workdir) are refused
  # here, before anything is built or compiled (docs/reliability.md).
  task = preflight.check(cfg, workdir, allow_config_change=allow_config_change)
  os.makedirs(workdir, exist_ok=True)
  files = {"config": os.path.join(workdir, "config.json"),
           "metrics": os.path.join(workdir, "metrics.jsonl"),
           "table": os.path.join(workdir, "results.md")}
  if gate is None:  # MIPU Step 2 / random rollback from `cfg.mipu` (docs/method.md §5)
    gate = gates_lib.from_config(cfg)
  run = build.build_run(cfg, donate=gate is None, task=task)
  params = nnx.to_pure_dict(nnx.state(run.model, nnx.Param))
  state = run.learner.init_state(params, cfg.seed)
  # Sync the sharded learner copy now: the sampler then compiles once, for
  # the parameter shardings that every later sync produces.
  run.sampler.update_weights(state.params)
  ckpt = resume.open_checkpoints(workdir, cfg.checkpoint)
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
      resume.record_commit(workdir, start)
      rows = resume.metrics_rows(files["metrics"], start)
    for r in rows:
      writer.write(int(r["step"]), {k: v for k, v in r.items() if k != "step"},
                   replay=True)
    state, stopped_at = _Loop(
        cfg=cfg, workdir=workdir, run=run, writer=writer, ckpt=ckpt, gate=gate,
        streak=streak, guard=guard, files=files, rows=rows,
        best_eval=meta.get("best_eval")).steps(state, start)
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
  table = run_report.results_table(rows, run.task.eval_names)
  if not main:
    return RunResult(state=state, rows=rows, table=table, files={})
  with open(files["table"], "w") as f:
    f.write(table + "\n")
  if cfg.logging.plots:
    files["plots"] = run_report.plot_run(rows, os.path.join(workdir, "plots.png"),
                                     title=os.path.basename(os.path.abspath(workdir)))
  return RunResult(state=state, rows=rows, table=table, files=files)
