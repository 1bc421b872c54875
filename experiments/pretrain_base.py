r"""Pretrains the small task's base policy and ships it as a Hugging Face checkpoint.

    python -m experiments.pretrain_base \
        --output_dir=mipu_jax/tasks/assets/base_policy
    python -m experiments.pretrain_base --num_experts=8 --num_experts_per_tok=2 \
        --moe_intermediate_size=128 --output_dir=mipu_jax/tasks/assets/base_policy_moe

Supervised next-token training of a small Qwen3 on the arithmetic task's SFT
mix, then a sampled evaluation per held-out tier (accuracy of direct versus
step-by-step answers), written with the checkpoint into `--output_dir`
(config.json, model.safetensors, tokenizer_meta.json, eval.json, README.md).
The logic lives in `mipu_jax/pretrain/`.
"""

import dataclasses
import sys

from absl import app
from absl import flags

from mipu_jax import pretrain

_DEFAULTS = pretrain.PretrainConfig()

_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", "mipu_jax/tasks/assets/base_policy", "Where to write the checkpoint.")
_STEPS = flags.DEFINE_integer("steps", _DEFAULTS.steps, "Optimiser steps.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", _DEFAULTS.batch_size, "Sequences per step.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", _DEFAULTS.learning_rate, "Peak LR.")
_COT_FRACTION = flags.DEFINE_float(
    "cot_fraction", _DEFAULTS.cot_fraction, "Share of step-by-step SFT answers.")
_DIRECT_ERROR_RATE = flags.DEFINE_float(
    "direct_error_rate", _DEFAULTS.direct_error_rate, "Share of wrong direct SFT answers.")
_SKILL_STEPS = flags.DEFINE_integer(
    "skill_steps", _DEFAULTS.skill_steps, "Curriculum steps on the skill mix.")
_SKILL_COT_FRACTION = flags.DEFINE_float(
    "skill_cot_fraction", _DEFAULTS.skill_cot_fraction,
    "Share of step-by-step answers during the skill steps.")
_SEED = flags.DEFINE_integer("seed", _DEFAULTS.seed, "Init and data seed.")
_NUM_EXPERTS = flags.DEFINE_integer(
    "num_experts", _DEFAULTS.num_experts, "Experts per layer (0: a dense policy).")
_NUM_EXPERTS_PER_TOK = flags.DEFINE_integer(
    "num_experts_per_tok", _DEFAULTS.num_experts_per_tok, "Experts per token (top-k).")
_MOE_INTERMEDIATE_SIZE = flags.DEFINE_integer(
    "moe_intermediate_size", _DEFAULTS.moe_intermediate_size, "Each expert's SwiGLU width.")
_EVAL_PER_TIER = flags.DEFINE_integer(
    "eval_per_tier", _DEFAULTS.eval_per_tier, "Held-out problems per tier.")
_EVAL_TEMPERATURE = flags.DEFINE_float(
    "eval_temperature", _DEFAULTS.eval_temperature, "Evaluation sampling temperature.")


def main(argv):
  del argv
  cfg = dataclasses.replace(
      _DEFAULTS, steps=_STEPS.value, batch_size=_BATCH_SIZE.value,
      learning_rate=_LEARNING_RATE.value, cot_fraction=_COT_FRACTION.value,
      direct_error_rate=_DIRECT_ERROR_RATE.value, skill_steps=_SKILL_STEPS.value,
      skill_cot_fraction=_SKILL_COT_FRACTION.value, seed=_SEED.value,
      num_experts=_NUM_EXPERTS.value, num_experts_per_tok=_NUM_EXPERTS_PER_TOK.value,
      moe_intermediate_size=_MOE_INTERMEDIATE_SIZE.value,
      eval_per_tier=_EVAL_PER_TIER.value, eval_temperature=_EVAL_TEMPERATURE.value)
  command = "python -m experiments.pretrain_base " + " ".join(sys.argv[1:])
  results = pretrain.run(cfg, _OUTPUT_DIR.value, command=command.strip())
  for tier, row in results.items():
    print(f"{tier}: accuracy {row['accuracy']:.3f}  step share {row['step_share']:.2f}  "
          f"direct {row['direct_accuracy']}  step {row['step_accuracy']}  "
          f"length {row['mean_length']:.1f}")


if __name__ == "__main__":
  app.run(main)
