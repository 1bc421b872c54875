"""Builds a run's pieces from a validated `TrainConfig`: task, policy, learner, sampler.

The base policy comes from `config.model.init_from` (a Hugging Face Qwen3
directory, e.g. the pretrained `mipu_jax/tasks/assets/base_policy/`) or, when
that is empty, a random init of `config.model.preset` with the task
tokenizer's vocabulary.
"""

import dataclasses
import logging
from typing import Any, Callable, Mapping, Sequence

import jax
from flax import nnx
from jax.sharding import Mesh

from mipu_jax import models
from mipu_jax import sampler as sampler_lib
from mipu_jax import tasks
from mipu_jax.config import ModelConfig, TrainConfig
from mipu_jax.learner import Learner, mesh_from_config

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Task:
  """What the loop needs from a task.

  Attributes:
    tokenizer: the task tokenizer.
    reward_fn: host-side `RewardFn`.
    sample: `sample(rng, n, split="train")` draws `n` problems of a split
      ("probe" for MIPU Step 2's held-out probe prompts).
    eval_sets: `eval_sets(seed, n_per_tier)` → `{tier: problems}`.
    prompt_budget: most prompt tokens (BOS included) the task produces.
  """
  tokenizer: Any
  reward_fn: tasks.RewardFn
  sample: Callable[..., Sequence[tasks.ProblemLike]]
  eval_sets: Callable[[int, int], Mapping[str, Sequence[tasks.ProblemLike]]]
  prompt_budget: int


def make_task(cfg: TrainConfig) -> Task:
  """The configured task (`arithmetic`: multi-operand addition tiers)."""
  data, ev = cfg.data, cfg.eval
  all_tiers = tuple(dict.fromkeys(data.train_tiers + ev.tiers))

  def eval_sets(seed, n):
    sets = tasks.eval_sets(seed, n)
    return {t: sets[t] for t in ev.tiers}

  return Task(
      tokenizer=tasks.make_tokenizer(), reward_fn=tasks.reward_batch,
      sample=lambda rng, n, split="train": tasks.sample_problems(
          rng, n, data.train_tiers, split=split),
      eval_sets=eval_sets,
      prompt_budget=tasks.max_prompt_len(all_tiers) + int(data.add_bos))


def make_policy(cfg: ModelConfig, vocab_size: int) -> models.Qwen3:
  """The base policy: `init_from` checkpoint, else a random preset init."""
  if cfg.init_from:
    _log.info("Loading the base policy from %s", cfg.init_from)
    model = models.from_pretrained(cfg.init_from, compute_dtype=cfg.dtype)
    if cfg.remat:
      model.config = model.config.replace(remat=True)
  else:
    _log.info("Random init of preset %r (no model.init_from)", cfg.preset)
    mcfg = models.get_config(cfg.preset, vocab_size=vocab_size, dtype=cfg.dtype,
                             remat=cfg.remat)
    model = models.Qwen3(mcfg, rngs=nnx.Rngs(cfg.init_seed))
  if model.config.vocab_size < vocab_size:
    raise ValueError(f"policy vocabulary {model.config.vocab_size} is smaller "
                     f"than the tokenizer's {vocab_size}.")
  return model


def make_sampler(model: models.Qwen3, cfg: TrainConfig, task: Task,
                 mesh: Mesh) -> sampler_lib.Sampler:
  """The inference policy μ at the configured precision (SPEC.md §7)."""
  s = cfg.sampling
  tok = task.tokenizer
  return sampler_lib.Sampler(
      model, eos_ids=[tok.eos_id], mesh=mesh if mesh.size > 1 else None,
      max_prefill_length=task.prompt_budget, max_decode_length=s.max_new_tokens,
      pad_id=tok.pad_id, **s.engine_kwargs())


@dataclasses.dataclass
class Run:
  """A run's live pieces, handed to hooks (e.g. the MIPU Step 2 gate).

  Attributes:
    cfg: the run config.
    task: the task.
    model: the policy module (architecture; its weights are the step-0 ones).
    mesh: the device mesh.
    learner: the jitted learner.
    sampler: the inference engine μ.
    seq_len: learner row length `L` (prompt budget + response budget).
    ref_params: frozen reference parameters (only with a KL term).
  """
  cfg: TrainConfig
  task: Task
  model: models.Qwen3
  mesh: Mesh
  learner: Learner
  sampler: sampler_lib.Sampler
  seq_len: int
  ref_params: Any = None


def build_run(cfg: TrainConfig, *, donate: bool = True) -> Run:
  """Task, policy, mesh, learner and sampler of `cfg`."""
  task = make_task(cfg)
  model = make_policy(cfg.model, task.tokenizer.vocab_size)
  mesh = mesh_from_config(cfg.learner.mesh)
  learner = Learner.from_config(cfg, model, mesh, donate=donate)
  sampler = make_sampler(model, cfg, task, mesh)
  ref = None
  if cfg.loss.kl_coef > 0:
    ref = jax.device_put(nnx.to_pure_dict(nnx.state(model, nnx.Param)),
                         learner.state_shardings.params)
  seq_len = -(-(task.prompt_budget + cfg.sampling.max_new_tokens) // 8) * 8
  return Run(cfg=cfg, task=task, model=model, mesh=mesh, learner=learner,
             sampler=sampler, seq_len=seq_len, ref_params=ref)
