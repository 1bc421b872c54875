r"""RL of a Hugging Face Qwen3 checkpoint on math prompts: the sources' experiment.

    python -m experiments.train --workdir /runs/qwen3_1p7b_mipu \
        --config studies/configs/math.py:ckpt=/ckpt/Qwen3-1.7B,train=/data/dapo-math-17k.parquet,eval=/data/evals
    # any table row, a smaller budget, any field:
    python -m experiments.train --workdir /runs/tis --config studies/configs/math.py:tis,ckpt=...,train=...,steps=100 \
        --config.sampling.max_new_tokens=4096

Options (`studies/configs/common.parse_arg`): the table row (`studies/configs/rows.py`, default
`mipu`), `ckpt` (a local Qwen3 directory: config.json, safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json; required),
`train` (DAPO-Math-17k or MATH-style JSONL / parquet; required), `eval` (a
directory holding `math500.jsonl`, `aime24.parquet`, `amc23.*`,
`minerva_math.*`, `olympiadbench.*`; the ones present are evaluated), `seed`,
`steps`, `prompts` (per step), `group` (responses per prompt), `max_new`
(response budget), `max_prompt` (prompt budget), `pack` (sequence packing,
default on: responses share rows of `max_prompt + max_new` tokens, micro-batches
of one packed row per data-parallel device), `micro` (without packing:
gradient-accumulation micro-batches per step, default one row each), `slots`
(sampler rows decoding at once, `sampling.max_concurrent_decodes`, default
32: the KV cache holds `slots x (max_prompt + max_new)` tokens, for Qwen3-0.6B
and 1.7B 112 KiB per token in bf16, so 32 GiB at the defaults; finished rows
are refilled, so fewer slots cost speed, not results), `p` (random-rollback
probability), `quick` (a CPU smoke budget for tests).

Defaults are the sources' hyperparameters (MIPU and the length-surge paper):
lr 1e-6, AdamW wd 0.01, grad clip 1, RLOO, 64 prompts x 16 responses, one
PPO epoch over one mini-batch, clip 0.2 / 0.28, TIS bound 2, temperature 1,
dynamic sampling, 8192-token responses, FP8 rollout (e4m3 weights + FP8
activations, bf16 compute), fp32 master weights with bf16 learner matmuls and
per-layer remat; the checkpoint's chat template; rewards 1 / 0 from the boxed
(or `Answer:`) final answer checked by math-verify; evaluation every 20 steps,
pass@1 over 4 samples; the final policy exported as a Hugging Face directory.

Hardware: one GPU with 80 GB for Qwen3-0.6B / 1.7B (`pip install -e ".[gpu]"`),
a TPU slice through `studies/configs/pod_qwen3_*.py`. On a GPU add
`--config.model.attention=cudnn` (faster than blockwise; memory, MFU and time per
step on one H100: bench/README.md, `bench/gpu/accelerator.py`). The sampler's matmuls can run as native FP8 / int8 dots
(`--config.sampling.quant_compute=native`; same numbers as the emulated default
up to float rounding, tests/test_native_quant.py). Result at the full budget:
not measured here; the sources report about +10-15 points of Avg. over the base
model after 300-500 steps.
"""

from mipu_jax import config as config_lib
from studies.configs import common
from studies.configs import rows


def get_config(arg=None):
  """The math-RL ConfigDict of `arg` (see module docstring)."""
  arg = common.parse_arg(arg, row="mipu", ckpt="", train="", eval="", seed=0,
                         steps=500, prompts=64, group=16, max_new=8192,
                         max_prompt=1024, pack=True, micro=0, slots=32, p=float,
                         quick=False)
  if not arg.ckpt or not arg.train:
    raise ValueError(
        "studies/configs/math.py needs ckpt=DIR (a local Hugging Face Qwen3 directory) and "
        "train=FILE (DAPO-Math-17k or MATH-style prompts), e.g. --config "
        "studies/configs/math.py:ckpt=/ckpt/Qwen3-1.7B,train=/data/dapo.parquet,eval=/data/evals")
  config = config_lib.default_config()
  config.seed = arg.seed
  config.num_steps = arg.steps

  config.model.init_from = arg.ckpt
  config.model.dtype = "bfloat16"
  config.model.remat = "layer"
  # Memory linear in the row length, on any backend; on GPU `cudnn` and on TPU
  # `splash` are the fast kernels (--config.model.attention=...).
  config.model.attention = "blockwise"

  config.sampling.dtype = "bfloat16"
  config.sampling.weight_quant = "fp8_e4m3"
  config.sampling.act_quant = "fp8"
  config.sampling.temperature = 1.0
  config.sampling.max_new_tokens = arg.max_new
  # The KV cache's rows: its memory, not the batch, bounds them (docstring).
  config.sampling.max_concurrent_decodes = arg.slots

  config.data.task = "math"
  config.data.train_file = arg.train
  config.data.max_prompt_tokens = arg.max_prompt
  config.data.prompts_per_step = arg.prompts
  config.data.group_size = arg.group
  config.data.dynamic_sampling = True

  config.loss.advantage = "rloo"
  config.loss.eps_low = 0.2
  config.loss.eps_high = 0.28

  config.optim.learning_rate = 1e-6
  config.optim.weight_decay = 0.01
  config.optim.clip_norm = 1.0
  config.optim.length_surge.min_ratio = 0.1

  config.learner.ppo_epochs = 1
  config.learner.num_minibatches = 1
  if arg.pack:
    if arg.micro:
      raise ValueError("studies/configs/math.py: micro= is for unpacked rows; with pack=True "
                       "a micro-batch is one packed row per data-parallel device "
                       "(--config.learner.pack_rows=... to change it).")
    # Rows of one full-length response each at most; short responses share
    # them, so a micro-batch still holds one (prompt + 8192)-token row per device.
    config.learner.pack_length = arg.max_prompt + arg.max_new
    config.learner.num_microbatches = 1
  else:
    # One row per micro-batch by default: the memory of one (prompt + 8192)-token
    # row at a time.
    config.learner.num_microbatches = arg.micro or arg.prompts * arg.group
  config.learner.mesh.data = 1
  config.learner.mesh.fsdp = -1
  config.learner.mesh.tensor = 1

  config.eval.benchmark_dir = arg.eval
  config.eval.every = 20
  config.eval.num_samples = 4
  config.checkpoint.every = 20
  config.checkpoint.keep = 3
  config.export.final = True
  config.mipu.num_probe_prompts = 8
  config.mipu.seed = arg.seed
  if arg.quick:
    _quick(config)
  return rows.apply(config, arg.row, p=arg.p)


def _quick(config):
  """A CPU smoke budget: fp32, 2 steps of 2 prompts x 2 responses of 16
  tokens, 2 problems per benchmark, one device."""
  config.num_steps = 2
  config.model.dtype = "float32"
  config.model.remat = "none"
  config.sampling.dtype = "float32"
  config.sampling.max_new_tokens = 16
  config.data.prompts_per_step = 2
  config.data.group_size = 2
  config.data.max_sampling_rounds = 1
  config.data.max_prompt_tokens = 192
  config.data.probe_holdout = 2
  config.data.reward_workers = 1
  config.learner.num_microbatches = 1
  if config.learner.pack_length:
    config.learner.pack_length = (config.data.max_prompt_tokens
                                  + config.sampling.max_new_tokens)
  config.learner.log_entropy = False
  config.learner.mesh.fsdp = 1
  config.eval.every = 0
  config.eval.max_problems = 2
  config.eval.num_samples = 2
  config.checkpoint.every = 1
  config.mipu.num_probe_prompts = 2
  config.logging.backends = "jsonl"
