"""One run of many: trained (or read back when finished) and summarised, its log
records labelled with its name, compiles shared through JAX's persistent cache."""

import contextlib
import dataclasses
import json
import logging
import os
import time
from typing import Callable, Optional

from mipu_jax import config as config_lib
from mipu_jax import rl
from mipu_jax.harness.summary import RunSummary
from mipu_jax.harness.summary import summarize


def enable_compilation_cache(path: Optional[str], workdir: str = "") -> None:
  """JAX's persistent compilation cache at `path`: runs of a row share compiles.

  Each run builds a new learner whose jitted step would otherwise recompile;
  with the cache, seeds of a row (and rows with the same learner program)
  compile once. Call before the first compilation.

  Args:
    path: the cache directory; None for `workdir/.jax_cache`, "" for no cache.
    workdir: the job's output directory.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if path is None:
    path = os.path.join(workdir, ".jax_cache")
  if not path:
    return
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@contextlib.contextmanager
def run_label(row: str, seed: int):
  """Every log record made inside starts with `[<row> seed <seed>]`.

  The main job trains several runs at once in worker processes whose output
  shares one terminal; a health warning ("step 45: mismatch health: k3_kl
  ...") or a logging backend's failure must say whose it is. The label goes
  into each record as it is created (a log-record factory), so it reaches
  every handler, absl's included; Python warnings are routed through logging
  meanwhile, so they carry it too. The previous factory and warning routing
  are restored on exit.
  """
  label = f"[{row} seed {seed}] ".replace("%", "%%")
  previous = logging.getLogRecordFactory()

  def factory(*args, **kwargs):
    record = previous(*args, **kwargs)
    record.msg = label + str(record.msg)
    return record

  logging.setLogRecordFactory(factory)
  logging.captureWarnings(True)
  try:
    yield
  finally:
    logging.captureWarnings(False)
    logging.setLogRecordFactory(previous)


def run_one(cfg: config_lib.TrainConfig, row: str, seed: int, workdir: str,
             log: Callable[[str], None],
             train: bool = True) -> Optional[RunSummary]:
  """Trains one run (or reads back a finished one) and summarises it.

  Returns None for an unfinished run when `train` is False, and for a run
  that a preemption notice (SIGTERM) stopped before its last step: it holds a
  checkpoint and resumes on the next call, and no summary marks it finished.

  Raises:
    ValueError: a finished run whose saved config differs from `cfg`.
  """
  done = os.path.join(workdir, "summary.json")
  if os.path.exists(done):
    with open(os.path.join(workdir, "config.json")) as f:
      saved = json.load(f)
    # What the run computed must match; how it logged (progress bar, plots)
    # need not, but its length must.
    diff = config_lib.resume_differences(saved, cfg)
    # A setting added to the code after the run was saved is not a difference
    # when the row asks for its default (the default keeps the old behaviour).
    saved_flat, defaults = config_lib.flatten(saved), config_lib.flatten(
        config_lib.TrainConfig())
    diff = {k: v for k, v in diff.items()
            if k in saved_flat or k not in defaults or v[1] != defaults[k]}
    if saved.get("num_steps") != cfg.num_steps:
      diff["num_steps"] = (saved.get("num_steps"), cfg.num_steps)
    if diff:
      raise ValueError(
          f"{workdir} holds a finished run of another config (differences, "
          f"(saved, wanted): {diff}); delete it or restore the config.")
    with open(done) as f:
      seconds = float(json.load(f)["seconds"])
    log(f"[reproduce] {row} seed {seed}: finished before, read back")
    # Summarised again from its metrics, so a summary always follows the
    # current criterion.
    rows = rl.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    return RunSummary(row=row, seed=seed, workdir=workdir, seconds=seconds,
                      commits=rl.resume.read_commits(workdir),
                      **summarize(rows, cfg.eval.tiers))
  if not train:
    return None
  log(f"[reproduce] {row} seed {seed}: training {cfg.num_steps} steps -> {workdir}")
  # An unfinished earlier attempt resumes from its newest checkpoint (the loop
  # checks its config and repairs its log: docs/reliability.md).
  start = time.perf_counter()
  with run_label(row, seed):
    result = rl.train(cfg, workdir)
  seconds = time.perf_counter() - start
  if result.stopped_at is not None:  # a preemption notice: not finished, resumes later
    log(f"[reproduce] {row} seed {seed}: stopped after step {result.stopped_at} on a "
        "preemption notice (checkpointed); rerun to finish it")
    return None
  s = RunSummary(row=row, seed=seed, workdir=workdir, seconds=seconds,
                 commits=rl.resume.read_commits(workdir),
                 **summarize(result.rows, cfg.eval.tiers))
  with open(done, "w") as f:  # the workdir as records name paths (config_lib.record_path)
    json.dump(dict(dataclasses.asdict(s), workdir=config_lib.record_path(workdir)), f, indent=2)
  log(f"[reproduce] {row} seed {seed}: Avg {s.final['avg']:.3f} (peak "
      f"{s.peak_avg:.3f} ± {s.peak_se:.3f} @ {s.peak_step}), stable={s.stable}, "
      f"rollback {s.rollback_rate:.2f}, {seconds:.0f} s")
  return s
