"""The run configuration: `ml_collections.ConfigDict` in, frozen dataclasses out.

The ConfigDict stops here. `from_config_dict` converts it
once into a validated `TrainConfig`; everything below takes these frozen
dataclasses or explicit arguments. An impossible combination (bypass mode with
IS weights, an unknown correction preset, a lower bound above an upper one, a
batch that does not split into mini-batches, ...) raises `ValueError` here,
before any compute.

`default_config()` is the inverse direction: the ConfigDict of `TrainConfig()`,
with every field present (optional ones as typed placeholders), so a config
file can start from it and `lock_config=True` command-line overrides reach any
field. The loss section is `LossConfig`'s fields plus
`correction = {preset, <CorrectionConfig field overrides>}`; an override left
at None keeps the preset's value, and the levels accept the string "none" to
switch IS or RS off.
"""

import dataclasses
import os
import types
import typing
import warnings
from typing import Any, Mapping

from ml_collections import config_dict

from mipu_jax import eval as eval_lib
from mipu_jax import losses
from mipu_jax import schedules
from mipu_jax.models import config as model_config
from mipu_jax.sampler import config as sampler_config
from mipu_jax.tasks import arithmetic
from mipu_jax.tasks import math_data
from mipu_jax.tasks import math_reward
from mipu_jax.tasks import math_task

TASKS = ("arithmetic", "math")


def _check_tiers(name: str, tiers: tuple[str, ...]) -> None:
  unknown = [t for t in tiers if t not in arithmetic.TIER_NAMES]
  if not tiers or unknown:
    raise ValueError(f"{name}={tiers!r}: need tiers from {arithmetic.TIER_NAMES}.")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """The policy (docs/method.md §7).

  Attributes:
    preset: `mipu_jax.models.PRESETS` name, used when `init_from` is empty
      (random init, vocabulary resized to the task tokenizer's).
    init_from: Hugging Face checkpoint directory of the base policy, or "".
    dtype: learner matmul dtype; master weights stay float32.
    remat: each layer's remat policy in the backward pass: "none", "layer"
      (recompute the layer: least memory) or "dots" (keep the matmul outputs);
      True / False mean "layer" / "none".
    attention: "dense" (the reference), "blockwise" (flash-style, pure JAX,
      memory linear in the row length), "cudnn" (GPU) or "splash" (TPU)
      (`mipu_jax.models.attention`).
    attention_block: the blockwise / splash tile.
    init_seed: seed of the random init.
  """
  preset: str = "tiny"
  init_from: str = ""
  dtype: str = "float32"
  remat: Any = "none"
  attention: str = "dense"
  attention_block: int = 512
  init_seed: int = 0

  def __post_init__(self):
    if self.preset not in model_config.PRESETS:
      raise ValueError(f"unknown model preset {self.preset!r}; choose one of "
                       f"{sorted(model_config.PRESETS)}.")
    model_config.as_dtype(self.dtype)
    if isinstance(self.remat, bool):
      object.__setattr__(self, "remat", "layer" if self.remat else "none")
    model_config.PRESETS["tiny"].replace(remat=self.remat, attention=self.attention,
                                         attention_block=self.attention_block)
    if self.init_from and not os.path.isdir(self.init_from):
      raise ValueError(f"model.init_from={self.init_from!r} is not a directory.")


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """The inference policy μ: its precision and how it decodes (docs/method.md §0, §7).

  Attributes:
    dtype: sampler compute dtype.
    weight_quant: None, "int8", "fp8_e4m3", "fp8_e5m2" or "int4".
    act_quant: None, "int8", "fp8" or "fp8_e5m2".
    kv_cache_dtype: None (= dtype), "bf16", "fp8", "int8", ...
    quant_lm_head: quantize the LM head too.
    temperature: sampling temperature (applied on the learner side too).
    top_k: 0 for off. Truncation biases the PPO ratio (docs/method.md §0).
    top_p: 1.0 for off.
    max_new_tokens: response budget; also the learner's response length.
    max_concurrent_decodes: most samples decoding at once; more are run
      through the same slots as earlier ones finish (continuous batching).
  """
  dtype: str = "float32"
  weight_quant: str | None = None
  act_quant: str | None = None
  kv_cache_dtype: str | None = None
  quant_lm_head: bool = False
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  max_new_tokens: int = 64
  max_concurrent_decodes: int = 256

  def __post_init__(self):
    sampler_config.SamplerConfig(**self.engine_kwargs())
    if not self.temperature > 0:
      raise ValueError(f"sampling.temperature must be > 0 for training, got "
                       f"{self.temperature}.")
    if self.top_k < 0 or not 0 < self.top_p <= 1:
      raise ValueError(f"need top_k >= 0 and 0 < top_p <= 1, got "
                       f"{self.top_k}, {self.top_p}.")
    if self.max_new_tokens < 1:
      raise ValueError(f"sampling.max_new_tokens must be >= 1, got "
                       f"{self.max_new_tokens}.")
    if self.truncates:
      warnings.warn("top-k/top-p truncation is on: lp_mu and lp_old are of the "
                    "truncated distribution and the PPO ratio is biased "
                    "(docs/method.md §0).", stacklevel=2)

  @property
  def truncates(self) -> bool:
    return self.top_k > 0 or self.top_p < 1.0

  def engine_kwargs(self) -> dict[str, Any]:
    """Keyword arguments of `mipu_jax.sampler.Sampler` for the precision."""
    return dict(dtype=self.dtype, weight_quant=self.weight_quant,
                act_quant=self.act_quant, kv_cache_dtype=self.kv_cache_dtype,
                quant_lm_head=self.quant_lm_head,
                max_concurrent_decodes=self.max_concurrent_decodes)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Prompts, groups and rewards (docs/method.md §1).

  Attributes:
    task: task name (`TASKS`): "arithmetic" (the small CPU task, character
      tokenizer) or "math" (a Hugging Face checkpoint's tokenizer and chat
      template, prompts from `train_file`, math-verify rewards).
    prompts_per_step: N, groups in the training batch.
    group_size: G, responses per prompt.
    dynamic_sampling: drop all-equal groups and over-sample to keep N.
    max_sampling_rounds: over-sampling rounds before the batch is topped up
      with dropped groups (which carry zero advantage).
    train_tiers: arithmetic: tiers the training prompts are drawn from.
    add_bos: arithmetic: prepend BOS to every prompt (the math task uses a BOS
      exactly when the checkpoint's tokenizer has one).
    train_file: math: the training prompts (JSONL / JSON / parquet, DAPO or
      MATH schema; `mipu_jax.tasks.math_data`).
    schema: math: "auto", "dapo" or "math".
    prompt_key: math: the prompt field (None: the schema's; dotted paths
      reach nested fields).
    answer_key: math: the answer field (None: the schema's).
    prompt_template: math: "chat" (the checkpoint's chat template) or a raw
      template with a `{question}` field, for base models.
    instruction: math: what a bare problem becomes (`{question}` field).
    max_prompt_tokens: math: the prompt budget; longer prompts are dropped
      (and counted).
    probe_holdout: math: training prompts held out as MIPU Step 2's probe.
    reward_correct: math: reward of a right final answer.
    reward_wrong: math: reward of a wrong (or missing) one; DAPO uses -1.
    truncated: math: a response cut at the token budget is graded as usual
      ("keep"), scored as wrong ("wrong"), or left out of the loss ("filter").
    reward_workers: math: grading processes.
    reward_timeout_s: math: per-answer grading limit (scored wrong, counted).
    reward_grader: math: the grader, `"module:function"` taking
      `(completion, gold)` and returning whether the answer is right
      (default: the boxed / `Answer:` final answer checked by math-verify).
  """
  task: str = "arithmetic"
  prompts_per_step: int = 16
  group_size: int = 8
  dynamic_sampling: bool = True
  max_sampling_rounds: int = 4
  train_tiers: tuple[str, ...] = arithmetic.TIER_NAMES
  add_bos: bool = True
  train_file: str = ""
  schema: str = "auto"
  prompt_key: str | None = None
  answer_key: str | None = None
  prompt_template: str = "chat"
  instruction: str = eval_lib.PROMPT_TEMPLATE
  max_prompt_tokens: int = 1024
  probe_holdout: int = 64
  reward_correct: float = 1.0
  reward_wrong: float = 0.0
  truncated: str = "keep"
  reward_workers: int = 2
  reward_timeout_s: float = 10.0
  reward_grader: str = math_reward.DEFAULT_GRADE

  def __post_init__(self):
    object.__setattr__(self, "train_tiers", tuple(self.train_tiers))
    if self.task not in TASKS:
      raise ValueError(f"unknown task {self.task!r}; choose one of {TASKS}.")
    if self.prompts_per_step < 1 or self.group_size < 2:
      raise ValueError(f"need prompts_per_step >= 1 and group_size >= 2, got "
                       f"{self.prompts_per_step}, {self.group_size}.")
    if self.max_sampling_rounds < 1:
      raise ValueError("data.max_sampling_rounds must be >= 1.")
    if self.task == "arithmetic":
      _check_tiers("data.train_tiers", self.train_tiers)
      return
    if not self.train_file:
      raise ValueError("data.task='math' needs data.train_file (a local JSONL or "
                       "parquet of prompts in the DAPO or MATH schema).")
    if not os.path.isfile(self.train_file):
      raise ValueError(f"data.train_file={self.train_file!r} is not a file.")
    if self.schema not in math_data.SCHEMAS:
      raise ValueError(f"unknown data.schema {self.schema!r}; choose one of "
                       f"{math_data.SCHEMAS}.")
    if self.truncated not in math_task.TRUNCATED_POLICIES:
      raise ValueError(f"unknown data.truncated {self.truncated!r}; choose one "
                       f"of {math_task.TRUNCATED_POLICIES}.")
    if "{question}" not in self.instruction or (
        self.prompt_template != "chat" and "{question}" not in self.prompt_template):
      raise ValueError("data.instruction and a raw data.prompt_template need a "
                       "{question} field.")
    if self.max_prompt_tokens < 1 or self.probe_holdout < 1:
      raise ValueError("need data.max_prompt_tokens >= 1 and data.probe_holdout >= 1.")
    if self.reward_workers < 1 or not self.reward_timeout_s > 0:
      raise ValueError("need data.reward_workers >= 1 and data.reward_timeout_s > 0.")
    if ":" not in self.reward_grader:
      raise ValueError(f"data.reward_grader must be 'module:function', got "
                       f"{self.reward_grader!r}.")
    if not self.reward_correct > self.reward_wrong:
      raise ValueError(f"need data.reward_correct > data.reward_wrong, got "
                       f"{self.reward_correct}, {self.reward_wrong}.")

  @property
  def batch_size(self) -> int:
    return self.prompts_per_step * self.group_size


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
  schedule: str = "constant"
  cosine: CosineConfig = CosineConfig()
  length_surge: LengthSurgeConfig = LengthSurgeConfig()

  def __post_init__(self):
    if self.weight_decay < 0 or not self.clip_norm > 0:
      raise ValueError(f"need weight_decay >= 0 and clip_norm > 0, got "
                       f"{self.weight_decay}, {self.clip_norm}.")

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
  """(data, fsdp, tensor) mesh shape; one axis may be -1 (the rest)."""
  data: int = 1
  fsdp: int = -1
  tensor: int = 1

  def __post_init__(self):
    shape = (self.data, self.fsdp, self.tensor)
    if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
      raise ValueError(f"invalid mesh shape {shape}.")


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

  def __post_init__(self):
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
  """Periodic evaluation of the sampler μ: pass@1 over k samples.

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
  """
  every: int = 0
  num_samples: int = 4
  temperature: float = 1.0
  seed: int = 1234
  tiers: tuple[str, ...] = arithmetic.TIER_NAMES
  n_per_tier: int = 64
  benchmark_dir: str = ""
  benchmarks: tuple[str, ...] = eval_lib.BENCHMARKS
  max_problems: int = 0

  def __post_init__(self):
    object.__setattr__(self, "tiers", tuple(self.tiers))
    object.__setattr__(self, "benchmarks", tuple(self.benchmarks))
    _check_tiers("eval.tiers", self.tiers)
    for name in self.benchmarks:
      eval_lib.canonical_name(name)
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
class LoggingConfig:
  """Where metrics go; JSONL is always written."""
  tensorboard: bool = True
  plots: bool = True
  progress_bar: bool = True


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

  def __post_init__(self):
    if self.num_steps < 1:
      raise ValueError(f"num_steps must be >= 1, got {self.num_steps}.")
    if self.data.task == "math" and not self.model.init_from:
      raise ValueError("data.task='math' trains a Hugging Face checkpoint: set "
                       "model.init_from to its directory (config.json, "
                       "safetensors, tokenizer.json).")
    chunks = self.learner.num_minibatches * self.learner.num_microbatches
    if self.data.batch_size % chunks:
      raise ValueError(
          f"batch of {self.data.batch_size} responses (prompts_per_step x "
          f"group_size) does not split into {self.learner.num_minibatches} "
          f"mini-batches x {self.learner.num_microbatches} micro-batches.")
    if self.loss.advantage == "rloo" and self.data.group_size < 2:
      raise ValueError("rloo needs group_size >= 2.")
    # Builds the schedule once so a bad argument fails here, not mid-run.
    schedules.make_schedule(self.optim.schedule, self.optim.learning_rate,
                            **self.optim.schedule_kwargs(self.num_steps))


# --- ConfigDict <-> dataclasses -------------------------------------------

_LEVEL_FIELDS = ("is_level", "rs_level")


def _optional_type(hint) -> type | None:
  """`T` for an `Optional[T]` / `T | None` hint, else None."""
  args = typing.get_args(hint)
  if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
    (inner,) = [a for a in args if a is not type(None)]
    return inner
  return None


def _placeholder(hint) -> config_dict.FieldReference:
  return config_dict.placeholder(_optional_type(hint) or hint)


def _to_cd(obj) -> config_dict.ConfigDict:
  """ConfigDict of a config dataclass; None fields become typed placeholders."""
  hints = typing.get_type_hints(type(obj))
  out = {}
  for f in dataclasses.fields(obj):
    value = getattr(obj, f.name)
    if isinstance(value, losses.LossConfig):
      out[f.name] = _loss_to_cd(value)
    elif dataclasses.is_dataclass(value):
      out[f.name] = _to_cd(value)
    elif value is None:
      out[f.name] = _placeholder(hints[f.name])
    else:
      out[f.name] = value
  return config_dict.ConfigDict(out)


def _loss_to_cd(loss: losses.LossConfig) -> config_dict.ConfigDict:
  """`loss` without its correction, plus `correction = {preset, overrides}`.

  Every override is a placeholder: the section means "the preset as is".
  """
  out = _to_cd(dataclasses.replace(loss, correction=losses.CorrectionConfig()))
  del out["correction"]
  corr_hints = typing.get_type_hints(losses.CorrectionConfig)
  correction = {"preset": "token_tis"}
  for f in dataclasses.fields(losses.CorrectionConfig):
    correction[f.name] = _placeholder(corr_hints[f.name])
  out["correction"] = correction
  return out


def default_config() -> config_dict.ConfigDict:
  """The full ConfigDict of `TrainConfig()`: the defaults of docs/method.md.

  The loss correction is the `token_tis` preset (docs/method.md §3, U = 2).
  """
  return _to_cd(TrainConfig())


def _from_mapping(cls, d: Mapping[str, Any], where: str):
  hints = typing.get_type_hints(cls)
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - names)
  if unknown:
    raise ValueError(f"unknown config field(s) {[f'{where}{k}' for k in unknown]}; "
                     f"{where or 'top level'} has {sorted(names)}.")
  kwargs = {}
  for name, value in d.items():
    hint = hints[name]
    if hint is losses.LossConfig:
      kwargs[name] = _loss_from_mapping(value)
    elif dataclasses.is_dataclass(hint):
      kwargs[name] = _from_mapping(hint, value, f"{where}{name}.")
    else:
      kwargs[name] = value
  return cls(**kwargs)


def _loss_from_mapping(d: Mapping[str, Any]) -> losses.LossConfig:
  d = dict(d)
  corr = d.pop("correction", None)
  if isinstance(corr, Mapping):
    corr = {k: v for k, v in corr.items() if v is not None}
    for name in _LEVEL_FIELDS:
      if isinstance(corr.get(name), str) and corr[name].lower() == "none":
        corr[name] = None
    corr = losses.CorrectionConfig.from_preset(corr.pop("preset", "token_tis"),
                                               **corr)
  elif isinstance(corr, str):
    corr = losses.CorrectionConfig.from_preset(corr)
  if corr is not None:
    d["correction"] = corr
  return losses.LossConfig.from_dict(d)


def from_config_dict(cd: config_dict.ConfigDict | Mapping[str, Any]) -> TrainConfig:
  """Validated `TrainConfig` from a ConfigDict (or plain nested mapping).

  Missing fields keep their defaults; unknown fields, presets and impossible
  combinations raise `ValueError`.
  """
  if isinstance(cd, config_dict.ConfigDict):
    cd = cd.to_dict()
  return _from_mapping(TrainConfig, cd, "")

