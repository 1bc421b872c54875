"""The host-side RL loop joining the sampler μ and the learner π.

  run = build_run(cfg)                       # task, policy, learner, sampler
  result = train(cfg, workdir)               # the whole job
  state, metrics = rl_step(run, state, k)    # one step, for custom loops
  # = collect(run, k) → learner_batch(...) → step.update(...) (learner step,
  #   weight sync, optional update gate with sampler rollback)

Hooks: an `UpdateGate` (MIPU Step 2, docs/method.md §5, `gates`); checkpoints
through `mipu_jax.checkpoint`, resumed from the latest one in the workdir (`resume`).
"""

from mipu_jax.rl.batching import make_batch
from mipu_jax.rl.batching import pad_and_concat
from mipu_jax.rl.build import build_run
from mipu_jax.rl.build import make_policy
from mipu_jax.rl.build import make_sampler
from mipu_jax.rl.build import make_task
from mipu_jax.rl.build import Run
from mipu_jax.rl.build import Task
from mipu_jax.rl.evaluation import evaluate
from mipu_jax.rl.gates import GateDecision
from mipu_jax.rl.gates import UpdateGate
from mipu_jax.rl.loop import RunResult
from mipu_jax.rl.loop import train
from mipu_jax.rl.rollout import dynamic_sampling
from mipu_jax.rl.rollout import Rollout
from mipu_jax.rl.rollout import sample_groups
from mipu_jax.rl.run_report import plot_run
from mipu_jax.rl.run_report import results_table
from mipu_jax.rl.step import collect
from mipu_jax.rl.step import learner_batch
from mipu_jax.rl.step import rl_step
from mipu_jax.rl.writer import compress_jsonl
from mipu_jax.rl.writer import decompress_jsonl
from mipu_jax.rl.writer import jsonl_exists
from mipu_jax.rl.writer import MetricWriter
from mipu_jax.rl.writer import read_jsonl

__all__ = [
    "GateDecision",
    "MetricWriter",
    "Rollout",
    "Run",
    "RunResult",
    "Task",
    "UpdateGate",
    "build_run",
    "collect",
    "dynamic_sampling",
    "evaluate",
    "learner_batch",
    "make_batch",
    "make_policy",
    "make_sampler",
    "make_task",
    "pad_and_concat",
    "plot_run",
    "compress_jsonl", "decompress_jsonl", "jsonl_exists", "read_jsonl",
    "results_table",
    "rl_step",
    "sample_groups",
    "train",
]
