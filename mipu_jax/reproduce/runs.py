"""Running a table: rows x seeds through the RL loop, like with like, resumable
(the package docstring has the whole procedure)."""

import contextlib
import dataclasses
import json
import logging
import os
import time
from typing import Callable, Mapping, Optional, Sequence

from mipu_jax import config as config_lib
from mipu_jax import rl
from mipu_jax.reproduce import signal
from mipu_jax.reproduce.report import plot_curves
from mipu_jax.reproduce.report import plot_gap
from mipu_jax.reproduce.report import plot_lr_decay
from mipu_jax.reproduce.report import tables_markdown
from mipu_jax.reproduce.spec import _ROW_EXTRA_FIELDS
from mipu_jax.reproduce.spec import MakeConfig
from mipu_jax.reproduce.spec import ROW_FIELDS
from mipu_jax.reproduce.spec import RunSummary
from mipu_jax.reproduce.spec import SOURCE_TABLES
from mipu_jax.reproduce.spec import STABLE_SES
from mipu_jax.reproduce.spec import summarize
from mipu_jax.reproduce.spec import TableResult


def check_like_with_like(configs: Mapping[str, config_lib.TrainConfig]) -> None:
  """Raises unless every two rows differ only in what their rows compare.

  Two rows may differ in `ROW_FIELDS`, and in the sampler precision when one
  of them is the no-mismatch `control`.

  Args:
    configs: row name -> validated config, all of one seed.

  Raises:
    ValueError: naming the rows and the settings that differ.
  """
  names = list(configs)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      allowed = (ROW_FIELDS + _ROW_EXTRA_FIELDS.get(a, ())
                 + _ROW_EXTRA_FIELDS.get(b, ()))
      diff = config_lib.config_diff(configs[a], configs[b])
      diff = {k: v for k, v in diff.items() if not k.startswith(allowed)}
      if diff:
        raise ValueError(
            f"rows {a!r} and {b!r} differ in more than the compared setting: "
            f"{diff}. A table compares like with like; make every other setting "
            "equal.")


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


def _as_train_config(cfg) -> config_lib.TrainConfig:
  if isinstance(cfg, config_lib.TrainConfig):
    return cfg
  return config_lib.from_config_dict(cfg)


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
                 **summarize(result.rows, cfg.eval.tiers))
  with open(done, "w") as f:
    json.dump(dataclasses.asdict(s), f, indent=2)
  log(f"[reproduce] {row} seed {seed}: Avg {s.final['avg']:.3f} (peak "
      f"{s.peak_avg:.3f} ± {s.peak_se:.3f} @ {s.peak_step}), stable={s.stable}, "
      f"rollback {s.rollback_rate:.2f}, {seconds:.0f} s")
  return s


def committed_placement(runs: Sequence[RunSummary], make_config: MakeConfig,
                        root: str) -> str:
  """The user's runs beside the committed ten seeds of the same rows under `root`.

  The committed runs are read back only when their saved config is what
  `make_config` builds for them (`run_one` checks, seed aside): another
  setting, step count or `--quick` has nothing to be compared with.
  """
  from mipu_jax.reproduce.report import placement_markdown  # pylint: disable=g-import-not-at-top
  reference = []
  for row in sorted({r.row for r in runs}):
    for seed in range(10):
      try:
        s = run_one(_as_train_config(make_config(row, seed, None)), row, seed,
                    os.path.join(root, "runs", f"{row}_s{seed}"), log=lambda _: None,
                    train=False)
      except ValueError as e:  # a committed run of another config
        return f"Not placed among the committed runs, another setting: {str(e)[:400]}"
      if s is not None:
        reference.append(s)
  table = placement_markdown(runs, reference)
  if not table:
    return f"Not placed: no committed run of these rows in {root}."
  return (f"Your runs among the committed seeds of each row ({root}; the float sums "
          "differ from host to host, so a seed is one more draw, not a copy of the "
          "committed one):\n\n" + table)


def perturbation_report(make_config: MakeConfig, rows: Sequence[str],
                        seeds: Sequence[int], perturbed_root: str,
                        original_root: str) -> str:
  """`report.perturbation_markdown` of the finished runs of `rows` x `seeds`
  under `perturbed_root` (made by `make_config`) against the same runs under
  `original_root`, read back with `model.init_perturb_ulps` = 0: each side is
  read only if its saved config is that (`run_one`'s check), so the two differ
  in the perturbation alone (and, for random rollback, in MIPU's rate, which
  each side measures itself).

  Raises:
    ValueError: a run saved under another config, or a perturbation of 0.
  """
  from mipu_jax.reproduce.report import perturbation_markdown  # pylint: disable=g-import-not-at-top
  if _as_train_config(make_config(rows[0], seeds[0], None)).model.init_perturb_ulps == 0:
    raise ValueError("the perturbed runs' configs have no perturbation "
                     "(model.init_perturb_ulps = 0).")
  sides = {"original": [], "perturbed": []}
  for seed in seeds:
    for row in order_rows(rows):
      for side, root in (("original", original_root), ("perturbed", perturbed_root)):
        p = None
        if row == "random_rollback":
          p = _mipu_rate(sides[side], seed)
          if p is None:
            continue
        cfg = _as_train_config(make_config(row, seed, p))
        if side == "original":
          cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model,
                                                                   init_perturb_ulps=0))
        s = run_one(cfg, row, seed, os.path.join(root, "runs", f"{row}_s{seed}"),
                    log=lambda _: None, train=False)
        if s is not None:
          sides[side].append(s)
  return perturbation_markdown(sides["original"], sides["perturbed"])


def _mipu_rate(runs: Sequence[RunSummary], seed: int) -> Optional[float]:
  """The rejection rate of seed `seed`'s finished MIPU run in `runs` (random
  rollback's p), or None."""
  return next((r.rollback_rate for r in runs if r.row == "mipu" and r.seed == seed), None)


def order_rows(rows: Sequence[str]) -> list[str]:
  """`mipu` before `random_rollback`, which needs its measured rate."""
  rows = list(dict.fromkeys(rows))
  if "mipu" in rows and "random_rollback" in rows:
    rows.remove("mipu")
    rows.insert(rows.index("random_rollback"), "mipu")
  return rows


def run_table(make_config: MakeConfig, rows: Sequence[str],
              seeds: Sequence[int], workdir: str, *,
              tables: Sequence[tuple[str, str, Sequence[str]]] = SOURCE_TABLES,
              log: Callable[[str], None] = print,
              train: bool = True) -> TableResult:
  """Runs `rows` x `seeds`, writes the tables and figures into `workdir`.

  Args:
    make_config: `(row, seed, p) -> ConfigDict | TrainConfig`; `p` is None
      except for `random_rollback` (see module docstring).
    rows: table rows (`configs/rows.py` names).
    seeds: seeds; the outer loop, so the first seed's table is complete first.
    workdir: output directory.
    tables: `(key, title, rows)` of the tables to write (`SOURCE_TABLES`, the
      sources' three; `COMPARE_TABLES`, the main job's), each with its figure
      `curves_<key>.png`.
    log: progress sink.
    train: False to only tabulate runs that finished before (a budget cut
      short: unfinished runs are left out and their seeds listed in the
      notes).

  Returns:
    A `TableResult`.

  Raises:
    ValueError: rows that differ in more than their compared setting
      (`check_like_with_like`), or a finished run of another config.
  """
  os.makedirs(workdir, exist_ok=True)
  runs, skipped, tiers = [], {}, None
  stopped = False
  for seed in seeds:
    if stopped:
      break
    seen: dict[config_lib.TrainConfig, RunSummary] = {}
    built: dict[str, config_lib.TrainConfig] = {}
    for row in order_rows(rows):
      p = None
      if row == "random_rollback":
        p = _mipu_rate(runs, seed)
        if p is None and seed in skipped.get("mipu", ()):  # MIPU's run is unfinished
          skipped.setdefault(row, []).append(seed)
          continue
        if p is None:
          raise ValueError("the random_rollback row needs the mipu row (its p "
                           "is MIPU's measured rejection rate): add it to rows.")
      if p == 0.0:  # MIPU rejected nothing: random rollback is Step 1.
        cfg = _as_train_config(make_config("step1", seed, None))
      else:
        cfg = _as_train_config(make_config(row, seed, p))
      built[row] = cfg
      check_like_with_like(built)
      tiers = cfg.eval.tiers
      if cfg in seen:
        twin = seen[cfg]
        runs.append(dataclasses.replace(twin, row=row,
                                        note=f"same run as {twin.row}"))
        log(f"[reproduce] {row} seed {seed}: identical config to {twin.row}, reused")
        continue
      s = run_one(cfg, row, seed, os.path.join(workdir, "runs", f"{row}_s{seed}"),
                   log, train)
      if s is None:
        skipped.setdefault(row, []).append(seed)
        if train:  # a preemption notice stopped it: start nothing more, report what finished
          log("[reproduce] stopped on a preemption notice: no further run started; "
              "rerun the same command to resume")
          stopped = True
          break
        continue
      if p is not None:
        s = dataclasses.replace(s, note=f"p = {p:.3f} (MIPU's rejection rate)")
      seen[cfg] = s
      runs.append(s)
  pending = {row: f"not run (seeds {missing} did not finish in the budget)"
             for row, missing in skipped.items()
             if not any(r.row == row for r in runs)}
  markdown = tables_markdown(runs, pending, tiers or (), tables=tables,
                             skipped=skipped)
  sig = signal.signal_markdown(runs)
  if sig:
    markdown += ("\n### Step 2's signal: what follows accepted and rejected updates\n\n"
                 "Pooled over seeds (`mipu_jax/reproduce/signal.py`): "
                 "next_reward_change = training reward of the next step minus "
                 "this step's; probe_minus_reward = the candidate's probe reward "
                 "minus this step's training reward. Random rollback decides by a "
                 "coin: its difference is the null.\n\n" + sig + "\n")
  files = {"table": os.path.join(workdir, "table.md"),
           "summary": os.path.join(workdir, "summary.json")}
  with open(files["table"], "w") as f:
    f.write(markdown)
  with open(files["summary"], "w") as f:
    json.dump({"runs": [dataclasses.asdict(r) for r in runs], "pending": pending,
               "stable_ses": STABLE_SES, "seeds": list(seeds)}, f, indent=2)
  seeds_run = sorted({r.seed for r in runs})
  for key, title, group in tables:
    path = plot_curves(runs, [r for r in group if r in rows],
                       os.path.join(workdir, f"curves_{key}.png"),
                       title=f"{title}: mean over seeds {seeds_run} (band: min-max)")
    if path:
      files[f"curves_{key}"] = path
  path = plot_lr_decay(runs, os.path.join(workdir, "lr_decay.png"))
  if path:
    files["lr_decay"] = path
  path = plot_gap(runs, os.path.join(workdir, "gap_post.png"))
  if path:
    files["gap_post"] = path
  return TableResult(runs=runs, pending=pending, markdown=markdown, files=files)
