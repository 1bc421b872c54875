"""Policy forward+backward throughput vs the machine's fp32 matmul peak and PyTorch.

Measures, in one run on the same machine:
  * mipu_jax's Qwen3 forward+backward (jitted, fp32): tokens/s and achieved GFLOP/s;
  * the machine's fp32 matmul peak (a large jitted jnp.dot);
  * Hugging Face transformers' Qwen3ForCausalLM forward+backward on the same
    config and the same weights (CPU torch, fp32);
and prints the ratios. Usage:

  python -m bench.perf.model [--batch 8 --seq 128 --hidden 256 --layers 4 --repeats 5]
"""

import argparse
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mipu_jax import models


def one_row_learner(mcfg: models.Qwen3Config, prompt: int, response: int, logits_chunk: int):
  """The learner step the benches time: MIPU Step 1's loss on one (prompt +
  response)-token row, one device; `(learner, state, batch)` with random
  tokens and log-probs (`bench/gpu/accelerator.py`, `bench/perf/attention.py`)."""
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax import losses  # pylint: disable=g-import-not-at-top
  from mipu_jax.learner import host_batch, Learner, mesh_from_config  # pylint: disable=g-import-not-at-top
  t = prompt + response
  model = models.Qwen3(mcfg, rngs=nnx.Rngs(0))
  cfg = config_lib.TrainConfig(
      data=config_lib.DataConfig(prompts_per_step=1, group_size=2),
      loss=losses.LossConfig(correction=losses.CorrectionConfig.from_preset("mipu_step1")),
      learner=config_lib.LearnerConfig(logits_chunk=logits_chunk, log_entropy=False,
                                       mesh=config_lib.MeshConfig(1, 1, 1)),
      sampling=config_lib.SamplingConfig(max_new_tokens=response))
  learner = Learner.from_config(cfg, model, mesh_from_config(cfg.learner.mesh))
  state = learner.init_state(nnx.to_pure_dict(nnx.state(model, nnx.Param)), seed=0)
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, mcfg.vocab_size, (1, t))
  loss_mask = (np.arange(t) >= prompt)[None].astype(np.float32)
  lp = rng.normal(-2.0, 0.1, (1, t)) * loss_mask
  batch = host_batch(tokens, np.ones((1, t), np.float32), loss_mask, lp, np.ones(1),
                     lp_old_BT=lp)
  return learner, state, batch


def train_flops_per_token(cfg: models.Qwen3Config, seq: int) -> float:
  """Matmul FLOPs of forward+backward per token (3x forward; causal attention halves QK/PV)."""
  d, f, n, k, h, v = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                      cfg.head_dim, cfg.vocab_size)
  per_layer = 2 * (d * n * h + 2 * d * k * h + n * h * d + 3 * d * f)
  attention = 2 * 2 * n * h * seq / 2
  return 3 * (cfg.num_layers * (per_layer + attention) + 2 * d * v)


def _time(fn, repeats):
  fn()  # compile / warm up
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def matmul_peak_program(n=2048):
  """`(call, flops)`: one fp32 n x n matmul, the machine's matmul peak; a bench that
  times it in the same rounds as its own programs gets a peak from the same load."""
  a = jnp.ones((n, n), jnp.float32)
  b = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda a, b: a @ b)
  return (lambda: f(a, b).block_until_ready()), 2 * n**3


def matmul_peak_gflops(n=2048, repeats=5) -> float:
  call, flops = matmul_peak_program(n)
  return flops / _time(call, repeats) / 1e9


def bench_jax(model, tokens, repeats):
  def loss(m, t):
    lp = models.token_logprobs(m(t).logits[:, :-1], t[:, 1:])
    return -jnp.mean(lp)

  step = nnx.jit(nnx.value_and_grad(loss))
  tokens = jnp.asarray(tokens)

  def run():
    l, g = step(model, tokens)
    jax.block_until_ready((l, g))

  return _time(run, repeats)


def bench_torch(path, tokens, repeats, threads):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)
  hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  hf.train()
  t = torch.tensor(np.asarray(tokens, np.int64))

  def run():
    hf.zero_grad(set_to_none=True)
    logits = hf(t).logits[:, :-1]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, t[:, 1:, None])[..., 0]
    (-lp.mean()).backward()

  return _time(run, repeats)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--kv_heads", type=int, default=2)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--mlp", type=int, default=768)
  p.add_argument("--vocab", type=int, default=4096)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--no_torch", action="store_true")
  args = p.parse_args()

  cfg = models.Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden,
                           num_layers=args.layers, num_heads=args.heads,
                           num_kv_heads=args.kv_heads, head_dim=args.head_dim,
                           intermediate_size=args.mlp, tie_embeddings=True)
  model = models.Qwen3(cfg, rngs=nnx.Rngs(0))
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq))
  n_tok = args.batch * args.seq
  flops = train_flops_per_token(cfg, args.seq) * n_tok
  threads = os.cpu_count() or 1

  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, cpu threads {threads}")
  print(f"config: {cfg.num_params() / 1e6:.1f}M params, batch {args.batch} x seq {args.seq}")
  peak = matmul_peak_gflops()
  t_jax = bench_jax(model, tokens, args.repeats)
  rows = [("fp32 matmul peak (jnp.dot 2048^2)", None, peak),
          ("mipu_jax Qwen3 fwd+bwd", n_tok / t_jax, flops / t_jax / 1e9)]
  t_torch = None
  if not args.no_torch:
    with tempfile.TemporaryDirectory() as d:
      models.save_pretrained(model, d)
      t_torch = bench_torch(d, tokens, args.repeats, threads)
    rows.append(("transformers Qwen3 fwd+bwd (torch CPU)", n_tok / t_torch, flops / t_torch / 1e9))

  print(f"\n{'what':42s} {'tokens/s':>10s} {'GFLOP/s':>9s}")
  for name, tps, gf in rows:
    print(f"{name:42s} {'' if tps is None else f'{tps:10.0f}':>10s} {gf:9.1f}")
  print(f"\nmipu_jax achieved / matmul peak: {flops / t_jax / 1e9 / peak:.2f}")
  if t_torch is not None:
    print(f"mipu_jax / transformers speed:   {t_torch / t_jax:.2f}x")


if __name__ == "__main__":
  main()
