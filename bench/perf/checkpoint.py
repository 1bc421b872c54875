r"""Checkpoint cost of a Qwen3-4B-shaped learner state: save, restore, fingerprint.

    python -m bench.perf.checkpoint --json /tmp/ckpt.json      # ~1 min on 2 CPU cores

The learner state is fp32 parameters plus Adam's two moments, 12 bytes per
parameter: 48 GB for Qwen3-4B, twice this machine's memory. So the bench
builds the state of `--layers` decoder layers (1 and 2 by default) at the 4B
shapes, sharded over 8 CPU devices (each array split on its first axis that 8
divides, as the learner's FSDP axis does), and times on each:

- `fingerprint`: `checkpoint.fingerprint` (what every save records and every
  restore checks), jitted, warm;
- `save`: `Checkpointer.save` until the step is committed (`wait()`), and the
  part the training loop waits for (the call itself: device → host copy);
- `restore`: `Checkpointer.restore` into the sharded target, fingerprint
  check included.

Each time is divided by the bytes, and the per-byte rate of the largest
subset extrapolates to the whole state (the embedding / tied head included
in the byte count). The fraction is against a planned learner step: 6 ×
parameters × `--step_tokens` FLOPs at `--mfu` of `--peak_tflops` (default: 64
× 2,048 tokens at the 43% MFU bench/README.md measured for the learner on an
H100, against the 989 TFLOP/s of NVIDIA's datasheet).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
from flax import nnx  # pylint: disable=wrong-import-position
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=wrong-import-position

from mipu_jax import checkpoint  # pylint: disable=wrong-import-position
from mipu_jax.models import Qwen3, get_config  # pylint: disable=wrong-import-position


def param_shapes(num_layers: int) -> dict:
  """Shapes of the 4B model's parameters with `num_layers` layers (no allocation)."""
  cfg = get_config("qwen3_4b", num_layers=num_layers)
  state = nnx.state(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))
  leaves = jax.tree_util.tree_leaves_with_path(state)
  return {jax.tree_util.keystr(p): tuple(x.shape) for p, x in leaves}


def sharding_for(shape, mesh) -> NamedSharding:
  spec = [None] * len(shape)
  for axis, n in enumerate(shape):
    if n % mesh.size == 0:
      spec[axis] = "fsdp"
      break
  return NamedSharding(mesh, P(*spec))


def build_state(shapes: dict, mesh, seed: int) -> dict:
  """fp32 params + Adam mu / nu, random, sharded; the embedding left out."""
  key = jax.random.key(seed)
  state = {}
  for part in ("params", "mu", "nu"):
    state[part] = {}
    for i, (name, shape) in enumerate(sorted(shapes.items())):
      if "embed" in name:
        continue
      sh = sharding_for(shape, mesh)
      make = jax.jit(lambda k, shape=shape: jax.random.normal(k, shape, jnp.float32),
                     out_shardings=sh)
      state[part][name] = make(jax.random.fold_in(key, 1000 * len(state) + i))
  return state


def nbytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def measure(layers: int, mesh, directory: str) -> dict:
  state = build_state(param_shapes(layers), mesh, seed=layers)
  jax.block_until_ready(state)
  size = nbytes(state)
  checkpoint.fingerprint(state)  # compile
  t0 = time.perf_counter()
  checkpoint.fingerprint(state)
  fp = time.perf_counter() - t0
  ckpt = checkpoint.Checkpointer(os.path.join(directory, f"l{layers}"), max_to_keep=1)
  t0 = time.perf_counter()
  ckpt.save(1, state, {"layers": layers})
  blocking = time.perf_counter() - t0
  ckpt.wait()
  save = time.perf_counter() - t0
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        state)
  del state
  t0 = time.perf_counter()
  restored, _ = ckpt.restore(1, target=target)
  jax.block_until_ready(restored)
  restore = time.perf_counter() - t0
  ckpt.close()
  del restored
  return dict(layers=layers, bytes=size, fingerprint_s=fp, save_s=save,
              save_blocking_s=blocking, restore_s=restore)


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--layers", default="1,2", help="subset sizes (decoder layers)")
  p.add_argument("--dir", default=None, help="where checkpoints are written (default: a temp dir)")
  p.add_argument("--step_tokens", type=int, default=64 * 2048)
  p.add_argument("--mfu", type=float, default=0.43)
  p.add_argument("--peak_tflops", type=float, default=989.0)
  p.add_argument("--json", default=None)
  a = p.parse_args()
  mesh = Mesh(np.array(jax.devices()), ("fsdp",))
  directory = a.dir or tempfile.mkdtemp(prefix="ckpt_bench_")
  full_shapes = param_shapes(36)
  params = sum(int(np.prod(s)) for s in full_shapes.values())
  full_bytes = 12 * params
  step_s = 6 * params * a.step_tokens / (a.mfu * a.peak_tflops * 1e12)
  out = dict(jax=jax.__version__, devices=len(jax.devices()), load_average=os.getloadavg(),
             params=params, full_state_bytes=full_bytes, planned_step_s=step_s, subsets=[])
  try:
    for layers in [int(x) for x in a.layers.split(",")]:
      m = measure(layers, mesh, directory)
      out["subsets"].append(m)
      print(f"  {layers} layer(s): {m}", file=sys.stderr, flush=True)
  finally:
    if a.dir is None:
      shutil.rmtree(directory, ignore_errors=True)
  last = out["subsets"][-1]
  scale = full_bytes / last["bytes"]
  out["extrapolated"] = {k: last[k] * scale for k in
                         ("fingerprint_s", "save_s", "save_blocking_s", "restore_s")}
  lines = [f"checkpoint of a Qwen3-4B learner state ({params / 1e9:.2f} B params, fp32 + "
           f"Adam: {full_bytes / 1e9:.1f} GB), {out['devices']} CPU devices, jax {out['jax']}, "
           f"load average {out['load_average'][0]:.2f}", "",
           "| subset | bytes | fingerprint | save (to commit) | save (loop waits) | restore |",
           "|---|---|---|---|---|---|"]
  for m in out["subsets"]:
    gb = m["bytes"] / 1e9
    lines.append(f"| {m['layers']} layer(s) | {gb:.2f} GB | {m['fingerprint_s']:.2f} s "
                 f"({gb / m['fingerprint_s']:.2f} GB/s) | {m['save_s']:.2f} s "
                 f"({gb / m['save_s']:.2f} GB/s) | {m['save_blocking_s']:.2f} s | "
                 f"{m['restore_s']:.2f} s ({gb / m['restore_s']:.2f} GB/s) |")
  e = out["extrapolated"]
  lines.append(f"| whole state (extrapolated) | {full_bytes / 1e9:.1f} GB | "
               f"{e['fingerprint_s']:.1f} s | {e['save_s']:.1f} s | {e['save_blocking_s']:.1f} s "
               f"| {e['restore_s']:.1f} s |")
  lines += ["", f"planned learner step: {step_s:.2f} s (6 x params x {a.step_tokens} tokens at "
                f"{a.mfu:.0%} of {a.peak_tflops:.0f} TFLOP/s); per save, as a fraction of it: "
                f"fingerprint {e['fingerprint_s'] / step_s:.2f}, the loop's wait "
                f"{e['save_blocking_s'] / step_s:.2f}, save to commit {e['save_s'] / step_s:.2f}; "
                f"fingerprint / save {e['fingerprint_s'] / e['save_s']:.3f}"]
  print("\n".join(lines))
  if a.json:
    with open(a.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
