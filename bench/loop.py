r"""RL steps per CPU-minute of the table's rows, before and after, in one run.

    python bench/loop.py                       # 4 rows x {before, after}, 8 steps each
    python bench/loop.py --steps 12 --workers 2 --rows baseline,mipu

Each (variant, row) trains `--steps` RL steps of `configs/table.py:<row>` in
its own process on one CPU thread (`--workers` processes at once, one per
core), with no periodic evaluation, no checkpoints and a 1-problem final
evaluation, from a fresh compilation (no persistent cache). Per run it
reports:

- `steady s/step`: the median `perf/step_seconds` over steps 2.. (wall time
  of a step; with one thread per process this is CPU time on an idle core);
- `compile s`: step 1's extra time over that median (tracing and XLA
  compilation of the sampler and learner programs, which step 1 pays);
- `steps / CPU-min`: steps x 60 / the process's CPU seconds for the whole run
  (setup and compilation included), the issue's measure;
- `steady steps / CPU-min`: 60 / (steady s/step x CPU / wall of the process),
  i.e. per step, compilation excluded (the CPU / wall factor takes out the
  time the process waited for a core on a shared machine);
- `60-step run, steps / CPU-min`: a table run's 60 steps over the CPU minutes
  of compilation + 60 steady steps (compilation included, at the table's run
  length rather than the bench's).

Variants (`VARIANTS`): `before` is the earlier table's setting (int4
weights, FP8 activations, FP8 KV cache and a quantized LM head, lr 1e-3);
`native` is the same with native low-precision matmuls
(`sampling.quant_compute=native`); `after` is `configs/table.py` as it is now;
`int4w` is the earlier setting with a weight-only int4 sampler. Both have dynamic sampling's 4
rounds. The load average is printed with the table: on a shared machine the
numbers are only comparable within one run.
"""

import concurrent.futures
import json
import multiprocessing
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position

_STEPS = flags.DEFINE_integer("steps", 8, "RL steps per run.")
_WORKERS = flags.DEFINE_integer("workers", 1, "Runs at once (one CPU thread each).")
_ROWS = flags.DEFINE_list("rows", ["control", "baseline", "tis", "mipu"], "Table rows.")
_VARIANTS = flags.DEFINE_list("variants", ["before", "native", "after"],
                              "Variants to measure.")
_OUT = flags.DEFINE_string("out", None, "Also write the results as JSON here.")

# variant -> (extra `configs/table.py` options, config overrides).
VARIANTS = {
    "before": ("precision=int4_all,lr=1e-3", {}),
    # The same sampler with native low-precision matmuls instead of
    # dequantize-then-float (`sampling.quant_compute`, mipu_jax/sampler/quant.py).
    "native": ("precision=int4_all,lr=1e-3", {"quant_compute": "native"}),
    "after": ("", {}),
    # Weight-only int4 (its weights stored dequantized: no activation, KV-cache
    # or LM-head quantization), the mismatch study's other collapsing sampler.
    "int4w": ("precision=int4,lr=1e-3", {}),
}


def _config(row, variant, steps):
  from configs import table  # pylint: disable=g-import-not-at-top
  options, sampling = VARIANTS[variant]
  arg = ",".join(x for x in (row, f"steps={steps}", options) if x)
  config = table.get_config(arg)
  for name, value in sampling.items():
    if row != "control":  # the control's fp32 sampler has nothing to quantize
      config.sampling[name] = value
  config.eval.every = 0
  config.eval.n_per_tier = 1
  config.eval.num_samples = 1
  config.checkpoint.enabled = False
  return config


def _init_worker():
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen"
                             "=false intra_op_parallelism_threads=1").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


def measure(row, variant, steps):
  """One run in this process: (row, variant, numbers)."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax import rl  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  cfg = config_lib.from_config_dict(_config(row, variant, steps))
  with tempfile.TemporaryDirectory() as workdir:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = rl.train(cfg, workdir)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
  step_s = np.array([r["perf/step_seconds"] for r in result.rows
                     if "perf/step_seconds" in r])
  rounds = [r["data/sampling_rounds"] for r in result.rows if "data/sampling_rounds" in r]
  steady = float(np.median(step_s[1:]))
  cpu_per_wall = cpu / wall
  return row, variant, dict(
      steps=len(step_s), cpu_s=cpu, wall_s=wall, steady_step_s=steady,
      compile_s=float(step_s[0] - steady),
      steps_per_cpu_min=len(step_s) * 60 / cpu,
      steady_steps_per_cpu_min=60 / (steady * cpu_per_wall),
      run60_steps_per_cpu_min=60 * 60 / ((step_s[0] - steady + 60 * steady) * cpu_per_wall),
      mean_sampling_rounds=float(np.mean(rounds)),
      sampler=f"{cfg.sampling.weight_quant or cfg.sampling.dtype}"
              f"/{cfg.sampling.act_quant or '-'} {cfg.sampling.quant_compute}")


def markdown(results, load):
  lines = [f"load average at start / end: {load[0]} / {load[1]}", "",
           "| row | variant | sampler (weights/acts) | steady s/step | compile s | "
           "steps / CPU-min | steady steps / CPU-min | 60-step run, steps / CPU-min | "
           "mean rounds |",
           "|---" * 9 + "|"]
  for (row, variant), m in results.items():
    lines.append(
        f"| {row} | {variant} | {m['sampler']} | {m['steady_step_s']:.2f} | "
        f"{m['compile_s']:.1f} | {m['steps_per_cpu_min']:.1f} | "
        f"{m['steady_steps_per_cpu_min']:.1f} | {m['run60_steps_per_cpu_min']:.1f} | "
        f"{m['mean_sampling_rounds']:.2f} |")
  others = [v for v in dict.fromkeys(k[1] for k in results) if v != "before"]
  lines += ["", "| row | variant | speed-up over before, 60-step run (compile included) | "
            "steady speed-up |", "|---|---|---|---|"]
  for row in dict.fromkeys(k[0] for k in results):
    for v in others:
      if (row, "before") in results and (row, v) in results:
        b, a = results[(row, "before")], results[(row, v)]
        lines.append(
            f"| {row} | {v} | {a['run60_steps_per_cpu_min'] / b['run60_steps_per_cpu_min']:.2f}x | "
            f"{a['steady_steps_per_cpu_min'] / b['steady_steps_per_cpu_min']:.2f}x |")
  return "\n".join(lines)


def main(argv):
  del argv
  load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
  jobs = [(row, v) for row in _ROWS.value for v in _VARIANTS.value]
  context = multiprocessing.get_context("spawn")
  results = {}
  with concurrent.futures.ProcessPoolExecutor(
      _WORKERS.value, mp_context=context, initializer=_init_worker,
      max_tasks_per_child=1) as pool:
    futures = [pool.submit(measure, row, v, _STEPS.value) for row, v in jobs]
    for f in futures:
      row, v, m = f.result()
      results[(row, v)] = m
      print(f"{row} {v}: {json.dumps(m)}", flush=True)
  load1 = " ".join(f"{x:.2f}" for x in os.getloadavg())
  md = markdown(results, (load0, load1))
  print(md)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({"load": [load0, load1], "steps": _STEPS.value,
                 "runs": [dict(row=r, variant=v, **m) for (r, v), m in results.items()]},
                f, indent=2)


if __name__ == "__main__":
  app.run(main)
