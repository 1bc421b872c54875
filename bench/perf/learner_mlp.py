r"""The learner step of a table row with and without the recomputed MLP, in one run.

    python -m bench.perf.learner_mlp                     # baseline row, 9 rounds
    python -m bench.perf.learner_mlp --row mipu --rounds 15 --trace

On XLA:CPU without a remat policy, each decoder layer computes its gate and up
projections and SwiGLU under `jax.checkpoint` (`models.qwen3.recompute_mlp_for`,
resolved by `Learner` into `StepSpec.recompute_mlp`):
the backward pass recomputes them instead of reading them back from the layer
scan's saved `[L, B, T, F]` stacks. This script measures what that does to one
learner step (`Learner.step`: the table's two PPO updates of 64 rows each) on
one RL batch of `studies/configs/table.py:<row>` (the tables' setting), on one CPU
thread:

- `kept`: the recompute switched off (`StepSpec.recompute_mlp=False`), i.e.
  the code before the change;
- `recomputed`: the code as it is;
- `remat=layer`: the whole layer recomputed instead (`model.remat`), the
  other way to the same effect.

Each variant is its own jitted step, compiled first; then the rounds call them
in turn (so drift of the machine hits all alike) and the table shows the
median seconds per step, its ratio to `kept`, and whether the step's outputs
(new parameters, optimizer state and metrics) are bitwise those of `kept`, or
the largest difference. `--trace` also prints the most expensive XLA ops of
one step of `kept` and `recomputed` from a `jax.profiler` trace.
"""

import collections
import dataclasses
import os
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen"
                           "=false intra_op_parallelism_threads=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from flax import nnx  # pylint: disable=g-import-not-at-top,wrong-import-position

from bench.perf import learner_profile  # pylint: disable=g-import-not-at-top,wrong-import-position

_ROW = flags.DEFINE_string("row", "baseline", "studies/configs/table.py row.")
_ROUNDS = flags.DEFINE_integer("rounds", 9, "Timed calls of each variant.")
_TRACE = flags.DEFINE_bool("trace", False, "Print each variant's most expensive XLA ops.")
_TOP = 6


def _outputs_vs(a, b) -> str:
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  diff = 0.0
  for x, y in zip(la, lb):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.kind not in "fc":  # keys, counters
      if not np.array_equal(x, y):
        return "differ (non-float leaves)"
      continue
    if x.tobytes() != y.tobytes():
      diff = max(diff, float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))))
  return "identical" if diff == 0.0 else f"differ, max |diff| {diff:.1e}"


def _top_ops(call, name):
  """The `_TOP` XLA ops with the most time over one call, from a profiler trace."""
  events = learner_profile.trace_events(call)
  total, count = collections.Counter(), collections.Counter()
  for e in events:
    # XLA's ops (thunks), not the Python frames ("$...") or the executor.
    if e.get("ph") == "X" and not e["name"].startswith(("$", "Thunk", "np.")):
      total[e["name"]] += e.get("dur", 0)
      count[e["name"]] += 1
  lines = [f"{name}: the {_TOP} most expensive XLA ops of one traced step (a loop's time "
           "includes its body's ops; tracing slows the step)"]
  for op, us in total.most_common(_TOP):
    lines.append(f"  {us / 1e3:7.1f} ms  x{count[op]:<3d} {op}")
  return "\n".join(lines)


def main(argv):
  del argv
  from absl import logging  # pylint: disable=g-import-not-at-top
  from studies.configs import table  # pylint: disable=g-import-not-at-top
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax.learner import Learner  # pylint: disable=g-import-not-at-top
  from mipu_jax.rl import step as step_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax.rl import build  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.WARNING)
  load0 = " ".join(f"{x:.2f}" for x in os.getloadavg())
  cfg = config_lib.from_config_dict(table.get_config(_ROW.value))
  run = build.build_run(cfg, donate=False)
  if not (run.learner.spec.recompute_mlp and cfg.model.remat == "none"):
    raise SystemExit("the recompute is on only on CPU without a remat policy: "
                     f"remat={cfg.model.remat!r}, backend {jax.default_backend()}.")
  params = nnx.to_pure_dict(nnx.state(run.model, nnx.Param))
  state = run.learner.init_state(params, cfg.seed)
  run.sampler.update_weights(state.params)
  chosen, everything, _ = step_lib.collect(run, 1)
  batch = step_lib.learner_batch(run, state, chosen, float(everything.lengths_R.mean()))

  kept = Learner(run.learner.graphdef, run.learner.abstract_params,
                 spec=dataclasses.replace(run.learner.spec, recompute_mlp=False),
                 optimizer=run.learner.optimizer, mesh=run.mesh, donate=False)
  learners = {"kept": kept, "recomputed": run.learner}
  model_config = run.model.config
  run.model.config = model_config.replace(remat="layer")
  learners["remat=layer"] = Learner.from_config(cfg, run.model, run.mesh, donate=False)
  run.model.config = model_config

  outputs, compile_s = {}, {}
  for name, learner in learners.items():  # trace and compile each variant once
    t0 = time.perf_counter()
    outputs[name] = jax.block_until_ready(learner.step(state, batch))
    compile_s[name] = time.perf_counter() - t0
  times = collections.defaultdict(list)
  for _ in range(_ROUNDS.value):
    for name, learner in learners.items():
      t0 = time.perf_counter()
      jax.block_until_ready(learner.step(state, batch))
      times[name].append(time.perf_counter() - t0)

  median = {k: float(np.median(v)) for k, v in times.items()}
  print(f"row {_ROW.value}: {batch.tokens_BT.shape[0]} rows x {batch.tokens_BT.shape[1]} "
        f"tokens, {cfg.learner.num_minibatches} updates per step; {_ROUNDS.value} rounds; "
        f"jax {jax.__version__}; load average at start / end: {load0} / "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()))
  print("\n| variant | learner step, median s | first call (compile) s | / kept | "
        "outputs vs kept |")
  print("|---|---|---|---|---|")
  for name in learners:
    print(f"| {name} | {median[name]:.3f} | {compile_s[name]:.1f} | "
          f"{median['kept'] / median[name]:.2f}x faster | "
          f"{_outputs_vs(outputs['kept'], outputs[name])} |")
  if _TRACE.value:
    for name in ("kept", "recomputed"):
      print("\n" + _top_ops(lambda n=name: learners[n].step(state, batch), name))


if __name__ == "__main__":
  app.run(main)
