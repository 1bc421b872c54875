"""The run config's training sections: optimizer and schedule, learner and mesh,
evaluation, export, checkpoints, MIPU, and the whole `TrainConfig`
(docs/method.md §2–7)."""

import dataclasses
import os
import warnings
from typing import Any

from mipu_jax import losses
from mipu_jax import math_eval
from mipu_jax import schedules
from mipu_jax.config import _ranges
from mipu_jax.config.logging_section import LoggingConfig
from mipu_jax.config.sections import _check_tiers
from mipu_jax.config.sections import DataConfig
from mipu_jax.config.sections import ModelConfig
from mipu_jax.config.sections import SamplingConfig
from mipu_jax.models import config as model_config
from mipu_jax.models import sharding
from mipu_jax.tasks import arithmetic


@dataclasses.dataclass(frozen=True)
class CosineConfig:
  """`mipu_jax.schedules.cosine` arguments; total_steps 0 means num_steps."""
  total_steps: int = 0
  warmup: int = 0
  min_ratio: float = 0.1


@dataclasses.dataclass(frozen=True)
class LengthSurgeConfig:
  """`mipu_jax.schedules.length_surge` arguments (docs/method.md §6).

  None leaves the schedule's own default in place.
  """
  mode: str | None = None
  decay_period: int | None = None
  surge_ratio: float | None = None
  surge_window: int | None = None
  min_steps: int | None = None
  period_factor: float | None = None
  min_ratio: float | None = None
  ema_decay: float | None = None
  baseline: str | None = None


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW with global-norm clipping; the rate lives in the optimizer state.

  Attributes:
    learning_rate: η_0.
    weight_decay: decoupled weight decay (scaled by the rate, as AdamW).
    clip_norm: global gradient-norm clip.
    b1: Adam β1.
    b2: Adam β2.
    eps: Adam ε.
    mu_dtype: dtype of Adam's first moment, "float32" or "bfloat16"
      (`learner.state.scale_by_adam_bf16_mu`: stored and stepped with in bf16;
      2 bytes less per parameter, which is what fits Qwen3-30B-A3B on 8 x 80
      GiB GPUs, docs/pods.md). The second moment and the master parameters
      stay fp32.
    schedule: "constant", "cosine" or "length_surge".
    cosine: its arguments.
    length_surge: its arguments.
  """
  learning_rate: float = 1e-6
  weight_decay: float = 0.01
  clip_norm: float = 1.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  mu_dtype: str = "float32"
  schedule: str = "constant"
  cosine: CosineConfig = CosineConfig()
  length_surge: LengthSurgeConfig = LengthSurgeConfig()

  def __post_init__(self):
    if self.weight_decay < 0 or not self.clip_norm > 0:
      raise ValueError(f"need weight_decay >= 0 and clip_norm > 0, got "
                       f"{self.weight_decay}, {self.clip_norm}.")
    if self.mu_dtype not in ("float32", "bfloat16"):
      raise ValueError(f"optim.mu_dtype must be 'float32' or 'bfloat16', got "
                       f"{self.mu_dtype!r}.")

  def schedule_kwargs(self, num_steps: int) -> dict[str, Any]:
    """Keyword arguments of `make_schedule(self.schedule, lr, **kwargs)`."""
    if self.schedule == "cosine":
      kw = dataclasses.asdict(self.cosine)
      kw["total_steps"] = kw["total_steps"] or num_steps
      return kw
    if self.schedule == "length_surge":
      return {k: v for k, v in dataclasses.asdict(self.length_surge).items()
              if v is not None}
    return {}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """(data, fsdp, tensor) mesh shape; one axis may be -1 (the rest).

  `expert` > 1 adds an expert-parallel axis for a mixture-of-experts policy
  (docs/method.md §7a; `mipu_jax.models.sharding`): a given size, never -1,
  that divides the model's `num_experts`.
  """
  data: int = 1
  fsdp: int = -1
  tensor: int = 1
  expert: int = 1

  def __post_init__(self):
    shape = (self.data, self.fsdp, self.tensor)
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
      raise ValueError(f"invalid mesh shape {shape}.")
    if isinstance(self.expert, bool) or not isinstance(self.expert, int) or self.expert < 1:
      raise ValueError(f"learner.mesh.expert must be an int >= 1, got {self.expert!r}.")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  """How one RL batch becomes updates (docs/method.md §7).

  Attributes:
    ppo_epochs: passes over the batch.
    num_minibatches: optimizer updates per epoch.
    num_microbatches: gradient-accumulation chunks per mini-batch.
    shuffle: reshuffle the rows every epoch.
    mesh: device mesh.
    log_entropy: compute the policy entropy (a full-vocabulary pass) for the
      `actor/entropy` metric even when `loss.entropy_coef` is 0.
    logits_chunk: log-probs and entropy from the LM head in chunks of this
      many positions, never holding the `[B, T, V]` logits (0: dense logits).
    pack_length: > 0: sequence packing — the responses' real tokens are
      packed into rows of this many tokens (at least prompt + response
      budget), attention kept within each response (`learner/packing.py`);
      every update then takes the whole batch (one mini-batch), in
      micro-batches of `pack_rows` packed rows. 0: one padded row per response.
    pack_rows: packed rows per micro-batch (its token budget is
      `pack_rows × pack_length`); 0: the data-parallel size. A multiple of it.
    max_nonfinite_steps: an optimizer update whose loss or gradient is not
      finite is skipped (parameters and moments untouched, counted in
      `actor/nonfinite_skipped`); after this many consecutive RL steps with a
      skipped update the run stops with an error, its last checkpoint intact
      (docs/reliability.md).
  """
  ppo_epochs: int = 1
  num_minibatches: int = 1
  num_microbatches: int = 1
  shuffle: bool = True
  mesh: MeshConfig = MeshConfig()
  log_entropy: bool = True
  logits_chunk: int = 1024
  pack_length: int = 0
  pack_rows: int = 0
  max_nonfinite_steps: int = 5

  def __post_init__(self):
    if self.max_nonfinite_steps < 1:
      raise ValueError(f"learner.max_nonfinite_steps must be >= 1, got "
                       f"{self.max_nonfinite_steps}.")
    if self.pack_length < 0 or self.pack_rows < 0:
      raise ValueError(f"learner.pack_length and learner.pack_rows must be >= 0, "
                       f"got {self.pack_length}, {self.pack_rows}.")
    if self.pack_length and (self.num_minibatches, self.num_microbatches) != (1, 1):
      raise ValueError(
          "learner.pack_length > 0 takes the whole batch per update, in "
          "micro-batches of learner.pack_rows packed rows: set num_minibatches=1 "
          "and num_microbatches=1 (the token budget is pack_rows x pack_length).")
    if self.logits_chunk < 0:
      raise ValueError(f"learner.logits_chunk must be >= 0, got {self.logits_chunk}.")
    if min(self.ppo_epochs, self.num_minibatches, self.num_microbatches) < 1:
      raise ValueError("ppo_epochs, num_minibatches and num_microbatches must "
                       "be >= 1.")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Periodic evaluation of the sampler μ (and, with `pi`, of the learner's π):
  pass@1 over k samples.

  Attributes:
    every: evaluate every this many steps (0: only before and after training).
    num_samples: k; pass@1 is the mean correctness over the k samples.
    temperature: 0 for greedy (then k is 1).
    seed: seed of the evaluation sets and samples.
    tiers: arithmetic: the evaluation sets.
    n_per_tier: arithmetic: problems per tier.
    benchmark_dir: math: the directory holding the benchmark files
      (`math500.jsonl`, `aime24.parquet`, ...: `<name>.jsonl|.json|.parquet`
      for the names in `benchmarks`; a missing one is skipped); "" for none.
    benchmarks: math: the benchmarks to look for.
    max_problems: math: the first problems of each benchmark (0: all).
    pi: also evaluate the learner's policy π at full precision (an fp32
      sampler without quantization, holding the learner's parameters) on the
      same problems with the same sampling seeds, logged as `eval_pi/*` beside
      μ's `eval/*`. The gap between the two is the cost of serving the
      quantized model, apart from what training did. It doubles the
      evaluation time and holds a second copy of the weights and KV cache (in
      fp32); with an fp32 μ the two are the same numbers and nothing is
      recomputed.
  """
  every: int = 0
  num_samples: int = 4
  temperature: float = 1.0
  seed: int = 1234
  tiers: tuple[str, ...] = arithmetic.TIER_NAMES
  n_per_tier: int = 64
  benchmark_dir: str = ""
  benchmarks: tuple[str, ...] = math_eval.BENCHMARKS
  max_problems: int = 0
  pi: bool = False

  def __post_init__(self):
    object.__setattr__(self, "tiers", tuple(self.tiers))
    object.__setattr__(self, "benchmarks", tuple(self.benchmarks))
    _check_tiers("eval.tiers", self.tiers)
    for name in self.benchmarks:
      math_eval.canonical_name(name)
    if self.every < 0 or self.n_per_tier < 1 or self.num_samples < 1:
      raise ValueError("need eval.every >= 0, n_per_tier >= 1, num_samples >= 1.")
    if self.temperature < 0 or self.max_problems < 0:
      raise ValueError(f"need eval.temperature >= 0 and eval.max_problems >= 0, "
                       f"got {self.temperature}, {self.max_problems}.")
    if self.benchmark_dir and not os.path.isdir(self.benchmark_dir):
      raise ValueError(f"eval.benchmark_dir={self.benchmark_dir!r} is not a directory.")


@dataclasses.dataclass(frozen=True)
class ExportConfig:
  """Hugging Face checkpoints of the trained policy, in `workdir/export/`.

  Attributes:
    final: write the final policy (`export/final`).
    best: also write the policy of the best evaluation so far (`export/best`),
      rewritten whenever `eval/avg` improves.
  """
  final: bool = True
  best: bool = False


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Periodic checkpoints through `mipu_jax.checkpoint` (0: only at the end)."""
  every: int = 0
  keep: int = 3
  enabled: bool = True


MIPU_PROBES = ("fresh", "next_batch")


@dataclasses.dataclass(frozen=True)
class MipuConfig:
  """MIPU Step 2 and the random-rollback baseline (docs/method.md §5).

  Attributes:
    step2: gate every candidate update on `T̂_post ≥ -c` (rollback otherwise).
    c: acceptance margin. The source shows c ∈ {0, ±1e-4} but does not
      publish the value it used; 1e-4 is our default.
    c_noise_multiple: when set (k > 0), the margin is k × the standard error
      of `T̂_post` measured on the same probe (`mipu.margin`) and `c` is
      unused: at small scale the probe's noise is far above any fixed c.
    probe: "fresh" (G responses for each of `num_probe_prompts` held-out probe
      prompts) or "next_batch" (the next training batch's prompts and seeds).
    num_probe_prompts: N_probe of the "fresh" probe.
    random_rollback_p: > 0 rejects each update i.i.d. with this probability
      instead (the random-rollback baseline); excludes `step2`.
    seed: seed of the probe prompts and samples and of the random rollback.
  """
  step2: bool = False
  c: float = 1e-4
  c_noise_multiple: float | None = None
  probe: str = "fresh"
  num_probe_prompts: int = 8
  random_rollback_p: float = 0.0
  seed: int = 0

  def __post_init__(self):
    if self.probe not in MIPU_PROBES:
      raise ValueError(f"unknown mipu.probe {self.probe!r}; choose one of "
                       f"{MIPU_PROBES}.")
    if not 0.0 <= self.random_rollback_p <= 1.0:
      raise ValueError(f"need 0 <= mipu.random_rollback_p <= 1, got "
                       f"{self.random_rollback_p}.")
    if self.step2 and self.random_rollback_p > 0:
      raise ValueError("mipu.step2 and mipu.random_rollback_p > 0 are mutually "
                       "exclusive (random rollback replaces Step 2's test).")
    if self.num_probe_prompts < 1:
      raise ValueError(f"mipu.num_probe_prompts must be >= 1, got "
                       f"{self.num_probe_prompts}.")
    if self.c_noise_multiple is not None:
      if not self.c_noise_multiple > 0:
        raise ValueError(f"mipu.c_noise_multiple must be > 0 (or None), got "
                         f"{self.c_noise_multiple}.")
      if self.probe == "fresh" and self.num_probe_prompts < 2:
        raise ValueError("mipu.c_noise_multiple needs num_probe_prompts >= 2: "
                         "the standard error is taken over probe groups.")

  @property
  def gated(self) -> bool:
    """Whether the loop runs an update gate (Step 2 or random rollback)."""
    return self.step2 or self.random_rollback_p > 0


ROUTING_REPLAYS = ("none", "learner", "rollout")


@dataclasses.dataclass(frozen=True)
class MoEConfig:
  """Mixture-of-experts policies: routing replay, routing metrics, load balancing
  (docs/method.md §7a). Ignored by a dense policy except `routing_replay`,
  which must then be "none".

  Attributes:
    routing_replay: "none" (the learner routes live), "learner" (R2: the update
      replays the experts the learner's recompute chose for the old policy)
      or "rollout" (R3: the recompute and the update replay the sampler's).
      Only the expert ids are replayed; the gate weights come from the live
      router, which keeps its gradient.
    record_routing: the sampler returns each token's experts every step, for
      the routing-mismatch metrics (`moe/*`); R3 records them regardless.
    aux_loss: add the load-balancing loss (`router_aux_loss_coef` of the
      model config times `moe.load_balancing_loss`) to the policy loss.
  """
  routing_replay: str = "none"
  record_routing: bool = True
  aux_loss: bool = False

  def __post_init__(self):
    if self.routing_replay not in ROUTING_REPLAYS:
      raise ValueError(f"unknown moe.routing_replay {self.routing_replay!r}; choose one of "
                       f"{ROUTING_REPLAYS}.")
    for name in ("record_routing", "aux_loss"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"moe.{name} must be True or False, got {getattr(self, name)!r}.")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """A whole RL run. Validated on construction."""
  seed: int = 0
  num_steps: int = 100
  model: ModelConfig = ModelConfig()
  sampling: SamplingConfig = SamplingConfig()
  data: DataConfig = DataConfig()
  loss: losses.LossConfig = losses.LossConfig()
  optim: OptimConfig = OptimConfig()
  learner: LearnerConfig = LearnerConfig()
  eval: EvalConfig = EvalConfig()
  logging: LoggingConfig = LoggingConfig()
  checkpoint: CheckpointConfig = CheckpointConfig()
  mipu: MipuConfig = MipuConfig()
  export: ExportConfig = ExportConfig()
  moe: MoEConfig = MoEConfig()

  def __post_init__(self):
    _ranges.check(self)
    if self.num_steps < 1:
      raise ValueError(f"num_steps must be >= 1, got {self.num_steps}.")
    if (self.moe.routing_replay != "none" and not self.model.init_from
        and not model_config.PRESETS[self.model.preset].is_moe):
      raise ValueError(f"moe.routing_replay={self.moe.routing_replay!r} on a dense model "
                       f"(model.preset={self.model.preset!r} has no MoE layers).")
    if self.data.task == "math" and not self.model.init_from:
      raise ValueError("data.task='math' trains a Hugging Face checkpoint: set "
                       "model.init_from to its directory (config.json, "
                       "safetensors, tokenizer.json).")
    chunks = self.learner.num_minibatches * self.learner.num_microbatches
    if self.data.batch_size % chunks:
      raise ValueError(
          f"batch of {self.data.batch_size} responses (data.prompts_per_step x "
          f"data.group_size) does not split into learner.num_minibatches="
          f"{self.learner.num_minibatches} x learner.num_microbatches="
          f"{self.learner.num_microbatches}.")
    if self.loss.advantage == "rloo" and self.data.group_size < 2:
      raise ValueError("rloo needs group_size >= 2.")
    if self.sampling.true_on_policy:
      self._check_true_on_policy()
      if self.moe.aux_loss:
        raise ValueError("moe.aux_loss with sampling.true_on_policy: the mode's forward is "
                         "not the differentiated one; train the load balance without it.")
    if not self.model.init_from:  # a checkpoint's experts are checked as it loads
      sharding.check_experts(model_config.PRESETS[self.model.preset].num_experts,
                             self.learner.mesh.expert)
    if self.model.attention == "cudnn" and self.learner.pack_length:
      # cuDNN takes rows whose valid tokens are a prefix, without segment ids
      # (`mipu_jax.models.attention`): packed rows are none of those.
      warnings.warn("model.attention='cudnn' with learner.pack_length > 0: the "
                    "learner's packed rows use the blockwise kernel (cuDNN runs "
                    "only on unpacked, right-padded rows); "
                    "model.attention='blockwise' runs the same and does not warn.",
                    stacklevel=2)
    # Builds the schedule once so a bad argument fails here, not mid-run.
    schedules.make_schedule(self.optim.schedule, self.optim.learning_rate,
                            **self.optim.schedule_kwargs(self.num_steps))

  def _check_true_on_policy(self):
    """What `sampling.true_on_policy` needs of the rest of the run (docs/method.md §7)."""
    learner_dtype = model_config.as_dtype(self.model.dtype)
    if learner_dtype != model_config.as_dtype(self.sampling.dtype):
      raise ValueError(
          f"sampling.true_on_policy needs the learner to compute in the sampler's dtype: "
          f"model.dtype={self.model.dtype!r}, sampling.dtype={self.sampling.dtype!r} "
          "(bf16: model.dtype='bfloat16' with float32 master weights).")
    if self.sampling.truncates:
      raise ValueError("sampling.true_on_policy samples the full distribution: set "
                       "sampling.top_k=0 and sampling.top_p=1.")
    if self.learner.mesh.tensor != 1:
      raise ValueError(
          f"sampling.true_on_policy needs learner.mesh.tensor=1, got "
          f"{self.learner.mesh.tensor}: a tensor-parallel contraction sums partial "
          "products across devices, an order the other side does not share.")


# --- ConfigDict <-> dataclasses -------------------------------------------
