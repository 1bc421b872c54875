r"""One row of the sources' tables on the small CPU task, under a high-mismatch sampler.

    python experiments/train.py --config configs/table.py:mipu --workdir /tmp/mipu
    python experiments/train.py --config configs/table.py:random_rollback,p=0.25,seed=1 \
        --workdir /tmp/rr1

The argument is `row[,option...]` with `row` one of `configs/rows.py:ROWS`
(default `baseline`) and options `seed=N`, `steps=N`, `prompts=N` (prompts per
step), `p=P` (random-rollback probability), `probe=N` (MIPU Step 2's probe
prompts, default 8), `precision=` / `lr=` (another setting of the mismatch
study, e.g. the earlier table's `precision=int4_all,lr=1e-3` for
`bench/loop.py`) and `quick` (a smoke budget for tests and Colab).
Every table at once, several seeds, with the results table and figures:

    python experiments/reproduce_tables.py --workdir results/small_cpu

Task: multi-operand addition (`mipu_jax.tasks.arithmetic`), trained on the
harder tiers 4-5 and evaluated on five held-out tiers standing in for MATH /
AIME / Olympiad / Minerva / AMC23. The setting is the second mismatch study's
(`results/mismatch_sweep/README.md`, `SETTING` below), where the fp32 control
is Stable and the uncorrected baseline collapses in most seeds: sampler μ with
int4 weights, FP8 activations, an FP8 KV cache and a quantized LM head; learner
π in fp32; lr 7e-4; 120 RL steps of 16 prompts x 8 responses, two optimizer
updates each; evaluation every 20 steps (32 problems x 4 samples per tier).
The first tables' setting is `lr=1e-3,steps=60` (results/small_cpu_lr1e-3).
The `control` row is the same run with an fp32 sampler (no mismatch).
Everything else is `configs/base.py` (docs/method.md defaults: GRPO, clip
0.2 / 0.28, token-mean, AdamW wd 0.01, clip 1, temperature 1). LR-decay
halves the rate every `T_decay` = round(1.8 x `SURGE_STEP`) steps, down to
0.1 x lr (docs/method.md §6). MIPU Step 2
probes 8 held-out prompts and rejects when `T̂_post` is more than 2 of its
standard errors below zero (`mipu.c_noise_multiple`).

Hardware: 2 CPU cores. Time per 120-step run (one CPU thread, a second run
beside it): about 5 minutes for any row, quantized or not, since the sampler
keeps its FP8 KV cache as float32 values on CPU (`kv_cache_storage`,
bench/loop.py); a collapsing run is slower (dynamic sampling redraws all-zero
groups). That was measured for the committed tables. The learner's recomputed
MLP came after them (same numbers): bench/loop.py's steady baseline step was
1.48-1.49 s before it and 1.24-1.34 s after, in separate runs.
`results/README.md` has the measured times and the results.
"""

from configs import base
from configs import common
from configs import mismatch
from configs import rows
from mipu_jax import schedules

# The second mismatch study's setting (results/mismatch_sweep/README.md): the
# highest-mismatch sampler, the harder tiers 4-5, learning rate 7e-4, 120
# steps. There the fp32 control is Stable in 2 of 3 seeds and never collapses,
# and the uncorrected baseline collapses in 2 of 3. (At lr 1e-3 and 60 steps,
# the first tables' setting, the control drifts too.)
PRECISION, LR, TIERS, STEPS = "int4_all", 7e-4, "45", 120
SETTING = f"precision={PRECISION},lr={LR:g},tiers={TIERS}"
# LR-decay follows the paper's rule, T_decay = 1.8 x the step at which the
# uncorrected run's mean response length surged (docs/method.md §6), with the
# surge step measured on this setting's baseline runs
# (`schedules.measured_surge_step`: the mean length, 19-22 tokens at step 1,
# doubles at step 2 / 3 / 2 in seeds 0-2 of results/small_cpu/runs/baseline_s*,
# median 2; checked by tests/test_schedules.py; the first tables' baselines at
# lr 1e-3 gave 2 in every seed). The `auto` detector cannot fire this early
# (its min_steps is 10), so the row uses the paper's fixed period.
SURGE_STEP = 2
BASELINE_RUNS = "results/small_cpu/runs/baseline_s{seed}"
# Rows that run LR-decay's schedule or match its rates (configs/rows.py), and
# the slow-decay row's period: 10x the surge step instead of 1.8x.
DECAY_ROWS = ("lr_decay", "control_lr_decay", "lr_decay_long", "baseline_lr_mean",
              "baseline_lr_floor")
LONG_PERIOD_FACTOR = 10


def get_config(arg=None):
  """The small-CPU-task ConfigDict of table row `arg` (see module docstring)."""
  arg = common.parse_arg(arg, row="baseline", seed=0, steps=STEPS, prompts=int,
                         p=float, probe=8, precision=PRECISION, lr=LR,
                         quick=False)
  config = mismatch.get_config(f"precision={arg.precision},lr={arg.lr:g},"
                               f"tiers={TIERS},seed={arg.seed},steps={arg.steps}")
  base.batch_run(config, eval_every=20)
  config.mipu.num_probe_prompts = arg.probe
  # Step 2 rejects a candidate when its post-update gap is 2 standard errors
  # below zero: at this scale the probe's noise is far above the source's c.
  config.mipu.c_noise_multiple = 2.0
  if arg.quick:
    base.quick(config)
  if arg.prompts:
    config.data.prompts_per_step = arg.prompts
  if arg.row in DECAY_ROWS:
    config.optim.length_surge.mode = "fixed"
    config.optim.length_surge.decay_period = (
        LONG_PERIOD_FACTOR * SURGE_STEP if arg.row == "lr_decay_long"
        else schedules.decay_period_from_surge(SURGE_STEP))
  return rows.apply(config, arg.row, p=arg.p)
