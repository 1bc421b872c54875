r"""Reproduces the sources' tables on the small CPU task: every row x ten seeds.

    python -m experiments.reproduce_tables --workdir results/small_cpu_lr2e-4        # 10 seeds
    python -m experiments.reproduce_tables --workdir results/small_cpu_lr2e-4 --seeds 0,2,4,6,8 &
    python -m experiments.reproduce_tables --workdir results/small_cpu_lr2e-4 --seeds 1,3,5,7,9 &
    python -m experiments.reproduce_tables --workdir results/small_cpu_lr2e-4 --report_only
    python -m experiments.reproduce_tables --workdir /tmp/t --quick                # smoke budget
    python -m experiments.reproduce_tables --workdir results/small_cpu \
        --setting lr=7e-4 --report_only         # the earlier tables' setting
    python -m experiments.reproduce_tables --workdir results/small_cpu_lr1e-3 \
        --setting lr=1e-3,steps=60 --seeds 0,1,2,3,4 --report_only  # the first tables' setting
    python -m experiments.reproduce_tables --workdir results/small_cpu_lr2e-4_ulp1 \
        --setting ulp=1 --rows control,baseline,tis,mipu --seeds 0,1,2,3,4 \
        --perturbation_of results/small_cpu_lr2e-4    # the float sums perturbed

Rows are `studies/configs/table.py:<row>` (an int4 / FP8 sampler, tiers 4-5, lr
2e-4, 120 steps: the lr the lr x precision study chose); the logic — runs, like
with like, Stable criterion, tables, statistics, figures — lives in
`studies.reproduce`. Writes `table.md`, `summary.json`, `curves_*.png`,
`gap_post.png` and one directory per run under `runs/`; re-running resumes
(finished runs are read back, unfinished ones continue from their
checkpoint), and `--report_only` only tabulates the runs that finished. Two
processes on disjoint seeds (one per core, as above) share the workdir and its
compilation cache; `--report_only` then makes the table of both.
`results/README.md` has the measured wall time and how the committed tables
were run.
"""



import os

from absl import app
from absl import flags
from absl import logging

from mipu_jax import harness
from studies import reproduce
from studies.configs import rows as rows_lib
from studies.configs import table

_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
_ROWS = flags.DEFINE_list("rows", list(rows_lib.ROWS), "Table rows to run.")
_SEEDS = flags.DEFINE_list("seeds", [str(i) for i in range(10)],
                           "Seeds (outer loop; the statistics are built for 10).")
_STEPS = flags.DEFINE_integer("steps", None, "RL steps per run (default: the config's).")
_PROMPTS = flags.DEFINE_integer("prompts", None, "Prompts per step (default: the config's).")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False,
                                 "Train nothing: tabulate the runs that finished.")
_QUICK = flags.DEFINE_bool("quick", False, "Smoke budget: 2 steps, 1 seed, tiny batches.")
_INIT_FROM = flags.DEFINE_string(
    "init_from", None, "Base policy checkpoint directory (default: the config's).")
_SETTING = flags.DEFINE_string(
    "setting", "", "More studies/configs/table.py options, e.g. 'lr=7e-4' (the earlier tables' "
    "setting, results/small_cpu).")
_PERTURBATION_OF = flags.DEFINE_string(
    "perturbation_of", None, "With --setting ulp=N: the workdir of the same rows unperturbed; "
    "writes perturbation.md (does each row's distribution, and each claim's verdict, "
    "survive the perturbed float sums?).")
_CACHE = flags.DEFINE_string("jax_cache", None,
                             "Persistent compilation cache (default WORKDIR/.jax_cache; '' off).")
flags.mark_flag_as_required("workdir")


def make_config(row, seed, p):
  parts = [row, f"seed={seed}"]
  if _QUICK.value:
    parts.append("quick")
  if _STEPS.value:
    parts.append(f"steps={_STEPS.value}")
  if _PROMPTS.value:
    parts.append(f"prompts={_PROMPTS.value}")
  if p is not None:
    parts.append(f"p={p}")
  if _SETTING.value:
    parts.append(_SETTING.value)
  config = table.get_config(",".join(parts))
  if _INIT_FROM.value is not None:
    config.model.init_from = _INIT_FROM.value
  return config


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO.
  harness.enable_compilation_cache(_CACHE.value, _WORKDIR.value)
  seeds = [int(s) for s in _SEEDS.value][:1 if _QUICK.value else None]
  result = reproduce.run_table(make_config, _ROWS.value, seeds, _WORKDIR.value,
                               train=not _REPORT_ONLY.value)
  print(result.markdown)
  print("\n".join(f"{k}: {v}" for k, v in result.files.items()))
  if _PERTURBATION_OF.value:
    md = reproduce.perturbation_report(make_config, _ROWS.value, seeds, _WORKDIR.value,
                                       _PERTURBATION_OF.value)
    path = os.path.join(_WORKDIR.value, "perturbation.md")
    with open(path, "w") as f:
      f.write(f"# The same runs under perturbed float sums ({_SETTING.value}) against "
              f"{_PERTURBATION_OF.value}\n\n{md}\n")
    print(md + f"\nperturbation: {path}")


if __name__ == "__main__":
  app.run(main)
