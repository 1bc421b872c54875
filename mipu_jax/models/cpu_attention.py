"""`attention="cpu_fused"`: `attention._dense`'s function as one XLA:CPU kernel.

XLA:CPU runs the dense attention core as its parts (two batched dots, the
mask, the softmax, their gradients and layout copies between them), and jax has
no fused attention for a CPU; `csrc/cpu_attention.cc` is one, forward and
backward (flash attention's scheme: the backward recomputes the probabilities
from the saved log-sum-exp), called through jax's FFI (docs/method.md §7).
It is built from source with the host's C++ compiler on first use (a few
seconds) and cached under `MIPU_JAX_KERNEL_CACHE` (default
`~/.cache/mipu_jax/kernels`), keyed by the source, the compiler, jax's FFI
headers and the CPU's flags. float32 only; within float32 rounding of `dense`,
not bitwise (a different summation order). Each batch row is computed on its
own, so under a mesh it runs per device on the device's rows (`shard_map`) and
8 devices give the bits of 1.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from mipu_jax.models import invariant

SOURCE = pathlib.Path(__file__).parent / "csrc" / "cpu_attention.cc"
_FWD, _BWD = "mipu_cpu_attention_fwd", "mipu_cpu_attention_bwd"
_lock = threading.Lock()
_built: dict = {}  # "error": why the kernel cannot run here ("" when it can)


def cache_dir() -> pathlib.Path:
  return pathlib.Path(os.environ.get("MIPU_JAX_KERNEL_CACHE")
                      or pathlib.Path.home() / ".cache" / "mipu_jax" / "kernels")


def _compiler() -> str | None:
  return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def _cpu_flags() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next((line for line in f if line.startswith("flags")), "")
  except OSError:
    return ""


_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")


def _library(cxx: str) -> pathlib.Path:
  """The built kernel: compiled once per (source, compiler, flags, jaxlib, CPU
  flags); the build writes a temporary file and renames it, so concurrent
  processes (pytest workers) never load a half-written library."""
  include = jax.ffi.include_dir()
  version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
  key = hashlib.sha256("\0".join([SOURCE.read_text(), cxx, version, " ".join(_FLAGS),
                                  jaxlib.__version__, include, _cpu_flags()]).encode())
  path = cache_dir() / f"cpu_attention_{key.hexdigest()[:16]}.so"
  if path.exists():
    return path
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
  os.close(fd)
  cmd = [cxx, *_FLAGS, f"-I{include}", str(SOURCE), "-o", tmp]
  done = subprocess.run(cmd, capture_output=True, text=True)
  if done.returncode:
    os.unlink(tmp)
    raise RuntimeError(f"building {SOURCE.name} failed ({' '.join(cmd)}):\n{done.stderr[-2000:]}")
  os.replace(tmp, path)
  return path


def error() -> str:
  """Why the kernel cannot run here, or "" when it can (building it on the first call)."""
  with _lock:
    if "error" not in _built:
      cxx = _compiler()
      if cxx is None:
        _built["error"] = "no C++ compiler (c++ / g++, or $CXX) to build it with"
      else:
        try:
          lib = ctypes.cdll.LoadLibrary(str(_library(cxx)))
          jax.ffi.register_ffi_target(_FWD, jax.ffi.pycapsule(lib.MipuAttentionForward),
                                      platform="cpu")
          jax.ffi.register_ffi_target(_BWD, jax.ffi.pycapsule(lib.MipuAttentionBackward),
                                      platform="cpu")
          _built["error"] = ""
        except (OSError, RuntimeError, AttributeError) as e:
          _built["error"] = str(e)
    return _built["error"]


def check(q_BTNH, k_BSKH, v_BSKH, mask_BTS) -> None:
  """A clear error before any compute when the kernel cannot take this call."""
  if jax.default_backend() != "cpu":
    raise ValueError(f"attention='cpu_fused' runs on a CPU; this is {jax.default_backend()!r}.")
  dtypes = sorted({str(x.dtype) for x in (q_BTNH, k_BSKH, v_BSKH)})
  if dtypes != ["float32"]:
    raise ValueError(f"attention='cpu_fused' takes float32 q, k, v; got {dtypes}.")
  q, k, v, m = (tuple(x.shape) for x in (q_BTNH, k_BSKH, v_BSKH, mask_BTS))
  if (len(q) != 4 or len(k) != 4 or k != v or k[0] != q[0] or k[3] != q[3] or not k[2]
      or q[2] % k[2] or m != (q[0], q[1], k[1])):
    raise ValueError(f"attention='cpu_fused' takes q [B, T, N, H], k and v [B, S, K, H] with "
                     f"K dividing N, and a mask [B, T, S]; got q {q}, k {k}, v {v}, mask {m}.")
  why = error()
  if why:
    raise RuntimeError(f"attention='cpu_fused' cannot run: {why}. Use attention='dense'.")


def _scale(h: int) -> np.float32:
  return np.float32(h ** -0.5)  # as `_dense`: the Python float, rounded to the scores' f32


def _forward(q, k, v, mask):
  b, t, n, h = q.shape
  call = jax.ffi.ffi_call(_FWD, (jax.ShapeDtypeStruct(q.shape, jnp.float32),
                                 jax.ShapeDtypeStruct((b, n, t), jnp.float32)),
                          vmap_method="sequential")
  return call(q, k, v, mask, scale=_scale(h))


@jax.custom_vjp
def _attend(q, k, v, mask):
  return _forward(q, k, v, mask)[0]


def _attend_fwd(q, k, v, mask):
  out, lse = _forward(q, k, v, mask)
  return out, (q, k, v, mask, out, lse)


def _attend_bwd(res, dout):
  q, k, v, mask, out, lse = res
  call = jax.ffi.ffi_call(_BWD, (jax.ShapeDtypeStruct(q.shape, jnp.float32),
                                 jax.ShapeDtypeStruct(k.shape, jnp.float32),
                                 jax.ShapeDtypeStruct(v.shape, jnp.float32)),
                          vmap_method="sequential")
  dq, dk, dv = call(q, k, v, mask, out, lse, dout, scale=_scale(q.shape[-1]))
  return dq, dk, dv, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def attend(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array,
           mask_BTS: jax.Array) -> jax.Array:
  """Softmax attention `[B, T, N, H]` of float32 `q` over `k`, `v` under the
  dense boolean mask `[B, T, S]`: `attention._dense`'s function. Under a mesh
  whose row axes divide B, each device runs the kernel on its own rows."""
  check(q_BTNH, k_BSKH, v_BSKH, mask_BTS)
  # XLA's partitioner cannot split a custom call: each device runs its own rows.
  return invariant.per_row_shard(lambda _, *rows: _attend(*rows), (), q_BTNH, k_BSKH, v_BSKH,
                                 mask_BTS.astype(jnp.bool_))
