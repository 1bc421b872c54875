"""Qwen3 and Qwen3-MoE architecture config and presets (docs/method.md §7, §7a).

The presets' dimensions equal the public Hugging Face `config.json` files of
Qwen/Qwen3-{0.6B,1.7B,4B,8B} and Qwen/Qwen3-{30B-A3B,235B-A22B}; `tiny` and
`tiny_moe` are CPU-sized models for tests and the small RL task.
"""

import dataclasses
import math
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
ATTENTIONS = ("auto", "dense", "blockwise", "cudnn", "splash", "cpu_fused")
MOE_IMPLS = ("auto", "ragged_dot", "blocked", "footprint")


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
    attention: "auto" (`cpu_fused` on a CPU in float32 where it builds, else
      `dense`), "dense" (the reference), "blockwise" (flash-style, pure JAX),
      "cudnn" (GPU), "splash" (TPU) or "cpu_fused" (one XLA:CPU kernel, float32,
      built on first use); `mipu_jax.models.attention`.
    attention_block: query and key tile of the blockwise and splash kernels.
    num_experts: E, experts per MoE layer; 0 is a dense model (Hugging Face
      `Qwen3MoeConfig`'s fields from here on, docs/method.md §7a).
    num_experts_per_tok: k, experts each token is routed to (top-k).
    moe_intermediate_size: each expert's SwiGLU width.
    norm_topk_prob: the k gate weights are renormalised to sum to 1 (HF's
      default is False; the released Qwen3-MoE checkpoints set True).
    decoder_sparse_step: layer i is MoE when (i + 1) % step == 0 ...
    mlp_only_layers: ... and i is not listed here (those keep a dense MLP of
      width `intermediate_size`).
    router_aux_loss_coef: weight of the load-balancing loss when the learner
      adds it (`MoEConfig.aux_loss`).
    moe_impl: the experts' grouped matmul: "ragged_dot" (`jax.lax.ragged_dot`,
      XLA's / the TPU's grouped matmul), "blocked" (rows sorted by expert in
      fixed blocks, a dot per block: XLA:CPU lowers ragged_dot to a masked dot
      over every expert) or "auto" (blocked on a CPU, ragged_dot elsewhere).
      "footprint" is for memory plans only (`mipu_jax.memory_plan`): a dot
      with a grouped matmul's operand and result shapes (`[m, I]` x
      `[E, I, O]` -> `[m, O]`), not its values, so that XLA:CPU plans an
      accelerator's grouped-matmul kernel rather than its own expansion.
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
  attention: str = "auto"
  attention_block: int = 512
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = False
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  router_aux_loss_coef: float = 0.001
  moe_impl: str = "auto"

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
    object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
    self._check_moe()

  def _check_moe(self):
    """MoE fields: all unset (dense) or consistent; errors name the field."""
    if self.num_experts < 0:
      raise ValueError(f"Qwen3Config.num_experts must be >= 0, got {self.num_experts}.")
    if self.moe_impl not in MOE_IMPLS:
      raise ValueError(f"unknown moe_impl {self.moe_impl!r}; choose one of {MOE_IMPLS}.")
    if self.num_experts == 0:
      return
    if not 1 <= self.num_experts_per_tok <= self.num_experts:
      raise ValueError(
          f"Qwen3Config.num_experts_per_tok ({self.num_experts_per_tok}) must be in "
          f"[1, num_experts={self.num_experts}].")
    if self.moe_intermediate_size <= 0:
      raise ValueError("Qwen3Config.moe_intermediate_size must be positive, got "
                       f"{self.moe_intermediate_size}.")
    if self.decoder_sparse_step < 1:
      raise ValueError(
          f"Qwen3Config.decoder_sparse_step must be >= 1, got {self.decoder_sparse_step}.")
    bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_layers]
    if bad:
      raise ValueError(f"Qwen3Config.mlp_only_layers {bad} are not layers of a "
                       f"{self.num_layers}-layer model.")
    if not (math.isfinite(self.router_aux_loss_coef) and self.router_aux_loss_coef >= 0):
      raise ValueError("Qwen3Config.router_aux_loss_coef must be finite and >= 0, got "
                       f"{self.router_aux_loss_coef}.")

  def is_moe_layer(self, i: int) -> bool:
    """Layer i has a sparse MoE block (Hugging Face `Qwen3MoeDecoderLayer`'s rule)."""
    return (self.num_experts > 0 and i not in self.mlp_only_layers
            and (i + 1) % self.decoder_sparse_step == 0)

  @property
  def moe_layers(self) -> tuple[int, ...]:
    """The MoE layers' indices (L_moe of them); empty for a dense model."""
    return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

  @property
  def dense_layers(self) -> tuple[int, ...]:
    """The layers with a dense SwiGLU MLP."""
    return tuple(i for i in range(self.num_layers) if not self.is_moe_layer(i))

  @property
  def is_moe(self) -> bool:
    return bool(self.moe_layers)

  def layer_runs(self) -> tuple[tuple[int, int, bool], ...]:
    """Consecutive layers of one kind as `(start, stop, is_moe)`: each run is one
    `lax.scan` over stacked weights (a dense model is a single run)."""
    runs = []
    for i in range(self.num_layers):
      kind = self.is_moe_layer(i)
      if runs and runs[-1][2] == kind:
        runs[-1] = (runs[-1][0], i + 1, kind)
      else:
        runs.append((i, i + 1, kind))
    return tuple(runs)

  def replace(self, **kwargs) -> "Qwen3Config":
    return dataclasses.replace(self, **kwargs)

  def num_params(self) -> int:
    d, f, n, k, h = (self.hidden_size, self.intermediate_size, self.num_heads,
                     self.num_kv_heads, self.head_dim)
    per_layer = 2 * d + d * n * h + 2 * d * k * h + n * h * d + 2 * h
    mlp = (len(self.dense_layers) * 3 * d * f
           + len(self.moe_layers) * self.num_experts * (d + 3 * d * self.moe_intermediate_size))
    head = 0 if self.tie_embeddings else d * self.vocab_size
    return self.vocab_size * d + self.num_layers * per_layer + mlp + d + head

  def num_active_params(self) -> int:
    """Parameters one token's forward pass multiplies by: each MoE layer counts
    its router and its k routed experts only (MFU on active parameters)."""
    if not self.is_moe:
      return self.num_params()
    e, k, fm, d = (self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size,
                   self.hidden_size)
    return self.num_params() - len(self.moe_layers) * (e - k) * 3 * d * fm


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
    # Mixture of experts (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B config.json).
    "qwen3_30b_a3b": Qwen3Config(hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4,
                                 intermediate_size=6144, tie_embeddings=False,
                                 num_experts=128, num_experts_per_tok=8,
                                 moe_intermediate_size=768, norm_topk_prob=True, **_QWEN3),
    "qwen3_235b_a22b": Qwen3Config(hidden_size=4096, num_layers=94, num_heads=64,
                                   num_kv_heads=4, intermediate_size=12288,
                                   tie_embeddings=False, num_experts=128, num_experts_per_tok=8,
                                   moe_intermediate_size=1536, norm_topk_prob=True, **_QWEN3),
    # CPU-sized MoE: `tiny`'s attention, 8 experts of width 32, top-2.
    "tiny_moe": Qwen3Config(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                            num_kv_heads=2, head_dim=16, intermediate_size=128,
                            tie_embeddings=True, rope_theta=10_000.0, num_experts=8,
                            num_experts_per_tok=2, moe_intermediate_size=32,
                            norm_topk_prob=True),
}


def get_config(name: str, **overrides) -> Qwen3Config:
  """Returns preset `name` with `overrides` applied (e.g. dtype='bfloat16')."""
  if name not in PRESETS:
    raise ValueError(f"Unknown model preset {name!r}; expected one of {sorted(PRESETS)}.")
  return PRESETS[name].replace(**overrides)
