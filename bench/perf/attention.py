r"""Attention at long context: dense vs blockwise (and cuDNN on a GPU), in one run.

    python -m bench.perf.attention                       # T = 1k, 2k, 4k, 8k; then the 9,216-token step
    python -m bench.perf.attention --lengths 1024,2048 --skip_step

Part 1, the attention op alone (`mipu_jax.models.attention.attend`), forward +
backward of `sum(out · w)` for one row of `T` tokens, 8 query heads over 4 KV
heads of 64, fp32, causal with the last 5% of the row padding:

- time: the fastest of `--repeats` calls after a warm-up;
- memory: XLA's `compiled.memory_analysis()` temporaries of that program
  (what the program allocates beyond its inputs and outputs: the `[T, S]`
  scores for dense, one `[block_q, block_k]` tile per head for blockwise).

Implementations: `dense` (the reference) and `blockwise` everywhere, `cudnn`
when the default device is a GPU (`jax.nn.dot_product_attention`'s cuDNN
kernel). The ratios blockwise / dense are printed beside each length.

Part 2, the learner: one `Learner.step` of the tiny Qwen3 (2 layers, D = 64) on
one (1,024 + 8,192)-token row — blockwise attention, log-probs from the LM head
in 1,024-position chunks, per-layer remat, as the pod configs run — actually
executed (not only compiled), each variant in its own process, with the
process's peak RSS (`ru_maxrss`) and the step's wall time. The peer is the same
step with dense attention and dense logits. On a GPU the same part prints the
step's tokens/s and MFU for a Qwen3-0.6B-shaped model at that length
(`--mfu_preset`).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _best_time(fn, repeats):
  fn()  # warm-up (compile)
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def bench_op(lengths, repeats, block):
  """Part 1 rows: (T, implementation, seconds, temp bytes)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from mipu_jax.models import attention  # pylint: disable=g-import-not-at-top

  impls = ["dense", "blockwise"]
  if jax.devices()[0].platform == "gpu":
    impls.append("cudnn")
  n, k, h = 8, 4, 64
  out = []
  for t in lengths:
    rng = np.random.default_rng(t)
    q = jnp.asarray(rng.normal(size=(1, t, n, h)), jnp.float32)
    kk = jnp.asarray(rng.normal(size=(1, t, k, h)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(1, t, k, h)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(1, t, n, h)), jnp.float32)
    valid = jnp.asarray(np.arange(t)[None, :] < int(t * 0.95))
    mask = attention.row_mask(valid)
    for impl in impls:
      def loss(q, kk, v, impl=impl):
        o = attention.attend(q, kk, v, mask, implementation=impl, block_q=block,
                             block_k=block, prefix_rows=True)
        return jnp.sum(o * w)
      f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
      temp = f.lower(q, kk, v).compile().memory_analysis().temp_size_in_bytes
      seconds = _best_time(lambda f=f: jax.block_until_ready(f(q, kk, v)), repeats)
      out.append((t, impl, seconds, temp))
      print(f"  T={t:5d} {impl:9s} {seconds * 1e3:9.1f} ms  temp {temp / 2**20:9.1f} MiB",
            file=sys.stderr, flush=True)
  return out


def step_child(attention_impl, logits_chunk, prompt, response, preset):
  """Part 2, in a child process: one learner step; prints a JSON line."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  from mipu_jax import models  # pylint: disable=g-import-not-at-top
  from bench.perf.model import one_row_learner, train_flops_per_token  # pylint: disable=g-import-not-at-top

  t = prompt + response
  gpu = jax.devices()[0].platform == "gpu"
  mcfg = dataclasses.replace(models.get_config(preset),
                             dtype="bfloat16" if gpu else "float32",
                             attention=attention_impl, remat="layer")
  learner, state, batch = one_row_learner(mcfg, prompt, response, logits_chunk)
  t0 = time.perf_counter()
  state, m = learner.step(state, batch)
  jax.block_until_ready((state, m))
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  state, m = learner.step(state, batch)
  jax.block_until_ready((state, m))
  seconds = time.perf_counter() - t0
  out = {"seconds": seconds, "first_call_seconds": first,
         "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
         "loss": float(m["actor/loss"]), "tokens": t,
         "params": sum(x.size for x in jax.tree.leaves(state.params))}
  if gpu:
    flops = train_flops_per_token(mcfg, t) * t
    out["tokens_per_second"] = t / seconds
    out["achieved_tflops"] = flops / seconds / 1e12
  print("RESULT " + json.dumps(out), flush=True)


def run_step(args, attention_impl, logits_chunk, preset):
  cmd = [sys.executable, "-m", "bench.perf.attention", "--child",
         f"{attention_impl},{logits_chunk},{args.prompt},{args.response},{preset}"]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  for line in proc.stdout.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[len("RESULT "):])
  tail = (proc.stderr or "").strip().splitlines()[-3:]
  return {"error": " / ".join(tail) or f"exit {proc.returncode}"}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--lengths", default="1024,2048,4096,8192")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--block", type=int, default=512)
  p.add_argument("--prompt", type=int, default=1024)
  p.add_argument("--response", type=int, default=8192)
  p.add_argument("--skip_step", action="store_true")
  p.add_argument("--skip_dense_step", action="store_true",
                 help="part 2 without the dense peer (it needs O(T²) memory)")
  p.add_argument("--mfu_preset", default="qwen3_0p6b",
                 help="GPU only: the model of the tokens/s and MFU line")
  p.add_argument("--peak_tflops", type=float, default=0.0,
                 help="GPU only: the device's dense peak (e.g. 989 for H100 bf16) for MFU")
  p.add_argument("--child", default="")
  args = p.parse_args()
  if args.child:
    impl, chunk, prompt, response, preset = args.child.split(",")
    step_child(impl, int(chunk), int(prompt), int(response), preset)
    return

  import jax  # pylint: disable=g-import-not-at-top
  print(f"device: {jax.devices()[0].device_kind} ({jax.devices()[0].platform}); "
        f"jax {jax.__version__}; load average {os.getloadavg()[0]:.1f}")
  lengths = [int(x) for x in args.lengths.split(",")]
  rows = bench_op(lengths, args.repeats, args.block)
  print("\n## Attention op, fwd + bwd, 1 row, 8 q / 4 kv heads of 64, fp32\n")
  print("| T | implementation | ms | temp MiB | time / dense | temp / dense |")
  print("|---:|---|---:|---:|---:|---:|")
  dense = {t: (s, m) for t, impl, s, m in rows if impl == "dense"}
  for t, impl, s, m in rows:
    print(f"| {t} | {impl} | {s * 1e3:.1f} | {m / 2**20:.1f} | "
          f"{s / dense[t][0]:.2f} | {m / max(dense[t][1], 1):.3f} |")
  for impl in sorted({r[1] for r in rows}):
    mem = [(t, m) for t, i, _, m in rows if i == impl]
    if len(mem) > 1:
      growth = mem[-1][1] / max(mem[0][1], 1)
      print(f"\n{impl}: temp memory x{growth:.1f} from T={mem[0][0]} to T={mem[-1][0]} "
            f"(x{mem[-1][0] / mem[0][0]:.0f} linear, x{(mem[-1][0] / mem[0][0])**2:.0f} "
            "quadratic)")
  if args.skip_step:
    return
  t = args.prompt + args.response
  print(f"\n## Learner step of the tiny Qwen3 on one {t}-token row (CPU-sized), run\n")
  print("| attention | logits | step s | first call s | peak RSS GiB | loss |")
  print("|---|---|---:|---:|---:|---:|")
  variants = [("blockwise", 1024)] + ([] if args.skip_dense_step else [("dense", 0)])
  for impl, chunk in variants:
    r = run_step(args, impl, chunk, "tiny")
    logits = f"chunks of {chunk}" if chunk else "dense"
    if "error" in r:
      print(f"| {impl} | {logits} | failed: {r['error']} | | | |")
    else:
      print(f"| {impl} | {logits} | {r['seconds']:.2f} | {r['first_call_seconds']:.1f} | "
            f"{r['peak_rss_gib']:.2f} | {r['loss']:.4f} |")
  if jax.devices()[0].platform == "gpu":
    for impl in ("cudnn", "blockwise"):
      r = run_step(args, impl, 1024, args.mfu_preset)
      if "error" in r:
        print(f"\n{args.mfu_preset} {impl}: failed: {r['error']}")
        continue
      mfu = (f", MFU {r['achieved_tflops'] / args.peak_tflops:.1%}"
             if args.peak_tflops else "")
      print(f"\n{args.mfu_preset} ({r['params'] / 1e6:.0f} M params), {impl}, one {t}-token "
            f"row: {r['tokens_per_second']:.0f} tokens/s, {r['achieved_tflops']:.1f} "
            f"TFLOP/s (bf16 matmuls, fp32 master; matmul FLOPs){mfu}")


if __name__ == "__main__":
  main()
