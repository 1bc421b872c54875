r"""The price of the true on-policy mode (docs/method.md §7), mode on against off, one run.

    python -m bench.perf.true_on_policy [--dtype bfloat16 --hidden 256 --layers 4 --seqs 16
                                       --prompt 48 --new 64 --repeats 5] [--tiny] [--json F]
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m bench.perf.true_on_policy --data 8

On one device (or `--data` devices), at one model size, for each of mode off and on:
  * row invariance at the model's own einsums: the largest difference between a
    row computed alone and inside `--seqs` rows, for a plain jitted einsum and
    for the mode's tiles (`invariant.map_rows`);
  * the sampler's tokens/s (`Sampler.generate`, warm: the fastest of
    `--repeats` calls, each decoding `--seqs` x `--new` tokens);
  * the learner step's time (`Learner.step` on those samples, warm, fastest of
    `--repeats`); both on `--data` devices (rows over a data axis);
  (the four timed calls alternate, so that load drifting on a shared machine
  hits mode on and off alike; mode off compiles the sampler with its CPU
  options, LLVM -O1 and XLA:CPU's loop emitters, mode on with jax's defaults);
  * whether the sampler's log-probs equal the learner's recomputed ones
    bitwise, and the largest difference: on a GPU this says whether the mode
    holds there with XLA's GPU kernels.
Prints a table and the ratios on / off; `--json` writes the numbers.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mipu_jax import config as config_lib
from mipu_jax import models
from mipu_jax.learner import Learner, host_batch, mesh_from_config
from mipu_jax.models import invariant
from mipu_jax.sampler import Sampler


def _interleaved(fns, repeats):
  """The fastest of `repeats` warm calls of each of `fns`, alternating between
  them so that load drifting on a shared machine hits each alike."""
  for fn in fns:
    fn()
  times = [[] for _ in fns]
  for _ in range(repeats):
    for fn, t in zip(fns, times):
      t0 = time.perf_counter()
      fn()
      t.append(time.perf_counter() - t0)
  return [float(np.min(t)) for t in times]


def _row_gaps(cfg, rows):
  """Max |row alone - row inside `rows` rows| at the model's projections, plain
  and tiled (0 means row-invariant)."""
  rng = np.random.default_rng(0)
  d, nh, f = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.intermediate_size
  out = {}
  for name, (k, n) in {"q": (d, nh), "gate": (d, f), "down": (f, d)}.items():
    w = jnp.asarray(rng.normal(0, 0.05, (k, n)), cfg.dtype)
    x = jnp.asarray(rng.normal(size=(rows, k)), cfg.dtype)
    plain = jax.jit(lambda a: a @ w)
    tiled = jax.jit(lambda a: invariant.map_rows(lambda t: t @ w, a))
    gap = lambda fn: float(jnp.max(jnp.abs(fn(x)[:1].astype(jnp.float32)
                                           - fn(x[:1]).astype(jnp.float32))))
    out[name] = {"plain": gap(plain), "tiled": gap(tiled)}
  return out


def _setup(a, model_cfg, true_on_policy):
  """A sampler and a learner of one mode, the samples' batch; the two timed calls."""
  dtype = a.dtype
  cfg = config_lib.TrainConfig(
      model=config_lib.ModelConfig(dtype=dtype),
      sampling=config_lib.SamplingConfig(dtype=dtype, true_on_policy=true_on_policy,
                                         max_new_tokens=a.new),
      data=config_lib.DataConfig(prompts_per_step=a.seqs // 2, group_size=2),
      learner=config_lib.LearnerConfig(mesh=config_lib.MeshConfig(a.data, 1, 1)))
  model = models.Qwen3(model_cfg.replace(dtype=dtype), rngs=nnx.Rngs(0))
  mesh = mesh_from_config(cfg.learner.mesh)
  sampler = Sampler(model, dtype=dtype, true_on_policy=true_on_policy,
                    max_concurrent_decodes=a.seqs, max_prefill_length=a.prompt,
                    max_decode_length=a.new, mesh=mesh if a.data > 1 else None)
  rng = np.random.default_rng(1)
  prompts = [rng.integers(1, model_cfg.vocab_size, a.prompt).tolist()
             for _ in range(a.seqs // 2)]
  gen = lambda: sampler.generate(prompts, max_new_tokens=a.new, num_samples=2, seed=0)
  out = gen()
  s, t = len(out.tokens), a.prompt + a.new
  tokens = np.zeros((s, t), np.int32)
  mask, lp_mu, loss_mask = (np.zeros((s, t), np.float32) for _ in range(3))
  for i, (resp, lp) in enumerate(zip(out.tokens, out.logprobs)):
    p, r = prompts[out.prompt_index[i]], len(resp)
    tokens[i, :a.prompt], tokens[i, a.prompt:a.prompt + r] = p, resp
    mask[i, :a.prompt + r], lp_mu[i, a.prompt:a.prompt + r] = 1, lp
    loss_mask[i, a.prompt:a.prompt + r] = 1
  learner = Learner.from_config(cfg, model, mesh, donate=False)
  state = learner.init_state(nnx.to_pure_dict(nnx.state(model, nnx.Param)), seed=0)
  lp_old = np.asarray(learner.logprobs(state.params, tokens, mask)) * loss_mask
  on = loss_mask > 0
  batch = host_batch(tokens, mask, loss_mask, lp_mu, np.tile([1.0, -1.0], s // 2),
                     lp_old_BT=lp_old)
  step = lambda: jax.block_until_ready(learner.step(state, batch))
  result = {"tokens": int(out.lengths.sum()),
            "bitwise": bool(np.array_equal(lp_old[on], lp_mu[on])),
            "max_abs_diff": float(np.abs(lp_old - lp_mu)[on].max())}
  return result, gen, step


def _run(a, model_cfg):
  """Mode off and on, their sampler and learner timed in alternation."""
  (off, gen_off, step_off), (on, gen_on, step_on) = (
      _setup(a, model_cfg, mode) for mode in (False, True))
  g_off, g_on, s_off, s_on = _interleaved([gen_off, gen_on, step_off, step_on], a.repeats)
  off.update(tokens_per_s=off.pop("tokens") / g_off, step_s=s_off)
  on.update(tokens_per_s=on.pop("tokens") / g_on, step_s=s_on)
  return {"off": off, "on": on}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--hidden", type=int, default=256)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--kv_heads", type=int, default=2)
  p.add_argument("--head_dim", type=int, default=64)
  p.add_argument("--ffn", type=int, default=768)
  p.add_argument("--vocab", type=int, default=4096)
  p.add_argument("--seqs", type=int, default=16)
  p.add_argument("--prompt", type=int, default=48)
  p.add_argument("--new", type=int, default=64)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--data", type=int, default=1, help="devices of the sampler's and the learner's data axis")
  p.add_argument("--tiny", action="store_true", help="smoke run: a tiny model, few tokens")
  p.add_argument("--json", default="")
  a = p.parse_args()
  if a.tiny:
    a.hidden, a.layers, a.ffn, a.vocab, a.head_dim = 64, 2, 128, 256, 16
    a.seqs, a.prompt, a.new, a.repeats = 4, 16, 16, 1
  if a.data > jax.device_count() or a.seqs % a.data:
    p.error(f"--data {a.data}: needs as many devices (jax has {jax.device_count()}; on a CPU "
            f"set XLA_FLAGS=--xla_force_host_platform_device_count) and --seqs a multiple")
  model_cfg = models.Qwen3Config(
      vocab_size=a.vocab, hidden_size=a.hidden, num_layers=a.layers, num_heads=a.heads,
      num_kv_heads=a.kv_heads, head_dim=a.head_dim, intermediate_size=a.ffn,
      rope_theta=10_000.0, dtype=a.dtype)
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, {a.dtype}, "
        f"D={a.hidden} L={a.layers} F={a.ffn} V={a.vocab}, {a.seqs} x ({a.prompt} + {a.new}), "
        f"on {a.data} device(s)")
  gaps = _row_gaps(model_cfg, a.seqs * a.prompt)
  for name, g in gaps.items():
    print(f"row alone vs in {a.seqs * a.prompt} rows, {name}: plain {g['plain']:.3g}, "
          f"tiled {g['tiled']:.3g}")
  res = _run(a, model_cfg)
  print("| mode | sampler tokens/s | learner step s | lp_mu == lp_old | max abs diff |")
  print("| --- | --- | --- | --- | --- |")
  for k, r in res.items():
    print(f"| {k} | {r['tokens_per_s']:.1f} | {r['step_s']:.3f} | {r['bitwise']} | "
          f"{r['max_abs_diff']:.3g} |")
  ratio = {"tokens_per_s": res["on"]["tokens_per_s"] / res["off"]["tokens_per_s"],
           "step_s": res["on"]["step_s"] / res["off"]["step_s"]}
  print(f"on / off: sampler tokens/s x{ratio['tokens_per_s']:.2f}, "
        f"learner step time x{ratio['step_s']:.2f}")
  if a.json:
    with open(a.json, "w") as f:
      json.dump({"args": vars(a), "row_gaps": gaps, "runs": res, "ratios": ratio,
                 "jax": jax.__version__, "device": jax.devices()[0].device_kind}, f, indent=1)


if __name__ == "__main__":
  main()
