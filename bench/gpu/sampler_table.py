"""bench/gpu/accelerator.py's sampler part: tokens/s of `Sampler.generate` per precision
mode, beside the bound of the bytes an average decode step must read.

Split out of bench/gpu/accelerator.py (which runs it: `--parts sampler`); usable
alone from Python: `bench_sampler(args, rows, model_cfg, platform)`.
"""

import gc
import os
import sys
import time

# name -> Sampler precision keywords (bf16 compute throughout).
SAMPLER_MODES = {
    "bf16": {},
    "fp8 native": {"weight_quant": "fp8_e4m3", "act_quant": "fp8", "quant_compute": "native"},
    "fp8 emulated": {"weight_quant": "fp8_e4m3", "act_quant": "fp8"},
    "int8 native": {"weight_quant": "int8", "act_quant": "int8", "quant_compute": "native"},
    "bf16 + fp8 KV": {"kv_cache_dtype": "fp8"},
    "fp8 native + fp8 KV": {"weight_quant": "fp8_e4m3", "act_quant": "fp8",
                            "quant_compute": "native", "kv_cache_dtype": "fp8"},
    "int8 native + fp8 KV": {"weight_quant": "int8", "act_quant": "int8",
                             "quant_compute": "native", "kv_cache_dtype": "fp8"},
    # Not in the default list (CPU comparisons: --sampler_modes=...).
    "int8 emulated": {"weight_quant": "int8", "act_quant": "int8"},
    "int4 weight-only emulated": {"weight_quant": "int4"},
    "int4 weight-only native": {"weight_quant": "int4", "quant_compute": "native"},
    # The decode attentions compared (the modes above use 'auto': the Pallas
    # kernel on a GPU, the XLA paged path elsewhere; the TPU kernel by name).
    "bf16 paged XLA": {"decode_attention": "paged"},
    "bf16 pallas TPU": {"decode_attention": "pallas_tpu"},
    "bf16 dense": {"decode_attention": "dense"},
}
DEFAULT_SAMPLER_MODES = ("bf16", "fp8 native", "fp8 emulated", "int8 native", "bf16 + fp8 KV",
                         "fp8 native + fp8 KV", "int8 native + fp8 KV")



def _hlo_files(directory: str) -> set:
  if not directory or not os.path.isdir(directory):
    return set()
  return {f for f in os.listdir(directory) if f.endswith("after_optimizations.txt")}


def dot_kernels(directory: str, files) -> dict:
  """What XLA made of the matmuls in optimized HLO `files`: cuBLAS(Lt) calls by
  kind, and dots (in any fusion, e.g. Triton GEMMs) by operand type."""
  import re  # pylint: disable=g-import-not-at-top
  counts = {}
  define = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\w+)\[")
  for name in files:
    if not re.search(r"prefill|generate", name):
      continue
    types = {}
    with open(os.path.join(directory, name)) as f:
      for line in f:
        m = define.match(line)
        if m:
          types[m.group(1)] = m.group(2)
        for target in re.findall(r'custom_call_target="(__cublas[^"]*|__cudnn[^"]*)"', line):
          counts[target] = counts.get(target, 0) + 1
        m = re.search(r" dot\(%(\S+?), %(\S+?)\)", line)
        if m:
          key = f"dot({types.get(m.group(1), '?')} x {types.get(m.group(2), '?')})"
          counts[key] = counts.get(key, 0) + 1
  return counts


def decode_bound(sampler, cfg, rows: int, prompt: int, new: int, repeats: int) -> dict:
  """The bytes a decode step must read, on average over the `new` steps, and the
  tokens/s of reading them at the rate measured now (bench/perf/decode.py's `read`:
  a jitted sum over that many bytes); `vs_bound` = bound / measured tokens/s.

  Weights: every parameter the sampler holds, at its stored dtype (the tied
  head read whole). KV: every row's filled slots, `prompt + new / 2` on
  average, at the cache's dtype, scales included. Prefill is not counted: the
  bound is optimistic by its time.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from bench.perf.decode import bandwidth_times, kv_slot_bytes  # pylint: disable=g-import-not-at-top

  weights = sum(x.nbytes for x in jax.tree.leaves(sampler.params))
  kv_bytes = rows * (prompt + new / 2) * kv_slot_bytes(cfg, sampler.config.kv_cache_dtype)
  step_bytes = int(weights + kv_bytes)
  _, read_s = bandwidth_times(step_bytes, repeats)
  bound = rows / read_s
  return dict(step_gb=round(step_bytes / 1e9, 3), read_tb_s=round(step_bytes / read_s / 1e12, 2),
              bound_tokens_per_s=round(bound, 1))


def bench_sampler(args, rows: list, mcfg, platform: str) -> list[dict]:
  """Appends one row per mode to `rows` (the caller saves after each, through
  `args.on_row`); `mcfg` the model's config, `platform` the device's."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from mipu_jax import models  # pylint: disable=g-import-not-at-top
  from mipu_jax.sampler import Sampler  # pylint: disable=g-import-not-at-top

  model = models.Qwen3(mcfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  n, p, new = args.sampler_seqs, args.sampler_prompt, args.sampler_new
  prompts = rng.integers(10, mcfg.vocab_size, (n, p)).tolist()
  dtype = args.sampler_dtype or ("float32" if platform == "cpu" else "bfloat16")
  for name in args.sampler_modes.split(","):
    kw = SAMPLER_MODES[name]
    row = {"mode": name, **{k: str(v) for k, v in kw.items()}}
    before = _hlo_files(args.dump_hlo)
    try:
      sampler = Sampler(model, dtype=dtype, max_prefill_length=p, max_decode_length=new,
                        max_concurrent_decodes=n, **kw)
      t0 = time.perf_counter()
      out = sampler.generate(prompts, max_new_tokens=new, temperature=1.0, seed=0)
      first = time.perf_counter() - t0
      t0 = time.perf_counter()
      out = sampler.generate(prompts, max_new_tokens=new, temperature=1.0, seed=1)
      second = time.perf_counter() - t0
      tokens = sum(len(t) for t in out.tokens)
      row.update(tokens=tokens, first_call_s=round(first, 2), second_call_s=round(second, 3),
                 tokens_per_s=round(tokens / second, 1),
                 compile_s_approx=round(first - second, 2))
      row.update(decode_bound(sampler, mcfg, n, p, new, args.repeats_bound))
      impl = sampler.engine.decode_attention
      row["decode_attention"] = impl
      if impl == "pallas":  # the kernel's launch plan (bench/gpu/paged_kernel.py)
        row["pallas_plan"] = os.environ.get("MIPU_PALLAS_DECODE_PLAN", "") or "default"
      del sampler, out
    except Exception as e:  # pylint: disable=broad-except
      row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    if args.dump_hlo:
      row["kernels"] = dot_kernels(args.dump_hlo, _hlo_files(args.dump_hlo) - before)
    print(f"  sampler {name}: {row}", file=sys.stderr, flush=True)
    rows.append(row)
    args.on_row()
    gc.collect()
  base = next((r for r in rows if r["mode"] == "bf16" and "tokens_per_s" in r), None)
  for r in rows:
    if base and "tokens_per_s" in r:
      r["vs_bf16"] = round(r["tokens_per_s"] / base["tokens_per_s"], 3)
    if "bound_tokens_per_s" in r:
      r["vs_bound"] = round(r["bound_tokens_per_s"] / r["tokens_per_s"], 2)
  return rows
