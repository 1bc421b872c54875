"""The run config's sections for the model, the sampler μ and the data (docs/method.md §0–1, §7)."""

import dataclasses
import os
import warnings
from typing import Any

from mipu_jax import math_eval
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
    attention: "auto" (the default: "cpu_fused" on a CPU in float32 where
      the kernel builds, else "dense"), "dense" (the reference), "blockwise"
      (flash-style, pure JAX, memory linear in the row length), "cudnn" (GPU),
      "splash" (TPU) or "cpu_fused" (one XLA:CPU kernel, float32, built with the
      host's C++ compiler on first use) (`mipu_jax.models.attention`).
    attention_block: the blockwise / splash tile.
    init_seed: seed of the random init.
    init_perturb_ulps: every float parameter of the base policy moved this
      many ulps toward +inf before training (0: none). The same experiment
      under float sums that differ from the first step on, as another host's
      would: do a study's conclusions survive other float sums?
  """
  preset: str = "tiny"
  init_from: str = ""
  dtype: str = "float32"
  remat: Any = "none"
  attention: str = "auto"
  attention_block: int = 512
  init_seed: int = 0
  init_perturb_ulps: int = 0

  def __post_init__(self):
    if (isinstance(self.init_perturb_ulps, bool) or not isinstance(self.init_perturb_ulps, int)
        or self.init_perturb_ulps < 0):
      raise ValueError(f"model.init_perturb_ulps must be an int >= 0, got "
                       f"{self.init_perturb_ulps!r}.")
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
class SamplingConfig(sampler_config.SamplerPrecision):
  """The inference policy μ: its precision and how it decodes (docs/method.md §0, §7).

  The precision fields (dtype, weight_quant, act_quant, kv_cache_dtype,
  quant_lm_head, max_concurrent_decodes) and their validation are
  `mipu_jax.sampler.config.SamplerPrecision`'s; `precision_kwargs()` hands them
  to the sampler. Here they stay names (strings), as in the ConfigDict.

  Attributes:
    temperature: sampling temperature (applied on the learner side too).
    top_k: 0 for off. Truncation biases the PPO ratio (docs/method.md §0).
    top_p: 1.0 for off.
    max_new_tokens: response budget; also the learner's response length.
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  max_new_tokens: int = 64

  def __post_init__(self):
    super().__post_init__()
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
  instruction: str = math_eval.PROMPT_TEMPLATE
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
    if self.reward_grader.startswith("mipu_jax.eval."):
      raise ValueError(f"data.reward_grader {self.reward_grader!r}: the package "
                       "mipu_jax.eval is now mipu_jax.math_eval; use "
                       f"{self.reward_grader.replace('mipu_jax.eval.', 'mipu_jax.math_eval.')!r}.")
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
