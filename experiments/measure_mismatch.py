r"""Mismatch lab: sampler precision modes vs the fp32 learner (docs/method.md §4, §7).

Samples with each precision mode of the sampler and prints, per mode, `k3_kl`,
`log_ppl_abs_diff`, max |Δ log-prob| and the share of tokens with |Δ| > 0.1
against the fp32 learner's log-probs of the same tokens; writes a CSV and a PNG.
The logic lives in `mipu_jax.sampler.mismatch.run_lab`.

  # Random-init preset, CPU (2 cores: about 2 minutes, mostly compilation):
  python -m experiments.measure_mismatch --preset=tiny --out_dir=runs/mismatch
  # A Hugging Face Qwen3 directory:
  python -m experiments.measure_mismatch --checkpoint=/path/to/Qwen3-0.6B \
      --modes=fp32,bf16,int8,fp8,int4 --max_new_tokens=64
"""

from absl import app, flags

from mipu_jax.sampler import mismatch

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Hugging Face Qwen3 directory.")
_PRESET = flags.DEFINE_string("preset", "tiny", "Model preset when no checkpoint is given.")
_INIT_STD = flags.DEFINE_float(
    "init_std", 0.16, "Std of a preset's random matmul weights (larger: peakier policy).")
_MODES = flags.DEFINE_list("modes", list(mismatch.DEFAULT_MODES),
                           f"Precision modes, from {sorted(mismatch.PRECISION_MODES)}.")
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 16, "Random prompts.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "Tokens per random prompt.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 32, "Tokens sampled per response.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 4, "Responses per prompt.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature.")
_TOP_K = flags.DEFINE_integer("top_k", None, "Optional top-k truncation.")
_TOP_P = flags.DEFINE_float("top_p", None, "Optional nucleus truncation.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of prompts, init and sampling.")
_OUT_DIR = flags.DEFINE_string("out_dir", "runs/mismatch", "Where mismatch.csv/png go.")


def main(argv):
  del argv
  mismatch.run_lab(
      checkpoint=_CHECKPOINT.value, preset=_PRESET.value, init_std=_INIT_STD.value,
      modes=_MODES.value, num_prompts=_NUM_PROMPTS.value, prompt_len=_PROMPT_LEN.value,
      max_new_tokens=_MAX_NEW.value, num_samples=_NUM_SAMPLES.value,
      temperature=_TEMPERATURE.value, top_k=_TOP_K.value, top_p=_TOP_P.value,
      seed=_SEED.value, out_dir=_OUT_DIR.value)


if __name__ == "__main__":
  app.run(main)
