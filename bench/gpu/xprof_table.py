"""A jax profiler trace of one program, reduced to a table of kernel classes.

    from bench.gpu import xprof_table
    table = xprof_table.reduce(xplane_path, compiled.as_text(), module="generate_step", steps=5)
    python -m bench.gpu.xprof_table trace.xplane.pb.gz hlo.txt.gz --steps 5   # a saved trace

Reads the trace's `*.xplane.pb` with `jax.profiler.ProfileData` (jaxlib's own
XSpace reader: no TensorBoard or xprof needed) and the program's optimized HLO
text (`jax.jit(f).lower(...).compile().as_text()`). Each timed event that names
an HLO instruction (the `hlo_op` stat: a GPU kernel on the device plane, an XLA:CPU
thunk on the host plane) is put in one class by what the instruction computes:

- `copies`: a copy or transpose (or a fusion whose root is one), or a GPU memcpy;
- `cache writes`: a write into the KV pool (`kv_cache.py`'s write functions);
- `attention`: the decode attention (the Pallas kernel, `attention.py`'s XLA path);
- a matmul group (`qkv projection`, `output projection`, `MLP gate/up`, `MLP down`,
  `LM head`, `experts`, `matmul (other)`): a kernel holding a dot, by the einsum
  its op name carries (jnp.einsum names its dot by the equation) or by the model
  function that called it;
- `sampling`: the head's softmax, the draw and the log-prob, token bookkeeping;
- `other`: norms, rope, residual adds, loop control.

The call sites come from the HLO text's stack-frame tables (FileNames,
FunctionNames, FileLocations, StackFrames), which jax writes into the op
metadata. Works on CPU traces too (the smoke test).
"""

import collections
import glob
import os
import re
from typing import Optional

CLASSES = ("attention", "qkv projection", "output projection", "MLP gate/up", "MLP down",
           "LM head", "experts", "matmul (other)", "sampling", "cache writes", "copies", "other")

# jnp.einsum's equations in mipu_jax/models (qwen3.py, moe.py) -> matmul group.
EINSUM_GROUPS = {
    "BTD,DNH->BTNH": "qkv projection", "BTD,DKH->BTKH": "qkv projection",
    "BTNH,NHD->BTD": "output projection",
    "BTD,DF->BTF": "MLP gate/up", "BTF,FD->BTD": "MLP down",
    "BTD,VD->BTV": "LM head", "BTD,DV->BTV": "LM head",
}
# Model functions (innermost first wins) -> matmul group, for dots without an einsum name
# (the native low-precision projections of `quantized.project`).
FUNCTION_GROUPS = (("_gated_mlp_in", "MLP gate/up"), ("_attention_out_mlp", "MLP down"),
                   ("_attention_in", "qkv projection"), ("_attention_out", "output projection"),
                   ("logits", "LM head"), ("moe", "experts"), ("expert", "experts"))
ATTENTION_FILES = ("attention.py", "paged_pallas.py", "paged_tpu.py", "splash_tpu.py")
WRITE_FUNCTIONS = ("scatter_set", "write", "write_targets", "append", "quantize")
SAMPLING_FILES = ("sampling.py", "logprobs.py")
SAMPLING_FUNCTIONS = ("_head", "_draw", "_fold", "_is_stop", "live_slots", "advance")
DOT_OPS = ("dot", "convolution", "ragged-dot")

_INST = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_COMP = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{\s*$")
_ANNOTATED_OP = re.compile(r"hlo_op=([^,#\s]+)")
_ANNOTATED_MODULE = re.compile(r"hlo_module=([^,#\s]+)")
_EINSUM = re.compile(r"([A-Za-z]+(?:,[A-Za-z]+)+->[A-Za-z]+)")


class Op:
  """One HLO instruction: its opcode, op name, call-site frames and called computations."""

  def __init__(self, name, opcode, attrs):
    self.name, self.opcode, self.attrs = name, opcode, attrs
    m = re.search(r'op_name="([^"]*)"', attrs)
    self.op_name = m.group(1) if m else ""
    m = re.search(r"stack_frame_id=(\d+)", attrs)
    self.frame = int(m.group(1)) if m else None
    m = re.search(r'custom_call_target="([^"]*)"', attrs)
    self.target = m.group(1) if m else ""
    self.calls = re.findall(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)", attrs)
    m = re.search(r"branch_computations=\{([^}]*)\}", attrs)
    if m:
      self.calls += re.findall(r"%([\w.\-]+)", m.group(1))


def _split_shape(rest: str):
  """`(shape, opcode, attributes)` of an instruction's right-hand side."""
  if rest.startswith("("):  # a tuple shape: up to its matching parenthesis
    depth = 0
    for i, c in enumerate(rest):
      depth += (c == "(") - (c == ")")
      if depth == 0:
        break
    shape, rest = rest[:i + 1], rest[i + 1:].lstrip()
  else:
    shape, _, rest = rest.partition(" ")
  opcode, _, attrs = rest.partition("(")
  return shape, opcode.strip(), attrs


class Hlo:
  """An optimized HLO module's text: instructions by name, computations, call sites."""

  def __init__(self, text: str):
    self.ops, self.computations, self.roots = {}, collections.defaultdict(list), {}
    tables = {}
    section, comp = None, None
    for line in text.splitlines():
      if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
        section = tables.setdefault(line, {})
        continue
      if section is not None:
        if not line.strip():
          section = None
        else:
          key, _, value = line.partition(" ")
          section[int(key)] = value
        continue
      m = _COMP.match(line)
      if m and "=" not in line.split("(")[0]:
        comp = m.group(1)
        continue
      m = _INST.match(line)
      if m and comp is not None:
        _, opcode, attrs = _split_shape(m.group(2))
        op = Op(m.group(1), opcode, attrs)
        self.ops[op.name] = op
        self.computations[comp].append(op)
        if line.lstrip().startswith("ROOT "):
          self.roots[comp] = op
    self._frames = self._frame_table(tables)
    # XLA:GPU names a fusion's kernel after it, '.' and '-' as '_'.
    self.by_kernel = {re.sub(r"[.\-]", "_", n): n for n in self.ops}

  @staticmethod
  def _frame_table(tables):
    """frame id -> (file, function, parent id) from the stack-frame tables."""
    unquote = lambda s: s.strip().strip('"')
    files = {k: unquote(v) for k, v in tables.get("FileNames", {}).items()}
    funcs = {k: unquote(v) for k, v in tables.get("FunctionNames", {}).items()}
    locs = {}
    for k, v in tables.get("FileLocations", {}).items():
      f = re.search(r"file_name_id=(\d+)", v)
      g = re.search(r"function_name_id=(\d+)", v)
      locs[k] = (files.get(int(f.group(1)), "") if f else "",
                 funcs.get(int(g.group(1)), "") if g else "")
    raw = {}
    for k, v in tables.get("StackFrames", {}).items():
      loc = re.search(r"file_location_id=(\d+)", v)
      parent = re.search(r"parent_frame_id=(\d+)", v)
      raw[k] = (int(loc.group(1)) if loc else 0, int(parent.group(1)) if parent else 0)
    # XLA prints a frame's parent as its id + 1 (a root frame names itself); an
    # XLA that prints the id itself names no frame as its own parent.
    shift = 1 if any(k == p for k, (_, p) in raw.items()) else 0
    return {k: locs.get(loc, ("", "")) + (p - shift,) for k, (loc, p) in raw.items()}

  def sites(self, op: Op) -> list[tuple[str, str]]:
    """`(file basename, function)` of the op's call stack, innermost first."""
    out, frame, seen = [], op.frame, set()
    while frame in self._frames and frame not in seen:
      seen.add(frame)
      path, func, frame = self._frames[frame]
      out.append((os.path.basename(path), func))
    return out

  def contents(self, op: Op) -> list[Op]:
    """The op and every instruction of the computations it calls, recursively."""
    out, todo, seen = [op], list(op.calls), set()
    while todo:
      c = todo.pop()
      if c in seen:
        continue
      seen.add(c)
      for inner in self.computations.get(c, ()):
        out.append(inner)
        todo += inner.calls
    return out

  def root_opcode(self, op: Op) -> str:
    """A fusion's root opcode (the op's own otherwise), through bitcasts."""
    if op.opcode != "fusion" or not op.calls:
      return op.opcode
    root = self.roots.get(op.calls[0])
    while root is not None and root.opcode in ("bitcast", "tuple") and root.attrs:
      first = re.match(r"\s*(?:[^%]*)%([\w.\-]+)", root.attrs)
      root = self.ops.get(first.group(1)) if first else None
    return root.opcode if root is not None else op.opcode


def _matmul_group(hlo: Hlo, op: Op) -> str:
  m = _EINSUM.search(op.op_name)
  if m and m.group(1) in EINSUM_GROUPS:
    return EINSUM_GROUPS[m.group(1)]
  if "ragged_dot" in op.op_name:
    return "experts"
  sites = hlo.sites(op)
  if any(f in ATTENTION_FILES for f, _ in sites):
    return "attention"
  for _, func in sites:
    for key, group in FUNCTION_GROUPS:
      if key in func:
        return group
  return "matmul (other)"


def classify(hlo: Hlo, name: str, kernel: str = "") -> str:
  """The class (one of CLASSES) of the kernel or thunk that ran HLO instruction `name`."""
  op = hlo.ops.get(name) or hlo.ops.get(hlo.by_kernel.get(kernel, ""))
  low = kernel.lower()
  if op is None:  # not an instruction of this module: by the kernel's name
    if "memcpy" in low or "memset" in low:
      return "copies"
    if "paged_decode" in low:
      return "attention"
    if "gemm" in low or "matmul" in low:
      return "matmul (other)"
    return "other"
  inner = hlo.contents(op)
  text = " ".join(o.op_name + " " + o.target for o in inner)
  if "paged_decode" in text or "pallas_call" in text:
    return "attention"
  if hlo.root_opcode(op) in ("copy", "transpose", "copy-start", "copy-done") or (
      op.opcode in ("copy", "transpose")):
    return "copies"
  sites = [s for o in inner for s in hlo.sites(o)]
  files = {f for f, _ in sites}
  if "kv_cache.py" in files and any(o.opcode in ("scatter", "dynamic-update-slice")
                                    for o in inner) and any(
                                        f == "kv_cache.py" and fn in WRITE_FUNCTIONS
                                        for f, fn in sites):
    return "cache writes"
  dots = [o for o in inner if o.opcode in DOT_OPS or "cublas" in o.target
          or "gemm" in o.target]
  if dots:
    groups = [_matmul_group(hlo, d) for d in dots]
    return max(set(groups), key=groups.count)
  if files & set(ATTENTION_FILES):
    return "attention"
  if files & set(SAMPLING_FILES) or any(fn in SAMPLING_FUNCTIONS for _, fn in sites):
    return "sampling"
  return "other"


def xplane_file(log_dir: str) -> str:
  """The newest `*.xplane.pb` under a `jax.profiler.trace` log directory."""
  files = glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)
  if not files:
    raise FileNotFoundError(f"no *.xplane.pb under {log_dir}")
  return max(files, key=os.path.getmtime)


def events(xplane: str, module: str = "") -> tuple[list[tuple[str, str, float]], str]:
  """`([(hlo_op, kernel name, seconds)], plane)`: the timed events of the device planes
  (GPU / TPU), or of the host plane when none has any (XLA:CPU), whose `hlo_module`
  contains `module`; an event holding others on its line (a loop's thunk on CPU) is
  left out, its children counted. Memcpys of a device plane count with no `hlo_op`."""
  import jax  # pylint: disable=g-import-not-at-top
  data = jax.profiler.ProfileData.from_file(xplane)
  device, host = [], []
  for plane in data.planes:
    is_device = plane.name.startswith("/device:")
    if not is_device and plane.name != "/host:CPU":
      continue
    lines = list(plane.lines)
    if is_device and any(line.name.startswith("Stream") for line in lines):
      lines = [line for line in lines if line.name.startswith("Stream")]
    for line in lines:
      if line.name == "python" or line.name.startswith("XLA "):
        continue
      spans = []
      for ev in line.events:
        stats = dict(ev.stats)
        op, mod = stats.get("hlo_op"), stats.get("hlo_module")
        if op is None:  # else from an annotation stat: "name:#hlo_op=fusion.3,...#"
          for value in stats.values():
            m = isinstance(value, str) and _ANNOTATED_OP.search(value)
            if m:
              op = m.group(1)
              m = _ANNOTATED_MODULE.search(value)
              mod = m.group(1) if m else mod
              break
        if op is None and not (is_device and "memcpy" in ev.name.lower()):
          continue
        if module and op is not None and module not in str(mod or module):
          continue
        spans.append((ev.start_ns, ev.duration_ns, str(op or ""), ev.name))
      spans.sort(key=lambda s: (s[0], -s[1]))
      for i, (start, dur, op, kernel) in enumerate(spans):
        nxt = spans[i + 1] if i + 1 < len(spans) else None
        if nxt is not None and nxt[0] < start + dur and dur > 0:
          continue  # holds the next event: a parent
        (device if is_device else host).append((op, kernel, dur * 1e-9))
  if device:
    return device, "device"
  return host, "host"


def trace_outline(xplane: str, lines: int = 12, events: int = 3) -> list[dict]:
  """The trace's planes, their first lines and each line's first events with their stats:
  what to read when a new XLA names its events or stats otherwise."""
  import jax  # pylint: disable=g-import-not-at-top
  out = []
  for plane in jax.profiler.ProfileData.from_file(xplane).planes:
    entry = dict(plane=plane.name, lines=[])
    for line in list(plane.lines)[:lines]:
      evs = list(line.events)
      entry["lines"].append(dict(
          line=line.name, events=len(evs),
          first=[dict(name=e.name[:80], ns=e.duration_ns,
                      stats={k: str(v)[:120] for k, v in e.stats}) for e in evs[:events]]))
    out.append(entry)
  return out


def reduce(xplane: str, hlo_text: str, *, module: str = "", steps: int = 1,
           top: int = 15) -> dict:
  """Seconds per step by class, and the `top` instructions by time, of `steps` runs
  of the module in the trace."""
  hlo = Hlo(hlo_text)
  evs, where = events(xplane, module)
  by_class = collections.defaultdict(float)
  by_op = collections.defaultdict(lambda: [0.0, 0, "", ""])
  unknown = 0
  for op, kernel, sec in evs:
    cls = classify(hlo, op, kernel)
    unknown += op not in hlo.ops and kernel not in hlo.by_kernel
    by_class[cls] += sec / steps
    entry = by_op[op or kernel]
    entry[0] += sec / steps
    entry[1] += 1
    entry[2], entry[3] = cls, kernel
  ops = sorted(by_op.items(), key=lambda kv: -kv[1][0])
  return dict(
      plane=where, events=len(evs), events_not_in_hlo=unknown, steps=steps,
      outline=trace_outline(xplane),
      classes={c: by_class.get(c, 0.0) for c in CLASSES},
      kernels_s=sum(by_class.values()),
      top=[dict(op=k, cls=v[2], s=v[0], count_per_step=v[1] / steps, kernel=v[3][:80])
           for k, v in ops[:top]])


def markdown(table: dict, step_s: Optional[float] = None, bound_s: Optional[float] = None,
             class_bytes: Optional[dict] = None, rate: Optional[float] = None) -> str:
  """The table: per class ms per step, share of the kernels' sum and of the measured
  step, and (with `class_bytes` and the read `rate` in bytes/s) its own byte bound."""
  total = table["kernels_s"] or float("nan")
  head = "| class | ms per step | share of kernels | share of step |"
  sep = "|---|---:|---:|---:|"
  if class_bytes and rate:
    head += " bytes read | bound ms | x bound |"
    sep += "---:|---:|---:|"
  lines = [head, sep]
  for cls, sec in table["classes"].items():
    if sec == 0 and not (class_bytes or {}).get(cls):
      continue
    row = (f"| {cls} | {sec * 1e3:.3f} | {sec / total:.1%} | "
           + (f"{sec / step_s:.1%} |" if step_s else "— |"))
    if class_bytes and rate:
      nbytes = class_bytes.get(cls)
      if nbytes:
        b = nbytes / rate
        row += f" {nbytes / 1e6:,.1f} MB | {b * 1e3:.3f} | " + (
            f"{sec / b:.2f}x |" if sec else "— |")
      else:
        row += " — | — | — |"
    lines.append(row)
  lines.append(f"| **kernels, sum** | {total * 1e3:.3f} | 100% | "
               + (f"{total / step_s:.1%} |" if step_s else "— |")
               + (" | | |" if class_bytes and rate else ""))
  if step_s:
    lines.append(f"| measured step (no profiler) | {step_s * 1e3:.3f} | | 100% |"
                 + (" | | |" if class_bytes and rate else ""))
    lines.append(f"| step - kernels (gaps, launches) | {(step_s - total) * 1e3:.3f} | | "
                 f"{(step_s - total) / step_s:.1%} |" + (" | | |" if class_bytes and rate else ""))
  if bound_s:
    lines.append(f"| step's byte bound (read rate) | {bound_s * 1e3:.3f} | | "
                 + (f"{bound_s / step_s:.1%} |" if step_s else "— |")
                 + (" | | |" if class_bytes and rate else ""))
  lines.append("")
  lines.append(f"Top instructions ({table['plane']} plane, {table['events']} events over "
               f"{table['steps']} steps, {table['events_not_in_hlo']} not in the HLO):")
  lines.append("")
  lines.append("| instruction | class | ms per step | per step | kernel |")
  lines.append("|---|---|---:|---:|---|")
  for t in table["top"]:
    lines.append(f"| {t['op']} | {t['cls']} | {t['s'] * 1e3:.3f} | {t['count_per_step']:.0f} "
                 f"| {t['kernel']} |")
  return "\n".join(lines)


def main():
  import argparse  # pylint: disable=g-import-not-at-top
  import gzip  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser(description="Reduce a saved trace: "
                              "python -m bench.gpu.xprof_table TRACE.xplane.pb[.gz] HLO.txt[.gz]")
  p.add_argument("xplane")
  p.add_argument("hlo")
  p.add_argument("--module", default="generate_step")
  p.add_argument("--steps", type=int, default=5)
  a = p.parse_args()
  opener = lambda path, mode: (gzip.open if path.endswith(".gz") else open)(path, mode)
  xplane = a.xplane
  if xplane.endswith(".gz"):
    import tempfile  # pylint: disable=g-import-not-at-top
    with opener(a.xplane, "rb") as f, tempfile.NamedTemporaryFile(
        suffix=".xplane.pb", delete=False) as g:
      g.write(f.read())
      xplane = g.name
  with opener(a.hlo, "rt") as f:
    hlo_text = f.read()
  print(markdown(reduce(xplane, hlo_text, module=a.module, steps=a.steps)))


if __name__ == "__main__":
  main()
