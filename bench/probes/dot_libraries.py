r"""The learner's dots, one at a time: each matmul library XLA:CPU can use against torch's.

    python -m bench.probes.dot_libraries [--shapes tiny,mid,moe --rounds 5 --no_fused]

transformers trains on torch, whose fp32 matmul on x86 is MKL's sgemm; XLA:CPU (jax
0.10.2) has three: YNNPACK (its default for a lone dot), Eigen (`moe.EIGEN_DOTS`) and
oneDNN (`ONEDNN_DOTS`: experimental, `xla_cpu_use_onednn` with lone dots as the
oneDNN fusion type; both are needed for the rewrite to fire). This probe times, per dot
of the learner at a bench shape, each library's program and torch's on the same
operands, in interleaved rounds (fastest of `--rounds`, each round `calls` calls in a
row), so a host where MKL is the faster library shows it dot by dot:

  * `up`   `[T, D] . [D, F]`   the MLP's gate / up projection (forward);
  * `down` `[T, F] . [F, D]`   its down projection (forward);
  * `dx`   `[T, F] . [D, F]^T` an input gradient (contracting both on their last axis);
  * `dw`   `[T, D]^T . [T, F]` a weight gradient (contracting the tokens);
  * `head` `[C, D] . [V, D]^T` one LM-head chunk against the tied embedding: C = B x
    min(`logits_chunk`, T - 1) rows (`models.chunked_token_logprobs` chunks each row's
    predicting positions, all B rows at once), so the whole batch at these shapes.

Shapes: `tiny` / `mid` the dense learner bench's at T = 64 x 96 tokens (the
`--vs_transformers` batch); `moe` the MoE bench's dense layer body (`bench.perf.moe`'s
dense twin: D = 128, F = 256, V = 256) at T = 16 x 128 tokens. Each program's result is
compared with the YNNPACK one (largest absolute difference). Then, unless `--no_fused`, oneDNN's
other dot fusion type (`LIBRARY_FUSION_TYPE_DOT`, a dot with the elementwise ops around
it) on the smallest program a learner's backward holds, the sum of two dots (the input
gradient of q / k / v, or of gate / up), in a child process, because on the Intel AMX
host it ended the process: its exit status is printed. `bench.probes.learner_dots`
times whole learner steps with each library.
"""

import argparse
import os
import subprocess
import sys

import jax
import numpy as np

from bench.perf.learner import host_line
from bench.perf.learner import interleaved
from bench.perf.learner import shape_config
from bench.perf.moe import dense_twin
from bench.perf.moe import moe_config
from mipu_jax.config.training import LearnerConfig
from mipu_jax.models import moe

# XLA:CPU's lone dots by oneDNN. Only lone dots: oneDNN's fused type (below) aborted the
# process on a sum of two dots (bench/README.md, "The dot libraries on the Intel AMX host").
ONEDNN_DOTS = {"xla_cpu_use_onednn": True,
               "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
ONEDNN_FUSED = {"xla_cpu_use_onednn": True,
                "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"}
LIBRARIES = {"ynnpack (jax default)": {}, "eigen": moe.EIGEN_DOTS, "onednn": ONEDNN_DOTS}
BATCH = (64, 96)  # rows x tokens: bench.perf.learner --vs_transformers' batch
MOE_BATCH = (16, 128)  # bench.perf.moe's batch

# name: (einsum, lhs shape, rhs shape) from (T, D, F, V, C)
DOTS = {
    "up": ("td,df->tf", lambda t, d, f, v, c: ((t, d), (d, f))),
    "down": ("tf,fd->td", lambda t, d, f, v, c: ((t, f), (f, d))),
    "dx": ("tf,df->td", lambda t, d, f, v, c: ((t, f), (d, f))),
    "dw": ("td,tf->df", lambda t, d, f, v, c: ((t, d), (t, f))),
    "head": ("cd,vd->cv", lambda t, d, f, v, c: ((c, d), (v, d))),
}


def _fusion_kind(compiled) -> str:
  text = compiled.as_text()
  for kind in ("onednn", "ynn"):
    if f"__{kind}_fusion" in text:
      return kind
  return "eigen"


def dot_cases(shapes: str):
  """`[(label, einsum, lhs shape, rhs shape)]` for the learner's dots at `shapes`."""
  chunk = LearnerConfig().logits_chunk
  cases = []
  for name in shapes.split(","):
    if name == "moe":
      cfg, (b, t) = dense_twin(moe_config()), MOE_BATCH
    else:
      cfg, (b, t) = shape_config(name), BATCH
    # The head runs on chunks of min(chunk, T - 1) predicting positions of every row.
    dims = (b * t, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size,
            b * min(chunk, t - 1))
    for dot, (eq, shapes_of) in DOTS.items():
      cases.append((f"{name}: {dot}", eq, *shapes_of(*dims)))
  return cases


def flops(eq: str, sa, sb) -> int:
  """2 x the product of every index's size: the multiply-adds of `einsum(eq)`."""
  lhs, rhs = eq.split("->")[0].split(",")
  return 2 * int(np.prod(list({**dict(zip(lhs, sa)), **dict(zip(rhs, sb))}.values())))


def time_dot(eq, sa, sb, rounds):
  """`{library: (seconds per call, fusion kind, max |diff| from YNNPACK's)}` and torch's."""
  import torch  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  a_np = rng.standard_normal(sa, dtype=np.float32)
  b_np = rng.standard_normal(sb, dtype=np.float32)
  a, b = jax.numpy.asarray(a_np), jax.numpy.asarray(b_np)
  fn = jax.jit(lambda x, y: jax.numpy.einsum(eq, x, y))
  progs = {lib: fn.lower(a, b).compile(compiler_options=opts) for lib, opts in LIBRARIES.items()}
  ta, tb = torch.from_numpy(a_np), torch.from_numpy(b_np)
  torch_fn = lambda: torch.einsum(eq, ta, tb)  # `mm` / `mm` of a transposed view: MKL sgemm
  flop = flops(eq, sa, sb)
  calls = max(2, int(2e9 / flop))
  runs = {lib: (lambda p=p: jax.block_until_ready([p(a, b) for _ in range(calls)][-1]))
          for lib, p in progs.items()}
  runs["torch"] = lambda: [torch_fn() for _ in range(calls)][-1]
  best = {k: r.wall / calls for k, r in interleaved(runs, rounds).items()}
  ref = np.asarray(progs["ynnpack (jax default)"](a, b))
  out = {lib: (best[lib], _fusion_kind(p), float(np.abs(np.asarray(p(a, b)) - ref).max()))
         for lib, p in progs.items()}
  blas = "mkl" if torch.backends.mkl.is_available() else "torch"
  out["torch"] = (best["torch"], blas, float(np.abs(torch_fn().numpy() - ref).max()))
  return out, flop


FUSED_CHILD = """
import jax, jax.numpy as jnp
from bench.probes.dot_libraries import ONEDNN_FUSED
x = [jnp.ones(s) for s in ((2048, 256), (128, 256), (2048, 256), (128, 256))]
f = jax.jit(lambda a, b, c, d: a @ b.T + c @ d.T)
compiled = f.lower(*x).compile(compiler_options=ONEDNN_FUSED)
fusions = compiled.as_text().count("__onednn_fusion")
print(f"{fusions} oneDNN fusion(s); result", float(compiled(*x)[0, 0]), "(expected 512.0)")
"""


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--shapes", default="tiny,mid,moe")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--no_fused", action="store_true")
  a = p.parse_args()
  import torch  # pylint: disable=g-import-not-at-top
  threads = len(os.sched_getaffinity(0))
  torch.set_num_threads(threads)
  print(f"{host_line()}; {threads} threads each side; torch BLAS: "
        f"{'MKL' if torch.backends.mkl.is_available() else 'not MKL'}")
  libs = list(LIBRARIES) + ["torch"]
  print("GFLOP/s per call (fastest of the rounds); in brackets the program's dot library "
        "and its largest difference from YNNPACK's result\n")
  print("| dot | shape | " + " | ".join(libs) + " | best XLA / torch |")
  print("| --- | --- | " + " | ".join("---:" for _ in libs) + " | ---: |")
  for label, eq, sa, sb in dot_cases(a.shapes):
    out, flop = time_dot(eq, sa, sb, a.rounds)
    cells = [f"{flop / out[k][0] / 1e9:.0f} ({out[k][1]}, {out[k][2]:.0e})" for k in libs]
    best_xla = min(out[k][0] for k in LIBRARIES)
    print(f"| {label} | {eq} {sa} {sb} | " + " | ".join(cells)
          + f" | {out['torch'][0] / best_xla:.2f}x |", flush=True)
  if not a.no_fused:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    try:
      r = subprocess.run([sys.executable, "-c", FUSED_CHILD], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=path), check=False, timeout=600)
    except subprocess.TimeoutExpired:
      print(f"\nthe sum of two dots compiled with {ONEDNN_FUSED}: no result in 600 s")
      return
    lines = [l for l in (r.stdout + r.stderr).splitlines() if "fusion" in l or "failed" in l]
    last = (r.stdout + r.stderr).strip().splitlines()[-1:]  # a traceback's last line
    how = f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
    print(f"\nthe sum of two dots compiled with {ONEDNN_FUSED}: {how}; "
          f"{' / '.join(lines or last)[:300] or 'no output'}")


if __name__ == "__main__":
  main()
