r"""One decode step against the bytes it must read, per fill level of the KV cache.

    python -m bench.perf.decode                     # CPU shape: KV cache dominates
    python -m bench.perf.decode --json /tmp/decode.json
    python -m bench.perf.decode --rows 64 --slots 2048 --preset qwen3_0p6b --dtype bfloat16  # a GPU

For each fill level (1/8, 1/2 and all of the cache's slots filled in every
row) and each decode attention (`paged`, which reads only the pages holding a
filled slot, as XLA ops; `pallas` / `pallas_tpu`, the same as one Pallas
kernel per layer, timed on a GPU / TPU only; and `dense`, the reference that
reads every slot), in one run:

- `step`: the best time of one engine decode step (`Engine.generate_step`: the
  model over one token per row, the cache write, the sample and its
  log-prob), the decode state donated as the sampler does;
- `must read`: the bytes the step cannot avoid reading: every row's filled
  K/V slots over all layers (at the cache's dtype, scales included) and every
  weight once (the tied LM head included; the embedding lookup reads B rows);
- `copy`: the best time of copying a buffer of that many bytes on the same
  device (a jitted `x + 1` over uint8: it reads the bytes once and writes
  them once), measured in the same run, and `read`: a jitted sum over the
  same bytes (reads only). `step / copy` is the ratio to the bound.

The goals: the 1/8-fill step at most 0.3x the full-fill step, and
every paged step within 2x of its copy bound. The rows of the cache hold
random K/V (their values do not change the time); prompts are not shared
here (one prompt block per row), so the bytes are those of a plain cache.
"""

import argparse
import json
import os

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.perf.attention import _best_time
from mipu_jax.models import Qwen3, get_config
from mipu_jax.sampler.config import SamplerConfig
from mipu_jax.sampler.engine import Engine

# The CPU shape: a small model whose KV cache, not its weights, is most of a
# step's bytes (64 rows x 4,096 slots: 268 MB of float32 K/V per layer pair).
SMALL = dict(vocab_size=4096, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4,
             head_dim=32, intermediate_size=512)


def bandwidth_times(nbytes: int, repeats: int) -> tuple[float, float]:
  """(copy, read) seconds for `nbytes` bytes on the default device."""
  x = jnp.ones((nbytes,), jnp.uint8)
  copy = jax.jit(lambda a: a + 1)
  read = jax.jit(lambda a: jnp.sum(a, dtype=jnp.uint32))
  t_copy = _best_time(lambda: copy(x).block_until_ready(), repeats)
  t_read = _best_time(lambda: read(x).block_until_ready(), repeats)
  return t_copy, t_read


def filled_state(engine: Engine, rows: int, slots: int, fill: int, prompt: int, seed: int):
  """A decode state whose every row holds `fill` slots (random K/V) and decodes."""
  state = engine.init_decode_state(num_slots=rows, prefill_length=prompt,
                                   decode_length=slots - prompt)
  cache = state.cache
  keys = iter(jax.random.split(jax.random.key(seed), 4))

  def rand(x):  # on the device: a GPU cache is gigabytes
    if x is None:
      return None
    if jnp.issubdtype(x.dtype, jnp.integer):
      return jax.random.randint(next(keys), x.shape, -127, 128, jnp.int32).astype(x.dtype)
    return jax.random.normal(next(keys), x.shape, jnp.float32).astype(x.dtype)

  cache = cache._replace(k=rand(cache.k), v=rand(cache.v),
                         index=jnp.full((rows,), fill, jnp.int32))
  n = state.tokens_BN.shape[1]
  return state._replace(cache=cache, active_B=jnp.ones((rows,), bool),
                        done_B=jnp.zeros((rows,), bool),
                        num_generated_B=jnp.ones((rows,), jnp.int32),
                        max_new_B=jnp.full((rows,), n, jnp.int32),
                        last_token_B=jnp.asarray(np.random.default_rng(seed).integers(1, 100, rows),
                                                 jnp.int32))


def weight_bytes(cfg, dtype) -> int:
  """Every weight read once per step at the compute dtype (the LM head included,
  tied or not), plus the B embedding rows, which are negligible and left out."""
  itemsize = jnp.dtype(dtype).itemsize
  d, f, n, k, h = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                   cfg.head_dim)
  per_layer = d * (n + 2 * k) * h + n * h * d + 3 * d * f
  return (cfg.num_layers * per_layer + cfg.vocab_size * d) * itemsize


def kv_slot_bytes(cfg, kv_dtype) -> int:
  """Bytes of one slot's K and V over all layers at the cache dtype (an int8
  cache's float32 per-(token, head) scales included: `kv_cache.init_pool`)."""
  kv_dtype = jnp.dtype(kv_dtype)
  per_slot = 2 * cfg.num_kv_heads * cfg.head_dim * kv_dtype.itemsize
  if kv_dtype == jnp.int8:
    per_slot += 2 * cfg.num_kv_heads * jnp.dtype(jnp.float32).itemsize
  return cfg.num_layers * per_slot


def kv_bytes(cache, cfg, rows: int, fill: int) -> int:
  """Bytes of the filled K/V slots of every row and layer (scales included)."""
  return rows * fill * kv_slot_bytes(cfg, cache.k.dtype)


def run(args) -> dict:
  cfg = (get_config(args.preset) if args.preset else
         get_config("tiny", tie_embeddings=True, **SMALL))
  model = Qwen3(cfg, rngs=nnx.Rngs(0))
  fills = [max(args.prompt + 1, int(round(f * args.slots))) for f in (1 / 8, 1 / 2, 1.0)]
  fills[-1] = args.slots - 1  # the last slot: the step writes one more entry
  out = dict(device=str(jax.devices()[0].device_kind), backend=jax.default_backend(),
             jax=jax.__version__, rows=args.rows, slots=args.slots, dtype=args.dtype,
             kv_cache_dtype=args.kv_cache_dtype or args.dtype, page_size=None,
             model=args.preset or "small", load_average=os.getloadavg(), levels=[])
  engines = {}
  for impl in args.impls:
    config = SamplerConfig(dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype,
                           kv_cache_storage="real", max_concurrent_decodes=args.rows,
                           max_prefill_length=args.prompt,
                           max_decode_length=args.slots - args.prompt,
                           page_size=args.page_size, decode_attention=impl)
    engine = Engine(model, config)
    engines[impl] = (engine, engine.load_params())
  for fill in fills:
    level = dict(fill=fill, fraction=fill / args.slots)
    for impl, (engine, params) in engines.items():
      state = filled_state(engine, args.rows, args.slots, fill, args.prompt, seed=fill)
      out["page_size"] = state.cache.page_size
      holder = [state]

      def step(engine=engine, params=params, holder=holder):
        # Each step advances every row by one slot; rewind the index (a host
        # scalar write) so every timed step sees the same fill.
        st, _ = engine.generate_step(params, holder[0])
        st.tokens_BN.block_until_ready()
        # done_B too: a row whose step wrote its last slot is finished, and a
        # finished row's next step does no work.
        holder[0] = st._replace(cache=st.cache._replace(
            index=jnp.full((args.rows,), fill, jnp.int32)),
            num_generated_B=jnp.ones((args.rows,), jnp.int32),
            done_B=jnp.zeros((args.rows,), bool))

      level[impl] = _best_time(step, args.repeats)
      must = kv_bytes(state.cache, cfg, args.rows, fill) + weight_bytes(cfg, args.dtype)
      level["must_read_bytes"] = must
    level["copy_s"], level["read_s"] = bandwidth_times(level["must_read_bytes"], args.repeats)
    out["levels"].append(level)
  return out


def report(out: dict) -> str:
  lines = [f"decode step, {out['rows']} rows x {out['slots']} slots, model {out['model']}, "
           f"{out['dtype']} (KV {out['kv_cache_dtype']}), page {out['page_size']}, "
           f"{out['device']} ({out['backend']}), jax {out['jax']}, load average "
           f"{out['load_average'][0]:.2f}", ""]
  impls = [k for k in ("pallas", "pallas_tpu", "paged", "dense") if k in out["levels"][0]]
  head = "| fill | must read | copy | read | " + " | ".join(
      f"{i} step | {i} / copy" for i in impls) + " |"
  lines += [head, "|" + "---|" * (4 + 2 * len(impls))]
  for lv in out["levels"]:
    cells = [f"{lv['fraction']:.3f} ({lv['fill']})", f"{lv['must_read_bytes'] / 1e6:,.1f} MB",
             f"{lv['copy_s'] * 1e3:.2f} ms", f"{lv['read_s'] * 1e3:.2f} ms"]
    for i in impls:
      cells += [f"{lv[i] * 1e3:.2f} ms", f"{lv[i] / lv['copy_s']:.2f}x"]
    lines.append("| " + " | ".join(cells) + " |")
  first, last = out["levels"][0], out["levels"][-1]
  lines.append("")
  for i in impls:
    worst = max(lv[i] / lv["copy_s"] for lv in out["levels"])
    lines.append(f"{i}: step at {first['fraction']:.3f} fill / full-fill step = "
                 f"{first[i] / last[i]:.2f} (goal <= 0.3); worst step / copy bound = "
                 f"{worst:.2f} (goal <= 2)")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--slots", type=int, default=4096, help="cache slots per row")
  parser.add_argument("--prompt", type=int, default=64, help="prefill region (slots)")
  parser.add_argument("--preset", default=None, help="a Qwen3 preset (default: the small CPU shape)")
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--kv_cache_dtype", default=None)
  parser.add_argument("--page_size", type=int, default=64)
  parser.add_argument("--impls", default=None, type=lambda s: s.split(","),
                      help="decode attentions (default: pallas,paged,dense on a GPU, "
                           "pallas_tpu,paged,dense on a TPU, paged,dense elsewhere: an "
                           "interpreted kernel is not timed)")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--json", default=None, help="also write the results here")
  args = parser.parse_args()
  if args.impls is None:
    kernel = {"gpu": ["pallas"], "tpu": ["pallas_tpu"]}.get(jax.default_backend(), [])
    args.impls = kernel + ["paged", "dense"]
  out = run(args)
  print(report(out))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
