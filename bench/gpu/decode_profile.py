r"""Where one decode step's time goes: a profile reduced to kernel classes, against the bound.

    python -m bench.gpu.decode_profile --out /tmp/prof        # a GPU: 64 x (1,024 + 1,024)
    python -m bench.gpu.decode_profile --tiny --out /tmp/prof # the CPU smoke run

For each KV-cache mode (`--modes`: bf16, FP8 KV), one engine decode step
(`Engine.generate_step`, the decode attention `auto` picks: the Pallas kernel on
a GPU) on rows filled to `--fill` slots (default: the table's average, prompt +
new / 2), in one process:

- `step`: the best of `--repeats` runs of `--steps` back-to-back steps (the state
  donated and carried, as the sampler runs them), per step, no profiler on;
- the step's byte bound: the bytes it must read (every row's filled K/V slots,
  every weight once: `bench/perf/decode.py`) at the read rate measured now (a
  jitted sum over as many bytes);
- a `jax.profiler` trace of `--steps` more steps, reduced here (`xprof_table`) to a
  table of kernel classes with their time per step, their share of the kernels'
  sum and of the step, and each class's own byte bound where it has one. XLA runs
  a command buffer's kernels one by one while a profiler is on, so the kernels'
  sum is compared with the step measured without it.

Writes `profile.md` / `profile.json` and each mode's optimized HLO (`hlo_<mode>.txt.gz`)
in `--out`; the trace itself stays in a temporary directory unless it could not be
reduced (then `trace_<mode>.xplane.pb.gz`, to reduce elsewhere).
"""

import argparse
import gzip
import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
from flax import nnx

from bench.gpu import xprof_table
from bench.perf.decode import bandwidth_times, filled_state, kv_slot_bytes, weight_bytes
from mipu_jax.models import Qwen3, get_config
from mipu_jax.sampler import engine as engine_lib
from mipu_jax.sampler.config import SamplerConfig

MODES = {"bf16": None, "fp8 KV": "fp8"}


def class_bytes(cfg, dtype, kv_dtype, rows: int, fill: int) -> dict:
  """Bytes each class must read in one step (weights at the compute dtype)."""
  it = jnp.dtype(dtype).itemsize
  d, f, n, k, h, lay = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                        cfg.num_kv_heads, cfg.head_dim, cfg.num_layers)
  return {"attention": rows * fill * kv_slot_bytes(cfg, kv_dtype),
          "qkv projection": lay * d * (n + 2 * k) * h * it,
          "output projection": lay * n * h * d * it,
          "MLP gate/up": lay * 2 * d * f * it, "MLP down": lay * f * d * it,
          "LM head": cfg.vocab_size * d * it,
          "cache writes": rows * kv_slot_bytes(cfg, kv_dtype)}


def profile_mode(args, cfg, model, mode: str) -> dict:
  kv = MODES[mode]
  config = SamplerConfig(dtype=args.dtype, kv_cache_dtype=kv, kv_cache_storage="real",
                         max_concurrent_decodes=args.rows, max_prefill_length=args.prompt,
                         max_decode_length=args.slots - args.prompt, page_size=args.page_size)
  engine = engine_lib.Engine(model, config)
  params = engine.load_params()
  fill = args.fill or args.prompt + (args.slots - args.prompt) // 2
  state = filled_state(engine, args.rows, args.slots, fill, args.prompt, seed=0)
  t0 = time.perf_counter()
  with engine.mesh_context():
    compiled = engine_lib.PROGRAMS["generate_step"].default.lower(
        engine._spec, params, state).compile()  # pylint: disable=protected-access
  compile_s = time.perf_counter() - t0
  hlo_text = compiled.as_text()

  def run(state, n):
    for _ in range(n):
      state, out = compiled(params, state)
    jax.block_until_ready(out)
    return state

  state = run(state, 2)  # warm-up
  best = float("inf")
  for _ in range(args.repeats):  # each run moves the rows on by `steps` slots
    t0 = time.perf_counter()
    state = run(state, args.steps)
    best = min(best, (time.perf_counter() - t0) / args.steps)
  must = (args.rows * fill * kv_slot_bytes(cfg, state.cache.k.dtype)
          + weight_bytes(cfg, args.dtype))
  _, read_s = bandwidth_times(must, args.repeats)
  log_dir = tempfile.mkdtemp(prefix="decode_profile_")
  t0 = time.perf_counter()
  with jax.profiler.trace(log_dir):
    state = run(state, args.steps)
  profiled_s = (time.perf_counter() - t0) / args.steps
  rate = must / read_s
  cb = class_bytes(cfg, args.dtype, state.cache.k.dtype, args.rows, fill)
  tag = mode.replace(" ", "_")
  with gzip.open(os.path.join(args.out, f"hlo_{tag}.txt.gz"), "wt") as f:
    f.write(hlo_text)
  out = dict(mode=mode, kv_cache_dtype=str(state.cache.k.dtype),
             decode_attention=engine.decode_attention, fill=fill,
             compile_s=round(compile_s, 2), step_s=best, profiled_step_s=profiled_s,
             must_read_bytes=must, read_s=read_s, read_tb_s=rate / 1e12,
             step_vs_bound=best / read_s, class_bytes=cb)
  xplane = xprof_table.xplane_file(log_dir)
  try:
    out["table"] = xprof_table.reduce(xplane, hlo_text, module="generate_step",
                                      steps=args.steps)
    out["markdown"] = xprof_table.markdown(out["table"], best, read_s, cb, rate)
  except Exception as e:  # pylint: disable=broad-except
    out["markdown"] = f"the trace was not reduced: {type(e).__name__}: {str(e)[:400]}"
  if "table" not in out or out["table"]["events"] == 0:  # the trace itself, to reduce later
    with open(xplane, "rb") as f, gzip.open(
        os.path.join(args.out, f"trace_{tag}.xplane.pb.gz"), "wb") as g:
      g.write(f.read())
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--preset", default="qwen3_0p6b")
  p.add_argument("--rows", type=int, default=64)
  p.add_argument("--slots", type=int, default=2048)
  p.add_argument("--prompt", type=int, default=1024)
  p.add_argument("--fill", type=int, default=0, help="filled slots per row (default: the "
                 "table's average, prompt + new / 2)")
  p.add_argument("--page_size", type=int, default=64)
  p.add_argument("--dtype", default="")
  p.add_argument("--modes", default=",".join(MODES))
  p.add_argument("--steps", type=int, default=5, help="steps per timed run and in the trace")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--tiny", action="store_true", help="CPU smoke sizes")
  p.add_argument("--out", default="decode_profile_out")
  a = p.parse_args()
  cpu = jax.default_backend() == "cpu"
  a.dtype = a.dtype or ("float32" if cpu else "bfloat16")
  if a.tiny:
    a.rows, a.slots, a.prompt, a.page_size, a.steps, a.repeats = 8, 256, 128, 16, 3, 2
    cfg = get_config("tiny", vocab_size=512, num_layers=2)
  else:
    cfg = get_config(a.preset)
  os.makedirs(a.out, exist_ok=True)
  model = Qwen3(cfg, rngs=nnx.Rngs(0))
  d = jax.devices()[0]
  result = dict(device=d.device_kind, platform=d.platform, jax=jax.__version__,
                preset="tiny" if a.tiny else a.preset, rows=a.rows, slots=a.slots,
                prompt=a.prompt, dtype=a.dtype, steps=a.steps, load_average=os.getloadavg()[0],
                modes=[])
  lines = [f"# One decode step, profiled: {result['preset']}, {a.rows} rows x {a.slots} slots "
           f"(prompt {a.prompt}), {a.dtype}, {d.device_kind} ({d.platform}), jax {jax.__version__}",
           ""]
  for mode in a.modes.split(","):
    print(f"[{mode}]", file=sys.stderr, flush=True)
    try:
      r = profile_mode(a, cfg, model, mode)
    except Exception as e:  # pylint: disable=broad-except
      r = dict(mode=mode, error=f"{type(e).__name__}: {str(e)[:400]}")
    result["modes"].append(r)
    if "error" in r:
      lines += [f"## {mode}: failed", "", r["error"], ""]
    else:
      lines += [f"## {mode} (KV {r['kv_cache_dtype']}, decode attention {r['decode_attention']}, "
                f"rows at {r['fill']} slots)", "",
                f"step {r['step_s'] * 1e3:.3f} ms (best of {a.repeats} x {a.steps} back-to-back "
                f"steps), {r['step_vs_bound']:.2f}x its byte bound {r['read_s'] * 1e3:.3f} ms "
                f"({r['must_read_bytes'] / 1e9:.3f} GB at {r['read_tb_s'] * 1e3:,.0f} GB/s, "
                f"read in "
                f"the same run); under the profiler {r['profiled_step_s'] * 1e3:.3f} ms a step; "
                f"compile {r['compile_s']} s.", "", r["markdown"], ""]
    with open(os.path.join(a.out, "profile.json"), "w") as f:
      json.dump(result, f, indent=1, default=str)
    with open(os.path.join(a.out, "profile.md"), "w") as f:
      f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
