r"""The main job: the remedies for mismatch side by side on the small CPU task.

    python experiments/compare.py --workdir /tmp/mipu_compare
    python experiments/compare.py --workdir /tmp/mipu_compare --quick   # ~1 min smoke

Four runs of `configs/table.py` under its high-mismatch sampler: the
no-mismatch control (the same run with an fp32 sampler), the uncorrected
baseline, token TIS, and MIPU (Step 1 + Step 2); then one table
(`table.md`) and the overlaid curves (`curves_compare.png`: reward, eval,
`k3_kl`, response length, learning rate, rollback rate). The rows differ only
in what they compare (`mipu_jax.reproduce.check_like_with_like`). Each run
shows a progress bar; re-running resumes (finished runs are read back).
"""

from absl import app
from absl import flags
from absl import logging

from configs import table
from mipu_jax import reproduce

_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
_STEPS = flags.DEFINE_integer("steps", 60, "RL steps per run.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds.")
_QUICK = flags.DEFINE_bool("quick", False, "Smoke budget: 2 steps, tiny batches.")
_CACHE = flags.DEFINE_string("jax_cache", None,
                             "Persistent compilation cache (default WORKDIR/.jax_cache; '' off).")
flags.mark_flag_as_required("workdir")


def make_config(row, seed, p):
  arg = f"{row},seed={seed}," + ("quick" if _QUICK.value else f"steps={_STEPS.value}")
  config = table.get_config(arg + (f",p={p}" if p is not None else ""))
  config.logging.progress_bar = True
  return config


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO.
  reproduce.enable_compilation_cache(_CACHE.value, _WORKDIR.value)
  result = reproduce.run_table(make_config, reproduce.COMPARE_ROWS,
                               [int(s) for s in _SEEDS.value], _WORKDIR.value,
                               tables=reproduce.COMPARE_TABLES)
  print(result.markdown)
  print("\n".join(f"{k}: {v}" for k, v in result.files.items()))


if __name__ == "__main__":
  app.run(main)
