r"""The long-horizon study: 600-step runs of the fp32 control, the uncorrected
int4_all baseline and a higher-mismatch sampler, ten seeds each; resumable.

    python -m experiments.horizon --workdir results/horizon --probe        # choose the sampler
    python -m experiments.horizon --workdir results/horizon               # train + report
    python -m experiments.horizon --workdir results/horizon --report_only

The lr is `horizon.choose_lr` over the lr study's fp32 cells at 1e-4 and 2e-4
(`--lr_study`), unless `--lr` is given. `--probe` trains 3-step runs of
each `horizon.STRONG_CANDIDATES` sampler (seeds 0-2, no evaluation) and prints
their step-1 `rollout_corr/k3_kl` and the choice (`horizon.choose_strong`).
Every other setting is `studies/configs/table.py`'s (tiers 4-5, evaluation of μ and π
every 20 steps), checked like with like. Runs go to
`WORKDIR/runs/<setting>_lr<lr>_s<seed>`; the report (statistics fixed in
`studies/reproduce/horizon.py` before the runs) is `horizon.md`,
`horizon.json` and `curves_horizon.png`. Seeds are the outer loop; rerunning
resumes finished runs by reading them back and unfinished ones from their
newest checkpoint (every 20 steps).
"""

import os

from absl import app
from absl import flags
from absl import logging

from mipu_jax import config as config_lib
from mipu_jax import harness
from mipu_jax import rl
from studies import reproduce
from studies.configs import table
from studies.reproduce import horizon
from studies.reproduce import lr_study

_WORKDIR = flags.DEFINE_string("workdir", "results/horizon", "Output directory.")
_LR_STUDY = flags.DEFINE_string("lr_study", "results/lr_study", "The lr study's directory.")
_LR = flags.DEFINE_float("lr", None, "Learning rate; default: horizon.choose_lr.")
_SETTINGS = flags.DEFINE_list("settings", list(horizon.SETTINGS), "Sampler precisions.")
_SEEDS = flags.DEFINE_list("seeds", [str(i) for i in range(10)], "Seeds (outer loop).")
_STEPS = flags.DEFINE_integer("steps", horizon.STEPS, "RL steps per run.")
_WORKERS = flags.DEFINE_integer("workers", 2, "Runs trained at once.")
_PROBE = flags.DEFINE_bool("probe", False, "Measure the candidates' step-1 k3_kl only.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False, "Train nothing: report what finished.")
_QUICK = flags.DEFINE_bool("quick", False, "Smoke budget (tests).")


def _config_dict(precision, seed, lr, steps):
  row = "control" if precision == horizon.CONTROL else "baseline"
  arg = f"{row},seed={seed},lr={lr:g},steps={steps}" + (
      "" if row == "control" else f",precision={precision}") + (",quick" if _QUICK.value else "")
  return table.get_config(arg)


def _config(precision, seed, lr, steps):
  return config_lib.from_config_dict(_config_dict(precision, seed, lr, steps))


def _lr() -> float:
  if _LR.value is not None:
    return _LR.value
  finals = {}
  for lr in horizon.LRS:
    for seed in range(10):
      s = harness.run_one(_config(horizon.CONTROL, seed, lr, 120), "control", seed,
                            os.path.join(_LR_STUDY.value, "runs",
                                         lr_study.run_name("control", lr, seed)),
                            log=lambda _: None, train=False)
      if s is not None:
        finals.setdefault(lr, []).append(s.final["avg"])
  short = {lr: len(finals.get(lr, [])) for lr in horizon.LRS if len(finals.get(lr, [])) < 10}
  if short:
    raise SystemExit(f"the lr study's fp32 cells are unfinished (finished seeds: {short}); "
                     "finish them (experiments/lr_study.py) or pass --lr.")
  return horizon.choose_lr(finals)


def _probe(workdir):
  jobs, lr = [], _lr()
  for seed in (0, 1, 2):
    for p in horizon.STRONG_CANDIDATES:
      cfg = _config_dict(p, seed, lr, 3)
      # The step-1 k3 is what the probe reads; the final evaluation is kept small.
      cfg.eval.every, cfg.eval.pi, cfg.eval.n_per_tier = 10**6, False, 4
      jobs.append(harness.Job(p, seed, config_lib.from_config_dict(cfg),
                                os.path.join(workdir, "probe", f"{p}_s{seed}")))
  harness.train_in_workers(jobs, workers=_WORKERS.value,
                             cache=os.path.join(workdir, ".jax_cache"))
  k3 = {}
  for j in jobs:
    rows = rl.read_jsonl(os.path.join(j.workdir, "metrics.jsonl"))
    k3.setdefault(j.row, []).append(next(r["rollout_corr/k3_kl"] for r in rows
                                         if r.get("step") == 1))
  for p, v in k3.items():
    reward = [next(r["rollout/reward_mean"] for r in rl.read_jsonl(
        os.path.join(j.workdir, "metrics.jsonl")) if r.get("step") == 1)
              for j in jobs if j.row == p]
    print(f"{p}: step-1 k3_kl {', '.join(f'{x:.3e}' for x in v)}; step-1 reward "
          f"{', '.join(f'{x:.3f}' for x in reward)}")
  best, ratio = horizon.choose_strong(k3)
  print(f"chosen: {best}, {ratio:.2f}x int4_all's step-1 k3_kl "
        f"(target {horizon.STRONG_TARGET:g}x)")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  workdir = _WORKDIR.value
  os.makedirs(workdir, exist_ok=True)
  if _PROBE.value:
    _probe(workdir)
    return
  lr, seeds, steps = _lr(), [int(s) for s in _SEEDS.value], _STEPS.value
  print(f"lr {lr:g} (horizon.choose_lr over {horizon.LRS} unless --lr)")
  name = lambda p, s: os.path.join(workdir, "runs", f"{p}_lr{lr:g}_s{s}")
  jobs = []
  for seed in seeds:
    configs = {p: _config(p, seed, lr, steps) for p in _SETTINGS.value}
    for p in configs:  # each sampler against the control: only the precision differs
      reproduce.check_like_with_like({"control": configs[horizon.CONTROL], p: configs[p]})
    jobs += [harness.Job(p, seed, cfg, name(p, seed)) for p, cfg in configs.items()]
  if not _REPORT_ONLY.value:
    harness.train_in_workers(jobs, workers=_WORKERS.value,
                               cache=os.path.join(workdir, ".jax_cache"))
  runs = []
  for j in jobs:
    if harness.run_one(j.cfg, j.row, j.seed, j.workdir, log=lambda _: None,
                         train=False) is not None:  # finished, and of this config
      runs.append(horizon.read_run(j.row, j.seed, j.workdir, steps=steps))
  out = horizon.report(runs, _SETTINGS.value, workdir)
  print(out["markdown"])
  # Like with like with the 120-step studies: a long run's first 120 steps should
  # repeat the lr study's run of the same sampler, seed and lr bitwise.
  for r in runs:
    short = os.path.join(_LR_STUDY.value, "runs", lr_study.run_name(
        {horizon.CONTROL: "control", horizon.BASELINE: "baseline"}.get(r.name, ""), lr, r.seed))
    if r.name in (horizon.CONTROL, horizon.BASELINE) and os.path.exists(
        os.path.join(short, "summary.json")):
      d = horizon.prefix_difference(rl.read_jsonl(os.path.join(r.workdir, "metrics.jsonl")),
                                    rl.read_jsonl(os.path.join(short, "metrics.jsonl")))
      print(f"{r.name} seed {r.seed}: first 120 steps against {short}: "
            + ("identical" if d == 0 else f"differ by up to {d:.3g}"))
  print("\n".join(f"{k}: {v}" for k, v in out["files"].items()))


if __name__ == "__main__":
  app.run(main)
