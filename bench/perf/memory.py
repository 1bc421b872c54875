r"""Per-device memory of the pod configs, before / after the long-context work, in one run.

    python -m bench.perf.memory                 # 8 fake CPU devices, Qwen3-1.7B and Qwen3-4B
    python -m bench.perf.memory --devices 16 --presets qwen3_4b
    python -m bench.perf.memory --presets qwen3_30b_a3b --experts 1,2,4,8
    python -m bench.perf.memory --presets qwen3_30b_a3b --experts 8 --mu_dtype bfloat16

A mixture-of-experts preset (`pod_qwen3_30b_a3b.py`) prints, for each expert
axis of `--experts` (default: the config's), the packed learner step and the
sampler's prefill and decode (no "before": its attention and logits are the
dense models' story); on a CPU its experts are planned with the grouped
matmul's stand-in (`memory_plan`); `cpu copy` is not computed for it (XLA:CPU's
own grouped matmul expands to every expert per row: terabytes, no plan of anything).
`--mu_dtype bfloat16` plans every program with Adam's first moment in bf16
(`optim.mu_dtype`), 2 bytes less per parameter in the learner's state.

For each preset's pod config (`studies/configs/pod_qwen3_*.py`, MIPU Step 1's learner
program, one (1024 + 8192)-token row per device per micro-batch), XLA's
`compiled.memory_analysis()` of (`mipu_jax.memory_plan`):

- the learner step **before** (dense attention: `[B, K, G, T, S]` scores; dense
  `[B, T, V]` fp32 logits; one padded row per response) and **after**
  (blockwise attention, log-probs from the LM head in 1,024-position chunks),
  unpacked and with sequence packing (one packed 9,216-token row per device
  per micro-batch, beside the step's whole unpacked per-token arrays), all
  with per-layer remat;
- the sampler's prefill (one 1,024-token prompt) and decode loop (the
  config's `max_concurrent_decodes` = 2 slots per device, responses of 8,192
  tokens), KV cache in bf16 and in FP8, sharded over the slots.

Peak = arguments + temporaries + non-aliased outputs, per device. `cpu copy`
is the same program with XLA:CPU's hoisted f32 copies of the bf16 weights
(see `memory_plan`); TPU and GPU multiply bf16 natively and do not make them.
"""

import argparse
import os
import sys


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--devices", type=int, default=8)
  parser.add_argument("--presets", default="qwen3_1p7b,qwen3_4b")
  parser.add_argument("--experts", default="",
                      help="expert axes for an MoE preset, e.g. 1,2,4,8 (default: the config's)")
  parser.add_argument("--mu_dtype", default="float32", choices=("float32", "bfloat16"),
                      help="Adam's first-moment dtype (optim.mu_dtype)")
  args = parser.parse_args()
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

  import dataclasses  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top

  from studies.configs import pod_qwen3_1p7b, pod_qwen3_4b, pod_qwen3_30b_a3b  # pylint: disable=g-import-not-at-top
  from mipu_jax import models  # pylint: disable=g-import-not-at-top
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax import memory_plan as mp  # pylint: disable=g-import-not-at-top
  from mipu_jax.testing import checkpoint  # pylint: disable=g-import-not-at-top

  ckpt = checkpoint.write_tiny_qwen3(tempfile.mkdtemp())  # the config's inputs only
  train = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "tests", "fixtures", "train", "dapo_math.jsonl")
  modules = {"qwen3_1p7b": pod_qwen3_1p7b, "qwen3_4b": pod_qwen3_4b,
             "qwen3_30b_a3b": pod_qwen3_30b_a3b}
  gib = mp.GIB
  print(f"{args.devices} devices; Adam's first moment in {args.mu_dtype}; "
        "per-device GiB: peak (args + temp)")
  print("| model | program | peak | args | temp | cpu copy peak |")
  print("|---|---|---:|---:|---:|---:|")

  def config(module, opts):
    cd = module.get_config(opts)
    cd.optim.mu_dtype = args.mu_dtype
    return config_lib.from_config_dict(cd)

  for preset in args.presets.split(","):
    opts = f"step1,chips={args.devices},ckpt={ckpt},train={train}"
    if models.get_config(preset).num_experts:
      _moe_rows(modules[preset], preset, opts, args.experts, config)
      continue
    cfg = config(modules[preset], opts)
    unpacked = config(modules[preset], opts + ",pack=False")
    before = dataclasses.replace(
        mp.with_model(unpacked, attention="dense"),
        learner=dataclasses.replace(unpacked.learner, logits_chunk=0))
    rows = [(name, mp.learner_memory(c, 1024), mp.learner_memory(c, 1024, cpu_artifacts=True))
            for name, c in (("learner before", before),
                            ("learner after, one row per device", unpacked),
                            ("learner after, packed (the default)", cfg))]
    slots = cfg.sampling.max_concurrent_decodes  # the config's: 2 per device
    for kv in (None, "fp8"):
      pre, dec = mp.sampler_memory(cfg, 1024, slots, kv_cache_dtype=kv)
      pre_c, dec_c = mp.sampler_memory(cfg, 1024, slots, kv_cache_dtype=kv,
                                       cpu_artifacts=True)
      name = "bf16" if kv is None else kv
      rows += [(f"prefill (KV {name})", pre, pre_c),
               (f"decode {slots} x 9216 (KV {name})", dec, dec_c)]
    for name, m, c in rows:
      print(f"| {preset} | {name} | {m.peak / gib:.2f} | {m.arguments / gib:.2f} | "
            f"{m.temporaries / gib:.2f} | {c.peak / gib:.2f} |", flush=True)
  return 0


def _moe_rows(module, preset: str, opts: str, experts: str, config) -> None:
  """The MoE rows: per expert axis, the packed learner, prefill and decode."""
  from mipu_jax import memory_plan as mp  # pylint: disable=g-import-not-at-top
  axes = [int(e) for e in experts.split(",") if e] or [None]
  for expert in axes:
    cfg = config(module, opts + ("" if expert is None else f",expert={expert}"))
    slots, ep = cfg.sampling.max_concurrent_decodes, cfg.learner.mesh.expert
    pre, dec = mp.sampler_memory(cfg, 1024, slots)
    rows = [("learner, packed", mp.learner_memory(cfg, 1024)), ("prefill (KV bf16)", pre),
            (f"decode {slots} x 9216 (KV bf16)", dec)]
    for name, m in rows:
      print(f"| {preset}, expert {ep} | {name} | {m.peak / mp.GIB:.2f} | "
            f"{m.arguments / mp.GIB:.2f} | {m.temporaries / mp.GIB:.2f} | n/a |", flush=True)


if __name__ == "__main__":
  sys.exit(main())
