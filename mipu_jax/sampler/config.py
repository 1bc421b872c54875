"""Sampler engine configuration and shape buckets (docs/method.md §7).

A frozen dataclass, validated once; everything below it takes explicit values. Shapes reaching a
compiled function are bucketed (powers of two between a floor and the configured maximum), so an
RL run whose prompts, batch sizes and `max_new_tokens` vary inside a bucket compiles each once.
"""

import dataclasses
import functools
import logging
from typing import Any, Optional

import jax.numpy as jnp

from mipu_jax.models import invariant
from mipu_jax.models import paged_pallas
from mipu_jax.models import paged_tpu
from mipu_jax.models.config import DTYPE_NAMES, as_dtype
from mipu_jax.sampler import quant

# Attention over the KV cache (`mipu_jax.models.attention.decode`).
DECODE_ATTENTIONS = ("auto", "paged", "pallas", "pallas_tpu", "dense")

# The compute dtypes' names plus the cache-only low-precision ones.
_KV_DTYPES = {
    **DTYPE_NAMES,
    "fp8": jnp.float8_e4m3fn, "fp8_e4m3": jnp.float8_e4m3fn, "fp8_e5m2": jnp.float8_e5m2,
    "int8": jnp.int8,
}

KV_STORAGES = ("auto", "real", "fake")


def kv_dtype(name: Any) -> jnp.dtype:
  """KV-cache dtype from a name ('bf16', 'fp8', 'int8', ...) or a dtype."""
  if isinstance(name, str):
    if name not in _KV_DTYPES:
      raise ValueError(f"Unknown kv_cache_dtype {name!r}; expected one of {sorted(_KV_DTYPES)}.")
    return jnp.dtype(_KV_DTYPES[name])
  return jnp.dtype(name)


def bucket(n: int, *, minimum: int, maximum: Optional[int] = None, what: str = "Size") -> int:
  """Smallest power of two ≥ max(n, minimum), capped at `maximum` (which must fit n)."""
  if maximum is not None and n > maximum:
    raise ValueError(f"{what} is {n}, more than the configured maximum {maximum}.")
  size = max(minimum, 1)
  while size < n:
    size *= 2
  return size if maximum is None else min(size, maximum)


_COMPUTE_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


@dataclasses.dataclass(frozen=True)
class SamplerPrecision:
  """How μ computes: the precision fields, declared once for the engine's `SamplerConfig` and the
  run config's `sampling` section (`mipu_jax.config.SamplingConfig`), which both inherit them with
  one validation. Names are kept here; `SamplerConfig` resolves `dtype` and `kv_cache_dtype`.

  Attributes:
    dtype: compute dtype of the matmuls: 'float32' / 'bfloat16' / 'float16' (or 'fp32' / 'bf16'
      / 'fp16', or a dtype).
    weight_quant: None, 'int8', 'fp8_e4m3', 'fp8_e5m2' or 'int4' (per-channel absmax).
    act_quant: None, 'int8' or 'fp8' (= 'fp8_e4m3'), 'fp8_e5m2' (per-token absmax).
    kv_cache_dtype: None (= compute dtype), 'bf16', 'fp16', 'fp32', 'fp8', 'fp8_e5m2', 'int8' (or
      a dtype).
    quant_lm_head: also quantize the LM head weight and its input activation (off by default, as
      in common FP8/INT8 serving recipes).
    quant_compute: 'emulated' (dequantize, then a float matmul: the reference) or 'native'
      (int8 / fp8 dots, weights stored quantized; needs weight_quant): `mipu_jax/sampler/quant.py`.
    max_concurrent_decodes: decode slots of an engine, the most samples decoding at once; more
      run through the same slots as earlier ones finish (continuous batching).
    true_on_policy: the sampler's log-probs bitwise equal to the learner's (docs/method.md §7):
      both run the batch-invariant arithmetic of `mipu_jax.models.invariant`. Needs float
      weights, activations and KV cache in the compute dtype, the learner computing in it, no
      top-k / top-p and an unsplit contraction (`tensor = 1`); KV-cache pages are the attention's
      key blocks (`invariant.KEY_BLOCK` slots) whatever `page_size` says, and on CPU the
      engine's programs compile with jax's default options, as the learner's.
  """

  dtype: Any = "float32"
  weight_quant: Optional[str] = None
  act_quant: Optional[str] = None
  kv_cache_dtype: Optional[str] = None
  quant_lm_head: bool = False
  quant_compute: str = "emulated"
  max_concurrent_decodes: int = 256
  true_on_policy: bool = False

  def __post_init__(self):
    if as_dtype(self.dtype) not in _COMPUTE_DTYPES:
      raise ValueError(f"Sampler dtype must be float32, bfloat16 or float16, got {self.dtype}.")
    if self.kv_cache_dtype is not None:
      kv_dtype(self.kv_cache_dtype)
    quant.check_weight_quant(self.weight_quant)
    quant.check_act_quant(self.act_quant)
    quant.check_compute(self.quant_compute, self.weight_quant)
    if self.max_concurrent_decodes <= 0:
      raise ValueError(
          f"max_concurrent_decodes must be positive, got {self.max_concurrent_decodes}.")
    if self.true_on_policy:
      kv = None if self.kv_cache_dtype is None else kv_dtype(self.kv_cache_dtype)
      if self.weight_quant or self.act_quant or (kv is not None and kv != as_dtype(self.dtype)):
        raise ValueError(
            "true_on_policy needs the sampler's weights, activations and KV cache in its "
            f"compute dtype ({as_dtype(self.dtype)}), as the learner computes; got "
            f"weight_quant={self.weight_quant!r}, act_quant={self.act_quant!r}, "
            f"kv_cache_dtype={self.kv_cache_dtype!r}. A quantized sampler cannot match "
            "a learner that trains the float weights.")

  def precision_kwargs(self) -> dict[str, Any]:
    """The precision fields as keyword arguments of `SamplerConfig` or `Sampler`."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(SamplerPrecision)}


@dataclasses.dataclass(frozen=True)
class SamplerConfig(SamplerPrecision):
  """How the sampler computes (the inference policy μ of docs/method.md §0). The precision fields
  are `SamplerPrecision`'s; `dtype` and `kv_cache_dtype` become dtypes (a None cache: `dtype`).

  Attributes:
    quant_storage: with `quant_compute='emulated'`, 'fake' (float tree of dequantized values) or
      'real' (QArrays, dequantized in each step); `native` always stores quantized values.
    kv_cache_storage: how a float KV cache narrower than `dtype` is kept (fp8 or bf16 / fp16
      under float32; fp8 under bfloat16 / float16): 'real' (arrays of the cache dtype), 'fake'
      (compute-dtype arrays holding the cache dtype's values, the new K/V rounded through it;
      CPU only) or 'auto' (fake on CPU where it applies, else real, int8 included). Fake and
      real give bitwise the same attention, tokens and log-probs (tested on CPU); fake costs more
      memory and saves XLA:CPU's scalar float8 converts of the whole cache at every decode step.
    max_prefill_length / max_decode_length: longest prompt / largest `max_new_tokens` accepted.
    min_prefill_bucket / min_decode_bucket / min_slot_bucket: bucket floors.
    stop_ids: token ids that end a response (EOS / stop ids); at most `max_stop_ids`.
    max_stop_ids: size of the fixed stop-id buffer (changing ids never recompiles).
    pad_id: id written in the padding of token buffers.
    page_size: most slots per KV-cache page (`mipu_jax.models.kv_cache`): the page size is the
      largest power of two up to this dividing the prefill region and the decode length. Decode
      attention reads one page per row per loop step (trade-off: bench/perf/decode.py).
    decode_attention: attention over the cache: 'paged' (only the pages holding a filled slot of
      some row, pure XLA), 'pallas' (the same as one Pallas GPU kernel per layer and decode
      step), 'pallas_tpu' (jax's TPU paged-attention kernel; bf16 and FP8 caches), 'dense'
      (every slot: the reference) or 'auto'; `decode_attention_for`.
    return_routing: MoE models: also return each prompt and generated token's
      experts in every MoE layer (`SampleOutput.routing_array`, rollout routing
      replay R3 and the routing-mismatch metrics, docs/method.md §7a); ignored
      for a dense model. Off by default: `[B, N, L_moe, k]` int32 per call.
  """

  quant_storage: str = "fake"
  kv_cache_storage: str = "auto"
  max_prefill_length: int = 512
  max_decode_length: int = 1024
  min_prefill_bucket: int = 16
  min_decode_bucket: int = 16
  min_slot_bucket: int = 8
  stop_ids: tuple[int, ...] = ()
  max_stop_ids: int = 8
  pad_id: int = 0
  page_size: int = 64
  decode_attention: str = "auto"
  return_routing: bool = False

  def __post_init__(self):
    super().__post_init__()
    object.__setattr__(self, "dtype", as_dtype(self.dtype))
    kv = self.dtype if self.kv_cache_dtype is None else kv_dtype(self.kv_cache_dtype)
    object.__setattr__(self, "kv_cache_dtype", kv)
    if self.quant_storage not in quant.STORAGES:
      raise ValueError(
          f"quant_storage must be one of {quant.STORAGES}, got {self.quant_storage!r}.")
    if self.kv_cache_storage not in KV_STORAGES:
      raise ValueError(f"kv_cache_storage must be one of {KV_STORAGES}, "
                       f"got {self.kv_cache_storage!r}.")
    for name in ("max_prefill_length", "max_decode_length", "min_prefill_bucket",
                 "min_decode_bucket", "min_slot_bucket", "max_stop_ids", "page_size"):
      if getattr(self, name) <= 0:
        raise ValueError(f"SamplerConfig.{name} must be positive, got {getattr(self, name)}.")
    if self.decode_attention not in DECODE_ATTENTIONS:
      raise ValueError(f"decode_attention must be one of {DECODE_ATTENTIONS}, got "
                       f"{self.decode_attention!r}.")
    if self.true_on_policy:
      if self.decode_attention != "auto":
        raise ValueError(f"true_on_policy runs its own decode attention (the learner's "
                         f"key blocks); decode_attention={self.decode_attention!r} "
                         "would sum in another order. Leave it 'auto'.")
      for name in ("min_prefill_bucket", "min_decode_bucket"):
        if getattr(self, name) % invariant.KEY_BLOCK:
          raise ValueError(f"true_on_policy: {name}={getattr(self, name)} must be a "
                           f"multiple of the key block ({invariant.KEY_BLOCK} slots): "
                           "each page is one block.")
      object.__setattr__(self, "page_size", invariant.KEY_BLOCK)
    object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))
    if len(self.stop_ids) > self.max_stop_ids:
      raise ValueError(
          f"{len(self.stop_ids)} stop ids, more than max_stop_ids={self.max_stop_ids}.")

  def kv_round(self, platform: str) -> Optional[jnp.dtype]:
    """The dtype a fake-stored cache rounds through on `platform`, or None (real).

    Raises:
      ValueError: `kv_cache_storage='fake'` where it cannot be exact: a cache dtype the compute
        dtype does not hold exactly (or the compute dtype itself), or a platform other than CPU
        (XLA's GPU pipeline may fold a float -> float8 -> float convert pair under its default
        excess-precision rule, dropping the rounding).
    """
    kv = self.kv_cache_dtype
    # Exact where the compute dtype holds every cache value: narrower in float32, float8 in 16-bit.
    exact = jnp.issubdtype(kv, jnp.floating) and kv.itemsize < self.dtype.itemsize and (
        self.dtype == jnp.float32 or kv.itemsize == 1)
    if self.kv_cache_storage == "real":
      return None
    if self.kv_cache_storage == "auto":
      return kv if exact and platform == "cpu" else None
    if not exact:
      raise ValueError(
          f"kv_cache_storage='fake' needs a float KV-cache dtype whose every value the "
          f"compute dtype holds (got {kv} under {self.dtype}); use 'real' or 'auto'.")
    if platform != "cpu":
      raise ValueError(f"kv_cache_storage='fake' is for CPU only, not {platform!r}; use "
                       "'real' or 'auto'.")
    return kv

  def decode_attention_for(self, platform: str, *, kv_dtype: Any = None,
                           head_dim: Optional[int] = None) -> str:
    """The decode attention on `platform` (docs/method.md §7): "auto" is the
    Pallas kernel on a GPU, jax's TPU kernel on a TPU, else "paged"; on a mesh
    either kernel runs per shard. Without Pallas' Triton backend "auto" is
    "paged" (one warning) and "pallas" an error. A cache the TPU kernel cannot
    serve (`paged_tpu.unsupported`, checked where `kv_dtype` is given) is an
    error by name, "paged" with a warning under "auto"."""
    if self.true_on_policy:
      if platform == "gpu" and as_dtype(self.dtype) == jnp.float32:
        _warn_true_on_policy_float32_gpu()
      return "invariant"
    asked = self.decode_attention
    if asked == "pallas" and (missing := paged_pallas.missing_backend()):
      raise RuntimeError(f'decode_attention="pallas" cannot run: {missing}; the kernel '
                         'is written for it. Use "auto" or "paged".')
    name = asked
    if asked == "auto":
      name = {"tpu": "pallas_tpu", "gpu": "pallas"}.get(platform, "paged")
      if name == "pallas" and (missing := paged_pallas.missing_backend()):
        _warn_auto_without_kernel(missing)
        name = "paged"
    if name != "pallas_tpu" or kv_dtype is None:
      return name
    reason = paged_tpu.unsupported(kv_dtype, head_dim, on_tpu=platform == "tpu")
    if reason is None:
      return name
    if asked == "pallas_tpu":
      raise ValueError(f"decode_attention='pallas_tpu' cannot serve {reason}; use 'paged'.")
    logging.warning("decode_attention='auto' runs 'paged' on this TPU instead of jax's "
                    "paged-attention kernel: %s.", reason)
    return "paged"

  def replace(self, **kwargs) -> "SamplerConfig":
    return dataclasses.replace(self, **kwargs)

  def prefill_bucket(self, prompt_len: int) -> int:
    return self._blocks(bucket(prompt_len, minimum=self.min_prefill_bucket,
                               maximum=self.max_prefill_length, what="Prompt length"))

  def decode_bucket(self, max_new_tokens: int) -> int:
    return self._blocks(bucket(max_new_tokens, minimum=self.min_decode_bucket,
                               maximum=self.max_decode_length, what="max_new_tokens"))

  def _blocks(self, size: int) -> int:
    """In the true on-policy mode a buffer holds whole key blocks (pages)."""
    if not self.true_on_policy:
      return size
    return -(-size // invariant.KEY_BLOCK) * invariant.KEY_BLOCK

  def slot_bucket(self, num_sequences: int) -> int:
    return bucket(num_sequences, minimum=self.min_slot_bucket)


@functools.cache
def _warn_true_on_policy_float32_gpu() -> None:  # once per process
  logging.warning("true_on_policy in float32 on a GPU: measured not bitwise on an H200 (a few "
                  "log-probs differ by up to 4.4e-5; bfloat16 was bitwise), docs/method.md §7. "
                  "The loop logs the gap each step (rollout_corr/k3_kl, training/rollout_probs_diff_max).")


@functools.cache
def _warn_auto_without_kernel(missing: str) -> None:  # once per process
  logging.warning('decode_attention="auto" runs "paged" (the XLA path, slower) on this GPU '
                  "instead of the Pallas kernel: %s. docs/method.md §7 lists the jax "
                  "versions that run the kernel.", missing)
