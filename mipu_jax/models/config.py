"""Qwen3 architecture config and presets (docs/method.md §7).

The presets' dimensions equal the public Hugging Face `config.json` files of
Qwen/Qwen3-{0.6B,1.7B,4B,8B}; `tiny` is a CPU-sized model for tests and the
small RL task.
"""

import dataclasses
from typing import Any

import jax.numpy as jnp

DTYPE_NAMES = {
    "float32": jnp.float32,
    "fp32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "bf16": jnp.bfloat16,
    "float16": jnp.float16,
    "fp16": jnp.float16,
}


def as_dtype(dtype: Any) -> jnp.dtype:
  """Accepts a dtype or one of 'float32'/'fp32'/'bfloat16'/'bf16'/'float16'/'fp16'."""
  if isinstance(dtype, str):
    if dtype not in DTYPE_NAMES:
      raise ValueError(f"Unknown dtype {dtype!r}; expected one of {sorted(DTYPE_NAMES)}.")
    return jnp.dtype(DTYPE_NAMES[dtype])
  return jnp.dtype(dtype)


REMAT_POLICIES = ("none", "layer", "dots")
ATTENTIONS = ("dense", "blockwise", "cudnn", "splash")


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
  """Dimensions of a Qwen3 decoder.

  Attributes:
    vocab_size: V.
    hidden_size: D.
    num_layers: L.
    num_heads: N, query heads.
    num_kv_heads: K, key/value heads (grouped-query attention: N % K == 0).
    head_dim: H.
    intermediate_size: F, SwiGLU hidden width.
    tie_embeddings: the LM head reuses the token embedding.
    rope_theta: RoPE base.
    rms_eps: RMSNorm epsilon.
    param_dtype: storage dtype of the parameters (fp32 master weights).
    dtype: compute dtype of matmuls; norms, softmax and logits stay float32.
    remat: remat policy of each layer in the backward pass: "none", "layer"
      (recompute the whole layer: least memory) or "dots" (keep the matmul
      outputs); `qwen3.remat`. True / False mean "layer" / "none".
    attention: "dense" (the reference), "blockwise" (flash-style, pure JAX),
      "cudnn" (GPU) or "splash" (TPU); `mipu_jax.models.attention`.
    attention_block: query and key tile of the blockwise and splash kernels.
  """

  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  tie_embeddings: bool = True
  rope_theta: float = 1_000_000.0
  rms_eps: float = 1e-6
  param_dtype: Any = jnp.float32
  dtype: Any = jnp.float32
  remat: Any = "none"
  attention: str = "dense"
  attention_block: int = 512

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim", "intermediate_size"):
      if getattr(self, name) <= 0:
        raise ValueError(f"Qwen3Config.{name} must be positive, got {getattr(self, name)}.")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads}).")
    if isinstance(self.remat, bool):
      object.__setattr__(self, "remat", "layer" if self.remat else "none")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"unknown remat policy {self.remat!r}; choose one of "
                       f"{REMAT_POLICIES}.")
    if self.attention not in ATTENTIONS:
      raise ValueError(f"unknown attention {self.attention!r}; choose one of "
                       f"{ATTENTIONS}.")
    if self.attention_block < 1:
      raise ValueError(f"attention_block must be >= 1, got {self.attention_block}.")
    object.__setattr__(self, "param_dtype", as_dtype(self.param_dtype))
    object.__setattr__(self, "dtype", as_dtype(self.dtype))

  def replace(self, **kwargs) -> "Qwen3Config":
    return dataclasses.replace(self, **kwargs)

  def num_params(self) -> int:
    d, f, n, k, h = (self.hidden_size, self.intermediate_size, self.num_heads,
                     self.num_kv_heads, self.head_dim)
    per_layer = 2 * d + d * n * h + 2 * d * k * h + n * h * d + 2 * h + 3 * d * f
    head = 0 if self.tie_embeddings else d * self.vocab_size
    return self.vocab_size * d + self.num_layers * per_layer + d + head


_QWEN3 = dict(vocab_size=151936, rope_theta=1_000_000.0, rms_eps=1e-6, head_dim=128)

PRESETS: dict[str, Qwen3Config] = {
    "tiny": Qwen3Config(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, intermediate_size=128,
                        tie_embeddings=True, rope_theta=10_000.0),
    "qwen3_0p6b": Qwen3Config(hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8,
                              intermediate_size=3072, tie_embeddings=True, **_QWEN3),
    "qwen3_1p7b": Qwen3Config(hidden_size=2048, num_layers=28, num_heads=16, num_kv_heads=8,
                              intermediate_size=6144, tie_embeddings=True, **_QWEN3),
    "qwen3_4b": Qwen3Config(hidden_size=2560, num_layers=36, num_heads=32, num_kv_heads=8,
                            intermediate_size=9728, tie_embeddings=True, **_QWEN3),
    "qwen3_8b": Qwen3Config(hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                            intermediate_size=12288, tie_embeddings=False, **_QWEN3),
}


def get_config(name: str, **overrides) -> Qwen3Config:
  """Returns preset `name` with `overrides` applied (e.g. dtype='bfloat16')."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; expected one of {sorted(PRESETS)}.")
  return PRESETS[name].replace(**overrides)
