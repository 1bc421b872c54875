r"""The Pallas decode-attention kernel alone, per launch plan, against its read bound.

    python bench/paged_kernel.py --json /tmp/plans.json        # a GPU

One layer of a Qwen3-0.6B-shaped paged cache (64 rows x 2,048 slots, 8 kv
heads of 128, 16 query heads, bfloat16, pages of 64), rows filled to 1/8, 1/2
and all of their slots. For each plan `(pages_per_block, k_splits, num_warps,
num_stages)` of `mipu_jax.models.paged_pallas.decode` and for the XLA path
(`attention.paged`): the best time of one call, and `read`, the best time of
a jitted sum over the bytes the call must read (the filled K/V slots), in the
same run. The best plan at full fill is printed as the
`MIPU_PALLAS_DECODE_PLAN` value that selects it.
"""

import argparse
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp

from attention import _best_time  # pylint: disable=g-import-not-at-top
from decode import bandwidth_times  # pylint: disable=g-import-not-at-top
from mipu_jax.models import attention, paged_pallas  # pylint: disable=g-import-not-at-top


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rows", type=int, default=64)
  p.add_argument("--slots", type=int, default=2048)
  p.add_argument("--page", type=int, default=64)
  p.add_argument("--kv_heads", type=int, default=8)
  p.add_argument("--heads", type=int, default=16)
  p.add_argument("--head_dim", type=int, default=128)
  p.add_argument("--ppb", default="1,2,4")
  p.add_argument("--splits", default="1,2,4")
  p.add_argument("--warps", default="4,8")
  p.add_argument("--stages", default="2")
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--json", default=None)
  a = p.parse_args()
  b, s, g, k, n, h = a.rows, a.slots, a.page, a.kv_heads, a.heads, a.head_dim
  j = s // g
  key = jax.random.split(jax.random.key(0), 3)
  kp = jax.random.normal(key[0], (k, b * j, g, h), jnp.bfloat16)
  vp = jax.random.normal(key[1], (k, b * j, g, h), jnp.bfloat16)
  q = jax.random.normal(key[2], (b, 1, n, h), jnp.bfloat16)
  ids = jnp.arange(b * j, dtype=jnp.int32).reshape(b, j)
  interpret = jax.default_backend() != "gpu"
  ints = lambda t: [int(x) for x in t.split(",")]
  plans = [pl for pl in itertools.product(ints(a.ppb), ints(a.splits), ints(a.warps),
                                          ints(a.stages)) if j % (pl[0] * pl[1]) == 0]
  out = dict(device=str(jax.devices()[0].device_kind), jax=jax.__version__, rows=b, slots=s,
             page=g, kv_heads=k, heads=n, head_dim=h, default_plan=paged_pallas.split_plan(
                 b, k, j, g) + (4, 2), levels=[])
  for fill in (s // 8, s // 2, s):
    valid = jnp.arange(s)[None, :] < fill
    valid = jnp.broadcast_to(valid, (b, s))
    q_slot = jnp.full((b, 1), fill - 1, jnp.int32)
    nbytes = 2 * b * fill * k * h * 2
    _, read_s = bandwidth_times(nbytes, a.repeats)
    level = dict(fill=fill, bytes=nbytes, read_s=read_s, plans={})
    xla = jax.jit(lambda q, kp, vp, ids, valid, q_slot: attention.paged(
        q, kp, vp, None, None, ids, valid, q_slot, jnp.bfloat16))
    level["xla_s"] = _best_time(lambda: xla(q, kp, vp, ids, valid, q_slot).block_until_ready(),
                                a.repeats)
    for plan in plans:
      fn = jax.jit(lambda q, kp, vp, ids, valid, q_slot, plan=plan: paged_pallas.decode(
          q, kp, vp, None, None, ids, valid, q_slot, jnp.bfloat16, plan=plan,
          interpret=interpret))
      try:
        t = _best_time(lambda: fn(q, kp, vp, ids, valid, q_slot).block_until_ready(), a.repeats)
      except Exception as e:  # pylint: disable=broad-except
        t = f"{type(e).__name__}: {str(e)[:120]}"
      level["plans"][",".join(map(str, plan))] = t
      print(f"fill {fill} plan {plan}: {t}", file=sys.stderr, flush=True)
    out["levels"].append(level)
  print(f"kernel, {b} rows x {s} slots, pages of {g}, {k} kv heads of {h}, {n} heads, bf16, "
        f"{out['device']}, jax {out['jax']}; times in ms, x = / read bound\n")
  names = list(out["levels"][0]["plans"])
  print("| plan | " + " | ".join(f"fill {lv['fill']}" for lv in out["levels"]) + " |")
  print("|---|" + "---|" * len(out["levels"]))
  fmt = lambda t, lv: (f"{t * 1e3:.3f} ({t / lv['read_s']:.2f}x)" if isinstance(t, float)
                       else "fails")
  print("| read bound | " + " | ".join(f"{lv['read_s'] * 1e3:.3f}" for lv in out["levels"]) + " |")
  print("| XLA paged | " + " | ".join(fmt(lv["xla_s"], lv) for lv in out["levels"]) + " |")
  for name in names:
    print(f"| {name} | " + " | ".join(fmt(lv["plans"][name], lv) for lv in out["levels"]) + " |")
  full = out["levels"][-1]["plans"]
  ok = {k_: v for k_, v in full.items() if isinstance(v, float)}
  if ok:
    best = min(ok, key=ok.get)
    out["best_plan"] = best
    print(f"\nbest at full fill: {paged_pallas.PLAN_ENV}={best} "
          f"(default plan {out['default_plan']})")
  if a.json:
    with open(a.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
