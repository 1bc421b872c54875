"""Running a table: rows x seeds through the RL loop, like with like, resumable
(the package docstring has the whole procedure)."""

import dataclasses
import json
import os
from typing import Callable, Mapping, Optional, Sequence

from mipu_jax import config as config_lib
from mipu_jax.harness.runs import run_one
from mipu_jax.harness.summary import RunSummary
from mipu_jax.harness.summary import STABLE_SES
from studies.reproduce import signal
from studies.reproduce.report import compared
from studies.reproduce.report import plot_curves
from studies.reproduce.report import plot_gap
from studies.reproduce.report import plot_lr_decay
from studies.reproduce.report import tables_markdown
from studies.reproduce.spec import _ROW_EXTRA_FIELDS
from studies.reproduce.spec import MakeConfig
from studies.reproduce.spec import PAIR_FIELDS
from studies.reproduce.spec import ROW_FIELDS
from studies.reproduce.spec import SOURCE_TABLES
from studies.reproduce.spec import TableResult


def check_like_with_like(configs: Mapping[str, config_lib.TrainConfig]) -> None:
  """Raises unless every two rows differ only in what their rows compare.

  Two rows may differ in `ROW_FIELDS`, and in the sampler precision when one
  of them is the no-mismatch `control`; a pair of `PAIR_FIELDS` (the bf16
  rows) in exactly its fields.

  Args:
    configs: row name -> validated config, all of one seed.

  Raises:
    ValueError: naming the rows and the settings that differ.
  """
  names = list(configs)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      allowed = PAIR_FIELDS.get(frozenset((a, b))) or (
          ROW_FIELDS + _ROW_EXTRA_FIELDS.get(a, ()) + _ROW_EXTRA_FIELDS.get(b, ()))
      diff = config_lib.config_diff(configs[a], configs[b])
      diff = {k: v for k, v in diff.items() if not k.startswith(allowed)}
      if diff:
        raise ValueError(
            f"rows {a!r} and {b!r} differ in more than the compared setting: "
            f"{diff}. A table compares like with like; make every other setting "
            "equal.")


def _as_train_config(cfg) -> config_lib.TrainConfig:
  if isinstance(cfg, config_lib.TrainConfig):
    return cfg
  return config_lib.from_config_dict(cfg)


def committed_placement(runs: Sequence[RunSummary], make_config: MakeConfig,
                        root: str) -> str:
  """The user's runs beside the committed ten seeds of the same rows under `root`.

  The committed runs are read back only when their saved config is what
  `make_config` builds for them (`run_one` checks, seed aside): another
  setting, step count or `--quick` has nothing to be compared with.
  """
  from studies.reproduce.report import placement_markdown  # pylint: disable=g-import-not-at-top
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
  from studies.reproduce.report import perturbation_markdown  # pylint: disable=g-import-not-at-top
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
    rows: table rows (`studies/configs/rows.py` names).
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
  why = "did not finish in the budget" if train else "have no finished run (report only)"
  pending = {row: f"not run (seeds {missing} {why})"
             for row, missing in skipped.items()
             if not any(r.row == row for r in runs)}
  markdown = tables_markdown(runs, pending, tiers or (), tables=tables,
                             skipped=skipped, why=why)
  sig = signal.signal_markdown(runs)
  if sig:
    markdown += ("\n### Step 2's signal: what follows accepted and rejected updates\n\n"
                 "Pooled over seeds (`studies/reproduce/signal.py`): "
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
    shown = [r for r in group if r in rows]
    if not compared(shown):
      continue  # as the tables: the reference row alone is no comparison
    path = plot_curves(runs, shown,
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
