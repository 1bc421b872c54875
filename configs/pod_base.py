r"""Shared TPU-pod settings of the Qwen3-1.7B / Qwen3-4B table rows (the sources' hyperparameters).

Not a job by itself: `pod_qwen3_1p7b.py` and `pod_qwen3_4b.py` call
`get_config(preset, arg)` and `configs/rows.py` turns it into a table row.
Multi-host launch, mesh shapes per pod size: `docs/pods.md`.

Hyperparameters (MIPU and the length-surge paper, `../shared/seeds/000_…`,
`002_…` Appendix C): learning rate 1e-6, AdamW weight decay 0.01, gradient
clip 1, RLOO advantages, 16 responses per prompt, 64 prompts per step, one
PPO epoch over one mini-batch (fully on-policy), clip ε 0.2 / 0.28, TIS / MIS
bound 2 (the presets' U), minimum LR ratio 0.1 (the length-surge floor),
temperature 1, dynamic sampling on, max response length 8192, FP8 rollout
(e4m3 weights and FP8 activations in the sampler; bf16 compute), fp32 master
weights with bf16 learner matmuls and per-layer remat.

Variant options after the row (`--config configs/pod_qwen3_4b.py:mipu,chips=32`):
  chips=N      data-parallel devices, chips / tensor (default 16, e.g. v5p-32);
               sets the gradient-accumulation micro-batches to one row per
               data-parallel device.
  ckpt=DIR     a local Hugging Face Qwen3 checkpoint (nothing is downloaded).
  seed=N, steps=N, p=P (random-rollback probability).

What this trains today: the loop's only task is the arithmetic one with its
character tokenizer (`config.data.task`), so a pod run is a systems run at
Qwen3 scale, not the sources' DAPO-math training; the real-benchmark
evaluation (`mipu_jax.eval`: MATH-500, AIME24, AMC23, Minerva, OlympiadBench)
runs separately on the trained checkpoint.
"""

from configs import base
from configs import common
from configs import rows

ROWS_PER_PROMPT = 16
PROMPTS_PER_STEP = 64


def get_config(preset: str, arg=None, *, decay_period: int | None = None):
  """A pod ConfigDict for model `preset` and table row `arg` ("row,opt=value").

  Args:
    preset: `qwen3_1p7b` or `qwen3_4b`.
    arg: the row and its options (see module docstring).
    decay_period: the LR-decay row's fixed `T_decay` when the source gives one
      (None: the `auto` surge detection of SPEC.md §6).
  """
  arg = common.parse_arg(arg, row="mipu", chips=16, ckpt="", seed=0,
                         steps=500, p=float)
  chips = arg.chips
  config = base.get_config()
  config.seed = arg.seed
  config.num_steps = arg.steps

  config.model.preset = preset
  config.model.init_from = arg.ckpt
  config.model.dtype = "bfloat16"
  config.model.remat = True

  config.sampling.dtype = "bfloat16"
  config.sampling.weight_quant = "fp8_e4m3"
  config.sampling.act_quant = "fp8"
  config.sampling.temperature = 1.0
  config.sampling.max_new_tokens = 8192

  config.data.train_tiers = ("tier1", "tier2", "tier3", "tier4", "tier5")
  config.data.prompts_per_step = PROMPTS_PER_STEP
  config.data.group_size = ROWS_PER_PROMPT
  config.data.dynamic_sampling = True

  config.loss.advantage = "rloo"
  config.loss.eps_low = 0.2
  config.loss.eps_high = 0.28

  config.optim.learning_rate = 1e-6
  config.optim.weight_decay = 0.01
  config.optim.clip_norm = 1.0
  config.optim.length_surge.min_ratio = 0.1
  if decay_period is not None:
    config.optim.length_surge.mode = "fixed"
    config.optim.length_surge.decay_period = decay_period

  rows_per_step = PROMPTS_PER_STEP * ROWS_PER_PROMPT
  if rows_per_step % chips:
    raise ValueError(f"chips={chips} does not divide the {rows_per_step} rows "
                     "of a step.")
  config.learner.ppo_epochs = 1
  config.learner.num_minibatches = 1
  config.learner.num_microbatches = rows_per_step // chips
  config.learner.mesh.data = 1
  config.learner.mesh.fsdp = -1
  config.learner.mesh.tensor = 1

  config.eval.every = 20
  config.eval.n_per_tier = 128
  config.eval.num_samples = 4
  config.checkpoint.enabled = True
  config.checkpoint.every = 20
  config.checkpoint.keep = 3
  config.mipu.num_probe_prompts = 8
  config.mipu.seed = config.seed
  return rows.apply(config, arg.row, p=arg.p)
