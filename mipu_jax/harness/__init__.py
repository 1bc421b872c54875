"""Many runs of the RL loop, and what a study says about them over seeds.

    jobs = [harness.Job("mine", seed, cfg_of(seed), f"runs/mine_s{seed}") for seed in range(10)]
    harness.train_in_workers(jobs, workers=2)
    runs = [harness.run_one(j.cfg, j.row, j.seed, j.workdir, print) for j in jobs]  # read back
    harness.stats.t_ci([r.final["avg"] for r in runs])

`train_in_workers` trains runs in worker processes (one CPU thread each, one
progress bar); `run_one` trains or reads back one run and reduces it to a
`RunSummary` (final and peak evaluation, the Stable flag, the collapse step);
`stats` has the intervals over seeds and the paired tests of claims. This
repository's own studies (`studies/`) are built on these.
"""

from mipu_jax.harness import stats
from mipu_jax.harness.runs import enable_compilation_cache
from mipu_jax.harness.runs import run_label
from mipu_jax.harness.runs import run_one
from mipu_jax.harness.summary import COLLAPSE_DROP
from mipu_jax.harness.summary import collapse_step
from mipu_jax.harness.summary import RunSummary
from mipu_jax.harness.summary import STABLE_SES
from mipu_jax.harness.summary import summarize
from mipu_jax.harness.workers import Job
from mipu_jax.harness.workers import train_in_workers

__all__ = [
    "COLLAPSE_DROP", "Job", "RunSummary", "STABLE_SES", "collapse_step",
    "enable_compilation_cache", "run_label", "run_one", "stats", "summarize",
    "train_in_workers",
]
