r"""The learner's attention core on a CPU against torch's fused one, at the bench shapes.

    python -m bench.probes.attention_core [--shapes moe,tiny --rounds 9 --calls 10]

On a CPU the learner runs `attention.attend(implementation="dense")` (`_dense`: scores
einsum, mask, softmax, PV einsum; docs/method.md has no formula here, it is the model's
own attention). transformers trains through torch's `scaled_dot_product_attention`, one
fused kernel (flash attention on a CPU, skipping the causal mask's empty half). This
probe times forward + backward of `sum(out * w)` for the same causal, GQA inputs, in
interleaved rounds (fastest of `--rounds`, each round `--calls` calls in a row):

  * `dense`, jax's default XLA options and `moe.EIGEN_DOTS` (the MoE learner's);
  * `blockwise` (`attend`'s tiled form, 64 x 64 tiles), jax's defaults;
  * `cpu_fused` (`attend`'s XLA:CPU kernel through jax's FFI, `models/cpu_attention.py`),
    left out with the reason printed where it cannot be built;
  * `head_major`, a layout the library does not use (q, k, v transposed to heads first
    once, the same einsums): what that layout alone would buy, and whether its
    results equal `dense`'s bit for bit (they need not: the dots sum in another order);
  * torch's `scaled_dot_product_attention(is_causal=True, enable_gqa=True)`.

Shapes (`[B, T]`, query heads over KV heads, head dim): `moe` the MoE bench's (16 x 128,
4 over 2, 32), `tiny` the dense learner bench's (64 x 96, 8 over 4, 32); on request `mid`
(64 x 96, 16 over 8, 64) and `long` (4 x 1024, 8 over 4, 64). The largest
difference of each output and gradient from `dense`'s under jax's defaults is printed.
"""

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

from bench.perf.learner import host_line
from bench.perf.learner import interleaved
from mipu_jax.models import attention
from mipu_jax.models import cpu_attention
from mipu_jax.models import moe

SHAPES = {"moe": (16, 128, 4, 2, 32), "tiny": (64, 96, 8, 4, 32),  # B, T, N, K, H
          "mid": (64, 96, 16, 8, 64), "long": (4, 1024, 8, 4, 64)}


def head_major(q_BTKQH, k_BSKH, v_BSKH, mask_BTS):
  """`attention._dense` with q, k, v transposed heads-first before the einsums."""
  h = q_BTKQH.shape[-1]
  q_BKQTH = q_BTKQH.transpose(0, 2, 3, 1, 4)
  k_BKSH, v_BKSH = k_BSKH.transpose(0, 2, 1, 3), v_BSKH.transpose(0, 2, 1, 3)
  scores = jnp.einsum("BKQTH,BKSH->BKQTS", q_BKQTH, k_BKSH,
                      preferred_element_type=jnp.float32) * (h ** -0.5)
  scores = jnp.where(mask_BTS[:, None, None], scores, attention.NEG_INF)
  probs = jax.nn.softmax(scores, axis=-1).astype(v_BKSH.dtype)
  return jnp.einsum("BKQTS,BKSH->BKQTH", probs, v_BKSH).transpose(0, 3, 1, 2, 4)


def jax_programs(q, k, v, w):
  """`{name: compiled value-and-grad}` of `sum(out * w)` w.r.t. q, k, v; each builds
  its causal mask in the program from the rows' token mask, as the learner does."""
  b, t, n, h = q.shape
  kh = k.shape[2]

  def attend(impl):
    def f(q, k, v):
      mask = attention.row_mask(jnp.ones((b, t), bool))
      if impl == "head_major":
        return head_major(q.reshape(b, t, kh, n // kh, h), k, v,
                          mask.dense_BTS()).reshape(b, t, n, h)
      return attention.attend(q, k, v, mask, implementation=impl, block_q=64, block_k=64)
    return f

  cases = {"dense": ("dense", {}), "dense, EIGEN_DOTS": ("dense", moe.EIGEN_DOTS),
           "blockwise": ("blockwise", {}), "head_major": ("head_major", {})}
  if not cpu_attention.error():
    cases["cpu_fused"] = ("cpu_fused", {})
  out = {}
  for name, (impl, options) in cases.items():
    f = attend(impl)
    g = jax.jit(jax.value_and_grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v) * w), (0, 1, 2)))
    out[name] = g.lower(q, k, v).compile(compiler_options=options)
  return out


def torch_step(q, k, v, w):
  """torch: forward + backward of `sum(sdpa(q, k, v) * w)` on `[B, N, T, H]` views."""
  import torch  # pylint: disable=g-import-not-at-top
  tq, tk, tv = (torch.tensor(np.asarray(x)).transpose(1, 2).contiguous().requires_grad_()
                for x in (q, k, v))
  tw = torch.tensor(np.asarray(w)).transpose(1, 2).contiguous()

  def run():
    for x in (tq, tk, tv):
      x.grad = None
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True,
                                                           enable_gqa=True)
    (out * tw).sum().backward()
    return out
  return run


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--shapes", default="moe,tiny")
  p.add_argument("--rounds", type=int, default=9)
  p.add_argument("--calls", type=int, default=10)
  a = p.parse_args()
  import torch  # pylint: disable=g-import-not-at-top
  threads = len(os.sched_getaffinity(0))
  torch.set_num_threads(threads)
  print(f"{host_line()}; {threads} threads each side")
  print("forward + backward of sum(attention(q, k, v) * w), causal; ms per call, fastest "
        "of the rounds\n")
  names = ["dense", "dense, EIGEN_DOTS", "blockwise", "head_major"]
  if cpu_attention.error():
    print(f"cpu_fused left out: {cpu_attention.error()}\n")
  else:
    names.append("cpu_fused")
  print("| shape | " + " | ".join(names + ["torch sdpa"]) + " | dense / torch | "
        + ("cpu_fused / torch | " if "cpu_fused" in names else "") + "head_major: max diff |")
  print("| --- |" + " ---: |" * (len(names) + 3 + ("cpu_fused" in names)))
  for name in a.shapes.split(","):
    b, t, n, kh, h = SHAPES[name]
    rng = np.random.default_rng(0)
    q, w = (jnp.asarray(rng.standard_normal((b, t, n, h), dtype=np.float32)) for _ in range(2))
    k, v = (jnp.asarray(rng.standard_normal((b, t, kh, h), dtype=np.float32)) for _ in range(2))
    progs = jax_programs(q, k, v, w)
    runs = {nm: (lambda pr=pr: jax.block_until_ready([pr(q, k, v) for _ in range(a.calls)]))
            for nm, pr in progs.items()}
    tstep = torch_step(q, k, v, w)
    runs["torch sdpa"] = lambda: [tstep() for _ in range(a.calls)]
    best = {nm: r.wall / a.calls for nm, r in interleaved(runs, a.rounds).items()}
    ref = jax.tree.leaves(progs["dense"](q, k, v))
    diffs = {nm: max(float(np.abs(np.asarray(x) - np.asarray(y)).max())
                     for x, y in zip(ref, jax.tree.leaves(pr(q, k, v))))
             for nm, pr in progs.items()}
    cells = [f"{best[nm] * 1e3:.2f}" for nm in runs]
    print(f"| {name} ({b} x {t}, {n} / {kh} heads of {h}) | " + " | ".join(cells)
          + f" | {best['dense'] / best['torch sdpa']:.2f}x | "
          + (f"{best['cpu_fused'] / best['torch sdpa']:.2f}x | " if "cpu_fused" in best else "")
          + ("bitwise" if diffs["head_major"] == 0 else f"{diffs['head_major']:.1e}") + " |",
          flush=True)
    print("  largest difference from `dense` (outputs, gradients): "
          + ", ".join(f"{nm} {d:.1e}" for nm, d in diffs.items() if nm != "dense"))


if __name__ == "__main__":
  main()
