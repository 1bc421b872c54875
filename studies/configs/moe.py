r"""One run of the MoE study on the small CPU task: the tiny Qwen3-MoE base policy, room
for responses to surge, a deployable sampler, and one of the answers (docs/method.md §7a).

    python -m experiments.train --config studies/configs/moe.py:row=baseline,lr=1e-3,seed=0 \
        --workdir /tmp/moe_baseline

Options (`studies/configs/common.parse_arg`): `row` (a key of `ROWS`), `precision` (a
sampler of `studies/configs/mismatch.py:PRECISIONS`, default `fp8`: the sources'
deployable FP8 rollout), `lr`, `seed`, `steps`, `max_new` (the response budget, 256:
four times tier 5's longest correct answer, so a length surge has room), `tiers`
(training tiers as digits), `eval_every`, `quick` (a smoke budget).

The setting differs from the long-horizon study's (`studies/configs/horizon.py`) in
two things only: the policy is the tiny MoE (`mipu_jax/tasks/assets/base_policy_moe/`:
8 experts of width 128, top-2, the dense base's attention and about its active
parameters) and responses may reach 256 tokens. The rows:

| row | what it changes |
| --- | --- |
| `control` | fp32 sampler (no mismatch), uncorrected |
| `baseline` | the sampler of `precision`, uncorrected, routing live on both sides |
| `r3` | `baseline` + rollout routing replay (the sampler's experts) |
| `r2` | `baseline` + learner routing replay (the recompute's experts) |
| `tis` | `baseline` + token TIS, U = 2 |
| `geo_rs` | `baseline` + geometric-mean rejection (preset `geo_rs`) |
| `mipu` | MIPU Step 1 + Step 2 |
| `lr_decay` | `baseline` + the length-surge schedule (online detection) |
| `bf16_true_on_policy` | bf16 sampler and learner in the true on-policy mode |
"""

import os

import mipu_jax
from studies.configs import common
from studies.configs import mismatch
from studies.configs import rows

BASE_POLICY_MOE = os.path.join(os.path.dirname(mipu_jax.__file__), "tasks", "assets",
                               "base_policy_moe")
ROWS = ("control", "baseline", "r3", "r2", "tis", "geo_rs", "mipu", "lr_decay",
        "bf16_true_on_policy")


def get_config(arg=None):
  """The ConfigDict of one MoE-study run (see module docstring)."""
  arg = common.parse_arg(arg, row="baseline", precision="fp8", lr=1e-3, seed=0, steps=600,
                         max_new=256, tiers="45", eval_every=50, quick=False)
  if arg.row not in ROWS:
    raise ValueError(f"unknown MoE-study row {arg.row!r}; choose one of {ROWS}.")
  config = mismatch.get_config(
      f"precision={arg.precision},lr={arg.lr:g},seed={arg.seed},steps={arg.steps},"
      f"max_new={arg.max_new},tiers={arg.tiers},eval_every={arg.eval_every}"
      + (",quick" if arg.quick else ""))
  config.model.init_from = BASE_POLICY_MOE
  config.model.preset = "tiny_moe"
  config.mipu.c_noise_multiple = 2.0
  # The sampler's routing each step: the moe/* metrics of every row.
  config.moe.record_routing = True
  row = arg.row
  if row in ("r3", "r2"):
    config = rows.apply(config, "baseline")
    config.moe.routing_replay = "rollout" if row == "r3" else "learner"
  elif row == "geo_rs":
    config = rows.apply(config, "baseline")
    config.loss.correction.preset = "geo_rs"
  else:
    config = rows.apply(config, row)
  return config
