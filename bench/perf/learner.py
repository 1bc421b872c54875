r"""Learner throughput vs the machine's fp32 matmul peak and tunix; correction overhead.

    python -m bench.perf.learner [--batch 16 --seq 128 --hidden 256 --layers 4 --repeats 7]

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
import subprocess
import sys
import time

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

_HERE = os.path.dirname(os.path.abspath(__file__))


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
  a = p.parse_args()

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
