r"""RL steps per CPU-minute of the table's rows, before and after a code change, in one run.

    python -m bench.perf.loop                       # 4 rows x {before, after}, 8 steps each
    python -m bench.perf.loop --steps 12 --workers 2 --rows baseline,mipu
    python -m bench.perf.loop --before_rev HEAD --setting lr=7e-4   # the defaults

`before` is the repository at `--before_rev` (extracted with `git archive`
into a temporary directory and imported from there), `after` the code this
script sits in; both train the same `studies/configs/table.py:<row>,<--setting>`.
Each (variant, row) trains `--steps` RL steps in its own process on one CPU
thread (`--workers` processes at once, one per core), with no periodic
evaluation, no checkpoints and a 1-problem final evaluation, from a fresh
compilation (a cold `after` run fills its row's own persistent cache, which
starts empty). Per run it reports:

- `steady s/step`: the median `perf/step_seconds` over steps 2.. (wall time
  of a step; with one thread per process this is CPU time on an idle core);
- `compile s`: step 1's extra time over that median (tracing and XLA
  compilation of the sampler and learner programs, which step 1 pays);
- `steps / CPU-min`: steps x 60 / the process's CPU seconds for the whole run
  (setup and compilation included), the issue's measure;
- `steady steps / CPU-min`: 60 / (steady s/step x CPU / wall of the process),
  i.e. per step, compilation excluded (the CPU / wall factor takes out the
  time the process waited for a core on a shared machine);
- `120-step run, steps / CPU-min`: a table run's 120 steps over the CPU
  minutes of compilation + 120 steady steps (compilation included, at the
  table's run length rather than the bench's).

`after, cached` (`--cached`, on by default) runs `after` once more per row
with JAX's persistent compilation cache the first `after` runs filled, as a
table's second and later runs find it (`harness.enable_compilation_cache`).

Results unchanged: for every row the script compares the logged metrics of
`before` and `after` step by step (every key but `perf/*`, which are
timings) and prints whether they are bitwise identical, or the first that
differs. The load average is printed with the table: on a shared machine the
numbers are only comparable within one run.
"""

import concurrent.futures
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_STEPS = flags.DEFINE_integer("steps", 8, "RL steps per run.")
_WORKERS = flags.DEFINE_integer("workers", 1, "Runs at once (one CPU thread each).")
_ROWS = flags.DEFINE_list("rows", ["control", "baseline", "tis", "mipu"], "Table rows.")
# The commit before the sampler's KV-cache storage change (kv_cache_storage).
_BEFORE = flags.DEFINE_string("before_rev", "HEAD",
                              "Git revision of the `before` code ('' for none).")
_SETTING = flags.DEFINE_string("setting", "lr=7e-4",
                               "studies/configs/table.py options shared by every run.")
_CACHED = flags.DEFINE_bool(
    "cached", True, "Also measure `after, cached`: `after` again, its compiles read from the "
    "persistent cache the first `after` runs wrote (a study compiles once, not per run).")
_OUT = flags.DEFINE_string("out", None, "Also write the results as JSON here.")

RUN_STEPS = 120  # a table run's length (studies/configs/table.py, --setting steps=120)


def _table():
  """The table config of the revision on sys.path: `studies/configs/`, or
  `configs/` in revisions from before the studies had a folder of their own."""
  try:
    from studies.configs import table  # pylint: disable=g-import-not-at-top
  except ImportError:
    from configs import table  # pylint: disable=g-import-not-at-top
  return table


def _config(row, steps, setting):
  config = _table().get_config(",".join(x for x in (row, setting, f"steps={steps}") if x))
  config.eval.every = 0
  config.eval.n_per_tier = 1
  config.eval.num_samples = 1
  config.checkpoint.enabled = False
  return config


def _init_worker():
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen"
                             "=false intra_op_parallelism_threads=1").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


def measure(row, variant, code_dir, steps, setting, cache_dir=None):
  """One run in this (fresh) process, importing the code of `code_dir`.

  With `cache_dir`, JAX's persistent compilation cache lives there (the
  tables' `harness.enable_compilation_cache`).
  """
  sys.path.insert(0, code_dir)  # this process imports the compared revision, not this clone
  from absl import logging  # pylint: disable=g-import-not-at-top
  import mipu_jax  # pylint: disable=g-import-not-at-top
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax import rl  # pylint: disable=g-import-not-at-top
  for module in (mipu_jax, _table()):
    if not os.path.realpath(module.__file__).startswith(os.path.realpath(code_dir) + os.sep):
      raise RuntimeError(f"{variant}: imported {module.__file__}, not the code in {code_dir}")
  logging.set_verbosity(logging.WARNING)
  if cache_dir:
    try:
      from mipu_jax.harness import enable_compilation_cache  # pylint: disable=g-import-not-at-top
    except ImportError:  # before the harness was part of the library
      from mipu_jax.reproduce import enable_compilation_cache  # pylint: disable=g-import-not-at-top
    enable_compilation_cache(cache_dir)
  cfg = config_lib.from_config_dict(_config(row, steps, setting))
  with tempfile.TemporaryDirectory() as workdir:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = rl.train(cfg, workdir)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
  step_s = np.array([r["perf/step_seconds"] for r in result.rows
                     if "perf/step_seconds" in r])
  rounds = [r["data/sampling_rounds"] for r in result.rows if "data/sampling_rounds" in r]
  metrics = [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in result.rows]
  steady = float(np.median(step_s[1:]))
  cpu_per_wall = cpu / wall
  compile_s = float(step_s[0] - steady)
  return row, variant, dict(
      steps=len(step_s), cpu_s=cpu, wall_s=wall, steady_step_s=steady,
      compile_s=compile_s,
      steps_per_cpu_min=len(step_s) * 60 / cpu,
      steady_steps_per_cpu_min=60 / (steady * cpu_per_wall),
      run_steps_per_cpu_min=RUN_STEPS * 60 / (
          (compile_s + RUN_STEPS * steady) * cpu_per_wall),
      mean_sampling_rounds=float(np.mean(rounds)),
      sampler=f"{cfg.sampling.weight_quant or cfg.sampling.dtype}"
              f"/{cfg.sampling.act_quant or '-'} kv {cfg.sampling.kv_cache_dtype or '-'}",
      metrics=metrics)


def _bits(v):
  """A logged value as bytes: numbers by their float64 bits (so -0.0 != 0.0 and
  every NaN of one payload is equal), anything else by its repr."""
  if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.number)):
    return repr(v)
  return np.float64(v).tobytes()


def same_metrics(a, b):
  """'identical' when two runs logged bitwise the same metrics, else the first difference."""
  if len(a) != len(b):
    return f"{len(a)} vs {len(b)} rows"
  for i, (ra, rb) in enumerate(zip(a, b)):
    for k in sorted(set(ra) | set(rb)):
      va, vb = ra.get(k), rb.get(k)
      if (k in ra) != (k in rb) or _bits(va) != _bits(vb):
        return f"differ: row {i} (step {ra.get('step')}) {k}: {va} vs {vb}"
  return "identical"


def markdown(results, load):
  lines = [f"load average at start / end: {load[0]} / {load[1]}", "",
           "| row | variant | sampler (weights/acts, KV) | steady s/step | compile s | "
           f"steps / CPU-min | steady steps / CPU-min | {RUN_STEPS}-step run, steps / CPU-min | "
           "mean rounds |",
           "|---" * 9 + "|"]
  for (row, variant), m in results.items():
    lines.append(
        f"| {row} | {variant} | {m['sampler']} | {m['steady_step_s']:.2f} | "
        f"{m['compile_s']:.1f} | {m['steps_per_cpu_min']:.1f} | "
        f"{m['steady_steps_per_cpu_min']:.1f} | {m['run_steps_per_cpu_min']:.1f} | "
        f"{m['mean_sampling_rounds']:.2f} |")
  lines += ["", f"| row | variant | / before, {RUN_STEPS}-step run (compile included) | "
            "/ before, bench run (compile included) | steady | metrics vs before, every step |",
            "|---|---|---|---|---|---|"]
  variants = [v for v in dict.fromkeys(k[1] for k in results) if v != "before"]
  for row, v in [(row, v) for row in dict.fromkeys(k[0] for k in results) for v in variants]:
    if (row, "before") in results and (row, v) in results:
      b, a = results[(row, "before")], results[(row, v)]
      lines.append(
          f"| {row} | {v} | {a['run_steps_per_cpu_min'] / b['run_steps_per_cpu_min']:.2f}x | "
          f"{a['steps_per_cpu_min'] / b['steps_per_cpu_min']:.2f}x | "
          f"{a['steady_steps_per_cpu_min'] / b['steady_steps_per_cpu_min']:.2f}x | "
          f"{same_metrics(b['metrics'], a['metrics'])} |")
  return "\n".join(lines)


def _revision():
  """This code's commit, with "+changes" when the work tree differs from it."""
  head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                        capture_output=True, text=True, check=False).stdout.strip()
  dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                         capture_output=True, text=True, check=False).stdout.strip()
  return head + ("+changes" if dirty else "")


def _extract(rev, into):
  """The repository at `rev`, as files under `into` (tracked files only)."""
  archive = subprocess.run(["git", "-C", REPO, "archive", rev], check=True,
                           capture_output=True).stdout
  subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
  return into


def main(argv):
  del argv
  load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
  with tempfile.TemporaryDirectory() as tmp:
    code = {"after": REPO}
    if _BEFORE.value:
      code["before"] = _extract(_BEFORE.value, tmp)
    # One cache per row: a cold `after` run compiles everything itself (rows share
    # programs), and `after, cached` reads what its own row's cold run wrote.
    cache = {row: os.path.join(tmp, "jax_cache", row) if _CACHED.value else None
             for row in _ROWS.value}
    phases = [[(row, v, code[v], cache[row] if v == "after" else None)
               for row in _ROWS.value for v in code]]
    if _CACHED.value:  # after every cold run
      phases.append([(row, "after, cached", REPO, cache[row]) for row in _ROWS.value])
    context = multiprocessing.get_context("spawn")
    results = {}
    for jobs in phases:
      with concurrent.futures.ProcessPoolExecutor(
          _WORKERS.value, mp_context=context, initializer=_init_worker,
          max_tasks_per_child=1) as pool:
        futures = [pool.submit(measure, row, v, path, _STEPS.value, _SETTING.value, c)
                   for row, v, path, c in jobs]
        for f in futures:
          row, v, m = f.result()
          results[(row, v)] = m
          print(f"{row} {v}: " + json.dumps({k: x for k, x in m.items() if k != "metrics"}),
                flush=True)
  load1 = " ".join(f"{x:.2f}" for x in os.getloadavg())
  md = f"before: {_BEFORE.value}, after: {_revision()}\n" + markdown(results, (load0, load1))
  print(md)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({"load": [load0, load1], "steps": _STEPS.value, "before_rev": _BEFORE.value,
                 "after_rev": _revision(),
                 "setting": _SETTING.value,
                 "runs": [dict(row=r, variant=v, **{k: x for k, x in m.items() if k != "metrics"})
                          for (r, v), m in results.items()]},
                f, indent=2)


if __name__ == "__main__":
  app.run(main)
