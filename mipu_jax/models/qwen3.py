"""Qwen3 and Qwen3-MoE decoders in Flax NNX (docs/method.md §7, §7a).

RMSNorm, RoPE, grouped-query attention with per-head q/k RMSNorm, SwiGLU MLP or
a sparse mixture-of-experts block (`mipu_jax.models.moe`), tied or untied
embeddings. Layer weights are stacked on a leading `L` axis and
the layers run under `jax.lax.scan`, so a 36-layer model compiles as fast as a
one-layer one and the KV cache is one array per K/V. Attention is
`mipu_jax.models.attention` (dense / blockwise / cuDNN / splash, by config),
each layer is rematerialised by the config's policy (`remat`), and packed rows
(segment ids, per-segment positions) attend within their segment.

Shape letters: B batch, T query positions, S key positions (cache slots),
D hidden, N query heads, K kv heads, Q = N // K, H head dim, F MLP width,
V vocab, L layers, E experts, k experts per token, L_moe MoE layers.

Layers of one kind that follow each other are one scan (`Qwen3Config.layer_runs`):
a dense model, or an all-MoE one, is a single scan.
"""

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from mipu_jax.models import attention
from mipu_jax.models import invariant
from mipu_jax.models import kv_cache
from mipu_jax.models import moe
from mipu_jax.models import quantized
from mipu_jax.models import sharding
from mipu_jax.models.config import Qwen3Config
from mipu_jax.models.kv_cache import KVCache, init_cache  # pylint: disable=unused-import

ActQuant = Optional[Callable[[jax.Array], jax.Array]]


@dataclasses.dataclass(frozen=True)
class Inference:
  """How a sampler runs the model (static; `mipu_jax.sampler.engine` builds it).

  Attributes:
    decode: attention over the KV cache (`attention.DecodeImpl`).
    act_quant: fake-quantizer of every projection's input (the sampler's
      emulated activation quantization), or None.
    quant_lm_head: whether `act_quant` also applies to the LM head's input.
    kv_round: a float dtype the new K/V are rounded through before they are
      written to a cache of another dtype (a float8 cache kept as float32
      values: bitwise the same attention; `SamplerConfig.kv_cache_storage`).
    invariant: the true on-policy mode's batch-invariant arithmetic
      (`mipu_jax.models.invariant`, docs/method.md §7): per-token work on fixed
      row tiles, attention by fixed key blocks; with a cache, `decode` must be
      the "invariant" attention. The learner's forward in the mode sets it too.
  """

  decode: attention.DecodeImpl = attention.DecodeImpl()
  act_quant: ActQuant = None
  quant_lm_head: bool = True
  kv_round: Any = None
  invariant: bool = False


class Output(NamedTuple):
  """A model call's result.

  Attributes:
    logits: float32 `[B, T, V]`, or None (`logits=False`).
    cache: the cache with the call's tokens written, or None without a cache.
    hidden: the final normalised hidden state `[B, T, D]`.
    routing: MoE models: int32 `[B, T, L_moe, k]`, the experts each token was
      routed to in each MoE layer (-1 where `mask_BT` is 0); None when dense.
    moe_stats: MoE models: `moe.LayerStats` stacked `[L_moe, E]` (expert load
      and mean router probability over the real tokens); None when dense.
  """

  logits: Optional[jax.Array]
  cache: Optional[KVCache]
  hidden: jax.Array
  routing: Optional[jax.Array] = None
  moe_stats: Optional[moe.LayerStats] = None


def rms_norm(x, weight, eps):
  """RMSNorm in float32, cast back to the input dtype (as Hugging Face Qwen3)."""
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
  weight = weight.astype(jnp.float32).reshape((1,) * (x.ndim - 1) + weight.shape)
  return (weight * x32).astype(x.dtype)


def rope(x_BTNH, positions_BT, theta):
  """Rotary embedding, half-split (`rotate_half`) layout as Hugging Face Qwen3."""
  h = x_BTNH.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
  angles_BTh = positions_BT.astype(jnp.float32)[..., None] * inv_freq[None, None, :]
  sin = jnp.sin(angles_BTh)[:, :, None, :]
  cos = jnp.cos(angles_BTh)[:, :, None, :]
  return _rotate(x_BTNH.astype(jnp.float32), cos, sin).astype(x_BTNH.dtype)


def _rotate_halves(x, cos, sin):
  h = x.shape[-1]
  x1, x2 = x[..., : h // 2], x[..., h // 2:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


@jax.custom_vjp
def _rotate(x, cos, sin):
  """`x` rotated by the angles of `cos`, `sin` (constants: no gradient). The
  gradient is the rotation back, `_rotate(dy, cos, -sin)`: one fusion, where
  autodiff's transpose of the halves' slices pads and adds them (4-7% of the
  MoE learner's CPU step; bench/README.md, "The fused attention kernel")."""
  return _rotate_halves(x, cos, sin)


def _rotate_fwd(x, cos, sin):
  return _rotate_halves(x, cos, sin), (cos, sin)


def _rotate_bwd(res, dy):
  cos, sin = res
  return _rotate_halves(dy, cos, -sin), None, None


_rotate.defvjp(_rotate_fwd, _rotate_bwd)


def shard_rows(x: jax.Array) -> jax.Array:
  """Constrains the leading (batch) axis of an activation to the mesh's rows.

  Active only while a mesh with `data` and `fsdp` axes is set (`jax.set_mesh`,
  as the learner does when it traces its step); otherwise a no-op. With the
  activations' rows pinned, XLA all-gathers the FSDP-sharded weights of each
  matmul (ZeRO-3) instead of computing partial sums over every row of the
  micro-batch on each device (vocabulary-sized buffers per token at long rows).
  The rows split over every `sharding.ROWS` axis the mesh has (`expert` too).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.manual_axes or not {"data", "fsdp"} <= set(mesh.axis_names):
    return x
  if x.shape[0] % sharding.row_shards(mesh):
    return x
  spec = jax.sharding.PartitionSpec(sharding.row_axes(mesh), *([None] * (x.ndim - 1)))
  return jax.lax.with_sharding_constraint(x, spec)


def _aq(x, act_quant: ActQuant):
  return x if act_quant is None else act_quant(x)


def _proj(eq: str, x, xq, w, n_in: int, rows: bool = False):
  """One projection of `x`'s last `n_in` axes by `w`'s first `n_in`:
  `einsum(eq, xq, w)` for a float weight (`xq` is `x` after the emulated
  activation quantizer), or the native low-precision dot of a
  `quantized.QuantizedWeight`, which quantizes `x` itself (docs/method.md §7).
  `rows`: the same product as one `[rows, I] x [I, O]` matmul, for XLA:CPU,
  which computes the weight gradient of a contraction over two row axes from a
  transposed copy of the output's gradient (bench/README.md, "Where the
  learner's time goes")."""
  if isinstance(w, quantized.QuantizedWeight):
    return quantized.project(x, w, n_in)
  if not rows:
    return jnp.einsum(eq, xq, w)
  i = math.prod(w.shape[:n_in])
  out = jnp.einsum("MI,IO->MO", xq.reshape(-1, i), w.reshape(i, -1))
  return out.reshape(*xq.shape[:xq.ndim - n_in], *w.shape[n_in:])


def _proj_rows(x_BTI, xq_BTI, w_IO):
  """`_proj` of a 2-D weight (the MLP's) as one `[B·T, I] x [I, O]` matmul."""
  return _proj("", x_BTI, xq_BTI, w_IO, 1, rows=True)


def _rows_for_attention(cfg: Qwen3Config) -> bool:
  """Whether the attention projections take `_proj`'s rows form: for an MoE
  model on a CPU, whose learner runs Eigen's dots (`moe.learner_compiler_options`),
  which read the rows form's transposed operand in place (4% off its step);
  YNNPACK, the dense learner's library, does not take that operand, and the
  einsum is 2% faster there (bench/README.md, "The fused attention kernel").
  Measured on a CPU only, so other backends keep the einsum."""
  return cfg.is_moe and jax.default_backend() == "cpu"


def _layer(cfg: Qwen3Config, x_BTD, w, positions_BT, act_quant, attend,
           recompute_mlp: bool = False, sparse=None):
  """One decoder layer. `w` holds this layer's weights (already in compute dtype).

  `attend(q, k, v) -> (out, layer_cache)` is the call's attention: over the
  T positions themselves, or through this layer's cache view, which it
  returns with the new K/V written. Returns the new hidden state, that, and
  the MoE block's `(experts_BTk, stats)` (None for a dense MLP).
  `recompute_mlp`: as `Qwen3.__call__`. `sparse`: an MoE layer's
  `(mask_BT, forced_BTk or None)`; None for a dense one.
  """
  x_BTD = shard_rows(x_BTD)
  q_BTNH, k_BTKH, v_BTKH = _attention_in(cfg, w, x_BTD, positions_BT, act_quant)
  attn_BTNH, layer_cache = attend(q_BTNH, k_BTKH, v_BTKH)
  if sparse is not None:
    mask_BT, forced_BTk = sparse
    routed = []

    def mlp(h_BTD, hq_BTD):
      out, experts, stats = moe.moe_block(cfg, h_BTD, hq_BTD, w, act_quant, mask_BT, forced_BTk)
      routed.append((experts, stats))
      return out

    x_BTD = _attention_out(cfg, w, x_BTD, attn_BTNH, act_quant, mlp)
    return shard_rows(x_BTD), layer_cache, routed[0]
  # Under a remat policy the layer is recomputed anyway.
  recompute = recompute_mlp and cfg.remat == "none"
  mlp_in = _gated_mlp_in_recomputed if recompute else _gated_mlp_in
  x_BTD = _attention_out_mlp(cfg, w, x_BTD, attn_BTNH, act_quant, mlp_in)
  return shard_rows(x_BTD), layer_cache, None


def _attention_in(cfg: Qwen3Config, w, x_BTD, positions_BT, act_quant):
  """The layer up to its attention: normed, projected, q/k-normed, rotated q, k, v."""
  h_BTD = rms_norm(x_BTD, w["attn_norm"], cfg.rms_eps)
  hq_BTD = _aq(h_BTD, act_quant)
  rows = _rows_for_attention(cfg)
  q_BTNH = _proj("BTD,DNH->BTNH", h_BTD, hq_BTD, w["q"], 1, rows)
  k_BTKH = _proj("BTD,DKH->BTKH", h_BTD, hq_BTD, w["k"], 1, rows)
  v_BTKH = _proj("BTD,DKH->BTKH", h_BTD, hq_BTD, w["v"], 1, rows)
  q_BTNH = rope(rms_norm(q_BTNH, w["q_norm"], cfg.rms_eps), positions_BT, cfg.rope_theta)
  k_BTKH = rope(rms_norm(k_BTKH, w["k_norm"], cfg.rms_eps), positions_BT, cfg.rope_theta)
  return q_BTNH, k_BTKH, v_BTKH


def _attention_out(cfg: Qwen3Config, w, x_BTD, attn_BTNH, act_quant, mlp):
  """The layer after its attention: output projection, residual, the MLP
  (`mlp(h, h quantized) -> out`), residual."""
  o_BTD = _proj("BTNH,NHD->BTD", attn_BTNH, _aq(attn_BTNH, act_quant), w["o"], 2,
                _rows_for_attention(cfg))
  x_BTD = x_BTD + o_BTD.astype(x_BTD.dtype)

  h_BTD = rms_norm(x_BTD, w["mlp_norm"], cfg.rms_eps)
  hq_BTD = _aq(h_BTD, act_quant)
  return x_BTD + mlp(h_BTD, hq_BTD).astype(x_BTD.dtype)


def _attention_out_mlp(cfg: Qwen3Config, w, x_BTD, attn_BTNH, act_quant, mlp_in):
  """`_attention_out` with the dense SwiGLU MLP (`mlp_in`, then the down projection)."""

  def mlp(h_BTD, hq_BTD):
    act_BTF = mlp_in(h_BTD, hq_BTD, w["gate"], w["up"])
    return _proj_rows(act_BTF, _aq(act_BTF, act_quant), w["down"])

  return _attention_out(cfg, w, x_BTD, attn_BTNH, act_quant, mlp)


def _invariant_layer(cfg: Qwen3Config, x_BTD, w, positions_BT, attend, sparse=None):
  """`_layer` in the true on-policy mode: the same per-token arithmetic, run on
  fixed row tiles (`invariant.map_rows`) so a token's bits do not depend on the
  batch (docs/method.md §7). An MoE layer routes each token on its own and runs
  its experts per (token, slot) (`moe.experts_mlp_per_token`)."""
  b, t, d = x_BTD.shape
  flat = lambda a: a.reshape((b * t,) + a.shape[2:])
  unflat = lambda a: a.reshape((b, t) + a.shape[1:])

  def attention_in(x_tD, pos_t):
    q, k, v = _attention_in(cfg, w, x_tD[None], pos_t[None], None)
    return q[0], k[0], v[0]

  def attention_out_mlp(x_tD, attn_tNH):
    return _attention_out_mlp(cfg, w, x_tD[None], attn_tNH[None], None, _gated_mlp_in)[0]

  q, k, v = invariant.map_rows(attention_in, flat(x_BTD), flat(positions_BT))
  attn_BTNH, layer_cache = attend(unflat(q), unflat(k), unflat(v))
  if sparse is None:
    x_BTD = invariant.map_rows(attention_out_mlp, flat(x_BTD), flat(attn_BTNH))
    return unflat(x_BTD), layer_cache, None
  mask_BT, forced_BTk = sparse
  kk = cfg.num_experts_per_tok
  forced = (jnp.full((b * t, kk), -1, jnp.int32) if forced_BTk is None
            else flat(forced_BTk).astype(jnp.int32))

  def attention_out_moe(x_tD, attn_tNH, forced_tk):
    routed = []

    def mlp(h_tD, _):
      r = moe.route(h_tD[0], w["router"], kk, cfg.norm_topk_prob, forced_tk)
      routed.append(r)
      return moe.experts_mlp_per_token(h_tD[0], r, w)[None]

    x = _attention_out(cfg, w, x_tD[None], attn_tNH[None], None, mlp)[0]
    return x, routed[0].experts, routed[0].probs

  x_MD, experts_Mk, probs_ME = invariant.map_rows(
      attention_out_moe, flat(x_BTD), flat(attn_BTNH), forced)
  mask_M = flat(mask_BT)
  stats = moe.layer_stats(moe.Routing(experts_Mk, None, probs_ME), mask_M)
  experts = jnp.where(mask_M[:, None], experts_Mk, -1)
  return unflat(x_MD), layer_cache, (unflat(experts), stats)


def _gated_mlp_in(h_BTD, hq_BTD, w_gate, w_up):
  """`silu(h W_gate) * (h W_up)`, the SwiGLU MLP up to its down projection."""
  gate_BTF = _proj_rows(h_BTD, hq_BTD, w_gate)
  up_BTF = _proj_rows(h_BTD, hq_BTD, w_up)
  return jax.nn.silu(gate_BTF) * up_BTF


# `_gated_mlp_in`, recomputed in the backward pass: the same math, and on
# XLA:CPU bitwise the same values and gradients (tests/test_models.py).
_gated_mlp_in_recomputed = jax.checkpoint(_gated_mlp_in)


def recompute_mlp_for(platform: str) -> bool:
  """Whether training on `platform` recomputes each layer's MLP input
  projections in the backward pass (`Qwen3.__call__`'s `recompute_mlp`); the
  caller that knows where it runs resolves it (`Learner`, from its mesh).

  Only on XLA:CPU. There the layer scan otherwise saves the projections and
  their sigmoid as `[L, B, T, F]` stacks, and XLA fuses the SiLU gradient's
  math, read from those stacks, into the transposes that feed the weight
  gradients: slow loop fusions (bench/README.md, "RL loop", change 2).
  Elsewhere the recompute would add two matmuls per layer.
  """
  return platform == "cpu"


def remat(body, policy: str):
  """`body` (one layer's scan step) under the remat policy (Qwen3Config.remat).

  `none`: keep every activation for the backward pass; `layer`: keep only the
  layer's input and recompute the layer in the backward pass (least memory);
  `dots`: keep the matmul outputs (no batch dimensions) and recompute the
  rest, the usual speed/memory middle (maxtext's `minimal`).
  """
  if policy == "none":
    return body
  if policy == "layer":
    return jax.checkpoint(body)
  if policy == "dots":
    return jax.checkpoint(
        body, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
  raise ValueError(f"unknown remat policy {policy!r}.")


def _check_routing(cfg: Qwen3Config, routing_BTLk, b: int, t: int):
  """Forced routing `[B, T, L_moe, k]` checked against the model and the batch,
  as `[L_moe, B, T, k]` (the MoE scans' inputs); None stays None."""
  if routing_BTLk is None:
    return None
  if not cfg.is_moe:
    raise ValueError("routing_BTLk (routing replay) was given to a dense model: it has no "
                     "MoE layers (num_experts=0).")
  want = (b, t, len(cfg.moe_layers), cfg.num_experts_per_tok)
  if tuple(routing_BTLk.shape) != want:
    raise ValueError(f"routing_BTLk has shape {tuple(routing_BTLk.shape)}; this batch and "
                     f"model need [B, T, L_moe, k] = {list(want)}.")
  if not jnp.issubdtype(routing_BTLk.dtype, jnp.integer):
    raise ValueError(f"routing_BTLk must hold integer expert ids, got {routing_BTLk.dtype}.")
  return jnp.transpose(routing_BTLk.astype(jnp.int32), (2, 0, 1, 3))


def _normal(rngs, shape, dtype, std=0.02):
  return (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)


ATTENTION_NAMES = ("attn_norm", "q", "k", "v", "o", "q_norm", "k_norm", "mlp_norm")
DENSE_MLP_NAMES = ("gate", "up", "down")
MOE_NAMES = ("router", "experts_gate", "experts_up", "experts_down")


class Layers(nnx.Module):
  """The L decoder layers, weights stacked on a leading layer axis.

  Attention weights and norms are `[L, ...]`; the dense MLPs' `gate`, `up`,
  `down` are stacked over the dense layers only (`cfg.dense_layers`) and the
  MoE blocks' `router [L_moe, D, E]`, `experts_gate / experts_up
  [L_moe, E, D, F]` and `experts_down [L_moe, E, F, D]` over the MoE layers.
  """

  def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs):
    l, d, n, k, h, f = (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                        cfg.head_dim, cfg.intermediate_size)
    pd = cfg.param_dtype
    self.attn_norm = nnx.Param(jnp.ones((l, d), pd))
    self.q = nnx.Param(_normal(rngs, (l, d, n, h), pd))
    self.k = nnx.Param(_normal(rngs, (l, d, k, h), pd))
    self.v = nnx.Param(_normal(rngs, (l, d, k, h), pd))
    self.o = nnx.Param(_normal(rngs, (l, n, h, d), pd))
    self.q_norm = nnx.Param(jnp.ones((l, h), pd))
    self.k_norm = nnx.Param(jnp.ones((l, h), pd))
    self.mlp_norm = nnx.Param(jnp.ones((l, d), pd))
    names = ATTENTION_NAMES
    ld, lm = len(cfg.dense_layers), len(cfg.moe_layers)
    if ld:
      self.gate = nnx.Param(_normal(rngs, (ld, d, f), pd))
      self.up = nnx.Param(_normal(rngs, (ld, d, f), pd))
      self.down = nnx.Param(_normal(rngs, (ld, f, d), pd))
      names += DENSE_MLP_NAMES
    if lm:
      e, fm = cfg.num_experts, cfg.moe_intermediate_size
      self.router = nnx.Param(_normal(rngs, (lm, d, e), pd))
      self.experts_gate = nnx.Param(_normal(rngs, (lm, e, d, fm), pd))
      self.experts_up = nnx.Param(_normal(rngs, (lm, e, d, fm), pd))
      self.experts_down = nnx.Param(_normal(rngs, (lm, e, fm, d), pd))
      names += MOE_NAMES
    self.names = names

  def stacked(self, dtype) -> dict[str, jax.Array]:
    """Weights as a dict of stacked arrays; matmul weights cast to `dtype`, norms kept."""
    out = {}
    for name in self.names:
      value = getattr(self, name)[...]
      keep = name.endswith("norm") or isinstance(value, quantized.QuantizedWeight)
      out[name] = value if keep else value.astype(dtype)
    return out


class Qwen3(nnx.Module):
  """Qwen3 causal LM: `model(tokens[B, T]).logits` is `[B, T, V]` (float32)."""

  def __init__(self, cfg: Qwen3Config, *, rngs: nnx.Rngs):
    self.config = cfg
    pd = cfg.param_dtype
    self.embed = nnx.Param(_normal(rngs, (cfg.vocab_size, cfg.hidden_size), pd))
    self.layers = Layers(cfg, rngs=rngs)
    self.final_norm = nnx.Param(jnp.ones((cfg.hidden_size,), pd))
    if not cfg.tie_embeddings:
      self.lm_head = nnx.Param(_normal(rngs, (cfg.hidden_size, cfg.vocab_size), pd))

  def __call__(self, tokens_BT: jax.Array, *, mask_BT: Optional[jax.Array] = None,
               positions_BT: Optional[jax.Array] = None,
               segment_ids_BT: Optional[jax.Array] = None,
               cache: Optional[KVCache] = None, inference: Inference = Inference(),
               logits: bool = True, recompute_mlp: Optional[bool] = None,
               routing_BTLk: Optional[jax.Array] = None,
               unroll_layers: bool = False) -> Output:
    """Runs the decoder.

    Args:
      tokens_BT: int token ids.
      mask_BT: 1 on real tokens, 0 on padding (padding keys are never attended).
      positions_BT: RoPE positions; default: count of real tokens before each
        position (so left- and right-padded rows both get 0, 1, 2, ...).
      segment_ids_BT: packed rows: the segment of each token; a token attends
        only to earlier tokens of its own segment (give per-segment
        `positions_BT` too). Not with a cache.
      cache: if given, row b's real tokens (`mask_BT`; they come first: right
        padding) are written at `cache.index[b] ..` and attend the row's
        earlier slots, and the row's length advances by their count.
      inference: the sampler's settings (`Inference`).
      logits: False: no `[B, T, V]` logits (the learner's chunked log-probs
        and the sampler's prefill take the hidden state).
      recompute_mlp: the backward pass recomputes each layer's gate and up
        projections and SwiGLU instead of saving them, without a remat policy:
        the same math (dense layers). None: the default backend's choice
        (`recompute_mlp_for`), so a bare call under `jax.grad` is as fast as
        the learner's.
      routing_BTLk: MoE models: int `[B, T, L_moe, k]` expert ids to route each
        token to (routing replay, docs/method.md §7a; a position with an id < 0
        keeps its own routing); None routes by the live router.
      unroll_layers: the layer scans run unrolled, one copy of each layer in the
        program: no while loop and no `[L, ...]` stacked residuals for the backward
        pass; the same math. Not with a cache (`moe.learner_unroll_layers` says
        where the learner takes it).
    """
    cfg = self.config
    b, t = tokens_BT.shape
    if unroll_layers and cache is not None:
      raise ValueError("unroll_layers is for calls without a KV cache (training, scoring).")
    unroll = True if unroll_layers else 1
    if recompute_mlp is None:
      recompute_mlp = cache is None and recompute_mlp_for(jax.default_backend())
    if mask_BT is None:
      mask_BT = jnp.ones((b, t), bool)
    mask_BT = mask_BT.astype(bool)
    if segment_ids_BT is not None and cache is not None:
      raise ValueError("segment_ids_BT (packed rows) cannot be used with a KV cache.")
    if positions_BT is None:
      positions_BT = jnp.maximum(jnp.cumsum(mask_BT, axis=1) - 1, 0)
      if cache is not None:  # a row's cache is its first `index` tokens
        positions_BT = positions_BT + cache.index[:, None]

    embed_VD = self.embed[...]
    if isinstance(embed_VD, quantized.QuantizedWeight):  # the quantized tied LM head
      x_BTD = quantized.lookup(embed_VD, tokens_BT, cfg.dtype)
    else:
      x_BTD = jnp.take(embed_VD, tokens_BT, axis=0).astype(cfg.dtype)
    weights = self.layers.stacked(cfg.dtype)
    act_quant = inference.act_quant
    routing_LBTk = _check_routing(cfg, routing_BTLk, b, t)

    if inference.invariant:
      if act_quant is not None or (cache is not None and inference.decode.name != "invariant"):
        raise ValueError("the batch-invariant forward takes no activation quantizer, and "
                         "over a cache the 'invariant' decode attention.")
      weights = invariant.replicated(weights)
      run_layer = lambda x, w, attend, sparse=None: _invariant_layer(
          cfg, x, w, positions_BT, attend, sparse)
    else:
      run_layer = lambda x, w, attend, sparse=None: _layer(
          cfg, x, w, positions_BT, act_quant, attend, recompute_mlp, sparse)

    if cfg.is_moe:
      return self._call_runs(tokens_BT, x_BTD, weights, run_layer, mask_BT, positions_BT,
                             segment_ids_BT, cache, inference, logits, routing_LBTk, unroll)

    if cache is None:
      attn_mask = attention.row_mask(mask_BT, segment_ids_BT)

      def attend(q, k, v):
        if inference.invariant:  # packed segments: per-segment positions suffice
          return invariant.attend_rows(q, k, v, positions_BT), None
        return attention.attend(
            q, k, v, attn_mask, implementation=cfg.attention, block_q=cfg.attention_block,
            block_k=cfg.attention_block, prefix_rows=segment_ids_BT is None), None

      def body(x, w):
        return run_layer(x, w, attend)[0], None

      x_BTD, _ = jax.lax.scan(remat(body, cfg.remat), x_BTD, weights, unroll=unroll)
      new_cache = None
    else:
      # The pools hold every layer's pages (kv_cache.py): a layer writes its T
      # new entries (one scatter, in place) and reads its pages through page
      # ids offset by `layer * P`; no layer is sliced out of the pools.
      index_B = cache.index.astype(jnp.int32)
      q_slot_BT = index_B[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
      per_layer = cache.pages_per_layer(cfg.num_layers, inference.decode.pool_parts)

      def body(carry, xs):
        x, pools = carry
        w, layer = xs
        view = kv_cache.LayerCache(*pools, cache.pages + layer * per_layer, q_slot_BT)

        def attend(q, k, v):
          new = view.append(k, v, mask_BT, inference.kv_round)
          return attention.decode(q, new, inference.decode, cfg.dtype), new

        x, view, _ = run_layer(x, w, attend)
        return (x, (view.k, view.v, view.k_scale, view.v_scale)), None

      pools = (cache.k, cache.v, cache.k_scale, cache.v_scale)
      (x_BTD, (k, v, k_s, v_s)), _ = jax.lax.scan(
          body, (x_BTD, pools), (weights, jnp.arange(cfg.num_layers)))
      new_cache = KVCache(k=k, v=v, k_scale=k_s, v_scale=v_s, pages=cache.pages,
                          index=index_B + jnp.sum(mask_BT, axis=1, dtype=jnp.int32))

    return self._head(x_BTD, new_cache, inference, logits)

  def _head(self, x_BTD, new_cache, inference: Inference, logits: bool, routing=None,
            moe_stats=None) -> Output:
    """Final norm and (optionally) the LM head."""
    cfg = self.config
    if inference.invariant:
      b, t, d = x_BTD.shape
      h_BTD = invariant.map_rows(
          lambda x_tD: rms_norm(x_tD, self.final_norm[...], cfg.rms_eps),
          x_BTD.reshape(b * t, d)).reshape(b, t, d)
    else:
      h_BTD = rms_norm(x_BTD, self.final_norm[...], cfg.rms_eps)
    logits_BTV = None
    if logits:
      act_quant = inference.act_quant
      logits_BTV = self.logits(h_BTD, act_quant if inference.quant_lm_head else None)
    return Output(logits=logits_BTV, cache=new_cache, hidden=h_BTD, routing=routing,
                  moe_stats=moe_stats)

  def _call_runs(self, tokens_BT, x_BTD, weights, run_layer, mask_BT, positions_BT,
                 segment_ids_BT, cache, inference, logits, routing_LBTk, unroll) -> Output:
    """`__call__` of a model with MoE layers: one scan per run of layers of a kind
    (`Qwen3Config.layer_runs`), each over its slice of the attention weights and
    its kind's stacked MLP weights; the MoE runs return their routing as the
    scan's outputs and read forced routing (replay) as its inputs."""
    cfg = self.config
    t = tokens_BT.shape[1]
    attn_w = {n: weights[n] for n in ATTENTION_NAMES}
    kind_names = {False: DENSE_MLP_NAMES, True: MOE_NAMES}
    kind_pos = {False: 0, True: 0}
    if cache is None:
      attn_mask = attention.row_mask(mask_BT, segment_ids_BT)

      def attend_fn(layer):
        del layer

        def attend(q, k, v):
          if inference.invariant:
            return invariant.attend_rows(q, k, v, positions_BT), None
          return attention.attend(
              q, k, v, attn_mask, implementation=cfg.attention, block_q=cfg.attention_block,
              block_k=cfg.attention_block, prefix_rows=segment_ids_BT is None), None
        return attend
    else:
      index_B = cache.index.astype(jnp.int32)
      q_slot_BT = index_B[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
      per_layer = cache.pages_per_layer(cfg.num_layers, inference.decode.pool_parts)
    pools = None if cache is None else (cache.k, cache.v, cache.k_scale, cache.v_scale)
    routed, stats = [], []
    for start, stop, is_moe in cfg.layer_runs():
      p0 = kind_pos[is_moe]
      kind_pos[is_moe] += stop - start
      w_run = {n: jax.tree.map(lambda a: a[start:stop], w) for n, w in attn_w.items()}
      w_run.update({n: jax.tree.map(lambda a, p0=p0, n_=stop - start: a[p0:p0 + n_], weights[n])
                    for n in kind_names[is_moe]})
      forced = None if routing_LBTk is None or not is_moe else routing_LBTk[p0:p0 + stop - start]

      def body(carry, xs, is_moe=is_moe):
        x, pools = carry
        w, layer, forced_BTk = xs
        if pools is None:
          attend, view = attend_fn(layer), None
        else:
          view = kv_cache.LayerCache(*pools, cache.pages + layer * per_layer, q_slot_BT)

          def attend(q, k, v):
            new = view.append(k, v, mask_BT, inference.kv_round)
            return attention.decode(q, new, inference.decode, cfg.dtype), new
        sparse = (mask_BT, forced_BTk) if is_moe else None
        x, new_view, out = run_layer(x, w, attend, sparse)
        if pools is not None:
          pools = (new_view.k, new_view.v, new_view.k_scale, new_view.v_scale)
        return (x, pools), out

      if cache is None:
        body = remat(body, cfg.remat)
      (x_BTD, pools), out = jax.lax.scan(
          body, (x_BTD, pools), (w_run, jnp.arange(start, stop), forced), unroll=unroll)
      if is_moe:
        routed.append(out[0])
        stats.append(out[1])
    new_cache = None
    if cache is not None:
      k, v, k_s, v_s = pools
      new_cache = KVCache(k=k, v=v, k_scale=k_s, v_scale=v_s, pages=cache.pages,
                          index=index_B + jnp.sum(mask_BT, axis=1, dtype=jnp.int32))
    routing = jnp.transpose(jnp.concatenate(routed, axis=0), (1, 2, 0, 3))
    moe_stats = jax.tree.map(lambda *a: jnp.concatenate(a, axis=0), *stats)
    return self._head(x_BTD, new_cache, inference, logits, routing, moe_stats)

  def logits(self, h_BTD, act_quant: ActQuant = None):
    """LM head: float32 logits from the final normalised hidden state."""
    h_BTD = shard_rows(h_BTD)
    head = self.embed[...] if self.config.tie_embeddings else self.lm_head[...]
    if isinstance(head, quantized.QuantizedWeight):  # [V, D]: native low-precision dot
      return quantized.project(h_BTD, head, 1, out_dtype=jnp.float32)
    h_BTD = _aq(h_BTD, act_quant)
    if self.config.tie_embeddings:
      w_VD = self.embed[...].astype(self.config.dtype)
      return jnp.einsum("BTD,VD->BTV", h_BTD, w_VD, preferred_element_type=jnp.float32)
    w_DV = self.lm_head[...].astype(self.config.dtype)
    return jnp.einsum("BTD,DV->BTV", h_BTD, w_DV, preferred_element_type=jnp.float32)
