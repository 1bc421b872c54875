r"""Learner throughput vs transformers, the machine's fp32 matmul peak and tunix; correction overhead.

    python -m bench.perf.learner --vs_transformers [--shapes tiny,mid --repeats 5]
    python -m bench.perf.learner [--batch 16 --seq 128 --hidden 256 --layers 4 --repeats 7]

`--vs_transformers`: per shape of `bench/perf/sampler.py` (fp32, tied
embeddings, 64 x 96 tokens), on the same weights and batch, interleaved:
  * forward + backward of the mean token log-prob: mipu_jax with the learner's
    arithmetic (`policy_logprobs`, its LM-head chunking and the platform's MLP
    recompute) against transformers' `Qwen3ForCausalLM` (CPU torch, as many
    threads as CPUs), our export of the same weights;
  * one learner step: `Learner.step` (PPO loss, entropy metric, AdamW with
    clipping, every metric) against the same update in torch
    (`torch_learner_step`);
and prints tokens/s, the ratio mipu_jax / transformers, and the host: CPU model,
its vector / matrix flags, versions and load.

Without it:

Measures, in one run on the same machine (fp32, single device):
  * the machine's fp32 matmul peak (a large jitted `a @ b`);
  * mipu_jax's Qwen3 forward+backward alone (the loss below), and tunix's Qwen3
    forward+backward on the same config (google-tunix 0.1.7 in its own venv,
    `--tunix_python`, driven by subprocess; same loss, same shapes);
  * the full mipu_jax learner step (`mipu_jax.learner.Learner.step`: log-probs,
    PPO loss, AdamW update, every metric) with corrections off (preset `none`)
    and all on (`mis_miles`: token TIS + token RS + veto + SNIS), interleaved
    so load drifts hit both alike: the corrections' overhead in % of the step;
  * the corrections alone (docs/method.md §3 weights/masks + §4 metrics + aggregation
    coefficients, jitted on the same `[B, L]` arrays), as a bound on that overhead.
Every time is the fastest of `--repeats` runs after a warm-up (the machine may be
shared; the minimum is the least disturbed measurement).
Achieved GFLOP/s count matmul FLOPs only (`bench/perf/model.py`'s formula).
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.perf.model import matmul_peak_gflops  # bench/perf/model.py: one FLOP model per project.
from bench.perf.model import train_flops_per_token
from mipu_jax import config as config_lib
from mipu_jax import losses
from mipu_jax import models
from mipu_jax.learner import host_batch
from mipu_jax.learner import Learner
from mipu_jax.learner import mesh_from_config
from mipu_jax.learner import policy_logprobs
from mipu_jax.learner import Scoring
from mipu_jax.models.config import ATTENTIONS

_HERE = os.path.dirname(os.path.abspath(__file__))
# The CPU flags that decide fp32 GEMM speed (oneDNN / MKL in torch, XNNPACK in XLA:CPU).
_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile",
          "amx_bf16", "amx_int8", "amx_fp16")


def host() -> dict:
  """This machine: CPU model, family / model numbers, the GEMM-relevant flags, versions."""
  info = {}
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    info = {k.strip(): v.strip() for k, v in
            (line.split(":", 1) for line in out.splitlines() if ":" in line)}
  except (OSError, subprocess.CalledProcessError):
    pass
  flags = set(info.get("Flags", "").split())
  versions = {"jax": jax.__version__}
  for name in ("torch", "transformers"):
    try:
      versions[name] = __import__(name).__version__
    except ImportError:
      pass
  return {"cpu": info.get("Model name", platform.processor() or "unknown"),
          "family_model": f"{info.get('CPU family', '?')}/{info.get('Model', '?')}",
          "cpus": os.cpu_count(), "flags": [f for f in _FLAGS if f in flags],
          "versions": versions, "load": round(os.getloadavg()[0], 2),
          "allocator": allocator()}


GLIBC_DEFAULTS = "glibc malloc, its defaults"  # `allocator()` when nothing changes it


def allocator() -> str:
  """This process's memory allocator as its environment sets it: a preloaded library
  and glibc's malloc settings (they move XLA:CPU's page faults: bench/README.md)."""
  parts = [f"LD_PRELOAD={os.path.basename(p)}" for p in
           os.environ.get("LD_PRELOAD", "").replace(":", " ").split() if "alloc" in p]
  parts += [f"{k}={v}" for k, v in sorted(os.environ.items())
            if k.startswith("MALLOC_") or k == "GLIBC_TUNABLES"]
  return " ".join(parts) or GLIBC_DEFAULTS


def host_line() -> str:
  h = host()
  versions = ", ".join(f"{k} {v}" for k, v in h["versions"].items())
  return (f"host: {h['cpu']} (family/model {h['family_model']}), {h['cpus']} CPUs, flags "
          f"{' '.join(h['flags']) or 'none of ' + '/'.join(_FLAGS)}; {versions}; "
          f"load average {h['load']}; allocator: {h['allocator']}")


def _best_time(fn, repeats):
  """Fastest of `repeats` calls after a warm-up: the least load-disturbed one."""
  fn()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return float(np.min(times))


def _model_config(a) -> models.Qwen3Config:
  return models.Qwen3Config(
      vocab_size=a.vocab, hidden_size=a.hidden, num_layers=a.layers, num_heads=a.heads,
      num_kv_heads=a.kv_heads, head_dim=a.head_dim, intermediate_size=a.ffn,
      tie_embeddings=True, rope_theta=10_000.0)


def bench_fwd_bwd(mcfg, tokens, repeats) -> float:
  """mipu_jax Qwen3 forward+backward of the mean token log-prob."""
  model = models.Qwen3(mcfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  mask = jnp.ones(tokens.shape, jnp.float32)

  def loss(params, tokens):
    lp = models.sequence_logprobs(nnx.merge(graphdef, params), tokens, mask)
    return -jnp.mean(lp[:, 1:])

  step = jax.jit(jax.value_and_grad(loss))
  return _best_time(lambda: jax.block_until_ready(step(params, tokens)), repeats)


def bench_tunix(mcfg, a):
  """tunix's forward+backward (subprocess); None if its venv is missing."""
  if not os.path.exists(a.tunix_python):
    return None
  spec = dict(num_layers=mcfg.num_layers, vocab_size=mcfg.vocab_size,
              hidden_size=mcfg.hidden_size, intermediate_size=mcfg.intermediate_size,
              num_heads=mcfg.num_heads, head_dim=mcfg.head_dim,
              num_kv_heads=mcfg.num_kv_heads, rope_theta=mcfg.rope_theta,
              batch=a.batch, seq=a.seq, repeats=a.repeats)
  out = subprocess.run([a.tunix_python, os.path.join(_HERE, "_tunix_qwen3.py"),
                        json.dumps(spec)], capture_output=True, text=True, check=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def _learner(mcfg, a, preset):
  cfg = config_lib.TrainConfig(
      data=config_lib.DataConfig(prompts_per_step=a.batch // 4, group_size=4),
      sampling=config_lib.SamplingConfig(max_new_tokens=a.seq - a.prompt),
      loss=losses.LossConfig(correction=losses.CorrectionConfig.from_preset(preset)),
      learner=config_lib.LearnerConfig(mesh=config_lib.MeshConfig(1, 1, 1)))
  model = models.Qwen3(mcfg, rngs=nnx.Rngs(0))
  learner = Learner.from_config(cfg, model, mesh_from_config(cfg.learner.mesh))
  state = learner.init_state(nnx.to_pure_dict(nnx.state(model, nnx.Param)), seed=0)
  return learner, state


def bench_learner_steps(mcfg, a):
  """Fastest step seconds for presets `none` and `mis_miles`, interleaved."""
  rng = np.random.default_rng(0)
  b, l = a.batch, a.seq
  tokens = rng.integers(3, mcfg.vocab_size, (b, l))
  input_mask = np.ones((b, l), np.float32)
  loss_mask = input_mask * (np.arange(l)[None, :] >= a.prompt)
  runs = {}
  for preset in ("none", "mis_miles"):
    learner, state = _learner(mcfg, a, preset)
    lp_old = np.asarray(learner.logprobs(state.params, tokens, input_mask)) * loss_mask
    lp_mu = (lp_old + rng.normal(0, 0.3, (b, l))) * loss_mask
    batch = learner.shard_batch(host_batch(tokens, input_mask, loss_mask, lp_mu,
                                           rng.normal(size=b), lp_old_BT=lp_old))
    state, m = learner.step(state, batch)  # compile
    jax.block_until_ready(m)
    runs[preset] = [learner, state, batch, []]
  for _ in range(a.repeats):
    for preset, run in runs.items():
      learner, state, batch, times = run
      t0 = time.perf_counter()
      state, m = learner.step(state, batch)
      jax.block_until_ready((state, m))
      times.append(time.perf_counter() - t0)
      run[1] = state
  return {p: float(np.min(r[3])) for p, r in runs.items()}


def bench_corrections_alone(a):
  """Seconds of the `mis_miles` correction + metrics + coefficients on [B, L]."""
  rng = np.random.default_rng(1)
  b, l = a.batch, a.seq
  mask = jnp.asarray(np.arange(l)[None, :] >= a.prompt, jnp.float32) * jnp.ones((b, 1))
  lp_old = jnp.asarray(-rng.uniform(0.1, 3, (b, l)), jnp.float32)
  lp_mu = lp_old + jnp.asarray(rng.normal(0, 0.3, (b, l)), jnp.float32)
  cfg = losses.LossConfig(correction=losses.CorrectionConfig.from_preset("mis_miles"))

  @jax.jit
  def corrections(lp_old, lp_mu, mask):
    corrected, metrics = losses.correct_batch(lp_old, lp_mu, mask, cfg)
    coef = losses.token_coefficients(corrected.keep_BT, corrected.denom_BT, cfg, l)
    return corrected, metrics, coef

  return _best_time(lambda: jax.block_until_ready(corrections(lp_old, lp_mu, mask)),
                    a.repeats * 10)


def shape_config(name: str) -> models.Qwen3Config:
  """A `bench/perf/sampler.py` shape ("tiny", "mid") as a tied-embedding Qwen3."""
  from bench.perf.sampler import CONFIGS  # pylint: disable=g-import-not-at-top
  return models.Qwen3Config(**CONFIGS[name], tie_embeddings=True)


def rl_batch(vocab: int, batch: int, seq: int, prompt: int, seed: int = 0):
  """`(tokens, input_mask, loss_mask, lp_old, advantages)`: random tokens, the
  response after `prompt` tokens, old log-probs and advantages (numpy)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(3, vocab, (batch, seq))
  input_mask = np.ones((batch, seq), np.float32)
  loss_mask = input_mask * (np.arange(seq)[None, :] >= prompt)
  lp_old = -rng.uniform(0.1, 3.0, (batch, seq)) * loss_mask
  return tokens, input_mask, loss_mask, lp_old, rng.normal(size=batch)


def shape_learner(mcfg: models.Qwen3Config, batch: int, seq: int, prompt: int,
                  compiler_options=None, unroll_layers=None):
  """`(model, learner, state, sharded batch)`: a default one-update learner
  (no correction, one device, state not donated) on `rl_batch`; `compiler_options`
  and `unroll_layers` as `Learner.from_config`'s (None: the learner's own choice)."""
  cfg = config_lib.TrainConfig(
      data=config_lib.DataConfig(prompts_per_step=batch // 4, group_size=4),
      sampling=config_lib.SamplingConfig(max_new_tokens=seq - prompt),
      loss=losses.LossConfig(correction=losses.CorrectionConfig.from_preset("none")),
      learner=config_lib.LearnerConfig(mesh=config_lib.MeshConfig(1, 1, 1)))
  model = models.Qwen3(mcfg, rngs=nnx.Rngs(0))
  learner = Learner.from_config(cfg, model, mesh_from_config(cfg.learner.mesh), donate=False,
                                compiler_options=compiler_options, unroll_layers=unroll_layers)
  state = learner.init_state(nnx.to_pure_dict(nnx.state(model, nnx.Param)), seed=0)
  tokens, input_mask, loss_mask, lp_old, adv = rl_batch(mcfg.vocab_size, batch, seq, prompt)
  rl = learner.shard_batch(host_batch(tokens, input_mask, loss_mask, lp_old, adv,
                                      lp_old_BT=lp_old))
  return model, learner, state, rl


def learner_fwd_bwd(model, learner, tokens):
  """mipu_jax: `() -> grads` of the mean token log-prob with the learner's
  arithmetic (`policy_logprobs`: its LM-head chunking, its MLP recompute, its
  layer unrolling) and its XLA options."""
  graphdef, params = nnx.split(model)
  tokens = jnp.asarray(tokens, jnp.int32)
  mask = jnp.ones(tokens.shape, jnp.float32)
  spec = learner.spec

  def loss(params):
    lp = policy_logprobs(nnx.merge(graphdef, params), tokens, mask, Scoring(),
                         logits_chunk=spec.logits_chunk, recompute_mlp=spec.recompute_mlp,
                         unroll_layers=spec.unroll_layers)
    return -jnp.mean(lp[:, 1:])

  grad = jax.jit(jax.grad(loss), compiler_options=learner.compiler_options or None)
  return lambda: jax.block_until_ready(grad(params))


def load_hf(path: str, threads: int):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)
  hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  hf.train()
  return hf


def hf_fwd_bwd(hf, tokens):
  """transformers: `()` -> forward + backward of the mean token log-prob."""
  import torch  # pylint: disable=g-import-not-at-top
  x = torch.tensor(np.asarray(tokens, np.int64))

  def run():
    hf.zero_grad(set_to_none=True)
    lp = torch.log_softmax(hf(x).logits[:, :-1].float(), -1).gather(-1, x[:, 1:, None])
    (-lp.mean()).backward()

  return run


def torch_learner_step(hf, tokens, input_mask, loss_mask, lp_old, adv):
  """transformers: `()` -> one PPO update as `Learner.step`'s with the library's
  defaults (docs/method.md §2: clip [1 - eps_low, 1 + eps_high], token mean over the
  response), the entropy as a metric without gradient, gradient clipping and
  `torch.optim.AdamW` with the defaults' rate and weight decay. Scopes `cat:vocab`,
  `cat:loss`, `cat:optimizer` name its parts for a profiler."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch.profiler import record_function  # pylint: disable=g-import-not-at-top
  del input_mask  # every token is real
  optim, loss_cfg = config_lib.OptimConfig(), losses.LossConfig()
  opt = torch.optim.AdamW(hf.parameters(), lr=optim.learning_rate,
                          weight_decay=optim.weight_decay, eps=optim.eps,
                          betas=(optim.b1, optim.b2))
  x = torch.tensor(np.asarray(tokens, np.int64))
  m = torch.tensor(loss_mask[:, 1:], dtype=torch.float32)
  old = torch.tensor(lp_old[:, 1:], dtype=torch.float32)
  a = torch.tensor(adv, dtype=torch.float32)[:, None]

  def step():
    opt.zero_grad(set_to_none=True)
    logits = hf(x).logits[:, :-1]
    with record_function("cat:vocab"):
      logp = torch.log_softmax(logits.float(), -1)
      lp = logp.gather(-1, x[:, 1:, None])[..., 0]
      with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)
    with record_function("cat:loss"):
      ratio = torch.exp(lp - old)
      pg = torch.maximum(-a * ratio, -a * ratio.clamp(1 - loss_cfg.eps_low,
                                                       1 + loss_cfg.eps_high))
      loss = (pg * m).sum() / m.sum()
      metric = (entropy * m).sum() / m.sum()
    loss.backward()
    with record_function("cat:optimizer"):
      torch.nn.utils.clip_grad_norm_(hf.parameters(), optim.clip_norm)
      opt.step()
    return loss.detach(), metric

  return step


def usage() -> np.ndarray:
  """`[wall, user CPU, kernel CPU, minor page faults]` of this process so far (seconds)."""
  r = resource.getrusage(resource.RUSAGE_SELF)
  return np.array([time.perf_counter(), r.ru_utime, r.ru_stime, r.ru_minflt])


class Timed(NamedTuple):
  """One program's `interleaved` record: its fastest wall seconds, and per call the
  median CPU seconds (all threads, user + kernel), kernel seconds, minor page
  faults (a fresh page touched: the kernel maps and zero-fills it) and wall seconds,
  each field's median over the rounds taken on its own."""
  wall: float
  cpu: float
  kernel: float
  faults: float
  wall_median: float


def interleaved(fns: dict, repeats: int) -> dict:
  """`{name: Timed}` over `repeats` rounds in which every fn runs once (after one
  warm-up each): load drift hits all alike."""
  for fn in fns.values():
    fn()
  calls = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      u0 = usage()
      fn()
      calls[name].append(usage() - u0)
  out = {}
  for name, rows in calls.items():
    wall, user, kernel, faults = np.array(rows).T
    out[name] = Timed(float(wall.min()), float(np.median(user + kernel)),
                      float(np.median(kernel)), float(np.median(faults)),
                      float(np.median(wall)))
  return out


def vs_transformers(a) -> list:
  """The `--vs_transformers` table rows (and a JSON record per shape)."""
  threads = os.cpu_count() or 1
  records = []
  print(host_line())
  print(f"{a.tx_batch} x {a.tx_seq} tokens ({a.prompt} prompt), fp32, fastest of "
        f"{a.repeats} interleaved rounds; torch on {threads} threads; mipu_jax's attention "
        f"{a.attention!r}\n")
  print("| shape | measured | transformers ms | mipu_jax ms | transformers tok/s | "
        "mipu_jax tok/s | mipu / transformers |")
  print("|---|---|---|---|---|---|---|")
  for name in a.shapes.split(","):
    mcfg = shape_config(name).replace(attention=a.attention)
    model, learner, state, rl = shape_learner(mcfg, a.tx_batch, a.tx_seq, a.prompt)
    data = rl_batch(mcfg.vocab_size, a.tx_batch, a.tx_seq, a.prompt)
    with tempfile.TemporaryDirectory() as d:
      models.save_pretrained(model, d)
      hf = load_hf(d, threads)
    holder = [state]

    def ours_step():
      jax.block_until_ready(learner.step(holder[0], rl))

    fns = {"fwd+bwd/transformers": hf_fwd_bwd(hf, data[0]),
           "fwd+bwd/mipu_jax": learner_fwd_bwd(model, learner, data[0]),
           "learner step/transformers": torch_learner_step(hf, *data),
           "learner step/mipu_jax": ours_step}
    best = interleaved(fns, a.repeats)
    n_tok = a.tx_batch * a.tx_seq
    rec = {"shape": name, "attention": a.attention, "params": mcfg.num_params(),
           "tokens": n_tok, **host()}
    for what in ("fwd+bwd", "learner step"):
      hf_, us = best[f"{what}/transformers"], best[f"{what}/mipu_jax"]
      print(f"| {name} | {what} | {hf_.wall * 1e3:,.0f} | {us.wall * 1e3:,.0f} | "
            f"{n_tok / hf_.wall:,.0f} | {n_tok / us.wall:,.0f} | "
            f"**{hf_.wall / us.wall:.2f}x** |")
      rec[what] = {"transformers_s": hf_.wall, "mipu_jax_s": us.wall,
                   "ratio": hf_.wall / us.wall, "transformers_cpu_s": hf_.cpu,
                   "mipu_jax_cpu_s": us.cpu, "transformers_kernel_s": hf_.kernel,
                   "mipu_jax_kernel_s": us.kernel}
    records.append(rec)
    del hf, learner, state, rl
  print(f"\nload average at end {os.getloadavg()[0]:.1f}")
  for rec in records:
    print(json.dumps(rec))
  return records


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--prompt", type=int, default=32, help="prompt tokens per row")
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=8)
  p.add_argument("--kv_heads", type=int, default=4)
  p.add_argument("--head_dim", type=int, default=32)
  p.add_argument("--ffn", type=int, default=768)
  p.add_argument("--vocab", type=int, default=2048)
  p.add_argument("--repeats", type=int, default=7)
  p.add_argument("--tunix_python", default="/tmp/tunix-venv/bin/python")
  p.add_argument("--vs_transformers", action="store_true",
                 help="only the comparison with transformers, per --shapes")
  p.add_argument("--shapes", default="tiny,mid")
  p.add_argument("--tx_batch", type=int, default=64, help="rows, --vs_transformers")
  p.add_argument("--tx_seq", type=int, default=96, help="tokens per row, --vs_transformers")
  p.add_argument("--attention", default="auto", choices=ATTENTIONS,
                 help="mipu_jax's attention, --vs_transformers (cpu_fused: the fused CPU kernel)")
  a = p.parse_args()
  if a.vs_transformers:
    vs_transformers(a)
    return

  mcfg = _model_config(a)
  tokens_per_step = a.batch * a.seq
  flops = train_flops_per_token(mcfg, a.seq) * tokens_per_step
  peak = matmul_peak_gflops()
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, a.vocab, (a.batch, a.seq)),
                       jnp.int32)
  t_ours = bench_fwd_bwd(mcfg, tokens, a.repeats)
  t_tunix = bench_tunix(mcfg, a)
  steps = bench_learner_steps(mcfg, a)
  t_corr = bench_corrections_alone(a)

  def row(name, sec):
    if sec is None:
      return f"| {name} | n/a (no {a.tunix_python}) | | | |"
    gflops = flops / sec / 1e9
    return (f"| {name} | {sec * 1e3:.1f} | {tokens_per_step / sec:,.0f} | {gflops:.1f} | "
            f"{gflops / peak:.1%} |")

  print(f"model: {mcfg.num_params():,} params (D={a.hidden}, L={a.layers}, "
        f"N={a.heads}, K={a.kv_heads}, H={a.head_dim}, F={a.ffn}, V={a.vocab}); "
        f"batch {a.batch} x {a.seq} tokens; jax {jax.__version__}, "
        f"{os.cpu_count()} CPUs, load avg {os.getloadavg()[0]:.1f}")
  print(f"fp32 matmul peak: {peak:.1f} GFLOP/s\n")
  print("| measured | ms / step | tokens/s | GFLOP/s | of peak |")
  print("|---|---|---|---|---|")
  print(row("mipu_jax Qwen3 fwd+bwd", t_ours))
  print(row("tunix Qwen3 fwd+bwd", t_tunix))
  print(row("mipu_jax learner step, corrections off", steps["none"]))
  print(row("mipu_jax learner step, all corrections on", steps["mis_miles"]))
  overhead = steps["mis_miles"] / steps["none"] - 1
  print(f"\ncorrection overhead, step with mis_miles vs none: {overhead:+.2%} "
        f"(goal <= 2%)")
  print(f"corrections alone (jitted, [B, L] = [{a.batch}, {a.seq}]): "
        f"{t_corr * 1e3:.3f} ms = {t_corr / steps['none']:.3%} of the step")


if __name__ == "__main__":
  sys.exit(main())
