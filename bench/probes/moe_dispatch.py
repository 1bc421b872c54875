r"""One MoE layer's experts, forward + backward, on a CPU: the grouped matmul's dispatch
against a plain SwiGLU of the same active width (docs/method.md §7a).

    python -m bench.probes.moe_dispatch [--width 512]

The small task's MoE shape (2,048 tokens, D 128, 8 experts of width 128, top-2; `--width`
sets D and the experts' width together): the
`blocked` and `ragged_dot` forms of `moe.experts_mlp`, every expert on every token (the
test reference) and the dense twin, each `jax.grad` of a sum of squares through the
router. Process CPU seconds (both threads), fastest of 15 after a warm-up: under load
they move less than wall time. Runs at any commit with `moe.experts_mlp(h, hq, routing,
w, act_quant, impl)`, so before / after a dispatch change is one command at each.
Then the blocked form's own matmul both ways, forward + backward of the same blocks: one
batched dot over weights gathered per block (as on an accelerator) against the block loop
XLA:CPU runs (`moe._block_loop`, each block's weight read in place), where it exists.
"""

import argparse
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from mipu_jax.models import moe


def _best_cpu(f, repeats=15):
  # Not bench/perf/learner.py's _best_time: this file alone is copied to older commits.
  f()
  times = []
  for _ in range(repeats):
    t = time.process_time()
    f()
    times.append(time.process_time() - t)
  return min(times)


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--width", type=int, default=128, help="D and the experts' width")
  a = p.parse_args()
  n, d, f, e, k = 2048, a.width, a.width, 8, 2
  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.normal(size=(n, d)), jnp.float32)
  router = jnp.asarray(rng.normal(size=(d, e)) * 0.1, jnp.float32)
  w = {"experts_gate": jnp.asarray(rng.normal(size=(e, d, f)) * .05, jnp.float32),
       "experts_up": jnp.asarray(rng.normal(size=(e, d, f)) * .05, jnp.float32),
       "experts_down": jnp.asarray(rng.normal(size=(e, f, d)) * .05, jnp.float32)}

  def timed(fn):
    def loss(h, w):
      return jnp.sum(fn(h, moe.route(h, router, k, True), w) ** 2)
    g = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return _best_cpu(lambda: jax.block_until_ready(g(h, w)))

  def dense(h, r, w):  # one SwiGLU of width k x f: the same active FLOPs
    cat = lambda name, axis: jnp.concatenate([w[name][0]] * k, axis)
    return (jax.nn.silu(h @ cat("experts_gate", 1)) * (h @ cat("experts_up", 1))) @ cat(
        "experts_down", 0)

  rows = {impl: timed(lambda h, r, w, impl=impl: moe.experts_mlp(h, h, r, w, None, impl))
          for impl in ("blocked", "ragged_dot")}
  rows["every expert on every token"] = timed(moe.experts_mlp_reference)
  rows["dense twin (same active width)"] = timed(dense)
  print(f"jax {jax.__version__}; load {open('/proc/loadavg').read().split()[0]}")
  for name, t in rows.items():
    dense_t = rows["dense twin (same active width)"]
    print(f"{name:32s} {t * 1e3:8.2f} CPU ms  {t / dense_t:.2f}x dense")
  if hasattr(moe, "_block_loop"):
    loop_against_batched(w["experts_gate"])
  batched_against_one_dot()
  # The same two dots in a process held to one core: a dot that takes as long there
  # as on every core ran on one thread anyway.
  subprocess.run([sys.executable, "-c", "import os; os.sched_setaffinity(0, "
                  "{min(os.sched_getaffinity(0))}); from bench.probes import moe_dispatch; "
                  "moe_dispatch.batched_against_one_dot(label='on one core')"], check=True)


def loop_against_batched(w_EIO, blocks=40, rows=128):
  """The blocked form's matmul, forward + backward (`jax.grad` of a sum of squares
  for the rows and the weights), both ways on the same blocks spread over the experts."""
  rng = np.random.default_rng(2)
  e = w_EIO.shape[0]
  x = jnp.asarray(rng.normal(size=(blocks, rows, w_EIO.shape[1])), jnp.float32)
  expert_b = jnp.asarray(np.sort(rng.integers(0, e, blocks)), jnp.int32)
  ways = {"one batched dot, weights gathered": moe._block_batched,
          "block loop, weights in place": moe._block_loop}
  times = {}
  for name, fn in ways.items():
    g = jax.jit(jax.grad(lambda x, w, fn=fn: jnp.sum(fn(x, w, expert_b) ** 2), argnums=(0, 1)))
    times[name] = _best_cpu(lambda g=g: jax.block_until_ready(g(x, w_EIO)))
  base = times["one batched dot, weights gathered"]
  for name, t in times.items():
    print(f"[{blocks}, {rows}, {w_EIO.shape[1]}] x [{e}, {w_EIO.shape[1]}, {w_EIO.shape[2]}] "
          f"fwd+bwd, {name:34s} {t * 1e3:8.2f} CPU ms  {t / base:.2f}x the batched dot")


def batched_against_one_dot(blocks=40, rows=128, width=128, label="on every core"):
  """XLA:CPU's batched dot (the blocked form's: one weight per block) against one dot
  of the same rows and FLOPs: the part of the blocked form's cost that is XLA's."""
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(blocks, rows, width)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(blocks, width, width)), jnp.float32)
  batched = jax.jit(lambda x, w: jnp.einsum("bsI,bIO->bsO", x, w))
  one = jax.jit(lambda x, w: x.reshape(-1, width) @ w[0])
  def median_wall(f):  # a sub-millisecond call: below the process clock's resolution
    f(x, w)
    times = []
    for _ in range(200):
      t = time.perf_counter()
      jax.block_until_ready(f(x, w))
      times.append(time.perf_counter() - t)
    return float(np.median(times))
  t_b, t_1 = median_wall(batched), median_wall(one)
  print(f"{label} ({len(os.sched_getaffinity(0))}): "
        f"batched dot [{blocks}, {rows}, {width}] x [{blocks}, {width}, {width}]: "
        f"{t_b * 1e3:.3f} ms (wall, median); one dot of the same rows: {t_1 * 1e3:.3f} "
        f"({t_b / t_1:.2f}x)")


if __name__ == "__main__":
  main()
