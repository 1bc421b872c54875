r"""One GRPO run on the arithmetic task, on CPU (docs/guide.md's single-run command;
the main job is `experiments/compare.py`).

    python -m experiments.train --config studies/configs/small_cpu.py --workdir /tmp/small_cpu

Hardware: 2 CPU cores. Expected time: under 10 minutes, compilation included.
30 GRPO steps of 16 prompts x 8 responses on tiers 1-3, from the
pretrained base policy in `mipu_jax/tasks/assets/base_policy/`, sampler in
fp32 (its numerics equal the learner's, so `rollout_corr/k3_kl` stays 0). Ends with a results table (pass@1 over 4
samples of 32 held-out problems per tier, at the start, the end and the best
evaluation) and `plots.png` in the workdir.

Expected result (seed 0): training reward 0.20 -> 0.77, mean response length
12 -> 27 tokens (the policy switches to step-by-step answers), eval Avg
0.236 -> 0.708 (tier1 0.29 -> 0.85, tier5 0.23 -> 0.62).

Override anything from the command line, e.g. a high-mismatch sampler:
    --config.sampling.weight_quant=fp8_e4m3 --config.sampling.act_quant=fp8
"""

from studies.configs import base


def get_config():
  config = base.get_config()
  config.num_steps = 30
  config.eval.every = 10
  config.eval.n_per_tier = 32
  config.checkpoint.every = 10
  return config
