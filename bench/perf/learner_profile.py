r"""Where a CPU learner step's time goes: mipu_jax's XLA ops against transformers' torch ops.

    python -m bench.perf.learner_profile [--shape mid --batch 64 --seq 96 --side both]
    python -m bench.perf.learner_profile --shape moe --batch 16 --seq 128   # or moe_twin

One learner step of the same Qwen3 (`bench/perf/sampler.py`'s shapes, or `moe`:
`bench/perf/moe.py`'s tiny Qwen3-MoE, `moe_twin` its dense twin; fp32, tied
embeddings), batch and loss on each side, profiled after two warm steps, `--steps`
times (each category's median: one traced step's op times vary from run to run):

  * mipu_jax: `Learner.step` (log-probs and entropy, PPO loss, AdamW with clipping,
    every metric), traced with `jax.profiler`; each XLA op (thunk) is placed by
    the Python call stack XLA keeps in the compiled HLO's metadata; a `while` or
    `conditional` op is left out, its body's ops being traced themselves. XLA:CPU
    runs a plain `dot` (Eigen's) asynchronously, so the trace may show part of its
    work only: each one's time is taken as at least its FLOPs at the traced
    library matmuls' rate, or, where every dot is Eigen's (`EIGEN_DOTS`, as the
    blocked MoE's learner on a CPU compiles), at the fp32 matmul peak measured in
    the same run (a lower bound); the estimated part is printed on its own line.
  * transformers: `Qwen3ForCausalLM` (`Qwen3MoeForCausalLM`) on our exported weights, log-softmax and
    gather, entropy without gradient, the PPO loss, `backward`, gradient
    clipping and `torch.optim.AdamW`, under `torch.profiler`; each aten op is
    placed by the module (or patched function) it ran in, a backward op by
    the forward op that recorded it (the autograd sequence number).

Prints one table of categories (matmuls, attention, the vocabulary's
log-softmax, norms, RoPE, SwiGLU, the layer scan's stacked residuals and copies,
the optimizer, ...) with each side's op time and share, the step's wall and
CPU time (and kernel time: page faults on fresh buffers), then the costliest
XLA ops with their category and source. Op times are summed over threads:
XLA:CPU runs independent ops on both of its threads at once, torch runs one op
at a time on all threads, so compare shares, and wall times only from the last lines.
"""

import argparse
import collections
import glob
import gzip
import importlib
import json
import linecache
import os
import re
import tempfile

import jax
import numpy as np

from bench.perf import learner as learner_bench
from bench.perf.model import matmul_peak_gflops
from bench.perf.sampler import CONFIGS
from mipu_jax import models
from mipu_jax.models import config as model_config

# Rows of the table, in order.
CATEGORIES = (
    ("mm_layers", "matmuls: layer projections (q k v o, gate up down)"),
    ("mm_head", "matmuls: LM head (tied embedding)"),
    ("mm_experts", "matmuls: MoE experts (gate up down, their gradients)"),
    ("attention", "attention core (scores, mask, softmax, PV)"),
    ("moe_route", "MoE: router, top-k, dispatch, combine, the experts' SwiGLU"),
    ("vocab", "log-softmax, gather, entropy over the vocabulary"),
    ("norm", "RMSNorms (layers, q/k, final)"),
    ("rope", "RoPE"),
    ("swiglu", "SwiGLU elementwise (silu, product, their gradients)"),
    ("residual", "residual adds, embedding lookup and its gradient"),
    ("scan", "layer scan: stacked residuals, carries, copies"),
    ("optimizer", "optimizer (AdamW, clipping, gradient norm)"),
    ("loss", "loss, corrections, metrics"),
    ("other", "other"),
)


# --- XLA side ---------------------------------------------------------------


def _hlo_index(text: str):
  """Per instruction of the compiled HLO: opcode, called computation, call stack.

  The stack is the list of `(file, function, line)` XLA keeps for the op
  (`stack_frame_id` into the module's FileNames / FunctionNames / FileLocations /
  StackFrames tables; a printed `parent_frame_id` is the parent's id + 1).
  """
  def table(name):
    start = text.index("\n" + name + "\n") + len(name) + 2
    out = {}
    for line in text[start:].splitlines():
      m = re.match(r"(\d+) (.*)$", line)
      if not m:
        break
      out[int(m[1])] = m[2]
    return out

  files = {k: v.strip('"') for k, v in table("FileNames").items()}
  funcs = {k: v.strip('"') for k, v in table("FunctionNames").items()}
  locs = {}
  for k, v in table("FileLocations").items():
    m = re.match(r"\{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)", v)
    locs[k] = (files[int(m[1])], funcs[int(m[2])], int(m[3]))
  frames = {}
  for k, v in table("StackFrames").items():
    m = re.match(r"\{file_location_id=(\d+) parent_frame_id=(\d+)\}", v)
    frames[k] = (int(m[1]), int(m[2]) - 1)

  def stack(fid):
    out, seen = [], set()
    while fid in frames and fid not in seen:
      seen.add(fid)
      loc, fid = frames[fid]
      out.append(locs[loc])
    return out

  instructions, comp_ops, comp = {}, collections.defaultdict(set), None
  comp_flops = collections.Counter()
  for line in text.splitlines():
    if not line.startswith(" "):
      m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
      comp = m[1] if m else comp
      continue
    m = re.match(r"^\s+(?:ROOT )?%?([\w.\-]+) = ", line)
    if not m:
      continue
    rest = line[m.end():]
    if rest.startswith("("):  # a tuple type
      depth = 0
      for i, ch in enumerate(rest):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
          break
      rest = rest[i + 1:]
    else:
      rest = rest.split(" ", 1)[1]
    op = re.match(r"\s*([\w\-]+)\(", rest)[1]
    comp_ops[comp].add(op)
    frame = re.search(r"stack_frame_id=(\d+)", line)
    calls = re.search(r"calls=%([\w.\-]+)", line)
    instructions[m[1]] = dict(
        op=op, calls=calls[1] if calls else None, computation=comp,
        shape=line[m.end():].split(" ")[0], stack=stack(int(frame[1])) if frame else [])
    if op == "dot":  # FLOPs: 2 x output elements x contracted elements
      lhs = re.search(r"dot\(%?([\w.\-]+)", rest)[1]
      dims = [int(d) for d in re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)[1].split(",") if d]
      lhs_shape = _dims(instructions[lhs]["shape"])
      flops = 2 * np.prod(_dims(instructions[m[1]]["shape"])) * np.prod([lhs_shape[d] for d in dims])
      instructions[m[1]]["flops"] = float(flops)
      comp_flops[comp] += float(flops)  # a fusion's: the dots of the computation it calls
  for ins in instructions.values():
    ins.setdefault("flops", comp_flops.get(ins["calls"], 0.0) if ins["op"] == "fusion" else 0.0)
  return instructions, comp_ops


def _dims(shape: str) -> list[int]:
  return [int(d) for d in re.match(r"\w+\[([\d,]*)\]", shape)[1].split(",") if d]


def _xla_category(ins, comp_ops) -> str:
  """A category of `CATEGORIES` for one HLO instruction (innermost frame first)."""
  is_dot = ins["op"] in ("dot", "convolution") or (
      ins["calls"] is not None and "dot" in comp_ops.get(ins["calls"], ()))
  for path, fn, line in ins["stack"]:
    name = fn.split(".")[-1]
    src = linecache.getline(path, line)
    if "/optax/" in path or "/mipu_jax/schedules/" in path or "optax.tree.norm" in src:
      return "optimizer"
    if "/mipu_jax/models/attention.py" in path or "/mipu_jax/models/cpu_attention.py" in path:
      return "attention"
    if "/mipu_jax/models/moe.py" in path:
      return "mm_experts" if is_dot and name != "route" else "moe_route"
    if name == "logits" and "/models/qwen3.py" in path:
      return "mm_head"
    if (is_dot and "/models/qwen3.py" in path) or name in ("_proj", "_proj_rows"):
      return "mm_layers"  # with the layout copies of a projection's operands
    if name == "rms_norm":
      return "norm"
    if name in ("rope", "_rotate_halves"):
      return "rope"
    if name == "_gated_mlp_in":
      return "swiglu"
    if name in ("token_logprobs", "entropy", "chunked_token_logprobs"):
      return "vocab"
    if "/mipu_jax/losses/" in path:
      return "loss"
    if "jax.lax.scan(" in src or "grad_fn(params" in src:
      return "scan"
    if "jnp.take(embed" in src or "x_BTD +" in src:
      return "residual"
  if ins["op"] in ("copy", "while", "dynamic-slice", "dynamic-update-slice", "broadcast",
                   "tuple", "get-tuple-element", "bitcast") or ins["op"] == "fusion" and (
                       "copy" in comp_ops.get(ins["calls"], ()) or
                       "dynamic-update-slice" in comp_ops.get(ins["calls"], ())):
    return "scan"
  return "other"


def trace_events(call) -> list:
  """The events of one profiled `call()` (jax's profiler, as a Perfetto trace)."""
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      jax.block_until_ready(call())
    path = glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)[0]
    with gzip.open(path) as f:
      events = json.load(f)
  return events["traceEvents"] if isinstance(events, dict) else events


def _median_counters(counters) -> collections.Counter:
  """Each key's median over `counters` (a missing key counts 0)."""
  keys = set().union(*counters)
  return collections.Counter({k: float(np.median([c.get(k, 0.0) for c in counters]))
                              for k in keys})


# Ops whose trace event spans their body's ops, which are traced too.
_CONTAINERS = ("while", "conditional", "call")


def op_times(events, instructions):
  """`(seconds, calls)` per HLO instruction of one trace's complete events; a container
  op (`while`, `conditional`) counts nothing itself, its body's ops count."""
  seconds, calls = collections.Counter(), collections.Counter()
  for e in events:
    if (e.get("ph") == "X" and e["name"] in instructions
        and instructions[e["name"]]["op"] not in _CONTAINERS):
      seconds[e["name"]] += e.get("dur", 0) * 1e-6
      calls[e["name"]] += 1
  return seconds, calls


def profile_xla(learner, state, batch, warm=2, steps=3):
  """Per-category op seconds of a traced step (each category's and op's median over
  `steps` traced steps), the step's usage (`learner_bench.interleaved` over `steps`
  untraced steps), the top ops, and `(rate, where the rate came from, seconds
  estimated)` of the Eigen dots' estimate."""
  with jax.set_mesh(learner.mesh):
    text = learner._step.lower(state, batch).compile().as_text()  # pylint: disable=protected-access
  instructions, comp_ops = _hlo_index(text)
  for _ in range(warm - 1):  # `interleaved` warms once more
    jax.block_until_ready(learner.step(state, batch))
  usage = learner_bench.interleaved(
      {"step": lambda: jax.block_until_ready(learner.step(state, batch))}, steps)["step"]
  traced = [op_times(trace_events(lambda: learner.step(state, batch)), instructions)
            for _ in range(steps)]
  # XLA:CPU runs a plain `dot` (Eigen; the ones library fusions do not take)
  # asynchronously: the trace may show its dispatch, not all its work. Each one
  # takes at least its FLOPs at the rate of the traced library matmuls: the
  # estimate adds what the trace did not show (a dot traced in full adds nothing).
  per_op = _median_counters([t[0] for t in traced])
  calls = _median_counters([t[1] for t in traced])
  fused = [n for n in per_op if instructions[n]["op"] == "fusion" and instructions[n]["flops"]]
  if fused:
    rate = sum(instructions[n]["flops"] * calls[n] for n in fused) / sum(per_op[n] for n in fused)
    source = "the traced library matmuls' rate"
  else:  # every dot is Eigen's: no traced matmul to take a rate from
    rate = matmul_peak_gflops() * 1e9
    source = "the fp32 matmul peak of this run: no library matmul in the trace"
  per_step, estimated = [], []
  for step_ops, step_calls in traced:
    cats, extra = collections.Counter(), 0.0
    for name, sec in step_ops.items():
      ins = instructions[name]
      if ins["op"] == "dot":
        more = max(0.0, ins["flops"] * step_calls[name] / rate - sec)
        sec, extra = sec + more, extra + more
      cats[_xla_category(ins, comp_ops)] += sec
    per_step.append(cats)
    estimated.append(extra)
  top = []
  for name, sec in per_op.most_common():
    ins = instructions[name]
    where = next((f"{os.path.basename(p)}:{fn.split('.')[-1]}:{ln}" for p, fn, ln in ins["stack"]
                  if "/mipu_jax/" in p), "")
    top.append((name, sec, calls[name], ins["shape"], _xla_category(ins, comp_ops), where))
  return _median_counters(per_step), usage, top, (rate, source, float(np.median(estimated)))


# --- torch side -------------------------------------------------------------


def _scoped_hf(path, threads):
  """transformers' Qwen3 (or Qwen3-MoE) with `cat:*` profiler scopes on its norms,
  MLPs, experts, router, attention core, RoPE, LM head and embedding."""
  from torch.profiler import record_function  # pylint: disable=g-import-not-at-top
  hf = learner_bench.load_hf(path, threads)
  kind = hf.config.model_type  # qwen3 or qwen3_moe
  modeling = importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")

  def scoped(fn, label):
    def wrapped(*args, **kwargs):
      with record_function(label):
        return fn(*args, **kwargs)
    return wrapped

  modeling.apply_rotary_pos_emb = scoped(modeling.apply_rotary_pos_emb, "cat:rope")
  impl = hf.config._attn_implementation  # pylint: disable=protected-access
  core = modeling.ALL_ATTENTION_FUNCTIONS.get_interface(
      impl, modeling.eager_attention_forward)
  modeling.ALL_ATTENTION_FUNCTIONS[impl] = scoped(core, "cat:attention")
  modeling.eager_attention_forward = scoped(modeling.eager_attention_forward,
                                                  "cat:attention")
  for mod in hf.modules():
    label = {"Qwen3RMSNorm": "cat:norm", "Qwen3MLP": "cat:mlp", "Embedding": "cat:residual",
             "Qwen3MoeRMSNorm": "cat:norm", "Qwen3MoeMLP": "cat:mlp",
             "Qwen3MoeExperts": "cat:experts", "Qwen3MoeTopKRouter": "cat:moe_route",
             "Qwen3MoeSparseMoeBlock": "cat:moe_route"}.get(type(mod).__name__)
    if mod is hf.lm_head:
      label = "cat:mm_head"
    if label:
      mod.forward = scoped(mod.forward, label)
  return hf


_MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
            "aten::_grouped_mm")


def profile_torch(path, data, threads, warm=2, steps=3):
  """Per-category op seconds of a profiled torch step (each category's median over
  `steps` profiled steps) and the step's usage (as `profile_xla`'s)."""
  hf = _scoped_hf(path, threads)
  step = learner_bench.torch_learner_step(hf, *data)
  for _ in range(warm - 1):  # `interleaved` warms once more
    step()
  usage = learner_bench.interleaved({"step": step}, steps)["step"]
  return _median_counters([_torch_categories(step) for _ in range(steps)]), usage


def _torch_categories(step) -> collections.Counter:
  """Per-category op seconds of one `step()` under `torch.profiler`."""
  from torch.profiler import profile, ProfilerActivity  # pylint: disable=g-import-not-at-top
  with profile(activities=[ProfilerActivity.CPU]) as prof:
    step()
  events = list(prof.events())
  fwd_by_seq = {}
  for e in events:
    if e.sequence_nr >= 0 and not e.name.startswith("autograd::") and "Backward" not in e.name:
      fwd_by_seq.setdefault(e.sequence_nr, e)

  def label(e, depth=0):
    while e is not None:
      if e.name.startswith("cat:"):
        return e.name[4:]
      if depth < 3 and "Backward" in e.name and e.sequence_nr >= 0:
        src = fwd_by_seq.get(e.sequence_nr)
        if src is not None:
          return label(src, depth + 1)
      e = e.cpu_parent
    return None

  per_cat = collections.Counter()
  for e in events:
    if e.name.startswith("cat:") or e.name.startswith("autograd::engine"):
      continue
    sec = e.self_cpu_time_total * 1e-6
    if sec <= 0:
      continue
    cat = label(e)
    is_mm = e.name in _MATMULS
    if cat == "mlp":
      cat = "mm_layers" if is_mm else "swiglu"
    elif cat == "experts":
      cat = "mm_experts" if is_mm else "moe_route"
    elif cat is None:
      cat = "mm_layers" if is_mm else "other"
    per_cat[cat] += sec
  return per_cat


# --- the table --------------------------------------------------------------


def top_line(name, sec, count, shape, cat, where) -> str:
  """One of the costliest ops: its seconds and calls (medians over the traced steps)."""
  return f"  {sec * 1e3:7.1f} ms x{round(count):<3d} {cat:9s} {name:34s} {shape:28s} {where}"


def _cpu_line(name, usage):
  """`usage`: the step's `learner_bench.Timed` (medians of its untraced rounds)."""
  return (f"{name}: step {usage.wall_median:.2f} s wall, {usage.cpu:.2f} s CPU "
          f"({usage.kernel:.2f} s of it kernel), {usage.faults / 1e3:.0f}k page faults")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--shape", default="mid", choices=sorted(CONFIGS) + ["moe", "moe_twin"],
                 help="moe: bench/perf/moe.py's tiny MoE; moe_twin: its dense twin")
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--seq", type=int, default=96)
  p.add_argument("--prompt", type=int, default=32)
  p.add_argument("--side", default="both", choices=("both", "jax", "torch"))
  p.add_argument("--top", type=int, default=15, help="costliest XLA ops to list")
  p.add_argument("--attention", default="auto", choices=model_config.ATTENTIONS,
                 help="the model's attention (cpu_fused: the fused XLA:CPU kernel)")
  p.add_argument("--steps", type=int, default=3,
                 help="profiled steps per side; each category's median is printed")
  a = p.parse_args()
  if a.steps < 1:
    p.error("--steps must be at least 1")
  if a.shape in ("moe", "moe_twin"):
    from bench.perf import moe  # pylint: disable=g-import-not-at-top
    mcfg = moe.moe_config() if a.shape == "moe" else moe.dense_twin(moe.moe_config())
  else:
    mcfg = learner_bench.shape_config(a.shape)
  mcfg = mcfg.replace(attention=a.attention)
  data = learner_bench.rl_batch(mcfg.vocab_size, a.batch, a.seq, a.prompt)
  model, learner, state, batch = learner_bench.shape_learner(mcfg, a.batch, a.seq, a.prompt)
  threads = len(os.sched_getaffinity(0))  # the CPUs this process may use (taskset)
  print(learner_bench.host_line())
  print(f"shape {a.shape}, attention {a.attention!r}: {mcfg.num_params() / 1e6:.1f} M params, "
        f"{a.batch} x {a.seq} "
        f"tokens, fp32; MLP input recomputed: {learner.spec.recompute_mlp}; load average "
        f"at start {os.getloadavg()[0]:.1f}\n")
  sides = {}
  if a.side in ("both", "jax"):
    sides["mipu_jax"] = profile_xla(learner, state, batch, steps=a.steps)
  del learner, state, batch  # their buffers, before torch's
  if a.side in ("both", "torch"):
    with tempfile.TemporaryDirectory() as d:
      models.save_pretrained(model, d)
      sides["transformers"] = profile_torch(d, data, threads, steps=a.steps)
  names = list(sides)
  print("| category | " + " | ".join(f"{n} ms | share" for n in names) + " |")
  print("|---|" + "---|---|" * len(names))
  totals = {n: sum(s[0].values()) for n, s in sides.items()}
  for key, title in CATEGORIES:
    cells = []
    for n in names:
      sec = sides[n][0].get(key, 0.0)
      cells.append(f"{sec * 1e3:,.0f} | {sec / totals[n]:.1%}")
    print(f"| {title} | " + " | ".join(cells) + " |")
  print("| **sum** | " + " | ".join(
      f"**{totals[n] * 1e3:,.0f}** | 100%" for n in names) + " |\n")
  for n in names:
    print(_cpu_line(n, sides[n][1]))
  print(f"load average at end {os.getloadavg()[0]:.1f}")
  if "mipu_jax" in sides:
    rate, source, estimated = sides["mipu_jax"][3]
    print(f"of mipu_jax's matmul rows, {estimated * 1e3:,.0f} ms is estimated: Eigen's "
          f"asynchronous dots' work the trace did not show, at {rate / 1e9:.0f} GFLOP/s "
          f"({source})")
  if "mipu_jax" in sides and a.top:
    print(f"\nthe {a.top} costliest XLA ops of a traced step (medians; time summed over calls):")
    for row in sides["mipu_jax"][2][:a.top]:
      print(top_line(*row))


if __name__ == "__main__":
  main()
