r"""The Pallas decode-attention kernel alone, per launch plan, against its read bound.

    python -m bench.gpu.paged_kernel --json /tmp/plans.json        # a GPU, ~2-3 min
    python -m bench.gpu.paged_kernel --kv_dtype fp8 --sweep_fills 2048,256 --json /tmp/fp8.json

A Qwen3-0.6B-shaped paged cache (64 rows x 2,048 slots, 8 kv heads of 128, 16
query heads, pages of 64; `--kv_dtype` bfloat16 or fp8) whose pools hold every
layer (`--layers` 28: 15 GB in bf16, so the kernel addresses them as the
sampler's does, with 64-bit offsets), one layer's pages read. Every plan
`(block, k_splits, num_warps, num_stages)` of `mipu_jax.models.paged_pallas.decode`
is timed with rows filled to each of `--sweep_fills` (default: full), for the page
gather (blocks of pages) and the slot gather (`--slot_plans`, blocks of slots),
each against `read`, a jitted sum over as many bytes as the call must read (the
filled K/V slots), in the same run; the default plan and the best `--top` are
then timed with rows filled to 1/8, 1/2 and all of their slots, next to the XLA
path (`attention.paged`).

A time is the best over `--repeats` of the mean of `--calls` back-to-back
calls, blocking on the last only: the device's time per call, the host's
dispatch overlapped (one blocking call also counts launch and dispatch,
about 0.1 ms on an H200, a third of a full-fill layer). The best plan at full
fill is printed as the `MIPU_PALLAS_DECODE_PLAN` value that selects it. A
plan whose full-fill output is not XLA paged's (within bf16 rounding) is
reported, not timed. The plan with the least summed time over the sweep's fills is
printed as the `paged_pallas.MEASURED_PLANS` row of this shape's class, to paste
there (the plan `auto` then takes on this device for this class).
"""

import argparse
import itertools
import json
import sys
import time

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp

from mipu_jax.models import attention, paged_pallas  # pylint: disable=g-import-not-at-top


def per_call(fn, calls: int, repeats: int) -> float:
  """Seconds per call of `fn` over `calls` back-to-back calls (best of `repeats`)."""
  jax.block_until_ready(fn())  # compile, warm up
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(calls):
      out = fn()
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - t0) / calls)
  return best


def main():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rows", type=int, default=64)
  p.add_argument("--slots", type=int, default=2048)
  p.add_argument("--page", type=int, default=64)
  p.add_argument("--kv_heads", type=int, default=8)
  p.add_argument("--heads", type=int, default=16)
  p.add_argument("--head_dim", type=int, default=128)
  p.add_argument("--layers", type=int, default=28, help="layers the pools hold")
  p.add_argument("--ppb", default="1,2")
  p.add_argument("--splits", default="2,4,8,16")
  p.add_argument("--warps", default="4,8")
  p.add_argument("--stages", default="2,3,4")
  p.add_argument("--slot_plans", default="32,4,4,2;32,4,4,3;32,8,4,2;32,8,4,3;"
                 "64,4,4,2;64,4,4,3;64,8,4,2;64,8,4,3",
                 help="plans of the slot gather ('block,splits,warps,stages;...'; '' for none)")
  p.add_argument("--kv_dtype", default="bfloat16", help="the pools' dtype: bfloat16 or fp8")
  p.add_argument("--sweep_fills", default="",
                 help="filled slots per row at which every plan is timed (default: all)")
  p.add_argument("--top", type=int, default=3, help="plans timed at every fill")
  p.add_argument("--max_seconds", type=float, default=0,
                 help="stop the sweep (in the plans' order) after this long; 0: no limit")
  p.add_argument("--calls", type=int, default=20)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--json", default=None)
  a = p.parse_args()
  b, s, g, k, n, h = a.rows, a.slots, a.page, a.kv_heads, a.heads, a.head_dim
  j = s // g
  per_layer = b * j
  key = jax.random.split(jax.random.key(0), 3)

  pool_dtype = jnp.dtype(jnp.float8_e4m3fn if a.kv_dtype == "fp8" else a.kv_dtype)
  sweep_fills = [int(x) for x in a.sweep_fills.split(",") if x.strip()] or [s]

  @jax.jit
  def pool(key):  # the read layer random, the others zero
    x = jax.random.normal(key, (k, per_layer, g, h), jnp.float32).astype(pool_dtype)
    return jnp.concatenate([jnp.zeros((k, (a.layers - 1) * per_layer, g, h), pool_dtype), x],
                           axis=1)

  kp, vp = pool(key[0]), pool(key[1])
  q = jax.random.normal(key[2], (b, 1, n, h), jnp.bfloat16)
  ids = jnp.arange(per_layer, dtype=jnp.int32).reshape(b, j) + (a.layers - 1) * per_layer
  interpret = jax.default_backend() != "gpu"
  ints = lambda t: [int(x) for x in t.split(",")]
  plans = [("pages", pl) for pl in itertools.product(ints(a.ppb), ints(a.splits),
                                                     ints(a.warps), ints(a.stages))
           if j % (pl[0] * pl[1]) == 0 and pl[0] * g >= 16]
  slot_plans = [tuple(ints(x)) for x in a.slot_plans.split(";") if x.strip()]
  plans += [("slots", pl) for pl in slot_plans if s % (pl[0] * pl[1]) == 0]
  default = ("pages", paged_pallas.split_plan(b, k, j, g) + (4, 2))
  # As MIPU_PALLAS_DECODE_PLAN reads it: "1,4,4,2" (pages), "slots:64,4,4,3".
  name = lambda plan: ("" if plan[0] == "pages" else plan[0] + ":") + ",".join(map(str, plan[1]))
  out = dict(device=str(jax.devices()[0].device_kind), jax=jax.__version__, rows=b, slots=s,
             page=g, kv_heads=k, heads=n, head_dim=h, layers=a.layers, calls=a.calls,
             kv_dtype=pool_dtype.name, default_plan=name(default), sweeps={}, levels=[])

  kernels = {}

  def kernel(plan):
    if plan not in kernels:
      kernels[plan] = jax.jit(lambda q, kp, vp, ids, lengths: paged_pallas.decode(
          q, kp, vp, None, None, ids, lengths, jnp.bfloat16, gather=plan[0],
          plan=plan[1], interpret=interpret))
    return kernels[plan]

  def inputs(fill):
    """Rows of `fill` slots: the kernel's lengths, the XLA path's query slots."""
    return jnp.full((b,), fill, jnp.int32), jnp.full((b, 1), fill - 1, jnp.int32)

  xla = jax.jit(lambda q, kp, vp, ids, q_slot: attention.paged(
      q, kp, vp, None, None, ids, q_slot, jnp.bfloat16))
  want = xla(q, kp, vp, ids, inputs(s)[1]).astype(jnp.float32)
  tol = 2e-2 * float(jnp.abs(want).max())  # bf16 outputs, other float orders

  checked = {}

  def timed(plan, fill):
    """Seconds per call, or why the plan did not run or gave other numbers."""
    lengths, _ = inputs(fill)
    try:
      if plan not in checked:  # a plan that reads the wrong pages (the zero layers) is not timed
        err = float(jnp.abs(kernel(plan)(q, kp, vp, ids, inputs(s)[0]) - want).max())
        checked[plan] = (None if err <= tol else
                         f"wrong: max |kernel - XLA paged| {err:.3g} > {tol:.3g}")
      if checked[plan]:
        return checked[plan]
      return per_call(lambda: kernel(plan)(q, kp, vp, ids, lengths), a.calls, a.repeats)
    except Exception as e:  # pylint: disable=broad-except
      checked.setdefault(plan, f"{type(e).__name__}: {str(e)[:120]}")
      return f"{type(e).__name__}: {str(e)[:120]}"

  # The floor of a back-to-back time: dispatching a call that does nothing.
  noop = jax.jit(lambda x: x + 1)
  one = jnp.zeros((), jnp.int32)
  out["dispatch_s"] = per_call(lambda: noop(one), a.calls, a.repeats)

  read = jax.jit(lambda x: jnp.sum(x, dtype=jnp.uint32))

  def read_s(nbytes):
    x = jnp.ones((nbytes,), jnp.uint8)
    return per_call(lambda: read(x), a.calls, a.repeats)

  def save():
    if a.json:
      with open(a.json, "w") as f:
        json.dump(out, f, indent=1)

  slot_bytes = 2 * k * h * pool_dtype.itemsize  # one slot's K and V, one layer
  for fill in sweep_fills:
    out["sweeps"][fill] = dict(read_s=read_s(b * fill * slot_bytes), plans={})
  start, swept = time.perf_counter(), []
  for plan in plans:  # the sweep, in the order given
    if a.max_seconds and time.perf_counter() - start > a.max_seconds:
      print(f"sweep stopped after {len(swept)} of {len(plans)} plans (--max_seconds "
            f"{a.max_seconds})", file=sys.stderr, flush=True)
      break
    for fill, sweep in out["sweeps"].items():
      sweep["plans"][name(plan)] = timed(plan, fill)
      print(f"fill {fill}, plan {name(plan)}: {sweep['plans'][name(plan)]}", file=sys.stderr,
            flush=True)
    swept.append(plan)
    save()
  out["swept"] = len(swept)
  ok = {x: sum(sw["plans"][x] for sw in out["sweeps"].values())
        for x in map(name, swept)
        if all(isinstance(sw["plans"][x], float) for sw in out["sweeps"].values())}
  ranked = sorted(ok, key=ok.get)  # the least summed time over the sweep's fills first
  by_name = {name(plan): plan for plan in plans}
  chosen = [default] + [by_name[x] for x in ranked[:a.top] if by_name[x] != default]
  for sw in out["sweeps"].values():
    fast = sorted((x for x, t in sw["plans"].items() if isinstance(t, float)),
                  key=sw["plans"].get)
    if fast and by_name[fast[0]] not in chosen:
      chosen.append(by_name[fast[0]])

  for fill in (s // 8, s // 2, s):
    nbytes = b * fill * slot_bytes
    _, q_slot = inputs(fill)
    level = dict(fill=fill, bytes=nbytes, read_s=read_s(nbytes),
                 xla_s=per_call(lambda: xla(q, kp, vp, ids, q_slot), a.calls, a.repeats),
                 # at a swept fill, the sweep's time
                 plans={name(plan): out["sweeps"].get(fill, {}).get("plans", {}).get(name(plan))
                        or timed(plan, fill) for plan in chosen})
    out["levels"].append(level)
    print(f"fill {fill}: {level}", file=sys.stderr, flush=True)

  print(f"kernel, {b} rows x {s} slots, pages of {g}, {k} kv heads of {h}, {n} heads, "
        f"{pool_dtype.name} pools, "
        f"pools of {a.layers} layers, {out['device']}, jax {out['jax']}; ms per call over "
        f"{a.calls} back-to-back calls (a call that does nothing: "
        f"{out['dispatch_s'] * 1e3:.3f} ms), x = / read bound\n")
  fmt = lambda t, lv: (f"{t * 1e3:.3f} ({t / lv['read_s']:.2f}x)" if isinstance(t, float)
                       else "fails")
  levels = out["levels"]
  print("| plan | " + " | ".join(f"fill {lv['fill']}" for lv in levels) + " |")
  print("|---|" + "---|" * len(levels))
  print("| read bound | " + " | ".join(f"{lv['read_s'] * 1e3:.3f}" for lv in levels) + " |")
  print("| XLA paged | " + " | ".join(fmt(lv["xla_s"], lv) for lv in levels) + " |")
  for plan in chosen:
    label = name(plan) + (" (default)" if plan == default else "")
    print(f"| {label} | " + " | ".join(fmt(lv["plans"][name(plan)], lv) for lv in levels) + " |")
  for fill, sw in out["sweeps"].items():
    fast = sorted((x for x, t in sw["plans"].items() if isinstance(t, float)),
                  key=sw["plans"].get)
    print(f"\nsweep at fill {fill} ({len(swept)} of {len(plans)} plans; {len(fast)} ran; "
          f"read bound "
          f"{sw['read_s'] * 1e3:.3f} ms), fastest first:")
    print(", ".join(f"{x} {fmt(sw['plans'][x], sw)}" for x in fast[:12]))
    if fast:
      sw["best_plan"] = fast[0]
  failed = {x: t for sw in out["sweeps"].values() for x, t in sw["plans"].items()
            if not isinstance(t, float)}
  for plan in sorted(failed):
    print(f"{plan}: {failed[plan]}")
  if ranked:
    out["best_plan"] = ranked[0]
    gather, numbers = (ranked[0].split(":") if ":" in ranked[0] else ("pages", ranked[0]))
    key = paged_pallas.plan_class(out["device"], pool_dtype, b, k, n // k, s, g, h)
    out["measured_plans_row"] = (f"    {key!r}: ({gather!r}, ({numbers})),  "
                                 f"# {time.strftime('%Y-%m-%d')}")
    print(f"\nbest over fills {sweep_fills}: {paged_pallas.PLAN_ENV}={ranked[0]} "
          f"(default plan {name(default)}); its paged_pallas.MEASURED_PLANS row:\n"
          f"{out['measured_plans_row']}")
  save()


if __name__ == "__main__":
  main()
