"""Every qwix call of the sampler: weight and activation quantization (docs/method.md §7).

The sampler's precision creates the mismatch on purpose, so this module has to be faithful,
not fast. Weights: symmetric absmax per output channel, the scale shared along the contraction
axes (§7's table); activations: per-token absmax on the input of every projection. Storage
`fake` (dequantized once at weight sync) or `real` (`QArray`s dequantized in every step,
bitwise `fake`); compute `emulated` (float matmuls) or `native` (`models/quantized.py`).
qwix's array primitives (`qwix.quantize` / `qwix.dequantize`), not its model providers: these
find a weight by tracing an einsum operand back to an NNX `Param`, and our layers' weights are
slices of a scan carry (on qwix 0.1.8 `QtProvider` quantizes only the tied LM head and
`PtqProvider` fails on the embedding lookup).
"""

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import qwix

from mipu_jax.models import quantized

WEIGHT_QTYPES = {
    "int8": jnp.int8,
    "int4": jnp.int4,
    "fp8_e4m3": jnp.float8_e4m3fn,
    "fp8_e5m2": jnp.float8_e5m2,
}
ACT_QTYPES = quantized.ACT_DTYPES
# Grids qwix has no type for (fake storage only): name -> the grid's largest level (int3: -3..3).
EMULATED_WEIGHT_LEVELS = {"int3": 3}
STORAGES = ("fake", "real")
COMPUTES = ("emulated", "native")

# Axes that keep their own scale (qwix `channelwise_axes`), per layer weight.
LAYER_CHANNEL_AXES = {
    "q": (0, 2, 3),
    "k": (0, 2, 3),
    "v": (0, 2, 3),
    "o": (0, 3),
    "gate": (0, 2),
    "up": (0, 2),
    "down": (0, 2),
    # MoE layers (docs/method.md §7a): each expert quantized like the dense MLP,
    # a scale per (layer, expert, output channel); the router stays in the
    # compute dtype (a routing decision is not a projection vLLM quantizes).
    "router": None,
    "experts_gate": (0, 1, 3),
    "experts_up": (0, 1, 3),
    "experts_down": (0, 1, 3),
}
# Axes kept in front of a native `QuantizedWeight`'s `[..., O, I]` (layer, and expert).
_NATIVE_LEAD = {"experts_gate": (0, 1), "experts_up": (0, 1), "experts_down": (0, 1)}
EMBED_CHANNEL_AXES = (0,)
LM_HEAD_CHANNEL_AXES = (1,)


def check_weight_quant(name: Optional[str]) -> None:
  if name is not None and name not in WEIGHT_QTYPES and name not in EMULATED_WEIGHT_LEVELS:
    raise ValueError(f"Unknown weight_quant {name!r}; expected None or one of "
                     f"{sorted(WEIGHT_QTYPES) + sorted(EMULATED_WEIGHT_LEVELS)}.")


def check_compute(compute: str, weight_quant: Optional[str]) -> None:
  if compute not in COMPUTES:
    raise ValueError(f"Unknown quant_compute {compute!r}; expected one of {COMPUTES}.")
  if compute == "native" and weight_quant is None:
    raise ValueError("quant_compute='native' multiplies quantized weights; set weight_quant "
                     "(int8, int4, fp8_e4m3, fp8_e5m2) or use quant_compute='emulated'.")


def check_act_quant(name: Optional[str]) -> None:
  if name is not None and name not in ACT_QTYPES:
    raise ValueError(f"Unknown act_quant {name!r}; expected None or one of "
                     f"{sorted(ACT_QTYPES)}.")


def quantize(w: jax.Array, qtype: str, channel_axes: tuple[int, ...]) -> qwix.QArray:
  """Per-channel symmetric absmax quantization (float32 scales) of `w`."""
  return qwix.quantize(w.astype(jnp.float32), WEIGHT_QTYPES[qtype],
                       channelwise_axes=channel_axes, calibration_method="absmax")


def dequantize(q: qwix.QArray) -> jax.Array:
  """`qwix.dequantize(q)` of a quantization made in the same program, a float8 `q.qvalue` kept
  float8 (`quantized.keep_float8`: on a GPU, XLA would otherwise drop the rounding)."""
  return qwix.dequantize(q.replace(qvalue=quantized.keep_float8(q.qvalue)))


def dequantize_stored(q: qwix.QArray) -> jax.Array:
  """`qwix.dequantize(q)` of stored values (a program input: no round trip to keep), int4 values
  of widths XLA's GPU dot mishandles first made int8 (`quantized.int4_safe`)."""
  return qwix.dequantize(q.replace(qvalue=quantized.int4_safe(q.qvalue)))


def fake_quantize(w: jax.Array, qtype: str, channel_axes: tuple[int, ...]) -> jax.Array:
  """`dequantize(quantize(w))` in float32: the values real PTQ would compute with."""
  if qtype in EMULATED_WEIGHT_LEVELS:
    return _fake_grid(w, EMULATED_WEIGHT_LEVELS[qtype], channel_axes)
  return dequantize(quantize(w, qtype, channel_axes))


def _fake_grid(w: jax.Array, levels: int, channel_axes: tuple[int, ...]) -> jax.Array:
  """Symmetric per-channel absmax rounding to the grid -levels..levels, float32 (no qwix type)."""
  w = w.astype(jnp.float32)
  contract = tuple(a for a in range(w.ndim) if a not in channel_axes)
  scale = jnp.max(jnp.abs(w), axis=contract, keepdims=True) / levels
  q = jnp.clip(jnp.round(w / jnp.where(scale > 0, scale, 1.0)), -levels, levels)
  return q * scale


def is_quantized(x: Any) -> bool:
  return isinstance(x, qwix.QArray)


def dequantize_tree(params: Any) -> Any:
  """Replaces every `QArray` leaf by its float32 dequantization (real-PTQ storage)."""
  return jax.tree.map(lambda x: dequantize_stored(x) if is_quantized(x) else x, params,
                      is_leaf=is_quantized)


def native_weight(w: jax.Array, qtype: str, channel_axes: tuple[int, ...], *,
                  act_quant: Optional[str], stacked: bool,
                  lead: Optional[tuple[int, ...]] = None) -> quantized.QuantizedWeight:
  """`w` as a `QuantizedWeight` in the `[L, O, I]` layout (native compute);
  `lead`: the axes kept in front (default: the layer axis when `stacked`)."""
  if lead is None:
    lead = (0,) if stacked else ()
  out = tuple(a for a in channel_axes if a not in lead)
  contract = tuple(a for a in range(w.ndim) if a not in channel_axes)
  return quantized.from_float(w, WEIGHT_QTYPES[qtype], out, contract, lead, act=act_quant)


def quantize_params(params: dict, *, weight_quant: Optional[str], compute_dtype,
                    quant_lm_head: bool, tie_embeddings: bool,
                    storage: str = "fake", compute: str = "emulated",
                    act_quant: Optional[str] = None) -> dict:
  """Learner params (pure dict, float) → sampler params: matmul weights cast to `compute_dtype`
  (or quantized with `weight_quant`), norm weights float32, as the model applies them
  (`qwen3.rms_norm`): narrower storage would change numerics beyond what the precision mode asks."""
  if storage not in STORAGES:
    raise ValueError(f"Unknown quant storage {storage!r}; expected one of {STORAGES}.")
  check_compute(compute, weight_quant)
  if weight_quant in EMULATED_WEIGHT_LEVELS and (storage, compute) != ("fake", "emulated"):
    raise ValueError(f"weight_quant {weight_quant!r} has no storage type: it runs with "
                     "weight storage 'fake' and quant_compute 'emulated' only.")

  def convert(w, axes, stacked=False, lead=None):
    if weight_quant is None or axes is None:
      return w.astype(compute_dtype)
    if compute == "native":
      return native_weight(w, weight_quant, axes, act_quant=act_quant, stacked=stacked,
                           lead=lead)
    if storage == "real":
      return quantize(w, weight_quant, axes)
    return fake_quantize(w, weight_quant, axes).astype(compute_dtype)

  layers = {}
  for name, w in params["layers"].items():
    layers[name] = w.astype(jnp.float32) if name.endswith("norm") else convert(
        w, LAYER_CHANNEL_AXES[name], stacked=True, lead=_NATIVE_LEAD.get(name))
  out = dict(params)
  out["layers"] = layers
  out["final_norm"] = params["final_norm"].astype(jnp.float32)
  head_axes = None if not quant_lm_head else (
      EMBED_CHANNEL_AXES if tie_embeddings else LM_HEAD_CHANNEL_AXES)
  if tie_embeddings:
    out["embed"] = convert(params["embed"], head_axes)
  else:
    out["embed"] = params["embed"].astype(compute_dtype)
    out["lm_head"] = convert(params["lm_head"], head_axes)
  return out


@functools.lru_cache(maxsize=None)  # one function per name: it is part of a static jit key
def make_act_quant(name: Optional[str]) -> Optional[Callable[[jax.Array], jax.Array]]:
  """Per-token absmax fake quantizer for the model's `act_quant` hook, or None. The hook sees
  `[B, T, ...]` inputs; the scale is per `(b, t)`, shared over all feature axes (the whole
  contraction for the o-projection's `[B, T, N, H]`), as a per-token dynamic quantizer on a real
  kernel. int8 values clip to ±127 (`quantized.quantize_activation`: no rounding tie at a token's
  absmax)."""
  check_act_quant(name)
  if name is None:
    return None
  qtype = ACT_QTYPES[name]

  def act_quant(x: jax.Array) -> jax.Array:
    q = quantized.quantize_activation(x, qtype, (0, 1))
    return dequantize(q).astype(x.dtype)

  return act_quant
