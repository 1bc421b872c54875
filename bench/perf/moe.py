r"""MoE learner step and sampler against transformers' Qwen3-MoE on the same weights, and
against a dense model of the same active parameters (docs/method.md §7a).

    python -m bench.perf.moe [--batch 16 --seq 128 --repeats 5]
    python -m bench.perf.moe --hidden 512 --expert_width 512   # a wider model, same layout

In one run, on this machine (fp32, one device, torch on as many threads as jax has):
  * the learner step, as each side trains: mipu_jax's `Learner.step` (log-probs and
    entropy, the PPO loss, AdamW with clipping, every metric) and the same PPO update
    in torch on transformers' `Qwen3MoeForCausalLM` loaded from our export (the same
    starting weights; `bench.perf.learner.torch_learner_step`); where the learner picks
    its own XLA options (`moe.learner_compiler_options`) or unrolls its layers
    (`moe.learner_unroll_layers`), its step without each in turn too; where the
    default attention ("auto") runs the fused CPU kernel, the step with `dense` too;
  * forward + backward of the mean token log-prob with the learner's arithmetic:
    mipu_jax's MoE (the grouped matmul `Qwen3Config.moe_impl` resolves to, and each
    implementation by name), transformers' MoE, and on both sides the dense twin whose
    MLP width equals the MoE's active width (k x expert width);
  * greedy decoding of `--new` tokens for `--batch` prompts: mipu_jax's `Sampler` and
    transformers' `generate` (its KV cache), same weights;
  * the MoE's own cost, like with like: each side's MoE step over its own dense twin's
    (transformers' `Qwen3ForCausalLM` loaded from our export of the dense twin), so the
    experts' dispatch is compared apart from each engine's dense speed on this host;
  * MFU on active parameters: 6 x active parameters x tokens / time against the
    machine's fp32 matmul peak (`bench/perf/model.py`), timed in the same rounds;
  * each step's CPU use, user and kernel (mostly page faults: the kernel zero-fills
    every fresh page a call touches), and the size of the one buffer XLA allocates
    for the step's temporaries on every call.
Training times, and the peak's matmul, are the fastest of `--repeats` rounds in which
every program runs once (after a warm-up each), so load drift hits all alike; decoding
times the fastest of max(2, `--repeats // 2`) after a warm-up. Each transformers program
has its own copy of the model (the PPO steps move theirs). Prints a table and one JSON
line.
"""

import argparse
import json
import os
import tempfile

import jax
import numpy as np

from bench.perf.learner import _best_time as _best  # fastest of repeats after a warm-up
from bench.perf.learner import GLIBC_DEFAULTS
from bench.perf.learner import allocator
from bench.perf.learner import hf_fwd_bwd
from bench.perf.learner import host
from bench.perf.learner import host_line
from bench.perf.learner import interleaved
from bench.perf.learner import learner_fwd_bwd
from bench.perf.learner import load_hf
from bench.perf.learner import rl_batch
from bench.perf.learner import shape_learner
from bench.perf.learner import torch_learner_step
from bench.perf.model import matmul_peak_program
from mipu_jax import models
from mipu_jax.models import attention
from mipu_jax.models import cpu_attention

# glibc's ceiling for keeping a freed block in its heap (DEFAULT_MMAP_THRESHOLD_MAX on
# 64-bit): a larger one is unmapped on free and mapped, page-faulted, afresh next time.
GLIBC_MMAP_MAX = 32 << 20

# Table rows of the training programs, in order: (key, what).
TRAIN_ROWS = (
    ("step/mipu_moe", "mipu_jax MoE `Learner.step`"),
    ("step/mipu_moe_scan", "mipu_jax MoE `Learner.step`, its XLA options, the layer scan"),
    ("step/mipu_moe_jax_default", "mipu_jax MoE `Learner.step`, jax's default XLA options, "
     "the layer scan"),
    ("step/mipu_moe_dense_attention", "mipu_jax MoE `Learner.step`, `attention=\"dense\"`"),
    ("step/transformers_moe", "transformers MoE, the same PPO step in torch"),
    ("step/mipu_dense", "mipu_jax dense twin `Learner.step`"),
    ("step/mipu_dense_dense_attention", "mipu_jax dense twin `Learner.step`, "
     "`attention=\"dense\"`"),
    ("step/transformers_dense", "transformers dense twin, PPO step"),
    ("fwd_bwd/mipu_moe_auto", "mipu_jax MoE fwd+bwd (`moe_impl` auto)"),
    ("fwd_bwd/mipu_moe_blocked", "mipu_jax MoE fwd+bwd, `blocked`"),
    ("fwd_bwd/mipu_moe_ragged_dot", "mipu_jax MoE fwd+bwd, `ragged_dot`"),
    ("fwd_bwd/transformers_moe", "transformers MoE fwd+bwd"),
    ("fwd_bwd/mipu_dense", "mipu_jax dense twin fwd+bwd"),
    ("fwd_bwd/transformers_dense", "transformers dense twin fwd+bwd"),
)


def moe_config(hidden=128, expert_width=128, experts=8, top_k=2, layers=3, vocab=256):
  """The bench's MoE (defaults: the dimensions of the small task's tiny MoE policy,
  with a vocabulary of 256 where the policy's is 20): heads of 32, twice as many query
  heads as key-value heads, tied embeddings."""
  heads = hidden // 32
  return models.Qwen3Config(vocab_size=vocab, hidden_size=hidden, num_layers=layers,
                            num_heads=heads, num_kv_heads=heads // 2, head_dim=32,
                            intermediate_size=top_k * expert_width, tie_embeddings=True,
                            rope_theta=10_000.0, num_experts=experts,
                            num_experts_per_tok=top_k, moe_intermediate_size=expert_width,
                            norm_topk_prob=True)


def dense_twin(cfg: models.Qwen3Config) -> models.Qwen3Config:
  """`cfg` with one dense SwiGLU of its active width (k x expert width) per layer."""
  return cfg.replace(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0,
                     intermediate_size=cfg.num_experts_per_tok * cfg.moe_intermediate_size)


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--prompt", type=int, default=32,
                 help="prompt tokens per row of the learner step (no loss on them)")
  p.add_argument("--new", type=int, default=64)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--hidden", type=int, default=128, help="model width D (head dim 32)")
  p.add_argument("--expert_width", type=int, default=128, help="each expert's SwiGLU width")
  p.add_argument("--experts", type=int, default=8)
  p.add_argument("--top_k", type=int, default=2)
  p.add_argument("--layers", type=int, default=3)
  p.add_argument("--vocab", type=int, default=256,
                 help="vocabulary (tied embeddings); 8192 is the dense learner's `tiny` shape")
  a = p.parse_args()
  threads = len(os.sched_getaffinity(0))  # the CPUs this process may use (taskset)

  if a.hidden % 64:
    p.error(f"--hidden {a.hidden} must be a multiple of 64 (heads of 32, twice as many "
            "query heads as key-value heads)")
  if a.batch % 4 or not 0 < a.prompt < a.seq:
    p.error("--batch must be a multiple of 4 (groups of 4) and 0 < --prompt < --seq")
  cfg = moe_config(a.hidden, a.expert_width, a.experts, a.top_k, a.layers, a.vocab)
  dense_cfg = dense_twin(cfg)
  data = rl_batch(cfg.vocab_size, a.batch, a.seq, a.prompt)  # tokens, masks, lp_old, adv
  tokens = data[0]
  n_tok = a.batch * a.seq

  def ours(mcfg, compiler_options=None, unroll_layers=None):
    """`(model, Learner.step as a call, fwd+bwd as a call, the learner's XLA options,
    whether its step unrolls the layers)`: one device, seed-0 weights."""
    model, learner, state, rl = shape_learner(mcfg, a.batch, a.seq, a.prompt,
                                              compiler_options, unroll_layers)
    if mcfg.is_moe not in temps:  # the first, the learner's own: its step's temporaries
      stats = learner.lower_step_on(state, rl).compile().memory_analysis()
      temps[mcfg.is_moe] = stats.temp_size_in_bytes if stats is not None else 0

    def step():  # the same state each time: every call does the same work
      jax.block_until_ready(learner.step(state, rl))

    return (model, step, learner_fwd_bwd(model, learner, tokens), learner.compiler_options,
            learner.spec.unroll_layers)

  def theirs(model):
    with tempfile.TemporaryDirectory() as d:
      models.save_pretrained(model, d)
      return load_hf(d, threads)

  fns, temps = {}, {}
  model, fns["step/mipu_moe"], fns["fwd_bwd/mipu_moe_auto"], options, unrolled = ours(cfg)
  # The learner's own choices for a CPU (`moe.learner_compiler_options`,
  # `moe.learner_unroll_layers`), each taken back in turn, in the same rounds.
  if unrolled:
    fns["step/mipu_moe_scan"] = ours(cfg, unroll_layers=False)[1]
  if options:
    fns["step/mipu_moe_jax_default"] = ours(cfg, compiler_options={}, unroll_layers=False)[1]
  for impl in ("blocked", "ragged_dot"):
    fns[f"fwd_bwd/mipu_moe_{impl}"] = ours(cfg.replace(moe_impl=impl))[2]
  dense, fns["step/mipu_dense"], fns["fwd_bwd/mipu_dense"], *_ = ours(dense_cfg)
  # The default attention ("auto") is the fused CPU kernel where it builds: `dense` beside it.
  runs = attention.resolve(cfg.attention, cfg.dtype)
  if runs != "dense":
    fns["step/mipu_moe_dense_attention"] = ours(cfg.replace(attention="dense"))[1]
    fns["step/mipu_dense_dense_attention"] = ours(dense_cfg.replace(attention="dense"))[1]
  hf = theirs(model)
  hf_dense = theirs(dense)
  assert type(hf).__name__ == "Qwen3MoeForCausalLM", type(hf).__name__
  assert type(hf_dense).__name__ == "Qwen3ForCausalLM", type(hf_dense).__name__
  fns["step/transformers_moe"] = torch_learner_step(hf, *data)
  fns["step/transformers_dense"] = torch_learner_step(hf_dense, *data)
  # Forward + backward on copies of their own: the PPO steps move their model's weights.
  fns["fwd_bwd/transformers_moe"] = hf_fwd_bwd(theirs(model), tokens)
  fns["fwd_bwd/transformers_dense"] = hf_fwd_bwd(theirs(dense), tokens)
  peak_call, peak_flops = matmul_peak_program()
  fns["peak/matmul"] = peak_call  # in the same rounds: this host's speed drifts
  timed = interleaved(fns, a.repeats)
  results = {k: t.wall for k, t in timed.items()}
  del fns, hf, hf_dense  # their buffers and optimizer states, before decoding

  # Greedy decoding, same weights.
  import torch  # pylint: disable=g-import-not-at-top
  from mipu_jax.sampler import Sampler  # pylint: disable=g-import-not-at-top
  prompts = [list(map(int, t[:16])) for t in tokens]
  sampler = Sampler(model, max_concurrent_decodes=a.batch)
  gen = lambda: sampler.generate(prompts, max_new_tokens=a.new, temperature=0.0)
  results["decode/mipu_moe"] = _best(gen, max(2, a.repeats // 2))
  hf = theirs(model)  # the PPO steps above moved the first copy's weights
  hf.eval()
  px = torch.tensor(np.asarray(prompts, np.int64))

  def hf_gen():
    with torch.no_grad():
      hf.generate(px, max_new_tokens=a.new, min_new_tokens=a.new, do_sample=False,
                  pad_token_id=0)

  results["decode/transformers_moe"] = _best(hf_gen, max(2, a.repeats // 2))

  peak = peak_flops / results["peak/matmul"] / 1e9
  active = cfg.num_active_params()
  mfu = lambda t: 6 * active * n_tok / t / 1e9 / peak
  gen_tok = a.batch * a.new
  print(f"{host_line()}; {threads} threads each side; fp32 peak {peak:.0f} GFLOP/s")
  print(f"MoE: {cfg.num_params():,} parameters, {active:,} active; dense twin "
        f"{dense_cfg.num_params():,}; {a.batch} x {a.seq} tokens ({a.prompt} prompt), "
        f"fastest of {a.repeats} interleaved rounds; the MoE learner's XLA options "
        f"{options or 'jax defaults'}, its layer scan {'unrolled' if unrolled else 'a scan'}")
  why = cpu_attention.error() if runs == "dense" else ""
  print(f"attention {cfg.attention!r} runs {runs!r} here" + (f" ({why})" if why else ""))
  print("| what | seconds | tokens/s | vs transformers' MoE | MFU (active) |")
  print("| --- | --- | --- | --- | --- |")
  for key, what in TRAIN_ROWS:
    if key not in results:
      continue
    t, ref = results[key], results[key.split("/")[0] + "/transformers_moe"]
    print(f"| {what} | {t:.4f} | {n_tok / t:,.0f} | {ref / t:.2f}x | {mfu(t):.1%} |")
  for key, what in (("decode/mipu_moe", "mipu_jax `Sampler`"),
                    ("decode/transformers_moe", "transformers `generate`")):
    t = results[key]
    print(f"| {what}, greedy, {a.batch} x {a.new} new | {t:.4f} | {gen_tok / t:,.0f} | "
          f"{results['decode/transformers_moe'] / t:.2f}x | — |")
  for what in ("step", "fwd_bwd"):
    r = lambda k: results[f"{what}/{k}"]
    ours_ = r("mipu_moe" if what == "step" else "mipu_moe_auto") / r("mipu_dense")
    print(f"{what}: MoE over its dense twin's: mipu_jax {ours_:.2f}x"
          f"{' (the MoE unrolled, the twin a scan)' if unrolled else ''}, transformers "
          f"{r('transformers_moe') / r('transformers_dense'):.2f}x; dense twin vs "
          f"transformers' dense twin: {r('transformers_dense') / r('mipu_dense'):.2f}x")
  # The note holds only under glibc's own malloc, whose settings stay at their defaults.
  big = max(temps.values()) > GLIBC_MMAP_MAX and allocator() == GLIBC_DEFAULTS
  print("CPU use per step (medians of the rounds; all threads): mipu_jax's XLA step "
        f"allocates its temporaries as one buffer per call, {temps[True] / 2**20:.0f} MiB "
        f"(the MoE) and {temps[False] / 2**20:.0f} MiB (the twin)" + (
            "; glibc's malloc maps a block above 32 MiB afresh on every call (bench/README.md, "
            "\"Kernel time and idle cores\")" if big else ""))
  print("| what | CPU ms | user ms | kernel ms | minor page faults | cores busy |")
  print("| --- | --- | --- | --- | --- | --- |")
  for key, what in TRAIN_ROWS:
    if key.startswith("step/") and key in timed:
      t = timed[key]
      print(f"| {what} | {t.cpu * 1e3:.0f} | {(t.cpu - t.kernel) * 1e3:.0f} | "
            f"{t.kernel * 1e3:.0f} | {t.faults:,.0f} | {t.cpu / t.wall_median:.2f} |")
  usage = {k: {"cpu_s": t.cpu, "kernel_s": t.kernel, "minor_faults": t.faults,
               "wall_median_s": t.wall_median} for k, t in timed.items()}
  print(json.dumps({"host": host(), "threads": threads, "peak_gflops": peak,
                    "args": vars(a), **results, "usage": usage,
                    "xla_temp_bytes": {"moe": temps[True], "dense": temps[False]}}))


if __name__ == "__main__":
  main()
