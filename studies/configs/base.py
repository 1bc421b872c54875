r"""Shared defaults of every run: the small arithmetic task, docs/method.md algorithm defaults.

Not a job by itself; `small_cpu.py` and the table-row configs start from
`get_config()` and change a few fields. A table row is a function of this base:

  def get_config():
    config = base.get_config()
    config.loss.correction.preset = "seq_tis"
    return config

Algorithm defaults (docs/method.md §1–3, the sources): GRPO advantages, PPO clip
ε_low 0.2 / ε_high 0.28, token-mean aggregation, on-policy recompute with token
TIS (U = 2), AdamW (weight decay 0.01, gradient clip 1.0), temperature 1.
"""

import os

import mipu_jax
from mipu_jax import config as config_lib

BASE_POLICY = os.path.join(os.path.dirname(mipu_jax.__file__), "tasks", "assets",
                           "base_policy")


def get_config():
  """The shared base ConfigDict (every field present, so CLI overrides reach it)."""
  config = config_lib.default_config()
  config.seed = 0
  # The pretrained base policy shipped with the package
  # (`experiments/pretrain_base.py` rebuilds it).
  config.model.init_from = BASE_POLICY
  config.model.preset = "tiny"
  # The committed studies and tables ran with `dense` attention, the default
  # before "auto" (the fused CPU kernel, other float sums): pinned, so that a
  # resumed or added run computes the sums of those already made.
  config.model.attention = "dense"

  config.data.train_tiers = ("tier1", "tier2", "tier3")
  config.data.prompts_per_step = 16
  config.data.group_size = 8
  config.sampling.max_new_tokens = 64  # Tier 5's longest step-by-step answer + EOS is 60.

  config.optim.learning_rate = 1e-4
  # Two optimizer updates per batch: the second is off-policy, so the PPO clip
  # (and `actor/pg_clipfrac`) does something.
  config.learner.num_minibatches = 2
  config.learner.mesh.data = 1
  config.learner.mesh.fsdp = 1
  config.learner.mesh.tensor = 1

  config.eval.every = 10
  config.eval.n_per_tier = 64
  config.eval.num_samples = 4
  config.eval.temperature = 1.0
  return config


def batch_run(config, *, eval_every: int):
  """Settings of a run that is one of many (a table row, a study cell): periodic
  evaluation on 32 problems x 4 samples per tier, of the deployed sampler μ
  and of the learner's π at full precision (`eval.pi`: twice the evaluation
  time); a checkpoint at every evaluation (the newest kept), so an interrupted
  job resumes where it stopped; no TensorBoard, per-run plots or progress bar
  (the caller reports)."""
  config.eval.every = eval_every
  config.eval.n_per_tier = 32
  config.eval.num_samples = 4
  config.eval.pi = True
  config.checkpoint.enabled = True
  config.checkpoint.every = eval_every
  config.checkpoint.keep = 1
  config.logging.backends = "jsonl"
  config.logging.plots = False
  config.logging.progress_bar = False
  return config


def quick(config):
  """A smoke budget (tests, Colab): 2 steps of 4 prompts x 4 responses on tier 1,
  24-token responses, no periodic evaluation. The final evaluation has 4
  problems x 4 samples, like the training batch, so that evaluation and probes
  reuse the training rollout's compiled sampler shapes."""
  config.num_steps = 2
  config.data.train_tiers = ("tier1",)
  config.data.prompts_per_step = 4
  config.data.group_size = 4
  config.data.max_sampling_rounds = 2
  config.sampling.max_new_tokens = 24
  config.eval.every = 0
  config.eval.n_per_tier = 4
  config.eval.num_samples = 4
  config.eval.pi = False  # a smoke run: no second sampler to compile
  config.learner.log_entropy = False
  config.mipu.num_probe_prompts = 4
  return config
