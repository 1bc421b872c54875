r"""The learner's layer scan against the same layers unrolled, on a CPU: step, forward, compile.

    python -m bench.probes.learner_unroll [--shapes moe128,moe512,twin128 --layers 2,3,4,6,8]

`moe.learner_unroll_layers` runs the layer scans of a small MoE's differentiated forward
unrolled on a CPU. This probe is the measurement behind that rule, three parts:
  1. `Learner.step` with the scan and unrolled, in alternating rounds (fastest of
     `--rounds` each), the largest parameter difference after one step between the two,
     per shape (`bench.probes.learner_dots`' shapes; each with the learner's own XLA
     options), and what the learner resolves by itself;
  2. the forward alone (the recompute of old log-probs runs one), the same two ways;
  3. compile time: the first step (trace and compile, jax's persistent cache off) of the
     D = 128 MoE at each of `--layers` layer counts, a 4 x 64-token batch, both ways.
"""

import argparse
import os
import time

import jax
from flax import nnx

from bench.perf.learner import host_line
from bench.perf.learner import interleaved
from bench.perf.learner import shape_learner
from bench.perf.moe import moe_config
from bench.probes.learner_dots import SHAPES
from bench.probes.learner_dots import max_abs_diff
from bench.probes.learner_dots import stepped
from mipu_jax.models import moe


def step_rows(names, rounds):
  print("| shape | scan (s) | unrolled (s) | unrolled / scan | max param diff | "
        "forward: scan (s) | unrolled (s) | unrolled / scan | the learner's own choice |")
  print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
  for name in names:
    make, batch, seq, prompt = SHAPES[name]
    cfg = make()
    fns, params = {}, {}
    for unroll in (False, True):
      model, learner, rl, fns[f"step/{unroll}"], params[unroll] = stepped(
          cfg, batch, seq, prompt, unroll_layers=unroll)
      graphdef, weights = nnx.split(model)
      fwd = jax.jit(lambda w, t, unroll=unroll, graphdef=graphdef: nnx.merge(graphdef, w)(
          t, logits=False, unroll_layers=unroll).hidden,
                    compiler_options=learner.compiler_options or None)
      tokens = rl.tokens_BT
      fns[f"fwd/{unroll}"] = lambda fwd=fwd, weights=weights, tokens=tokens: (
          jax.block_until_ready(fwd(weights, tokens)))
    diff = max_abs_diff(params[False], params[True])
    t = {k: r.wall for k, r in interleaved(fns, rounds).items()}
    own = moe.learner_unroll_layers(cfg, "cpu")
    print(f"| {name} | {t['step/False']:.4f} | {t['step/True']:.4f} | "
          f"{t['step/True'] / t['step/False']:.2f} | {diff:.1e} | {t['fwd/False']:.4f} | "
          f"{t['fwd/True']:.4f} | {t['fwd/True'] / t['fwd/False']:.2f} | "
          f"{'unrolled' if own else 'the scan'} |", flush=True)


def compile_rows(layers):
  jax.config.update("jax_enable_compilation_cache", False)
  print("| MoE D = 128, layers | first step, scan (s) | unrolled (s) | unrolled / scan |")
  print("| ---: | ---: | ---: | ---: |")
  for n in layers:
    cfg = moe_config(128, 128, layers=n)
    first = {}
    for unroll in (False, True):
      _, learner, state, rl = shape_learner(cfg, 4, 64, 16, unroll_layers=unroll)
      t0 = time.perf_counter()
      jax.block_until_ready(learner.step(state, rl))
      first[unroll] = time.perf_counter() - t0
    print(f"| {n} | {first[False]:.2f} | {first[True]:.2f} | {first[True] / first[False]:.2f} |",
          flush=True)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--shapes", default="moe128,moe512,twin128")
  p.add_argument("--layers", default="2,3,4,6,8")
  p.add_argument("--rounds", type=int, default=5)
  a = p.parse_args()
  print(f"{host_line()}; {len(os.sched_getaffinity(0))} threads; jax {jax.__version__}")
  if a.shapes:
    step_rows(a.shapes.split(","), a.rounds)
  if a.layers:
    compile_rows([int(n) for n in a.layers.split(",")])


if __name__ == "__main__":
  main()
