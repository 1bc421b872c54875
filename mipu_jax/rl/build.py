"""Builds a run's pieces from a validated `TrainConfig`: task, policy, learner, sampler.

The task is the one `config.data.task` names (`make_task`): the arithmetic
task with its character tokenizer, or the math task with the checkpoint's own
tokenizer. The base policy comes from `config.model.init_from` (a Hugging
Face Qwen3 directory, e.g. the pretrained `mipu_jax/tasks/assets/base_policy/`)
or, when that is empty, a random init of `config.model.preset` with the task
tokenizer's vocabulary. A checkpoint paired with a tokenizer other than its
own is an error here, before any compute.
"""

import dataclasses
import logging
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from mipu_jax import models
from mipu_jax import sampler as sampler_lib
from mipu_jax import tokenizer as tokenizer_lib
from mipu_jax.config import ModelConfig, TrainConfig
from mipu_jax.learner import Learner, mesh_from_config
from mipu_jax.tasks import arithmetic_task
from mipu_jax.tasks import base
from mipu_jax.tasks import math_reward
from mipu_jax.tasks import math_task

_log = logging.getLogger(__name__)

Task = base.Task


def make_task(cfg: TrainConfig) -> base.Task:
  """The task `cfg.data.task` names, with its tokenizer."""
  data, ev = cfg.data, cfg.eval
  if data.task == "arithmetic":
    if cfg.model.init_from and os.path.isfile(
        os.path.join(cfg.model.init_from, "tokenizer.json")):
      raise ValueError(
          f"model.init_from={cfg.model.init_from!r} has its own tokenizer "
          "(tokenizer.json), but data.task='arithmetic' drives the model with "
          "the arithmetic task's character tokenizer: its ids would mean "
          "nothing to this checkpoint. Use data.task='math' (as the repository's "
          "studies/configs/math.py does).")
    return arithmetic_task.ArithmeticTask(data.train_tiers, ev.tiers, ev.n_per_tier,
                                          add_bos=data.add_bos)
  try:
    tokenizer = tokenizer_lib.HFTokenizer.from_dir(cfg.model.init_from)
  except FileNotFoundError as e:
    raise ValueError(
        f"data.task='math' uses the checkpoint's own tokenizer, but "
        f"model.init_from={cfg.model.init_from!r} has no tokenizer.json.") from e
  pool = math_reward.RewardPool(data.reward_workers, data.reward_timeout_s,
                                data.reward_grader)
  return math_task.MathTask(
      tokenizer, data.train_file, schema=data.schema, prompt_key=data.prompt_key,
      answer_key=data.answer_key, prompt_template=data.prompt_template,
      instruction=data.instruction, max_prompt_tokens=data.max_prompt_tokens,
      seed=cfg.seed, max_rounds=data.max_sampling_rounds,
      num_probe=data.probe_holdout, reward_correct=data.reward_correct,
      reward_wrong=data.reward_wrong, truncated=data.truncated, pool=pool,
      benchmark_dir=ev.benchmark_dir, benchmarks=ev.benchmarks,
      max_eval_problems=ev.max_problems)


def make_policy(cfg: ModelConfig, tokenizer,
                mesh: Mesh | None = None) -> models.Qwen3:
  """The base policy: `init_from` checkpoint, else a random preset init.

  With a mesh the parameters are born in their `train` shards (a checkpoint's
  tensors go from the host straight into each device's shard; a random init
  is a jitted init with sharded outputs): no device holds the whole model,
  which for Qwen3-4B in fp32 (16 GB) no v5e chip could.

  Raises:
    ValueError: the policy's vocabulary cannot hold the tokenizer's ids (or, for
      the character tokenizer, is not exactly its vocabulary).
  """
  vocab_size = tokenizer.vocab_size
  if cfg.init_from:
    _log.info("Loading the base policy from %s", cfg.init_from)
    model = models.from_pretrained(cfg.init_from, compute_dtype=cfg.dtype, mesh=mesh)
    _warn_if_preset_differs(cfg, model.config)
  else:
    _log.info("Random init of preset %r (no model.init_from)", cfg.preset)
    mcfg = models.get_config(cfg.preset, vocab_size=vocab_size, dtype=cfg.dtype)
    make = lambda: models.Qwen3(mcfg, rngs=nnx.Rngs(cfg.init_seed))
    model = make() if mesh is None else models.init_sharded(make, mesh)
  model.config = model.config.replace(remat=cfg.remat, attention=cfg.attention,
                                      attention_block=cfg.attention_block)
  if cfg.init_perturb_ulps:
    nnx.update(model, perturb_ulps(nnx.state(model, nnx.Param), cfg.init_perturb_ulps))
  model_vocab = model.config.vocab_size
  exact = isinstance(tokenizer, tokenizer_lib.CharTokenizer)
  if model_vocab < vocab_size or (exact and model_vocab != vocab_size):
    raise ValueError(
        f"the policy's vocabulary ({model_vocab} ids) does not fit the task "
        f"tokenizer ({vocab_size} ids, {type(tokenizer).__name__}): the "
        "checkpoint was not trained with this tokenizer.")
  return model


def perturb_ulps(tree, n: int):
  """Every float leaf of `tree` moved `n` ulps toward +inf (`jnp.nextafter`),
  in its own dtype and sharding; other leaves unchanged."""
  def nudge(x):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      return x
    for _ in range(n):
      x = jnp.nextafter(x, jnp.asarray(jnp.inf, x.dtype))
    return x
  return jax.tree.map(nudge, tree)


# The architecture fields a preset and a checkpoint's config.json can disagree on.
_ARCHITECTURE = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                 "intermediate_size", "vocab_size")


def _warn_if_preset_differs(cfg: ModelConfig, loaded: models.Qwen3Config) -> None:
  """Warns when `model.preset` is not the architecture `init_from` holds.

  The checkpoint's architecture is what runs; the preset only sizes memory
  plans (`mipu_jax.memory_plan`), which are then off. A difference from the
  default preset (which a config that loads a checkpoint usually leaves as is)
  is logged at info level only.
  """
  preset = models.get_config(cfg.preset)
  diffs = [f"{f} {getattr(preset, f)} vs {getattr(loaded, f)}" for f in _ARCHITECTURE
           if getattr(preset, f) != getattr(loaded, f)]
  if not diffs:
    return
  level = logging.INFO if cfg.preset == ModelConfig.preset else logging.WARNING
  _log.log(level, "model.preset=%r is not the architecture of model.init_from=%r "
           "(preset vs checkpoint: %s): the checkpoint's architecture runs; the "
           "preset only sizes memory plans, which are off for this checkpoint.",
           cfg.preset, cfg.init_from, ", ".join(diffs))


def make_sampler(model: models.Qwen3, cfg: TrainConfig, task: base.Task,
                 mesh: Mesh) -> sampler_lib.Sampler:
  """The inference policy μ at the configured precision (docs/method.md §7).

  Every stop id of the task's tokenizer ends a response. With several
  processes, the sampler lives on this process's devices (`distributed`).
  """
  s = cfg.sampling
  tok = task.tokenizer
  if jax.process_count() > 1:
    # Each process samples its share of the prompts on its own devices.
    local = jax.local_devices()  # its experts split as far as its devices allow
    expert = math.gcd(models.sharding.expert_shards(mesh), len(local))
    mesh = models.make_mesh(1, -1, 1, devices=local, expert=expert)
  # MoE: each token's experts for rollout routing replay (R3) and the
  # routing-mismatch metrics (docs/method.md §7a).
  routing = model.config.is_moe and (cfg.moe.record_routing
                                     or cfg.moe.routing_replay == "rollout")
  return sampler_lib.Sampler(
      model, eos_ids=list(tok.stop_ids), mesh=mesh if mesh.size > 1 else None,
      max_prefill_length=task.prompt_budget, max_decode_length=s.max_new_tokens,
      pad_id=tok.pad_id, return_routing=routing, **s.precision_kwargs())


def full_precision(cfg: TrainConfig) -> TrainConfig:
  """`cfg` with its sampler at full precision: fp32 matmuls, no weight,
  activation, KV-cache or LM-head quantization (the sampler of π; the
  no-mismatch control's μ)."""
  sampling = dataclasses.replace(
      cfg.sampling, dtype="float32", weight_quant=None, act_quant=None,
      kv_cache_dtype=None, quant_lm_head=False, quant_compute="emulated",
      true_on_policy=False)  # π's evaluation: a bf16 learner's mode is not this sampler's
  return dataclasses.replace(cfg, sampling=sampling)


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
    seq_len: learner row length `T` (prompt budget + response budget).
    ref_params: frozen reference parameters (only with a KL term).
    pi_sampler: with `eval.pi`, the full-precision sampler that evaluates the
      learner's policy π (`sampler` itself when μ is already full precision);
      None otherwise.
  """
  cfg: TrainConfig
  task: Task
  model: models.Qwen3
  mesh: Mesh
  learner: Learner
  sampler: sampler_lib.Sampler
  seq_len: int
  ref_params: Any = None
  pi_sampler: Any = None


def build_run(cfg: TrainConfig, *, donate: bool = True,
              task: Task | None = None) -> Run:
  """Task (unless given: `rl.preflight.check` made it), policy, mesh, learner
  and sampler of `cfg`."""
  task = make_task(cfg) if task is None else task
  mesh = mesh_from_config(cfg.learner.mesh)
  model = make_policy(cfg.model, task.tokenizer, mesh)
  if cfg.moe.routing_replay != "none" and not model.config.is_moe:
    raise ValueError(f"moe.routing_replay={cfg.moe.routing_replay!r} on a dense model: "
                     f"{cfg.model.init_from or cfg.model.preset!r} has no MoE layers.")
  learner = Learner.from_config(cfg, model, mesh, donate=donate)
  sampler = make_sampler(model, cfg, task, mesh)
  ref = None
  if cfg.loss.kl_coef > 0:
    ref = jax.device_put(nnx.to_pure_dict(nnx.state(model, nnx.Param)),
                         learner.state_shardings.params)
  seq_len = -(-(task.prompt_budget + cfg.sampling.max_new_tokens) // 8) * 8
  pi_sampler = None
  if cfg.eval.pi:
    full = full_precision(cfg)
    pi_sampler = (sampler if full.sampling == cfg.sampling
                  else make_sampler(model, full, task, mesh))
  return Run(cfg=cfg, task=task, model=model, mesh=mesh, learner=learner,
             sampler=sampler, seq_len=seq_len, ref_params=ref, pi_sampler=pi_sampler)
