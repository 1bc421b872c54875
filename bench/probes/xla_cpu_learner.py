r"""Three XLA:CPU behaviours behind the learner's CPU time, each as the smallest program.

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
3. **YNNPACK's dots lose on batched dots of small matrices.** jax 0.10.2's XLA:CPU
   compiles a lone dot into a YNNPACK fusion (`__ynn_fusion`); against the same
   programs compiled with `moe.EIGEN_DOTS` (Eigen's dots), per dot shape: a batched
   dot of 40 blocks of 128 rows (the MoE experts' blocked form), attention's scores
   at head dim 32, and single dots of 128 and 2,048 rows. Each pair in alternation.
   (mipu_jax takes the batched case: `moe.learner_compiler_options`.)

Prints, per case, the HLO evidence, whether results are bitwise equal, and CPU
times (fastest and median of repeats; user + kernel CPU of this process, which
a shared machine disturbs less than wall time); case 3, which is about threads,
its wall time beside its CPU time.
"""

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time

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


def _wall_and_cpu(fn, n):
  """`(wall s, CPU s)` per call over `n` calls in a row after a warm-up (a
  sub-millisecond call is below the CPU clock's resolution; n of them are not)."""
  fn()
  u0, t0 = _usage(), time.perf_counter()
  for _ in range(n):
    fn()
  t, u = time.perf_counter() - t0, _usage() - u0
  return t / n, (u[0] + u[1]) / n


def ynn_against_eigen(repeats):
  from mipu_jax.models.moe import EIGEN_DOTS  # pylint: disable=g-import-not-at-top
  print("\n3. the same dot compiled by default (YNNPACK fusion) and with "
        f"{EIGEN_DOTS} (Eigen), fp32; wall ms a call over {repeats} calls in a row, the "
        "fastest of 3 such runs each, alternated; CPU / wall: the threads it kept busy")
  cases = (("batched dot, 40 blocks: [40,128,128] . [40,128,256]", "bsI,bIO->bsO",
            (40, 128, 128), (40, 128, 256)),
           ("attention scores: [64,128,32] . [64,128,32]^T", "bqd,bkd->bqk",
            (64, 128, 32), (64, 128, 32)),
           ("single dot: [128,512] . [512,512]", "sI,IO->sO", (128, 512), (512, 512)),
           ("single dot: [2048,128] . [128,256]", "sI,IO->sO", (2048, 128), (128, 256)))
  rng = np.random.default_rng(0)
  for name, eq, sa, sb in cases:
    x = jnp.asarray(rng.normal(size=sa), jnp.float32)
    w = jnp.asarray(rng.normal(size=sb), jnp.float32)
    dot = lambda x, w, eq=eq: jnp.einsum(eq, x, w)
    fns = {"ynn": jax.jit(dot), "eigen": jax.jit(dot, compiler_options=EIGEN_DOTS)}
    fused = {k: "__ynn_fusion" in f.lower(x, w).compile().as_text() for k, f in fns.items()}
    runs = {k: [] for k in fns}
    for _ in range(3):  # alternated, so drift hits both
      for k, f in fns.items():
        runs[k].append(_wall_and_cpu(lambda f=f: jax.block_until_ready(f(x, w)), repeats))
    (yw, yc), (ew, ec) = min(runs["ynn"]), min(runs["eigen"])
    same = np.array_equal(np.asarray(fns["ynn"](x, w)), np.asarray(fns["eigen"](x, w)))
    print(f"   {name:52s} YNNPACK {yw * 1e3:6.3f} ms (CPU / wall {yc / yw:.1f}, fusion "
          f"{fused['ynn']}), Eigen {ew * 1e3:6.3f} ms (CPU / wall {ec / ew:.1f}, fusion "
          f"{fused['eigen']}): Eigen/YNNPACK {ew / yw:.2f}; bitwise equal: {same}")


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
  ynn_against_eigen(a.repeats * 4)


if __name__ == "__main__":
  main()
