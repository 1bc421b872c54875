r"""One cell of the mismatch study on the small CPU task: a sampler precision x a setting.

    python -m experiments.train --config studies/configs/mismatch.py:precision=int4_all,lr=1e-3 \
        --workdir /tmp/cell
    python -m experiments.mismatch_sweep --workdir results/mismatch_sweep   # the grid

Options (`studies/configs/common.parse_arg`): `precision` (a key of `PRECISIONS`),
`lr` (learning rate), `temperature` (sampling and evaluation), `steps`,
`seed`, `correction` (a preset; `none` is the uncorrected baseline the study
is about), `tiers` (training tiers as digits, e.g. `123`), `max_new`
(response budget), `eval_every` (evaluation and checkpoint period; the
second study's cells use the tables' 20), `quick` (a smoke budget). Everything else is
`studies/configs/base.py`: the shipped base policy, GRPO, 16 prompts x 8 responses
per step, two optimizer updates per step, AdamW, fp32 learner.

Hardware: 2 CPU cores. Time: about 1 s per step on idle cores plus
evaluations (every 25 steps: 32 problems x 4 samples per tier); a 200-step
cell is 5-10 minutes. Result: `results/mismatch_sweep/README.md`.
"""

from studies.configs import base
from studies.configs import common

# Sampler precision modes (`mipu_jax.sampler.Sampler` keyword arguments), from
# no mismatch to the most the sampler can make.
PRECISIONS = {
    "fp32": {},
    "bf16": dict(dtype="bfloat16"),
    "fp8": dict(weight_quant="fp8_e4m3", act_quant="fp8"),  # the sources' FP8 rollout
    "fp8_e5m2": dict(weight_quant="fp8_e5m2", act_quant="fp8_e5m2"),
    "int8": dict(weight_quant="int8", act_quant="int8"),
    "int4": dict(weight_quant="int4"),
    # int4 weights, FP8 activations, FP8 KV cache and a quantized LM head.
    "int4_all": dict(weight_quant="int4", act_quant="fp8", kv_cache_dtype="fp8",
                     quant_lm_head=True),
    # The same with e5m2 (2 mantissa bits) activations and KV cache: more mismatch.
    "int4_e5m2_all": dict(weight_quant="int4", act_quant="fp8_e5m2",
                          kv_cache_dtype="fp8_e5m2", quant_lm_head=True),
    # int4_all and int4_e5m2_all with 3-bit weights (-3..3 per channel, emulated).
    "int3_all": dict(weight_quant="int3", act_quant="fp8", kv_cache_dtype="fp8",
                     quant_lm_head=True),
    "int3_e5m2_all": dict(weight_quant="int3", act_quant="fp8_e5m2",
                          kv_cache_dtype="fp8_e5m2", quant_lm_head=True),
}


def get_config(arg=None):
  """The ConfigDict of one study cell (see module docstring)."""
  arg = common.parse_arg(arg, precision="fp8", lr=1e-4, temperature=1.0,
                         steps=200, seed=0, correction="none", tiers="123",
                         max_new=64, eval_every=25, quick=False)
  if arg.precision not in PRECISIONS:
    raise ValueError(f"unknown precision {arg.precision!r}; choose one of "
                     f"{sorted(PRECISIONS)}.")
  config = base.get_config()
  config.seed = arg.seed
  config.mipu.seed = arg.seed
  config.num_steps = arg.steps
  config.optim.learning_rate = arg.lr
  config.sampling.temperature = arg.temperature
  config.eval.temperature = arg.temperature
  config.sampling.max_new_tokens = arg.max_new
  config.data.train_tiers = tuple(f"tier{t}" for t in arg.tiers)
  config.loss.correction.preset = arg.correction
  for name, value in PRECISIONS[arg.precision].items():
    config.sampling[name] = value
  base.batch_run(config, eval_every=arg.eval_every)
  if arg.quick:
    base.quick(config)
  return config


# The study's grid (`experiments/mismatch_sweep.py`): name -> argument, in the
# order they run. The same setting with the fp32 sampler (no mismatch: the
# control) and with high-mismatch samplers: first the table's setting (the
# harder tiers 4-5 at lr 1e-3), then a lower rate, the sources' FP8 and
# weight-only int4 in that setting, then the easier tiers 1-3.
GRID = {
    "fp32_lr1e-3_tiers45": "precision=fp32,lr=1e-3,tiers=45",
    "int4_all_lr1e-3_tiers45": "precision=int4_all,lr=1e-3,tiers=45",
    "fp32_lr3e-4_tiers45": "precision=fp32,lr=3e-4,tiers=45",
    "int4_all_lr3e-4_tiers45": "precision=int4_all,lr=3e-4,tiers=45",
    "fp8_lr1e-3_tiers45": "precision=fp8,lr=1e-3,tiers=45",
    "int4_lr1e-3_tiers45": "precision=int4,lr=1e-3,tiers=45",
    "fp32_lr1e-3": "precision=fp32,lr=1e-3",
    "int4_all_lr1e-3": "precision=int4_all,lr=1e-3",
}

# The second study: a setting where the fp32 control is Stable in most seeds and
# the uncorrected baseline collapses in most, looked for between lr 3e-4 (nothing
# collapses) and 1e-3 (the fp32 control drifts too). Cells have the tables'
# budget (60 steps, evaluation every 20) and 3 seeds each, for the fp32, bf16,
# weight-only int4 and int4-everything samplers on tiers 4-5. Cheap samplers
# first (fp32 and weight-only int4 run at the same speed), the slow int4_all
# last.
STUDY2_LRS = ("7e-4", "5e-4")
STUDY2_PRECISIONS = ("fp32", "int4", "bf16", "int4_all")
STUDY2_SEEDS = (0, 1, 2)
STUDY2 = {
    f"{prec}_lr{lr}_tiers45_60s_s{seed}":
        f"precision={prec},lr={lr},tiers=45,steps=60,eval_every=20,seed={seed}"
    for prec in STUDY2_PRECISIONS for lr in STUDY2_LRS for seed in STUDY2_SEEDS
}
GRID.update(STUDY2)
# The same cells run on to 120 steps at lr 7e-4, where nothing collapsed by
# step 60: does the int4 baseline collapse later while fp32 stays Stable?
STUDY2_LONG = {
    f"{prec}_lr7e-4_tiers45_120s_s{seed}":
        f"precision={prec},lr=7e-4,tiers=45,steps=120,eval_every=20,seed={seed}"
    for prec in ("fp32", "int4_all", "int4", "bf16") for seed in STUDY2_SEEDS
}
GRID.update(STUDY2_LONG)
# Weight-only int4 at lr 1e-3 with the tables' budget: does it collapse in
# most seeds within 60 steps, as its 200-step cell did by step 50? (It runs at
# fp32's speed, so it would be a cheaper collapse setting.)
STUDY2_INT4_LR1E3 = {
    f"int4_lr1e-3_tiers45_60s_s{seed}":
        f"precision=int4,lr=1e-3,tiers=45,steps=60,eval_every=20,seed={seed}"
    for seed in STUDY2_SEEDS
}
GRID.update(STUDY2_INT4_LR1E3)
