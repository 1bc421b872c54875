r"""A reduced Qwen3-30B-A3B on one device: learner step and sampler through the grouped matmul.

    python -m bench.gpu.moe_step --json /tmp/moe.json          # a GPU: 2 layers of Qwen3-30B-A3B
    python -m bench.gpu.moe_step --tiny                        # the CPU smoke run (tiny_moe)

The `qwen3_30b_a3b` preset's dimensions (D 2,048, 32 / 4 heads of 128, 128 experts of
width 768, top-8, V 151,936, untied head) with `--layers` layers, random weights,
in one run:

- `experts`: the experts' SwiGLU alone (`moe.experts_mlp`, uniform routing) for
  `--expert_tokens` tokens (64: a decode step's rows; 512), per `--impls`
  (`ragged_dot`: `jax.lax.ragged_dot`; `blocked`: row blocks of one expert each, a
  batched dot), its time and TFLOP/s on the routed rows' own FLOPs;

then with each of `--impls` as the experts' `moe_impl` (the first's learner step and
sampler, then the others' samplers, then their learner steps):

- `learner`: the learner step (`bench/perf/model.one_row_learner`: MIPU Step 1's loss, fp32
  master weights + Adam, per-layer remat, bf16 matmuls on a GPU) on one
  (`--prompt` + `--response`)-token row: tokens/s, and MFU on active parameters
  (matmul FLOPs of forward + backward with each token's k experts and the
  router, causal attention) against the matmul peak measured in the same run;
- the sampler (`Sampler.generate`, temperature 1, no stop token) for `--seqs`
  sequences of `--sampler_prompt` + `--sampler_new` tokens: tokens/s of the second
  call against the bound of the bytes an average decode step must read
  (`bench/gpu/sampler_table.decode_bound`: every weight as stored, every expert
  among them, and the filled KV slots) at the read rate measured in the same run.

Times are the fastest of `--repeats` warm calls. Prints a table and writes `--json`.
"""

import argparse
import dataclasses
import gc
import json
import os
import sys
import time

import jax
import numpy as np
from flax import nnx

from bench.gpu.accelerator import matmul_peak_tflops
from bench.gpu.sampler_table import decode_bound
from bench.perf.model import one_row_learner
from mipu_jax import models
from mipu_jax.sampler import Sampler


def moe_train_flops_per_token(cfg: models.Qwen3Config, seq: int) -> float:
  """Matmul FLOPs of forward + backward per token on active parameters (3x forward): the
  attention projections, the router, k experts' SwiGLU, the head; causal QK / PV."""
  d, n, k, h, v = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                   cfg.vocab_size)
  mlp = (cfg.num_experts * d + cfg.num_experts_per_tok * 3 * d * cfg.moe_intermediate_size
         if cfg.is_moe else 3 * d * cfg.intermediate_size)
  per_layer = 2 * (d * n * h + 2 * d * k * h + n * h * d + mlp)
  attention = 2 * 2 * n * h * seq / 2
  return 3 * (cfg.num_layers * (per_layer + attention) + 2 * d * v)


def _fastest(fn, repeats: int) -> tuple[float, float]:
  """(first call s, fastest of `repeats` warm calls s)."""
  t0 = time.perf_counter()
  fn()
  first = time.perf_counter() - t0
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return first, best


def bench_experts(cfg, a, dtype: str) -> list[dict]:
  """The experts' SwiGLU (`moe.experts_mlp`: rows into the expert-sorted buffer, three
  grouped matmuls, back) for n tokens of k uniformly routed slots, per impl."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from mipu_jax.models import moe  # pylint: disable=g-import-not-at-top
  e, k, d, f = (cfg.num_experts, cfg.num_experts_per_tok, cfg.hidden_size,
                cfg.moe_intermediate_size)
  rng = np.random.default_rng(0)
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape) * 0.02, dtype)
  w = {"experts_gate": normal(e, d, f), "experts_up": normal(e, d, f),
       "experts_down": normal(e, f, d)}
  rows = []
  for n in (int(x) for x in a.expert_tokens.split(",")):
    h = jnp.asarray(rng.normal(size=(n, d)), dtype)
    experts = jnp.asarray(np.argsort(rng.random((n, e)), axis=1)[:, :k], jnp.int32)
    routing = moe.Routing(experts, jnp.full((n, k), 1 / k, dtype), jnp.zeros((n, e)))
    for impl in a.impls.split(","):
      row = dict(tokens=n, routed_rows=n * k, impl=impl)
      try:
        fn = jax.jit(lambda h, r, w, impl=impl: moe.experts_mlp(h, h, r, w, None, impl))
        first, best = _fastest(lambda: jax.block_until_ready(fn(h, routing, w)), a.repeats)
        row.update(ms=round(best * 1e3, 3), first_call_s=round(first, 2),
                   tflops=round(2 * n * k * 3 * d * f / best / 1e12, 2))
      except Exception as ex:  # pylint: disable=broad-except
        row["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
      print(f"  experts {row}", file=sys.stderr, flush=True)
      rows.append(row)
  return rows


def bench_learner(cfg, a, peak_tflops: float) -> dict:
  t = a.prompt + a.response
  learner, state, batch = one_row_learner(cfg, a.prompt, a.response, min(1024, t))
  holder = [state]

  def step():
    holder[0], m = learner.step(holder[0], batch)
    jax.block_until_ready((holder[0], m))

  first, best = _fastest(step, a.repeats)
  tflops = moe_train_flops_per_token(cfg, t) * t / best / 1e12
  stats = jax.devices()[0].memory_stats() or {}
  return dict(tokens=t, step_s=round(best, 4), first_call_s=round(first, 2),
              tokens_per_s=round(t / best, 1), model_tflops=round(tflops, 2),
              mfu_active=round(tflops / peak_tflops, 4) if peak_tflops else None,
              peak_device_gib=(round(stats["peak_bytes_in_use"] / 2**30, 2)
                               if "peak_bytes_in_use" in stats else None))


def bench_sampler(cfg, a, dtype: str) -> dict:
  model = models.Qwen3(cfg, rngs=nnx.Rngs(0))
  n, p, new = a.seqs, a.sampler_prompt, a.sampler_new
  prompts = np.random.default_rng(0).integers(10, cfg.vocab_size, (n, p)).tolist()
  sampler = Sampler(model, dtype=dtype, max_prefill_length=p, max_decode_length=new,
                    max_concurrent_decodes=n)
  seeds = iter(range(1000))
  tokens = []

  def gen():
    out = sampler.generate(prompts, max_new_tokens=new, temperature=1.0, seed=next(seeds))
    tokens.append(sum(len(t) for t in out.tokens))

  first, best = _fastest(gen, max(1, a.repeats - 1))
  row = dict(seqs=n, prompt=p, new=new, first_call_s=round(first, 2), second_call_s=round(best, 3),
             tokens_per_s=round(tokens[-1] / best, 1),
             decode_attention=sampler.engine.decode_attention)
  row.update(decode_bound(sampler, cfg, n, p, new, a.repeats))
  row["vs_bound"] = round(row["bound_tokens_per_s"] / row["tokens_per_s"], 2)
  return row


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--preset", default="qwen3_30b_a3b")
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--impls", default="blocked,ragged_dot",
                 help="the experts' moe_impl values, each timed (learner and sampler) in turn")
  p.add_argument("--expert_tokens", default="64,512")
  p.add_argument("--prompt", type=int, default=512)
  p.add_argument("--response", type=int, default=1536)
  p.add_argument("--seqs", type=int, default=64)
  p.add_argument("--sampler_prompt", type=int, default=256)
  p.add_argument("--sampler_new", type=int, default=256)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--parts", default="experts,learner,sampler")
  p.add_argument("--tiny", action="store_true", help="CPU smoke sizes (the tiny_moe preset)")
  p.add_argument("--json", default="")
  a = p.parse_args()
  cpu = jax.default_backend() == "cpu"
  if a.tiny:
    a.preset, a.layers, a.prompt, a.response, a.seqs = "tiny_moe", 2, 16, 48, 4
    a.sampler_prompt, a.sampler_new, a.repeats, a.expert_tokens = 16, 16, 2, "8"
  cfg = models.get_config(a.preset).replace(num_layers=a.layers)
  dtype = "float32" if cpu else "bfloat16"
  d = jax.devices()[0]
  out = dict(device=d.device_kind, platform=d.platform, jax=jax.__version__, preset=a.preset,
             layers=a.layers, impls=a.impls, params=cfg.num_params(),
             active_params=cfg.num_active_params(), dtype=dtype,
             load_average=round(os.getloadavg()[0], 2))
  out["peak_tflops"] = round(matmul_peak_tflops(1024 if cpu else 8192), 1)
  parts = a.parts.split(",")

  def save():
    if a.json:
      with open(a.json, "w") as f:
        json.dump(out, f, indent=1)

  if "experts" in parts:
    out["experts"] = bench_experts(cfg, a, dtype)
    save()
  # The first impl's learner and sampler, then the others' samplers before their learner
  # steps: where XLA lowers a grouped matmul as a dot padded to every expert (bench/README.md,
  # "The second window"), a step of thousands of tokens takes minutes.
  first, *rest = a.impls.split(",")
  order = ([("learner", first), ("sampler", first)] + [("sampler", i) for i in rest]
           + [("learner", i) for i in rest])
  for part, impl in order:
    if part not in parts:
      continue
    print(f"[{part}, {impl}]", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
      if part == "learner":
        lcfg = dataclasses.replace(cfg, dtype=dtype, remat="layer", moe_impl=impl,
                                   attention="cudnn" if d.platform == "gpu" else "dense")
        row = bench_learner(lcfg, a, out["peak_tflops"])
      else:
        row = bench_sampler(cfg.replace(moe_impl=impl), a, dtype)
    except Exception as e:  # pylint: disable=broad-except
      row = dict(error=f"{type(e).__name__}: {str(e)[:400]}")
    row.update(impl=impl, part_s=round(time.perf_counter() - t0, 1))
    out.setdefault(part, []).append(row)
    print(f"  {part}: {row}", file=sys.stderr, flush=True)
    gc.collect()
    save()
  print(report(out, a))


def report(out: dict, a) -> str:
  lines = [f"{out['preset']} with {out['layers']} layers ({out['params'] / 1e9:.2f}B parameters, "
           f"{out['active_params'] / 1e9:.3f}B active), {out['dtype']}, {out['device']}, jax "
           f"{out['jax']}; matmul peak {out['peak_tflops']} TFLOP/s measured in the same run", ""]
  if out.get("experts"):
    lines += ["| experts' SwiGLU | tokens (routed rows) | ms | TFLOP/s (routed rows) |",
              "|---|---:|---:|---:|"]
    for r in out["experts"]:
      lines.append(f"| {r['impl']} | {r['tokens']} ({r['routed_rows']}) | {r.get('ms', 'failed')}"
                   f" | {r.get('tflops', r.get('error', ''))} |")
    lines.append("")
  lines += ["| moe_impl | what | tokens/s | step / call s | MFU (active) or x bound "
            "| first call s |",
            "|---|---|---:|---:|---:|---:|"]
  for r in out.get("learner", []):
    what = f"learner step, 1 x ({a.prompt} + {a.response}) tokens"
    lines.append(f"| {r['impl']} | {what} | failed: {r['error']} | | | |" if "error" in r else
                 f"| {r['impl']} | {what} | {r['tokens_per_s']:,.0f} | {r['step_s']} | "
                 f"{r['mfu_active']:.1%} | {r['first_call_s']} |")
  for r in out.get("sampler", []):
    what = f"sampler, {a.seqs} x ({a.sampler_prompt} + {a.sampler_new})"
    lines.append(f"| {r['impl']} | {what} | failed: {r['error']} | | | |" if "error" in r else
                 f"| {r['impl']} | {what} | {r['tokens_per_s']:,.0f} | {r['second_call_s']} | "
                 f"{r['vs_bound']}x its bound ({r['bound_tokens_per_s']:,.0f} tokens/s, "
                 f"{r['step_gb']} GB a step at {r['read_tb_s']} TB/s) | {r['first_call_s']} |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
