r"""The first command on a new GPU or TPU VM: how fast and how big, in one table.

    python -m bench.gpu.accelerator                        # Qwen3-0.6B shape, everything
    python -m bench.gpu.accelerator --preset qwen3_1p7b    # or qwen3_4b
    python -m bench.gpu.accelerator --parts sampler,learner --out /tmp/acc
    python -m bench.gpu.accelerator --tiny                 # CPU smoke test (what the suite runs)

Any backend, no edits. It writes a randomly initialised Hugging Face checkpoint
of a real Qwen3 shape (`--preset`) with the project's test tokenizer
(`mipu_jax.testing.checkpoint`) and uses the shipped DAPO / MATH fixtures
(`tests/fixtures`), then measures, in one run:

- `math`: `studies/configs/math.py` end to end for 2 RL steps with the FP8 sampler
  (sampling, math-verify rewards, learner, sync, MIPU Step 2, evaluation,
  checkpoint, HF export), with the wall time of each phase as the loop's own
  timers log it (`perf/*`), in a child process;
- `sampler` (`bench/gpu/sampler_table.py`): generated tokens/s of
  `Sampler.generate` at bf16, FP8 emulated, FP8 native, int8 native and those
  with an FP8 KV cache, 64 sequences × (1,024 prompt + 1,024 new) tokens (no
  stop token: every sequence decodes all 1,024), with the first call (compile
  included) and the second, and the bound: the tokens/s of reading an average
  decode step's bytes at the rate measured in the same run;
- `learner`: one learner step on one (1,024 + 8,192)-token row (the packed
  row of one full-length response), bf16 matmuls, fp32 master weights,
  per-layer remat, chunked log-probs: tokens/s, model FLOP/s and MFU against
  the bf16 matmul peak measured in the same run, the device's peak memory
  (`device.memory_stats()`) beside `mipu_jax.memory_plan`'s figure for the
  same program (each variant in its own process, so the peak is its own);
- `attention`: fwd + bwd of the attention op at 1k–8k tokens: dense,
  blockwise, cuDNN (GPU), splash (TPU).

Output: one markdown table per part and `accelerator.json` / `accelerator.md`
in `--out` (rewritten after each part, so a cut-off run keeps what finished).
A part that fails is reported as failed and the others still run.

Imports beyond JAX, flax, optax, orbax-checkpoint, chex and absl-py (the
packages a GPU / TPU image usually has): numpy, qwix, ml-collections,
safetensors, tokenizers, jinja2, math-verify (+ latex2sympy2_extended,
antlr4-python3-runtime), tensorboardX, tqdm, pyarrow — all of
`pip install -e .`. On a machine without a package index: `pip download` them
elsewhere and `pip install --no-deps` the wheels (bench/README.md).
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

# Each part allocates what it uses (the learner and math parts run in child
# processes, which must find the device memory free).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.gpu.sampler_table import DEFAULT_SAMPLER_MODES, SAMPLER_MODES, bench_sampler  # noqa: E402
from bench.perf.attention import _best_time  # noqa: E402

PARTS = ("learner", "math", "attention", "sampler")  # children first: see XLA_PYTHON_CLIENT_PREALLOCATE


def _platform():
  import jax  # pylint: disable=g-import-not-at-top
  return jax.devices()[0].platform


def device_info() -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  d = jax.devices()[0]
  info = {"platform": d.platform, "device_kind": d.device_kind, "devices": jax.device_count(),
          "jax": jax.__version__, "load_average": round(os.getloadavg()[0], 2)}
  try:
    import jaxlib  # pylint: disable=g-import-not-at-top
    info["jaxlib"] = jaxlib.__version__
  except ImportError:
    pass
  if d.platform == "gpu":
    with contextlib.suppress(OSError, subprocess.SubprocessError):
      info["driver"] = subprocess.run(
          ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
          capture_output=True, text=True, check=True, timeout=30).stdout.strip()
  return info


def matmul_peak_tflops(n: int) -> float:
  """The device's matmul peak, measured: `n³` bf16 (fp32 on CPU) products."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  dtype = jnp.float32 if _platform() == "cpu" else jnp.bfloat16
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda a, b: a @ b)
  return 2 * n**3 / _best_time(lambda: f(a, b).block_until_ready(), 10) / 1e12


def model_config(args):
  from mipu_jax import models  # pylint: disable=g-import-not-at-top
  cfg = models.get_config(args.preset)
  if args.tiny:
    cfg = models.get_config("tiny", vocab_size=512, num_layers=1)
  return cfg


# --- learner ----------------------------------------------------------------


def learner_child(args, attention_impl: str) -> dict:
  """One learner step of `--preset` on one (prompt + response)-token row; a JSON dict."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  from mipu_jax import memory_plan  # pylint: disable=g-import-not-at-top
  from bench.perf.model import one_row_learner, train_flops_per_token  # pylint: disable=g-import-not-at-top

  prompt, response = args.learner_prompt, args.learner_response
  t = prompt + response
  cpu = _platform() == "cpu"
  mcfg = dataclasses.replace(model_config(args), dtype="float32" if cpu else "bfloat16",
                             attention=attention_impl, remat="layer")
  learner, state, batch = one_row_learner(mcfg, prompt, response, min(1024, t))
  # The plan of the very program the step runs (lowered on these inputs, CPU's own
  # passes): the step's first call below then reuses its compile.
  t0 = time.perf_counter()
  plan = memory_plan._memory(learner.lower_step_on(state, batch),  # pylint: disable=protected-access
                             cpu_artifacts=True)
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  state, m = learner.step(state, batch)
  jax.block_until_ready((state, m))
  first = time.perf_counter() - t0
  times = []
  for _ in range(args.learner_repeats):
    t0 = time.perf_counter()
    state, m = learner.step(state, batch)
    jax.block_until_ready((state, m))
    times.append(time.perf_counter() - t0)
  seconds = min(times)
  flops = train_flops_per_token(mcfg, t) * t
  stats = jax.devices()[0].memory_stats() or {}
  return {"attention": attention_impl, "tokens": t, "step_s": round(seconds, 4),
          "compile_s": round(compile_s, 2), "first_call_s": round(first, 2),
          "tokens_per_s": round(t / seconds, 1),
          "model_tflops": round(flops / seconds / 1e12, 2),
          "peak_device_gib": (round(stats["peak_bytes_in_use"] / 2**30, 2)
                              if "peak_bytes_in_use" in stats else None),
          "plan_peak_gib": round(plan.peak / 2**30, 2), "plan_peak_bytes": int(plan.peak),
          "loss": float(m["actor/loss"])}


def bench_learner(args, peak_tflops: float) -> list[dict]:
  impls = ["blockwise"] + {"gpu": ["cudnn"], "tpu": ["splash"]}.get(_platform(), [])
  if args.learner_attention:
    impls = args.learner_attention.split(",")
  rows = []
  for impl in impls:
    row = _child(args, f"learner:{impl}")
    row.setdefault("attention", impl)
    if "model_tflops" in row and peak_tflops:
      row["mfu"] = round(row["model_tflops"] / peak_tflops, 3)
    if row.get("peak_device_gib") and row.get("plan_peak_gib"):
      row["measured_vs_plan"] = round(row["peak_device_gib"] / row["plan_peak_gib"], 3)
    print(f"  learner {impl}: {row}", file=sys.stderr, flush=True)
    rows.append(row)
  return rows


# --- attention --------------------------------------------------------------


def bench_attention(args) -> list[dict]:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from mipu_jax.models import attention  # pylint: disable=g-import-not-at-top

  platform = _platform()
  impls = ["dense", "blockwise"] + {"gpu": ["cudnn"], "tpu": ["splash"]}.get(platform, [])
  dtype = jnp.float32 if platform == "cpu" else jnp.bfloat16
  n, k, h = 16, 8, 128  # Qwen3-0.6B / 1.7B heads
  rows = []
  for t in [int(x) for x in args.attention_lengths.split(",")]:
    rng = np.random.default_rng(t)
    q, kk, v, w = (jnp.asarray(rng.normal(size=(1, t, m, h)), dtype) for m in (n, k, k, n))
    valid = jnp.asarray(np.arange(t)[None, :] < int(t * 0.95))
    mask = attention.row_mask(valid)
    for impl in impls:
      def loss(q, kk, v, impl=impl):
        o = attention.attend(q, kk, v, mask, implementation=impl, block_q=512, block_k=512,
                             prefix_rows=True)
        return jnp.sum(o.astype(jnp.float32) * w.astype(jnp.float32))
      row = {"tokens": t, "implementation": impl}
      try:
        f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
        temp = f.lower(q, kk, v).compile().memory_analysis().temp_size_in_bytes
        row["ms"] = round(_best_time(lambda f=f: jax.block_until_ready(f(q, kk, v)), 3) * 1e3, 3)
        row["temp_mib"] = round(temp / 2**20, 1)
      except Exception as e:  # pylint: disable=broad-except
        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
      print(f"  attention {row}", file=sys.stderr, flush=True)
      rows.append(row)
  dense = {r["tokens"]: r.get("ms") for r in rows if r["implementation"] == "dense"}
  for r in rows:
    if r.get("ms") and dense.get(r["tokens"]):
      r["vs_dense"] = round(r["ms"] / dense[r["tokens"]], 3)
  return rows


# --- math end to end --------------------------------------------------------


def math_child(args) -> dict:
  """studies/configs/math.py for 2 RL steps with the FP8 sampler, every phase timed by
  the loop's own timers (`perf/*`, docs/method.md §4's training metrics)."""
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax import rl  # pylint: disable=g-import-not-at-top
  from mipu_jax.testing import checkpoint  # pylint: disable=g-import-not-at-top
  from studies.configs import math as math_config  # pylint: disable=g-import-not-at-top

  work = args.math_workdir or tempfile.mkdtemp()
  t0 = time.perf_counter()
  mcfg = model_config(args)
  fields = {f: getattr(mcfg, f) for f in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                                           "num_kv_heads", "head_dim", "intermediate_size",
                                           "tie_embeddings", "rope_theta")}
  ckpt = checkpoint.write_tiny_qwen3(os.path.join(work, "ckpt"), **fields)
  write_s = time.perf_counter() - t0
  fixtures = os.path.join(ROOT, "tests", "fixtures")
  arg = (f"mipu,ckpt={ckpt},train={fixtures}/train/dapo_math.jsonl,"
         f"eval={fixtures}/benchmarks,steps=2,prompts={args.math_prompts},"
         f"group={args.math_group},max_new={args.math_max_new},max_prompt=256,"
         f"slots={args.math_prompts * args.math_group}" + (",quick=True" if args.tiny else ""))
  cd = math_config.get_config(arg)
  cd.sampling.quant_compute = args.math_quant_compute
  # The shipped fixture has a dozen prompts: hold out a few for MIPU's probe.
  cd.data.probe_holdout = cd.mipu.num_probe_prompts = min(4, args.math_prompts)
  cd.eval.every = 2
  cd.eval.max_problems = args.math_eval_problems
  cd.eval.num_samples = 2
  cd.checkpoint.every = 1  # step 1's save is timed in step 2's row
  cd.export.final = True
  cd.logging.progress_bar = False
  if args.tiny:  # the smoke test: no tensorboard (imports torch) or plots, timed by no phase
    cd.logging.backends, cd.logging.plots = "jsonl", False
  if _platform() == "gpu":
    cd.model.attention = "cudnn"
  cfg = config_lib.from_config_dict(cd)
  t0 = time.perf_counter()
  result = rl.train(cfg, os.path.join(work, "run"))
  total = time.perf_counter() - t0
  rows = rl.read_jsonl(result.files["metrics"])
  steps = [r for r in rows if r.get("step", 0) >= 1]
  per_step = lambda key: [r.get(key, 0.0) for r in steps]
  phases = {"write random HF checkpoint": write_s}
  for key, name in (("rollout", "rollout (sampling + rewards)"), ("rewards", "rewards"),
                    ("recompute", "recompute lp_old"), ("update", "learner update"),
                    ("sync", "weight sync"), ("gate", "MIPU Step 2"),
                    ("eval", "evaluation (mu)"), ("eval_pi", "evaluation (pi)"),
                    ("checkpoint", "checkpoint save (previous step's)")):
    phases[f"{name}, per step"] = per_step(f"perf/{key}_seconds")
  logged = sum(per_step("perf/step_seconds")) + sum(
      sum(per_step(f"perf/{k}_seconds")) for k in ("eval", "eval_pi", "checkpoint"))
  # Setup, step-0 evaluation, the last save's wait and the HF export: not in a step's row.
  phases["outside the steps (setup, step-0 eval, final save, HF export)"] = total - logged
  share = [r["perf/rollout_seconds"] / r["perf/step_seconds"] for r in steps]
  return {"steps": len(steps), "total_s": round(total, 1),
          "phases": {k: ([round(x, 4) for x in v] if isinstance(v, list) else round(v, 4))
                     for k, v in phases.items()},
          "rollout_share_of_step": [round(x, 3) for x in share],
          "reward_mean": [r.get("rollout/reward_mean") for r in steps],
          "eval_avg": [r.get("eval/avg") for r in rows if "eval/avg" in r],
          "k3_kl": [r.get("rollout_corr/k3_kl") for r in steps],
          "export": os.path.isdir(os.path.join(work, "run", "export", "final")),
          "quant_compute": cfg.sampling.quant_compute}


# --- plumbing ---------------------------------------------------------------


def _child(args, what: str) -> dict:
  cmd = [sys.executable, "-m", "bench.gpu.accelerator", "--child", what] + _forward_args(args)
  env = dict(os.environ)  # the children do not dump HLO (--dump_hlo is the sampler's)
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if not f.startswith("--xla_dump"))
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, cwd=ROOT)
  for line in proc.stdout.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[len("RESULT "):])
  tail = (proc.stderr or "").strip().splitlines()[-4:]
  return {"error": " / ".join(tail)[-600:] or f"exit {proc.returncode}"}


def _forward_args(args) -> list[str]:
  out = []
  for key, value in vars(args).items():
    if key in ("child", "out", "parts", "on_row", "dump_hlo"):
      continue
    if isinstance(value, bool):
      out += [f"--{key}"] if value else []
    else:
      out += [f"--{key}", str(value)]
  return out


def _table(rows: list[dict], columns: list[str]) -> str:
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for r in rows:
    cells = []
    for c in columns:
      v = r.get(c, "")
      cells.append("" if v is None else str(v))
    if "error" in r:
      cells[-1] = f"failed: {r['error'][:160]}"
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def report(result: dict) -> str:
  d = result["device"]
  out = [f"# bench/gpu/accelerator.py — {d['device_kind']} ({d['platform']} x{d['devices']}), "
         f"jax {d['jax']}, driver {d.get('driver', '-')}, load average {d['load_average']}",
         f"\nModel shape: `{result['preset']}`; measured matmul peak "
         f"{result.get('peak_tflops', 0):.1f} TFLOP/s "
         f"({'fp32' if d['platform'] == 'cpu' else 'bf16'}, {result['peak_n']}³).\n"]
  s = result.get("sampler")
  if s:
    out.append(f"## Sampler: {result['sampler_shape']}\n")
    out.append(_table(s, ["mode", "tokens_per_s", "vs_bf16", "bound_tokens_per_s", "vs_bound",
                          "step_gb", "read_tb_s", "decode_attention", "pallas_plan", "second_call_s", "first_call_s",
                          "compile_s_approx"]))
    out.append("\n`bound_tokens_per_s`: rows / the time to read the bytes of an average decode "
               "step (`step_gb`: weights as stored + filled KV slots) at the read rate "
               "measured in the same run (`read_tb_s`); `vs_bound` = bound / measured.")
    if any("kernels" in r for r in s):
      out.append("\nMatmul kernels in the optimized prefill / decode programs:\n")
      out += [f"- {r['mode']}: {r.get('kernels')}" for r in s]
  s = result.get("learner")
  if s:
    out.append(f"\n## Learner step: {result['learner_shape']}\n")
    out.append(_table(s, ["attention", "tokens_per_s", "model_tflops", "mfu", "step_s",
                          "compile_s", "first_call_s", "peak_device_gib", "plan_peak_gib",
                          "measured_vs_plan"]))
  s = result.get("attention")
  if s:
    out.append("\n## Attention op fwd + bwd (16 q / 8 kv heads of 128, one row)\n")
    out.append(_table(s, ["tokens", "implementation", "ms", "vs_dense", "temp_mib"]))
  s = result.get("math")
  if s:
    out.append("\n## studies/configs/math.py, 2 RL steps, FP8 sampler\n")
    if "error" in s:
      out.append(f"failed: {s['error']}")
    else:
      out.append(_table([{"phase": k, "seconds": v} for k, v in s["phases"].items()],
                        ["phase", "seconds"]))
      out.append(f"\ntotal {s['total_s']} s for {s['steps']} steps; reward "
                 f"{s['reward_mean']}; eval avg {s['eval_avg']}; k3_kl {s['k3_kl']}; "
                 f"HF export written: {s['export']}; sampler matmuls: {s['quant_compute']}")
  return "\n".join(out) + "\n"


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--preset", default="qwen3_0p6b", help="qwen3_0p6b, qwen3_1p7b, qwen3_4b")
  p.add_argument("--parts", default=",".join(PARTS))
  p.add_argument("--out", default="accelerator_out")
  p.add_argument("--tiny", action="store_true", help="CPU smoke sizes (the test suite)")
  p.add_argument("--sampler_modes", default=",".join(DEFAULT_SAMPLER_MODES),
                 help=f"comma-separated, from {sorted(SAMPLER_MODES)}")
  p.add_argument("--sampler_seqs", type=int, default=64)
  p.add_argument("--sampler_dtype", default="",
                 help="compute dtype of the sampler (default bfloat16; float32 on CPU)")
  p.add_argument("--sampler_prompt", type=int, default=1024)
  p.add_argument("--sampler_new", type=int, default=1024)
  p.add_argument("--repeats_bound", type=int, default=5, help="timings of the read bound")
  p.add_argument("--learner_prompt", type=int, default=1024)
  p.add_argument("--learner_response", type=int, default=8192)
  p.add_argument("--learner_repeats", type=int, default=3)
  p.add_argument("--learner_attention", default="",
                 help="attention implementations of the learner part (default: blockwise and "
                      "the platform's kernel: cudnn on GPU, splash on TPU)")
  p.add_argument("--attention_lengths", default="1024,2048,4096,8192")
  p.add_argument("--math_prompts", type=int, default=8)
  p.add_argument("--math_group", type=int, default=4)
  p.add_argument("--math_max_new", type=int, default=1024)
  p.add_argument("--math_eval_problems", type=int, default=4)
  p.add_argument("--math_quant_compute", default="native")
  p.add_argument("--math_workdir", default="")
  p.add_argument("--peak_n", type=int, default=0, help="default 8192 (1024 on CPU)")
  p.add_argument("--dump_hlo", default="",
                 help="a directory: dump the sampler's optimized HLO there and report which "
                      "kernels its matmuls became (cuBLASLt FP8, Triton GEMMs, ...)")
  p.add_argument("--child", default="")
  args = p.parse_args()
  if args.dump_hlo and not args.child:
    os.makedirs(args.dump_hlo, exist_ok=True)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={args.dump_hlo}"
                               " --xla_dump_hlo_as_text"
                               " --xla_dump_hlo_module_re=.*(prefill|generate).*").strip()
  if args.tiny:
    for key, value in dict(sampler_seqs=4, sampler_prompt=16, sampler_new=16,
                           learner_prompt=16, learner_response=48, learner_repeats=1,
                           attention_lengths="64,128", math_prompts=2, math_group=2,
                           math_max_new=16, math_eval_problems=1).items():
      if getattr(args, key) == p.get_default(key):
        setattr(args, key, value)
  if not args.peak_n:
    args.peak_n = 1024 if _platform() == "cpu" else 8192
  if args.child:
    kind, _, impl = args.child.partition(":")
    result = learner_child(args, impl) if kind == "learner" else math_child(args)
    print("RESULT " + json.dumps(result), flush=True)
    return

  parts = [x for x in args.parts.split(",") if x]
  unknown = set(parts) - set(PARTS)
  if unknown:
    p.error(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
  os.makedirs(args.out, exist_ok=True)
  args.on_row = lambda: None
  result = {"device": device_info(), "preset": "tiny" if args.tiny else args.preset,
            "peak_n": args.peak_n,
            "args": {k: v for k, v in vars(args).items() if not callable(v)},
            "sampler_shape": (f"{args.sampler_seqs} sequences x ({args.sampler_prompt} prompt + "
                              f"{args.sampler_new} new) tokens, "
                              f"{args.sampler_dtype or ('float32' if _platform() == 'cpu' else 'bfloat16')}"
                              " compute, temperature 1"),
            "learner_shape": (f"one ({args.learner_prompt} + {args.learner_response})-token row, "
                              "bf16 matmuls, fp32 master + Adam, remat per layer, "
                              "log-probs in 1,024-position chunks")}
  print(f"device: {result['device']}", file=sys.stderr, flush=True)

  def save():
    with open(os.path.join(args.out, "accelerator.json"), "w") as f:
      json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "accelerator.md"), "w") as f:
      f.write(report(result))

  result["peak_tflops"] = round(matmul_peak_tflops(args.peak_n), 1)
  save()
  for part in parts:
    t0 = time.perf_counter()
    print(f"[{part}]", file=sys.stderr, flush=True)
    try:
      if part == "sampler":
        result["sampler"] = []
        args.on_row = save
        bench_sampler(args, result["sampler"], model_config(args), _platform())
      elif part == "learner":
        result["learner"] = bench_learner(args, result["peak_tflops"])
      elif part == "attention":
        result["attention"] = bench_attention(args)
      elif part == "math":
        result["math"] = _child(args, "math")
    except Exception as e:  # pylint: disable=broad-except
      result[part] = [{"error": f"{type(e).__name__}: {str(e)[:300]}"}]
    result.setdefault("part_seconds", {})[part] = round(time.perf_counter() - t0, 1)
    save()
  print(report(result))


if __name__ == "__main__":
  main()
