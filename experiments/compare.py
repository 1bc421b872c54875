r"""The main job: the remedies for mismatch side by side on the small CPU task.

    python -m experiments.compare --workdir /tmp/mipu_compare
    python -m experiments.compare --workdir /tmp/mipu_compare --quick   # smoke budget

Four runs of `studies/configs/table.py` under its high-mismatch sampler (int4 weights,
FP8 activations, FP8 KV cache, quantized LM head; tiers 4-5, lr 2e-4, 120
steps: the tables' setting, the lr the lr x precision study found best for the
fp32 control): the
no-mismatch control (the same run with an fp32 sampler), the uncorrected
baseline, token TIS, and MIPU (Step 1 + Step 2); then one table (`table.md`)
and the overlaid curves (`curves_compare.png`: reward, eval, `k3_kl`,
response length, learning rate, rollback rate). The rows differ only in what
they compare (`studies.reproduce.check_like_with_like`). The job ends with
the verdict lines of the sources' claims about its rows (MIPU > baseline,
MIPU > TIS; `mipu_jax/harness/stats.py`: paired by seed, exact sign-flip
test, 0.05). One seed (the default, about 9 minutes on 2 idle cores) can only
say "undecidable"; `--seeds 0,1,2,3,4` is the least that can decide (smallest
one-sided p 1/32), at about five times the time.

The runs train in `--workers` processes at once, each on one CPU thread (on a
small model that is faster than one process using every core), with one
progress bar over all of them; every message a run logs (a health warning, a
logging backend's failure) and a worker's error start with its name, e.g.
`[baseline seed 0] step 45: mismatch health: ...` (`harness.run_label`).
Then the table is made from the finished runs.
Re-running resumes: finished runs are read back, unfinished ones continue
from their newest checkpoint.
"""

import os
import time

from absl import app
from absl import flags
from absl import logging

from mipu_jax import config as config_lib
from mipu_jax import harness
from studies import reproduce
from studies.configs import table

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
_STEPS = flags.DEFINE_integer("steps", None, "RL steps per run (default: studies/configs/table.py's).")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds.")
_QUICK = flags.DEFINE_bool("quick", False, "Smoke budget: 2 steps, tiny batches.")
_WORKERS = flags.DEFINE_integer(
    "workers", 2, "Runs trained at once, one process and one CPU thread each "
    "(1: one after the other in this process).")
_SETTING = flags.DEFINE_string(
    "setting", "", "More studies/configs/table.py options, e.g. 'lr=7e-4' (the earlier tables' "
    "setting; the committed runs of studies/configs/table.py COMMITTED's lrs place yours).")
_CACHE = flags.DEFINE_string("jax_cache", None,
                             "Persistent compilation cache (default WORKDIR/.jax_cache; '' off).")
flags.mark_flag_as_required("workdir")


def make_config(row, seed, p, *, quick, steps, setting=""):
  arg = f"{row},seed={seed}," + ("quick" if quick else
                                 (f"steps={steps}" if steps else ""))
  arg = arg.rstrip(",") + (f",p={p}" if p is not None else "")
  return table.get_config(arg + (f",{setting}" if setting else ""))


def train_in_workers(rows, seeds, workdir, *, workers, quick, steps, cache, setting=""):
  """Trains every (row, seed) in `workers` processes, with one progress bar
  (`harness.train_in_workers`), after checking the rows like with like."""
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  jobs = []
  for seed in seeds:
    configs = {row: config_lib.from_config_dict(
        make_config(row, seed, None, quick=quick, steps=steps, setting=setting)) for row in rows}
    reproduce.check_like_with_like(configs)
    jobs += [harness.Job(row, seed, configs[row],
                           os.path.join(workdir, "runs", f"{row}_s{seed}")) for row in rows]
  harness.train_in_workers(jobs, workers=workers,
                             cache=os.path.join(workdir, ".jax_cache") if cache is None else cache)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO.
  seeds = [int(s) for s in _SEEDS.value]
  rows = list(reproduce.COMPARE_ROWS)
  start = time.perf_counter()
  if _WORKERS.value > 1:
    train_in_workers(rows, seeds, _WORKDIR.value, workers=_WORKERS.value,
                     quick=_QUICK.value, steps=_STEPS.value, cache=_CACHE.value,
                     setting=_SETTING.value)
  harness.enable_compilation_cache(_CACHE.value, _WORKDIR.value)

  def config(row, seed, p):
    c = make_config(row, seed, p, quick=_QUICK.value, steps=_STEPS.value,
                    setting=_SETTING.value)
    c.logging.progress_bar = _WORKERS.value <= 1  # a bar per run when one at a time
    return c

  # Trains whatever is left (everything with --workers=1), checks the rows
  # are like with like, and writes the table and the curves.
  result = reproduce.run_table(config, rows, seeds, _WORKDIR.value,
                               tables=reproduce.COMPARE_TABLES)
  print(result.markdown)
  print("\n".join(f"{k}: {v}" for k, v in result.files.items()))
  print(f"wall time: {time.perf_counter() - start:.0f} s")
  # The verdicts last: the sources' claims about these rows, paired by seed
  # (mipu_jax/harness/stats.py, fixed before the runs).
  print("\nVerdicts (final eval Avg., paired by seed, threshold 0.05):")
  print(reproduce.claims_markdown(result.runs) or "- no claim has both its rows")
  lr = config("control", 0, None).optim.learning_rate
  committed = table.COMMITTED.get(lr)
  print("\n" + (reproduce.committed_placement(
      result.runs, lambda r, s, p: config_lib.from_config_dict(config(r, s, p)),
      os.path.join(_ROOT, committed)) if committed else
      f"Not placed: no committed tables at lr {lr:g} (studies/configs/table.py COMMITTED)."))


if __name__ == "__main__":
  app.run(main)
