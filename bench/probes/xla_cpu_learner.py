r"""Two XLA:CPU behaviours behind the learner's CPU time, each as the smallest program.

    python -m bench.probes.xla_cpu_learner

1. **A weight gradient over two row axes is computed from a transposed copy.**
   `grad(sum(sin(einsum("BTD,DF->BTF", x, w))))` w.r.t. `w`: XLA:CPU fuses the
   sine's gradient into a loop fusion that writes the `[B, T, F]` cotangent
   transposed, `[F, B·T]`, for a dot with `rhs_contracting_dims={1}`; with `x`
   flattened to `[B·T, D]` the same dot reads the cotangent as it is
   (`rhs_contracting_dims={0}`), no copy, bitwise the same gradient.
   (mipu_jax takes it back: `models.qwen3._proj_rows`.)
2. **Every execution page-faults its whole temporary buffer.** The PJRT CPU
   client allocates an executable's temporaries per execution with
   `posix_memalign` from an Eigen worker thread; glibc serves a block that large
   from a fresh `mmap` of a thread arena and unmaps it on free, so each call
   touches (zero-fills, faults in) every page again. Run in child processes:
   the default, and with glibc told to keep freed memory
   (`MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<large>`),
   which takes the faults and their kernel time away.

Prints, per case, the HLO evidence, whether results are bitwise equal, and CPU
times (fastest and median of repeats; user + kernel CPU of this process, which
a shared machine disturbs less than wall time).
"""

import argparse
import json
import os
import re
import resource
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

MALLOC_KEEP = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0",
               "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def _usage():
  r = resource.getrusage(resource.RUSAGE_SELF)
  return np.array([r.ru_utime, r.ru_stime, r.ru_minflt], np.float64)


def _repeat(fn, n):
  """`(cpu seconds per call, kernel seconds per call, page faults per call)` of
  `n` calls after a warm-up: the fastest call's CPU, medians of the rest."""
  fn()
  rows = []
  for _ in range(n):
    u0 = _usage()
    fn()
    rows.append(_usage() - u0)
  rows = np.array(rows)
  cpu = rows[:, 0] + rows[:, 1]
  return float(cpu.min()), float(np.median(cpu)), float(np.median(rows[:, 1])), float(
      np.median(rows[:, 2]))


def transposed_weight_gradient(b, t, d, f, repeats):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(d, f)) * 0.05, jnp.float32)
  variants = {
      "einsum BTD,DF->BTF": lambda w, x: jnp.sum(jnp.sin(jnp.einsum("BTD,DF->BTF", x, w))),
      "einsum MD,DF->MF (x flattened)": lambda w, x: jnp.sum(jnp.sin(
          jnp.einsum("MD,DF->MF", x.reshape(b * t, d), w))),
  }
  print(f"1. grad of sum(sin(x @ w)) w.r.t. w, x [{b}, {t}, {d}], w [{d}, {f}], fp32")
  grads = []
  for name, loss in variants.items():
    fn = jax.jit(jax.grad(loss))
    hlo = fn.lower(w, x).compile().as_text()
    copies = re.findall(r"%(\S*(?:copy|transpose)\S*) = (f32\[[\d,]+\])\S* fusion", hlo)
    dots = re.findall(r"= (f32\[[\d,]+\])\S* dot\(.*?lhs_contracting_dims=(\{[\d,]+\}), "
                      r"rhs_contracting_dims=(\{[\d,]+\})", hlo)
    grads.append(np.asarray(fn(w, x)))
    best, median, _, _ = _repeat(lambda fn=fn: jax.block_until_ready(fn(w, x)), repeats)
    print(f"   {name:32s} CPU {best * 1e3:6.1f} ms (median {median * 1e3:6.1f}); "
          f"transposing fusions {copies or 'none'}; weight-gradient dot "
          f"{[(s, 'lhs ' + l, 'rhs ' + r) for s, l, r in dots if s == f'f32[{d},{f}]']}")
  print(f"   gradients bitwise equal: {np.array_equal(*grads)}")


def _temp_child(rows, vocab, d, repeats):
  """In a child: the per-call faults of a program with a `[rows, vocab]` temporary."""
  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.normal(size=(rows, d)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(vocab, d)) * 0.05, jnp.float32)
  # log-softmax over a vocabulary: the [rows, vocab] logits are a temporary.
  fn = jax.jit(lambda h, w: jnp.sum(jax.nn.logsumexp(h @ w.T, axis=-1)))
  best, median, kernel, faults = _repeat(lambda: jax.block_until_ready(fn(h, w)), repeats)
  print(json.dumps(dict(best=best, median=median, kernel=kernel, faults=faults)))


def temporary_page_faults(rows, vocab, d, repeats):
  mb = rows * vocab * 4 / 2**20
  print(f"\n2. sum(logsumexp(h @ w.T)) with h [{rows}, {d}], w [{vocab}, {d}]: a {mb:.0f} MiB "
        "temporary, per call (child processes)")
  for name, env in (("glibc default", {}), ("MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 "
                                            "MALLOC_TRIM_THRESHOLD_=2^40", MALLOC_KEEP)):
    out = subprocess.run(
        [sys.executable, "-m", "bench.probes.xla_cpu_learner", "--child",
         json.dumps([rows, vocab, d, repeats])], capture_output=True, text=True, check=True,
        env={**os.environ, **env})
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"   {name:62s} CPU {r['best'] * 1e3:6.1f} ms (median {r['median'] * 1e3:6.1f}), "
          f"of it kernel {r['kernel'] * 1e3:5.1f} ms; {r['faults']:,.0f} page faults "
          f"({r['faults'] * 4 / 1024:.0f} MiB of 4 KiB pages)")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument("--child", default=None, help=argparse.SUPPRESS)
  a = p.parse_args()
  if a.child:
    _temp_child(*json.loads(a.child))
    return
  print(f"jax {jax.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n")
  transposed_weight_gradient(64, 96, 256, 768, a.repeats)
  temporary_page_faults(6144, 8192, 256, a.repeats)


if __name__ == "__main__":
  main()
