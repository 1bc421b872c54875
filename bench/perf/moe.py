r"""MoE learner step and sampler against transformers' Qwen3-MoE on the same weights, and
against a dense model of the same active parameters (docs/method.md §7a).

    python -m bench.perf.moe [--batch 16 --seq 128 --repeats 5]
    python -m bench.perf.moe --hidden 512 --expert_width 512   # a wider model, same layout

In one run, on this machine (fp32, one device, torch on as many threads as jax has):
  * forward + backward of the mean token log-prob: mipu_jax's MoE (the grouped matmul
    `Qwen3Config.moe_impl` resolves to, and each implementation by name), transformers'
    `Qwen3MoeForCausalLM` loaded from our export (the same weights), and mipu_jax's dense
    Qwen3 whose MLP width equals the MoE's active width (k x expert width);
  * greedy decoding of `--new` tokens for `--batch` prompts: mipu_jax's `Sampler` and
    transformers' `generate` (its KV cache), same weights;
  * the MoE's own cost, like with like: each side's MoE step over its own dense twin's
    (transformers' `Qwen3ForCausalLM` loaded from our export of the dense twin), so the
    experts' dispatch is compared apart from each engine's dense speed on this host;
  * MFU on active parameters: 6 x active parameters x tokens / time against the
    machine's fp32 matmul peak measured in the same run (`bench/perf/model.py`).
Times are the fastest of `--repeats` after a warm-up. Prints a table and one JSON line.
"""

import argparse
import json
import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.perf.learner import _best_time as _best  # fastest of repeats after a warm-up
from bench.perf.learner import hf_fwd_bwd
from bench.perf.learner import host
from bench.perf.learner import host_line
from bench.perf.model import matmul_peak_gflops
from mipu_jax import models


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--new", type=int, default=64)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--hidden", type=int, default=128, help="model width D (head dim 32)")
  p.add_argument("--expert_width", type=int, default=128, help="each expert's SwiGLU width")
  p.add_argument("--experts", type=int, default=8)
  p.add_argument("--top_k", type=int, default=2)
  p.add_argument("--layers", type=int, default=3)
  a = p.parse_args()
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  threads = len(os.sched_getaffinity(0))  # the CPUs this process may use (taskset)
  torch.set_num_threads(threads)

  if a.hidden % 64:
    p.error(f"--hidden {a.hidden} must be a multiple of 64 (heads of 32, twice as many "
            "query heads as key-value heads)")
  heads = a.hidden // 32
  cfg = models.Qwen3Config(vocab_size=256, hidden_size=a.hidden, num_layers=a.layers,
                           num_heads=heads, num_kv_heads=heads // 2, head_dim=32,
                           intermediate_size=a.top_k * a.expert_width, tie_embeddings=True,
                           rope_theta=10_000.0, num_experts=a.experts,
                           num_experts_per_tok=a.top_k, moe_intermediate_size=a.expert_width,
                           norm_topk_prob=True)
  dense_cfg = cfg.replace(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0,
                          intermediate_size=cfg.num_experts_per_tok * cfg.moe_intermediate_size)
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, cfg.vocab_size, (a.batch, a.seq)).astype(np.int32)
  n_tok = a.batch * a.seq

  def fwd_bwd(model):
    graphdef, params = nnx.split(model, nnx.Param)
    x = jnp.asarray(tokens)

    def loss(params):
      m = nnx.merge(graphdef, params)
      lp = jax.nn.log_softmax(m(x).logits[:, :-1])
      return -jnp.mean(jnp.take_along_axis(lp, x[:, 1:, None], -1))

    step = jax.jit(jax.grad(loss))
    return lambda: jax.block_until_ready(step(params))

  model = models.Qwen3(cfg, rngs=nnx.Rngs(0))
  results = {}
  for impl in ("auto", "blocked", "ragged_dot"):
    m = models.Qwen3(cfg.replace(moe_impl=impl), rngs=nnx.Rngs(0))
    results[f"mipu_moe_{impl}"] = _best(fwd_bwd(m), a.repeats)
  results["mipu_dense_same_active"] = _best(fwd_bwd(models.Qwen3(dense_cfg, rngs=nnx.Rngs(0))),
                                            a.repeats)
  def load_hf(m):
    with tempfile.TemporaryDirectory() as d:
      models.save_pretrained(m, d)
      return transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)

  hf = load_hf(model)
  hf_dense = load_hf(models.Qwen3(dense_cfg, rngs=nnx.Rngs(0)))
  assert type(hf_dense).__name__ == "Qwen3ForCausalLM", type(hf_dense).__name__
  results["transformers_moe"] = _best(hf_fwd_bwd(hf, tokens), a.repeats)
  results["transformers_dense_same_active"] = _best(hf_fwd_bwd(hf_dense, tokens), a.repeats)

  # Greedy decoding, same weights.
  from mipu_jax.sampler import Sampler  # pylint: disable=g-import-not-at-top
  prompts = [list(map(int, t[:16])) for t in tokens]
  sampler = Sampler(model, max_concurrent_decodes=a.batch)
  gen = lambda: sampler.generate(prompts, max_new_tokens=a.new, temperature=0.0)
  results["mipu_moe_decode"] = _best(gen, max(2, a.repeats // 2))
  hf.eval()
  px = torch.tensor(np.asarray(prompts, np.int64))

  def hf_gen():
    with torch.no_grad():
      hf.generate(px, max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False,
                  pad_token_id=0)

  results["transformers_moe_decode"] = _best(hf_gen, max(2, a.repeats // 2))

  peak = matmul_peak_gflops()
  active = cfg.num_active_params()
  mfu = lambda t: 6 * active * n_tok / t / 1e9 / peak
  gen_tok = a.batch * a.new
  print(f"{host_line()}; {threads} threads each side; fp32 peak {peak:.0f} GFLOP/s")
  print(f"MoE: {cfg.num_params():,} parameters, {active:,} active; dense twin "
        f"{dense_cfg.num_params():,}; forward+backward of {a.batch} x {a.seq} tokens")
  print("| what | seconds | tokens/s | vs transformers | MFU (active) |")
  print("| --- | --- | --- | --- | --- |")
  for k in ("mipu_moe_auto", "mipu_moe_blocked", "mipu_moe_ragged_dot",
            "mipu_dense_same_active", "transformers_moe", "transformers_dense_same_active"):
    t = results[k]
    print(f"| {k} fwd+bwd | {t:.4f} | {n_tok / t:,.0f} | "
          f"{results['transformers_moe'] / t:.2f}x | {mfu(t):.1%} |")
  for k in ("mipu_moe_decode", "transformers_moe_decode"):
    t = results[k]
    print(f"| {k} ({a.new} new x {a.batch}) | {t:.4f} | {gen_tok / t:,.0f} | "
          f"{results['transformers_moe_decode'] / t:.2f}x | — |")
  ours = results["mipu_moe_auto"] / results["mipu_dense_same_active"]
  theirs = results["transformers_moe"] / results["transformers_dense_same_active"]
  print(f"MoE step over its dense twin's: mipu_jax {ours:.2f}x, transformers {theirs:.2f}x; "
        f"dense twin vs transformers' dense twin: "
        f"{results['transformers_dense_same_active'] / results['mipu_dense_same_active']:.2f}x")
  print(json.dumps({"host": host(), "threads": threads, "peak_gflops": peak,
                    "args": vars(a), **results}))


if __name__ == "__main__":
  main()
