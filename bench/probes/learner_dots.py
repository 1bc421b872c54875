r"""The learner step with XLA:CPU's default dots (YNNPACK fusions), Eigen's and oneDNN's, per shape.

    python -m bench.probes.learner_dots [--shapes moe128,moe128w,moe256n,moe256,moe512,twin128,tiny]

`moe.learner_compiler_options` picks `moe.EIGEN_DOTS` for an MoE whose experts run as
batched dots of blocks on a CPU, and jax's defaults elsewhere. This probe is the
measurement behind that rule: for each shape, `Learner.step` (the `bench.perf.moe` /
`bench.perf.learner` learner: one update, no correction, one device) compiled with jax's
defaults, with `EIGEN_DOTS` and with `ONEDNN_DOTS` (lone dots by oneDNN,
`bench.probes.dot_libraries`), in alternating rounds (fastest of `--rounds` each), the
largest parameter difference after one step from the defaults', and what the learner
resolves by itself. Shapes: `moeD[w|n]` the MoE bench's model at width D (expert width D,
`w` twice it, `n` half), `twin128` its dense twin at D = 128, `tiny` / `mid` the dense
learner bench's shapes at 64 x 96 tokens.
"""

import argparse
import os

import jax
import numpy as np

from bench.perf.learner import host_line
from bench.perf.learner import interleaved
from bench.perf.learner import shape_config
from bench.perf.learner import shape_learner
from bench.perf.moe import dense_twin
from bench.perf.moe import moe_config
from bench.probes.dot_libraries import ONEDNN_DOTS
from mipu_jax.models import moe

SHAPES = {  # name: (config, batch, seq, prompt)
    "moe128": (lambda: moe_config(128, 128), 16, 128, 32),
    "moe128w": (lambda: moe_config(128, 256), 16, 128, 32),
    "moe256n": (lambda: moe_config(256, 128), 16, 128, 32),
    "moe256": (lambda: moe_config(256, 256), 16, 128, 32),
    "moe512": (lambda: moe_config(512, 512), 16, 128, 32),
    "twin128": (lambda: dense_twin(moe_config(128, 128)), 16, 128, 32),
    "tiny": (lambda: shape_config("tiny"), 64, 96, 32),
    "mid": (lambda: shape_config("mid"), 64, 96, 32),
}


def stepped(cfg, batch, seq, prompt, **learner_kwargs):
  """`(model, learner, batch, step call, parameter leaves after one step)` of
  `shape_learner(cfg, ..., **learner_kwargs)`; the call repeats that step on the
  same state."""
  model, learner, state, rl = shape_learner(cfg, batch, seq, prompt, **learner_kwargs)
  leaves = jax.tree.leaves(learner.step(state, rl)[0].params)
  return model, learner, rl, lambda: jax.block_until_ready(learner.step(state, rl)), leaves


def max_abs_diff(xs, ys) -> float:
  """The largest absolute difference between two lists of arrays."""
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(xs, ys))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--shapes", default="moe128,moe128w,moe256n,moe256,moe512,twin128,tiny")
  p.add_argument("--rounds", type=int, default=5)
  a = p.parse_args()
  print(f"{host_line()}; {len(os.sched_getaffinity(0))} threads")
  print("| shape | jax defaults (s) | EIGEN_DOTS (s) | ONEDNN_DOTS (s) | Eigen / default | "
        "oneDNN / default | max param diff: Eigen, oneDNN | the learner's own choice |")
  print("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |")
  for name in a.shapes.split(","):
    make, batch, seq, prompt = SHAPES[name]
    cfg = make()
    fns, params = {}, {}
    for tag, options in (("default", {}), ("eigen", moe.EIGEN_DOTS), ("onednn", ONEDNN_DOTS)):
      *_, fns[tag], params[tag] = stepped(cfg, batch, seq, prompt, compiler_options=options)
    diffs = [max_abs_diff(params["default"], params[k]) for k in ("eigen", "onednn")]
    t = {k: r.wall for k, r in interleaved(fns, a.rounds).items()}
    own = moe.learner_compiler_options(cfg, "cpu")
    print(f"| {name} | {t['default']:.4f} | {t['eigen']:.4f} | {t['onednn']:.4f} | "
          f"{t['eigen'] / t['default']:.2f} | {t['onednn'] / t['default']:.2f} | "
          f"{diffs[0]:.1e}, {diffs[1]:.1e} | {'EIGEN_DOTS' if own else 'jax defaults'} |",
          flush=True)


if __name__ == "__main__":
  main()
