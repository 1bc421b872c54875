"""Training many runs at once: worker processes, one CPU thread each, one bar.

On the small CPU task one process per core, each on one XLA thread, trains
faster than one process using every core. `train_in_workers` trains a list
of runs (`Job`) in `workers` such processes with one progress bar over all
of them; a run's messages and its error name it (`runs.run_label`). Runs
resume: a finished one is read back, an unfinished one continues from its
newest checkpoint (`runs.run_one`).
"""

import concurrent.futures
import dataclasses
import gzip
import logging
import logging.handlers
import multiprocessing
import os
import signal
import threading
import time
from typing import Optional, Sequence

import tqdm

from mipu_jax import config as config_lib
from mipu_jax.harness import runs
from mipu_jax.rl import console

ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


@dataclasses.dataclass(frozen=True)
class Job:
  """One run: its row label and seed (for messages), config and directory."""
  row: str
  seed: int
  cfg: config_lib.TrainConfig
  workdir: str


_STOP = None  # the job's stop event, in a worker (`_init_worker`)


def _init_worker(stop=None, records=None):
  """A worker's XLA on one CPU thread (read when its backend starts); `stop`:
  the job's event, set when it is stopped (no new run starts after it);
  `records`: the queue its warnings go to (printed above the parent's bar)."""
  global _STOP
  _STOP = stop
  if records is not None:
    console.queue_records(records)
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + ONE_THREAD).strip()
  logging.getLogger("absl").setLevel(logging.WARNING)
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.set_verbosity(absl_logging.WARNING)  # orbax logs every save at INFO


def _train(job: Job, cache: Optional[str]):
  """One run in a worker process; its error names the run."""
  if _STOP is not None and _STOP.is_set():  # queued before the job was stopped
    raise RuntimeError(f"[{job.row} seed {job.seed}] not started: the job was stopped.")
  try:
    runs.enable_compilation_cache(cache, os.path.dirname(os.path.dirname(job.workdir)))
    done = runs.run_one(job.cfg, job.row, job.seed, job.workdir, log=lambda _: None)
  except Exception as e:  # the main process re-raises it: say whose it is
    raise RuntimeError(f"[{job.row} seed {job.seed}] {type(e).__name__}: {e}") from e
  if done is None:  # stopped on a preemption notice: the job stops, the rerun resumes
    raise RuntimeError(f"[{job.row} seed {job.seed}] stopped on a preemption notice "
                       "(checkpointed); rerun the same command to resume.")
  return job.row, job.seed


def _ok(future) -> bool:
  return future.done() and not future.cancelled() and future.exception() is None


def steps_done(workdir: str) -> int:
  """RL steps a run has logged (its step-0 evaluation row is not a step)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if os.path.exists(path):
    with open(path, "rb") as f:
      return max(sum(1 for _ in f) - 1, 0)
  if os.path.exists(path + ".gz"):  # a finished, committed run
    with gzip.open(path + ".gz", "rb") as f:
      return max(sum(1 for _ in f) - 1, 0)
  return 0


def train_in_workers(jobs: Sequence[Job], *, workers: int, cache: Optional[str] = None,
                     desc: str = "") -> None:
  """Trains every job in `workers` processes (spawned: a fresh JAX each).

  Args:
    jobs: the runs, trained in this order as workers free up.
    workers: processes at once.
    cache: JAX's persistent compilation cache (None: `<runs dir>/../.jax_cache`
      of each job, i.e. the study's; "" for none).
    desc: the progress bar's label.

  Raises:
    RuntimeError: a run's error, naming it (after the other runs finished).
  """
  with console.through_bar() as printer:
    context = multiprocessing.get_context("spawn")
    records = context.Queue()
    listener = logging.handlers.QueueListener(records, printer)
    listener.start()
    try:
      _train_in_workers(jobs, workers, cache, desc, context, records)
    finally:
      listener.stop()


def _train_in_workers(jobs, workers, cache, desc, context, records) -> None:
  total = sum(j.cfg.num_steps for j in jobs)
  bar = tqdm.tqdm(total=total, desc=desc or f"{len(jobs)} runs", unit="step")
  # A SIGTERM to this process (a scheduler's preemption notice, `kill`) is
  # passed on to the workers, whose runs stop at their next step boundary
  # with a checkpoint (rl.guard); no new run starts. Without this the workers
  # would outlive the job and go on training.
  stop = []
  stop_event = context.Event()
  previous = None
  if threading.current_thread() is threading.main_thread():
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    if previous is None:  # a handler not set from Python: restore the default
      previous = signal.SIG_DFL
  try:
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context,
                                                initializer=_init_worker,
                                                initargs=(stop_event, records)) as pool:
      futures = [pool.submit(_train, j, cache) for j in jobs]
      while True:
        done = sum(min(steps_done(j.workdir), j.cfg.num_steps) for j in jobs)
        bar.update(done - bar.n)
        finished = [f for f in futures if f.done()]
        bar.set_postfix(finished=f"{len(finished)}/{len(jobs)}")
        if stop:
          stop_event.set()  # runs already queued to a worker do not start
          for f in futures:
            f.cancel()
          # SIGTERM: a running run checkpoints and stops at its next step
          # boundary (rl.guard); an idle worker just exits (the pool then
          # reports the others' futures as broken: they stop all the same).
          for process in list(getattr(pool, "_processes", {}).values()):
            if process.is_alive():
              process.terminate()
          concurrent.futures.wait(futures)
          bar.close()
          raise RuntimeError(
              f"stopped by SIGTERM: {sum(1 for f in futures if _ok(f))} of {len(jobs)} runs "
              "finished, the others stopped at a step boundary with a checkpoint or did "
              "not start; rerun the same command to resume.")
        failed = [f for f in finished if not f.cancelled() and f.exception() is not None]
        if failed:  # no new run starts; those running finish or stop on their own
          stop_event.set()
          for f in futures:
            f.cancel()
          bar.close()
          if previous is not None:  # a SIGTERM while they finish ends the job at once
            signal.signal(signal.SIGTERM, previous)
            previous = None
          raise failed[0].exception()
        if len(finished) == len(futures):
          break
        time.sleep(2.0)
      for f in futures:
        f.result()  # a worker's error stops the job here
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
  bar.close()
