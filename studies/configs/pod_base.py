r"""Shared TPU-pod settings of the Qwen3-1.7B / Qwen3-4B / Qwen3-30B-A3B table rows: `studies/configs/math.py` at pod scale.

Not a job by itself: `pod_qwen3_1p7b.py`, `pod_qwen3_4b.py` and `pod_qwen3_30b_a3b.py` call
`get_config(preset, arg)`. Every row trains the sources' experiment, math RL
of a local Qwen3 checkpoint on DAPO / MATH prompts with benchmark evaluation
(`studies/configs/math.py`, its hyperparameters: lr 1e-6, AdamW wd 0.01, grad clip 1,
RLOO, 16 responses x 64 prompts, one PPO epoch over one mini-batch, clip
0.2 / 0.28, TIS / MIS bound 2, min LR ratio 0.1, temperature 1, dynamic
sampling, 8192-token responses, FP8 rollout, fp32 master weights with bf16
matmuls and per-layer remat). Multi-host launch, mesh shapes per pod size:
`docs/pods.md`.

Options after the row (`--config studies/configs/pod_qwen3_4b.py:mipu,chips=32,ckpt=...,train=...,eval=...`):
  chips=N      data-parallel devices, chips / tensor (default 16, e.g. v5p-32);
               a micro-batch is one packed (1024 + 8192)-token row per
               data-parallel device (pack=False: one response row per device).
  ckpt=DIR     the local Hugging Face Qwen3 checkpoint (required).
  train=FILE   DAPO-Math-17k / MATH-style prompts (required).
  eval=DIR     the benchmark files (math500.jsonl, aime24.parquet, ...).
  slots=N      sampler rows decoding at once per data-parallel device (default
               2: with the learner's state on the same chips, two 9,216-token
               KV-cache rows of Qwen3-4B per v5e chip is what fits, docs/pods.md).
  expert=N     a mixture-of-experts model's expert-parallel axis (default 1, and
               8 for Qwen3-30B-A3B): each chip holds E / N experts, the rest of
               the chips (chips / N) split over fsdp; N divides chips and E.
  seed=N, steps=N, p=P (random-rollback probability), pack=True|False.
"""

from studies.configs import common
from studies.configs import math

ROWS_PER_PROMPT = 16
PROMPTS_PER_STEP = 64


def get_config(preset: str, arg=None, *, decay_period: int | None = None, expert: int = 1):
  """A pod ConfigDict for model `preset` and table row `arg` ("row,opt=value").

  Args:
    preset: `qwen3_1p7b`, `qwen3_4b` or `qwen3_30b_a3b`.
    arg: the row and its options (see module docstring).
    decay_period: the LR-decay row's fixed `T_decay` when the source gives one
      (None: the `auto` surge detection of docs/method.md §6).
    expert: the default of the `expert=` option.
  """
  arg = common.parse_arg(arg, row="mipu", chips=16, ckpt="", train="", eval="",
                         seed=0, steps=500, p=float, pack=True, slots=2, expert=expert)
  rows_per_step = PROMPTS_PER_STEP * ROWS_PER_PROMPT
  if rows_per_step % arg.chips:
    raise ValueError(f"chips={arg.chips} does not divide the {rows_per_step} rows "
                     "of a step.")
  if arg.chips % arg.expert:
    raise ValueError(f"expert={arg.expert} does not divide chips={arg.chips}.")
  config = math.get_config(
      f"{arg.row},ckpt={arg.ckpt},train={arg.train},eval={arg.eval},seed={arg.seed},"
      f"steps={arg.steps},prompts={PROMPTS_PER_STEP},group={ROWS_PER_PROMPT},"
      f"pack={arg.pack},slots={arg.slots * arg.chips}"
      + ("" if arg.pack else f",micro={rows_per_step // arg.chips}")
      + (f",p={arg.p}" if arg.p is not None else ""))
  # The architecture the pod's memory plan is for; the weights are the ckpt's.
  config.model.preset = preset
  config.learner.mesh.expert = arg.expert
  if decay_period is not None:
    config.optim.length_surge.mode = "fixed"
    config.optim.length_surge.decay_period = decay_period
  return config
