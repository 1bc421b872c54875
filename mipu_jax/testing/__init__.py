"""Shared by the tests, the benchmarks and the Colab: real components at toy sizes.

- `tiny_run_config`: the smallest complete RL run of the arithmetic task (one
  tier, 4 prompts x 4 responses of 16 tokens), for tests of the loop.
- `checkpoint.write_tiny_qwen3`: a tiny random Qwen3 checkpoint directory in
  the Hugging Face layout, with a byte-level BPE tokenizer.
- `kill_resume`: the kill-anywhere-and-resume harness.
- `graders`: deliberately slow or failing answer graders for the reward pool.
"""

import dataclasses
from typing import Any, Mapping

from mipu_jax import config as config_lib

__all__ = ["tiny_run_config"]


def tiny_run_config(num_steps: int = 2, **sections: Mapping[str, Any]
                    ) -> config_lib.TrainConfig:
  """The tiny RL run of the loop tests, with section fields overridden.

  Args:
    num_steps: RL steps.
    **sections: `section=dict(field=value, ...)` for any `TrainConfig`
      section (`data`, `learner`, `mipu`, `checkpoint`, ...).

  Returns:
    A validated `TrainConfig`: tier 1, 4 prompts x 4 responses of up to 16
    tokens, one sampling round, lr 1e-3, one device, no entropy pass,
    evaluation of 4 problems x 1 sample, a checkpoint every step (2 kept),
    no TensorBoard, plots, progress bar or export.
  """
  base = dict(
      data=dict(prompts_per_step=4, group_size=4, train_tiers=("tier1",),
                max_sampling_rounds=1),
      sampling=dict(max_new_tokens=16),
      optim=dict(learning_rate=1e-3),
      learner=dict(log_entropy=False, mesh=config_lib.MeshConfig(1, 1, 1)),
      eval=dict(tiers=("tier1",), n_per_tier=4, num_samples=1),
      logging=dict(backends="jsonl", plots=False, progress_bar=False),
      checkpoint=dict(every=1, keep=2),
      export=dict(final=False),
  )
  for name, fields in sections.items():
    base[name] = {**base.get(name, {}), **fields}
  default = config_lib.TrainConfig()
  return config_lib.TrainConfig(num_steps=num_steps, **{
      name: dataclasses.replace(getattr(default, name), **fields)
      for name, fields in base.items()})
