r"""The MoE study (docs/method.md §7a): where mismatch can break RL, and which answer holds.

    python -m experiments.moe_study --workdir results/moe_study --pilot    # the pilot grid
    python -m experiments.moe_study --workdir results/moe_study --report_only --pilot

The pilot looks for the setting the study runs in: the tiny MoE base policy
(`studies/configs/moe.py`), responses up to 256 tokens, a deployable sampler
(`--precisions`, default FP8) uncorrected against the fp32 control, at each
`--lrs`, seeds `--seeds`, for `--steps` steps. The rules that read it are fixed
in `studies/reproduce/moe.py` before the runs (collapse and degradation on μ
and on π, and which setting the study then takes). Runs go to
`WORKDIR/runs/<row>_<precision>_lr<lr>_s<seed>`; rerunning resumes each run
from its newest checkpoint (every `--eval_every` steps) and reads finished
runs back. `--rows baseline` trains (and reports) only the baselines, to add
seeds to a cell whose control has run.
"""

import os

from absl import app
from absl import flags
from absl import logging

from mipu_jax import config as config_lib
from mipu_jax import harness
from studies.configs import moe as moe_config
from studies.reproduce import moe as moe_report

_WORKDIR = flags.DEFINE_string("workdir", "results/moe_study", "Output directory.")
_PILOT = flags.DEFINE_bool("pilot", True, "Run the pilot grid (control vs uncorrected).")
_LRS = flags.DEFINE_list("lrs", ["5e-4"], "Learning rates of the pilot.")
_PRECISIONS = flags.DEFINE_list("precisions", ["fp8"], "Deployable samplers of the pilot.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds (outer loop).")
_STEPS = flags.DEFINE_integer("steps", 600, "RL steps per run.")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 25, "Evaluation and checkpoint period.")
_ROWS = flags.DEFINE_list("rows", ["control", "baseline"],
                          "Which of the pilot's rows to train and report (e.g. only the "
                          "baseline, to add seeds to a cell whose control has run).")
_WORKERS = flags.DEFINE_integer("workers", 2, "Runs trained at once.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Train nothing: report what is there.")
_QUICK = flags.DEFINE_bool("quick", False, "Smoke budget (tests).")


def config_dict(row: str, precision: str, lr: float, seed: int, steps: int, eval_every: int,
                quick: bool = False):
  return moe_config.get_config(
      f"row={row},precision={precision},lr={lr:g},seed={seed},steps={steps},"
      f"eval_every={eval_every}" + (",quick" if quick else ""))


def pilot_jobs(workdir: str) -> list:
  """The pilot's jobs: per lr and seed the fp32 control and each precision's
  uncorrected baseline, checked like with like (only the sampler differs)."""
  jobs = []
  for seed in (int(s) for s in _SEEDS.value):
    for lr in (float(x) for x in _LRS.value):
      make = lambda row, p: config_lib.from_config_dict(config_dict(
          row, p, lr, seed, _STEPS.value, _EVAL_EVERY.value, _QUICK.value))
      control = make("control", "fp32")
      cells = {"control": control}
      for p in _PRECISIONS.value:
        cells[f"baseline_{p}"] = make("baseline", p)
      for p in _PRECISIONS.value:
        moe_report.check_pilot_pair(control, cells[f"baseline_{p}"])
      run_dir = lambda row, p: os.path.join(workdir, "runs",
                                            moe_report.run_name(row, p, lr, seed))
      if "control" in _ROWS.value:
        jobs.append(harness.Job("control", seed, control, run_dir("control", "fp32")))
      for p in _PRECISIONS.value if "baseline" in _ROWS.value else ():
        jobs.append(harness.Job(f"baseline_{p}", seed, cells[f"baseline_{p}"],
                                run_dir("baseline", p)))
  return jobs


def main(argv):
  del argv
  unknown = set(_ROWS.value) - {"control", "baseline"}
  if unknown or not _ROWS.value:
    raise app.UsageError(f"--rows takes control and/or baseline, got {_ROWS.value}.")
  logging.set_verbosity(logging.WARNING)
  workdir = _WORKDIR.value
  os.makedirs(workdir, exist_ok=True)
  jobs = pilot_jobs(workdir)
  if not _REPORT_ONLY.value:
    harness.train_in_workers(jobs, workers=_WORKERS.value,
                             cache=os.path.join(workdir, ".jax_cache"))
  out = moe_report.pilot_report([j.workdir for j in jobs], workdir, _STEPS.value)
  print(out)


if __name__ == "__main__":
  app.run(main)
