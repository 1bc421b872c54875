"""Projection weights stored quantized, multiplied by native low-precision dots (docs/method.md §7).

The sampler's `quant_compute="native"` mode keeps each quantized matmul weight
as a `QuantizedWeight`: the quantized values laid out `[..., O, I]` (outputs,
then the contraction, as serving kernels store them: a "TN" GEMM, the layout
cuBLASLt's FP8 GEMM takes without a transpose) and one float32 scale per output
channel `[..., O]`. A leading layer axis `L` is allowed; `lax.scan` slices
both leaves.

`project(x, w)` multiplies the input's last `n_in` axes by the weight:

- **int8 × int8 → int32** when the activations are int8 and the weight int8
  or int4 (an int4 value is an int8 value): `lax.dot_general(...,
  preferred_element_type=int32)`, exact, then `· s_x · s_w` in float32;
- **fp8 × fp8** when the activations are FP8 and the weight FP8, or int4 (the
  integers -8..7 are exact in e4m3): `lax.dot_general` of two float8 operands
  with a bf16 (or float32) result, the pattern XLA's GPU gemm rewriter turns
  into a cuBLASLt FP8 GEMM (bench/README.md);
- **weight-only** (float activations) and the mixed pairs with no native
  dot (int8 weights with FP8 activations, FP8 weights with int8 activations):
  the weight's values are converted to the compute dtype inside the step, next
  to the dot, and the scale is applied to the dot's output (XLA fuses the
  convert into the GEMM where it can); a mixed pair fake-quantizes its
  activations first, as the emulated path does.

Activations are quantized per token (absmax over the contraction, one scale per
row of the `[M, I]` input) by `quantize_activation`, which the emulated path
(`mipu_jax/sampler/quant.py`) uses too, so the quantized operands are bitwise
those of the emulated path; the two paths differ only in how the products are
accumulated and rounded.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import qwix

# Activation qtypes of the native dots, by the name the config uses.
# Activation quantization modes and their dtypes (the sampler's `act_quant`
# names; `mipu_jax.sampler.quant.ACT_QTYPES` is this table).
ACT_DTYPES = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn, "fp8_e4m3": jnp.float8_e4m3fn,
              "fp8_e5m2": jnp.float8_e5m2}
_INT = (jnp.dtype(jnp.int8), jnp.dtype(jnp.int4))
_FP8 = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e5m2))


@jax.tree_util.register_pytree_node_class
class QuantizedWeight:
  """Quantized values `[..., O, I]` + float32 per-output-channel scales `[..., O]`.

  Static (not traced): `out_shape`, the output axes `O` unflattens to (e.g.
  `(N, H)` for the q projection), and `act`, the activations' qtype name
  (None: weight-only).
  """

  def __init__(self, values, scale, out_shape: tuple[int, ...], act: Optional[str]):
    self.values, self.scale = values, scale
    self.out_shape, self.act = tuple(out_shape), act

  def tree_flatten(self):
    return (self.values, self.scale), (self.out_shape, self.act)

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(*children, *aux)

  def __getitem__(self, index):  # `param[...]` of an nnx.Param holding one
    if index is not Ellipsis:
      raise IndexError("A QuantizedWeight only supports [...].")
    return self

  @property
  def shape(self):
    return self.values.shape

  @property
  def dot_kind(self) -> str:
    """'int8', 'fp8' (a native low-precision dot) or 'dequantized'."""
    if self.act is None:
      return "dequantized"
    a, w = jnp.dtype(ACT_DTYPES[self.act]), jnp.dtype(self.values.dtype)
    if a == jnp.int8 and w in _INT:
      return "int8"
    if a in _FP8 and (w in _FP8 or w == jnp.int4):
      return "fp8"
    return "dequantized"

  def __repr__(self):
    return (f"QuantizedWeight({self.values.dtype}{list(self.values.shape)}, "
            f"out_shape={self.out_shape}, act={self.act}, dot={self.dot_kind})")


def from_float(w: jax.Array, qtype, out_axes: tuple[int, ...], in_axes: tuple[int, ...],
               lead_axes: tuple[int, ...] = (), act: Optional[str] = None) -> QuantizedWeight:
  """Quantizes `w` per output channel (symmetric absmax, qwix) into the `[..., O, I]` layout.

  `out_axes` keep their own scale, `in_axes` are contracted, `lead_axes`
  (the layer axis) are kept in front. The values equal those of
  `qwix.quantize(w, channelwise_axes=lead + out)` transposed: same absmax, same
  rounding.
  """
  perm = tuple(lead_axes) + tuple(out_axes) + tuple(in_axes)
  if sorted(perm) != list(range(w.ndim)):
    raise ValueError(f"Axes {perm} do not name each of the {w.ndim} axes once.")
  shape = [w.shape[a] for a in lead_axes]
  out_shape = tuple(w.shape[a] for a in out_axes)
  flat = jnp.transpose(w.astype(jnp.float32), perm).reshape(
      *shape, int(np.prod(out_shape)), int(np.prod([w.shape[a] for a in in_axes])))
  n = len(lead_axes)
  q = qwix.quantize(flat, qtype, channelwise_axes=tuple(range(n + 1)),
                    calibration_method="absmax")
  return QuantizedWeight(q.qvalue, q.scale[..., 0], out_shape, act)


def dequantize(w: QuantizedWeight) -> jax.Array:
  """float32 `[..., O, I]` values · scales (the emulated path's weight, in this layout)."""
  return w.values.astype(jnp.float32) * w.scale[..., None]


def quantize_activation(x: jax.Array, qtype, channel_axes: tuple[int, ...]) -> qwix.QArray:
  """Per-token absmax quantization of activations (qwix), symmetric.

  qwix scales int8 by absmax / 127.5, so a token's largest element lands
  exactly on the rounding tie ±127.5, and the last bit of float rounding
  upstream decides between ±127 and -128 for it. The int8 values are clipped
  to ±127 here, which removes that tie (the emulated and native paths share
  this function; docs/method.md §7).
  """
  q = qwix.quantize(x.astype(jnp.float32), qtype, channelwise_axes=channel_axes,
                    calibration_method="absmax")
  if jnp.dtype(q.qvalue.dtype) == jnp.int8:
    q = q.replace(qvalue=jnp.clip(q.qvalue, -127, 127))
  return q


def quantize_rows(x_MI: jax.Array, act: str):
  """Per-row quantization of `[M, I]` activations: values and float32 scales `[M, 1]`."""
  q = quantize_activation(x_MI, ACT_DTYPES[act], (0,))
  return q.qvalue, q.scale


def keep_float8(x: jax.Array) -> jax.Array:
  """`x`, behind an optimization barrier if it is float8: its rounding is kept.

  XLA's GPU compiler removes a float conversion round trip such as float32 →
  float8 → float32 (its `SimplifyFPConversions` pass, on while
  `xla_allow_excess_precision` is, the default): inside one jitted program an
  emulated FP8 quantization (`astype(float8)` then back) then does nothing
  (measured with bench/probes/native_gap.py, bench/README.md). The barrier
  costs the float8 tensor's materialization, where it is used: the emulated
  path and the native path's mixed pairs. Integer values need none
  (their round trip is not a float conversion).
  """
  if jnp.issubdtype(x.dtype, jnp.floating) and jnp.dtype(x.dtype).itemsize == 1:
    return jax.lax.optimization_barrier(x)
  return x


# XLA's GPU compiler (jax 0.11.2) miscomputed float32 dots of an int4 -> float
# convert at some widths that are not multiples of 8 (none of Qwen3's): such
# int4 arrays are first made int8 behind a barrier (bench/probes/int4_dot_probe.py,
# bench/README.md).
_INT4_SAFE_MULTIPLE = 8


def int4_safe(values: jax.Array) -> jax.Array:
  """`values`, or, for int4 values whose last two widths are not both
  multiples of 8, their int8 copy behind an optimization barrier."""
  if values.dtype == jnp.int4 and any(d % _INT4_SAFE_MULTIPLE for d in values.shape[-2:]):
    return jax.lax.optimization_barrier(values.astype(jnp.int8))
  return values


def _dot_tn(a_MI, b_OI, out_dtype):
  return jax.lax.dot_general(a_MI, b_OI, (((1,), (1,)), ((), ())),
                             preferred_element_type=out_dtype)


# The int8 GEMM's contraction is padded with zeros to a multiple of this: on a
# GPU an int8 x int8 -> int32 dot with another contraction length once came out
# wrong (bench/README.md). Zeros add exact zeros to an int32 sum; Qwen3's widths
# are multiples of 4, so a real model never pays for it.
INT8_CONTRACTION_MULTIPLE = 4


def _int8_dot_tn(a_MI, b_OI):
  """`a @ b.T` of int8 operands, accumulated exactly in int32."""
  pad = -a_MI.shape[1] % INT8_CONTRACTION_MULTIPLE
  if pad:
    a_MI = jnp.pad(a_MI, ((0, 0), (0, pad)))
    b_OI = jnp.pad(b_OI, ((0, 0), (0, pad)))
  return _dot_tn(a_MI, b_OI, jnp.int32)


def project(x: jax.Array, w: QuantizedWeight, n_in: int, out_dtype=None) -> jax.Array:
  """`x[..., *in]` times the weight → `[..., *w.out_shape]` in `out_dtype` (default x's).

  See the module docstring for which dot runs.
  """
  out_dtype = jnp.dtype(out_dtype or x.dtype)
  lead = x.shape[:x.ndim - n_in]
  x_MI = x.reshape(int(np.prod(lead)), -1)
  if x_MI.shape[1] != w.values.shape[-1]:
    raise ValueError(f"Input of {x_MI.shape[1]} features for a weight of {w.values.shape}.")
  kind = w.dot_kind
  scale_O = w.scale.astype(jnp.float32).reshape(1, -1)  # [1, O]
  if kind == "int8":
    xq_MI, sx_M1 = quantize_rows(x_MI, w.act)
    acc_MO = _int8_dot_tn(xq_MI, w.values.astype(jnp.int8))
    y_MO = acc_MO.astype(jnp.float32) * sx_M1 * scale_O
  elif kind == "fp8":
    xq_MI, sx_M1 = quantize_rows(x_MI, w.act)
    wq_OI = w.values if w.values.dtype in _FP8 else w.values.astype(jnp.float8_e4m3fn)
    # The output in the model's dtype (bf16: the cuBLASLt FP8 GEMM's fast output).
    y_MO = _dot_tn(xq_MI, wq_OI, out_dtype).astype(jnp.float32) * sx_M1 * scale_O
  else:
    cd = x.dtype
    if w.act is not None:  # a mixed pair: fake-quantized activations, as emulated
      xq_MI, sx_M1 = quantize_rows(x_MI, w.act)
      x_MI = (keep_float8(xq_MI).astype(jnp.float32) * sx_M1).astype(cd)
    acc = jnp.float32 if out_dtype == jnp.float32 else cd
    y_MO = _dot_tn(x_MI, int4_safe(w.values).astype(cd), acc).astype(jnp.float32) * scale_O
  return y_MO.astype(out_dtype).reshape(*lead, *w.out_shape)


def lookup(w: QuantizedWeight, ids: jax.Array, dtype) -> jax.Array:
  """Rows `ids` of a `[V, D]` quantized table (the tied embedding), dequantized to `dtype`."""
  rows = jnp.take(w.values, ids, axis=0).astype(jnp.float32)
  return (rows * jnp.take(w.scale, ids, axis=0)[..., None]).astype(dtype)
