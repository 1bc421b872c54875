r"""One MoE layer's experts, forward + backward, on a CPU: the grouped matmul's dispatch
against a plain SwiGLU of the same active width (docs/method.md §7a).

    python -m bench.probes.moe_dispatch

The small task's MoE shape (2,048 tokens, D 128, 8 experts of width 128, top-2): the
`blocked` and `ragged_dot` forms of `moe.experts_mlp`, every expert on every token (the
test reference) and the dense twin, each `jax.grad` of a sum of squares through the
router. Process CPU seconds (both threads), fastest of 15 after a warm-up: under load
they move less than wall time. Runs at any commit with `moe.experts_mlp(h, hq, routing,
w, act_quant, impl)`, so before / after a dispatch change is one command at each.
"""

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
  n, d, f, e, k = 2048, 128, 128, 8, 2
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
  batched_against_one_dot()
  # The same two dots in a process held to one core: a dot that takes as long there
  # as on every core ran on one thread anyway.
  subprocess.run([sys.executable, "-c", "import os; os.sched_setaffinity(0, "
                  "{min(os.sched_getaffinity(0))}); from bench.probes import moe_dispatch; "
                  "moe_dispatch.batched_against_one_dot(label='on one core')"], check=True)


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
