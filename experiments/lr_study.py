r"""The lr × sampler precision study, and the rows that isolate LR-decay: resumable.

    python -m experiments.lr_study --workdir results/lr_study            # train + report
    python -m experiments.lr_study --workdir results/lr_study --report_only
    python -m experiments.lr_study --workdir results/lr_study --isolate  # + the isolating rows

Cells: the tables' no-mismatch `control` (fp32 sampler) and uncorrected
`baseline` (int4_all sampler) at each lr of `--lrs`, ten seeds each, every
other setting `studies/configs/table.py`'s (tiers 4-5, 120 steps, evaluation every
20 steps of μ and, with `eval.pi`, of π at full precision). The tables' own
earlier tables' lr (`--tables_lr`, 7e-4) is not rerun: its runs are
`results/small_cpu/runs/{control,baseline}_s*` (`--tables_workdir`), read back. Runs go to
`WORKDIR/runs/<row>_lr<lr>_s<seed>`; the report (`studies.reproduce.lr_study`)
is `study.md`, `summary.json` and `final_vs_lr.png`.

`--isolate` also trains the tables' rows that isolate LR-decay
(`reproduce.ISOLATE_ROWS`: LR-decay on the fp32 control, LR-decay with a 10x
period, the baseline at LR-decay's mean and floor rates) into
`--tables_workdir/runs`; `experiments/reproduce_tables.py --report_only`
then tabulates them with their claims.

Seeds are the outer loop, so every cell gains a seed before any gains two.
Runs train in `--workers` processes, one CPU thread each (about 5-6 minutes
per 120-step run with a second beside it on 2 cores; π's evaluation adds
about a tenth). Rerunning resumes: finished runs are read back, unfinished
ones continue from their newest checkpoint.
"""

import os

from absl import app
from absl import flags
from absl import logging

from mipu_jax import config as config_lib
from mipu_jax import harness
from studies import reproduce
from studies.configs import table
from studies.reproduce import lr_study

_WORKDIR = flags.DEFINE_string("workdir", "results/lr_study", "Output directory.")
_TABLES = flags.DEFINE_string("tables_workdir", "results/small_cpu",
                              "The tables' directory: its lr's cells and the isolating rows.")
_LRS = flags.DEFINE_list("lrs", ["2e-4", "3e-4", "5e-4"], "Learning rates to train.")
_SEEDS = flags.DEFINE_list("seeds", [str(i) for i in range(10)], "Seeds (outer loop).")
_WORKERS = flags.DEFINE_integer("workers", 2, "Runs trained at once.")
_TABLES_LR = flags.DEFINE_float("tables_lr", 7e-4, "The lr of --tables_workdir's runs.")
_ISOLATE = flags.DEFINE_bool("isolate", False, "Also train the isolating rows of the tables.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Train nothing: report what finished.")
_QUICK = flags.DEFINE_bool("quick", False, "Smoke budget (tests).")


def _config(row, seed, lr=None):
  arg = f"{row},seed={seed}" + (f",lr={lr}" if lr is not None else "") + (
      ",quick" if _QUICK.value else "")
  return config_lib.from_config_dict(table.get_config(arg))


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  workdir, tables = _WORKDIR.value, _TABLES.value
  seeds = [int(s) for s in _SEEDS.value]
  lrs = [float(x) for x in _LRS.value]
  jobs = []
  for seed in seeds:
    for lr in lrs:
      configs = {row: _config(row, seed, lr) for row in lr_study.ROWS}
      reproduce.check_like_with_like(configs)
      jobs += [harness.Job(row, seed, cfg, os.path.join(
          workdir, "runs", lr_study.run_name(row, lr, seed))) for row, cfg in configs.items()]
    if _ISOLATE.value:
      configs = {row: _config(row, seed, _TABLES_LR.value) for row in reproduce.ISOLATE_ROWS}
      reproduce.check_like_with_like(configs)
      jobs += [harness.Job(row, seed, cfg, os.path.join(tables, "runs", f"{row}_s{seed}"))
               for row, cfg in configs.items() if row not in ("control", "baseline", "lr_decay")]
  os.makedirs(workdir, exist_ok=True)
  if not _REPORT_ONLY.value:
    harness.train_in_workers(jobs, workers=_WORKERS.value,
                               cache=os.path.join(workdir, ".jax_cache"))

  # The report: every cell's finished runs, the earlier tables' lr (--tables_lr) from theirs.
  by_cell, sources = {}, {}
  cells = [(lr, workdir, lambda row, lr, s: lr_study.run_name(row, lr, s)) for lr in lrs]
  cells.append((_TABLES_LR.value, tables, lambda row, lr, s: f"{row}_s{s}"))
  for lr, root, name in cells:
    for row, precision in lr_study.PRECISION_OF_ROW.items():
      found = []
      for seed in seeds:
        cfg = _config(row, seed, lr)
        s = harness.run_one(cfg, row, seed, os.path.join(root, "runs", name(row, lr, seed)),
                              log=lambda _: None, train=False)
        if s is not None:
          found.append(s)
      by_cell[(precision, lr)] = found
      sources[(precision, lr)] = os.path.join(root, "runs")
  steps = _config("baseline", 0).num_steps
  out = lr_study.report(by_cell, sources, workdir, steps=steps)
  print(out["markdown"])
  print("\n".join(f"{k}: {v}" for k, v in out["files"].items()))


if __name__ == "__main__":
  app.run(main)
