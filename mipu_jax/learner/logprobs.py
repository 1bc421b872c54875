"""Learner log-probs of sampled tokens: `lp` inside the loss, `lp_old` recompute.

The learner must score the distribution the sampler drew from (docs/method.md §0):
the same temperature, and, when top-k / top-p truncation is on, the truncated
and renormalised distribution (`mipu_jax.sampler.truncated_logprobs`). In the
true on-policy mode both `lp` and `lp_old` are the sampler's arithmetic
(`mipu_jax.models.invariant`), bitwise its `lp_mu` (docs/method.md §7).
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from mipu_jax import models
from mipu_jax.learner import packing
from mipu_jax.models import invariant
from mipu_jax.models import moe
from mipu_jax.models import qwen3
from mipu_jax.sampler import sampling


@dataclasses.dataclass(frozen=True)
class Scoring:
  """The sampled distribution the learner scores (hashable, static under jit).

  Attributes:
    temperature: the sampler's temperature.
    top_k: 0 for off.
    top_p: 1.0 for off.
    true_on_policy: score with the sampler's batch-invariant forward
      (`invariant_logprobs`; docs/method.md §7).
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  true_on_policy: bool = False

  def __post_init__(self):
    if self.true_on_policy and self.truncates:
      raise ValueError("true_on_policy scores the full distribution: no top-k / top-p "
                       "(docs/method.md §7).")

  @property
  def truncates(self) -> bool:
    return self.top_k > 0 or self.top_p < 1.0


def policy_logprobs(model, tokens_BT: jax.Array, mask_BT: jax.Array,
                    scoring: Scoring, *, with_entropy: bool = False,
                    entropy_grad: bool = False, logits_chunk: int = 0,
                    segment_ids_BT: jax.Array | None = None,
                    positions_BT: jax.Array | None = None, recompute_mlp: bool | None = None,
                    routing_BTLk: jax.Array | None = None, with_routing: bool = False,
                    with_aux: bool = False, unroll_layers: bool = False):
  """`lp[:, t] = log π(tokens[t] | tokens[:t])` (0 at t = 0), and the entropy.

  Args:
    model: a `Qwen3`.
    tokens_BT: int token ids.
    mask_BT: 1 on real tokens.
    scoring: temperature and truncation of the sampled distribution.
    with_entropy: also return the per-token entropy of the tempered
      (untruncated) distribution.
    entropy_grad: differentiate through the entropy (an entropy bonus);
      otherwise it is a logged metric computed on stop-gradient logits, which
      keeps it out of the backward pass.
    logits_chunk: > 0: log-probs and entropy from the LM head chunk by chunk
      of this many positions, never holding `[B, T, V]` logits
      (`models.chunked_token_logprobs`); 0: the dense logits. Truncated
      scoring (top-k / top-p) needs the full distribution and uses the dense
      path.
    segment_ids_BT: packed rows: each token's segment (a position's log-prob
      is meaningful only within its segment; the loss mask drops the rest).
    positions_BT: packed rows: RoPE positions restarting in each segment.
    recompute_mlp: the model's backward pass recomputes each layer's MLP input
      (`Qwen3.__call__`; None: the default backend's choice; the learner's step
      resolves it for its mesh's platform).
    routing_BTLk: MoE routing replay: the experts to route each token to
      (`Qwen3.__call__`, docs/method.md §7a); None: the live router's.
    with_routing: also return the forward's routing (`Output.routing`: the
      experts each token went to, int32 `[B, T, L_moe, k]`; None when dense).
    with_aux: also return the MoE load-balancing loss of the forward
      (`moe.load_balancing_loss`, differentiable; 0 when dense). Not in the
      true on-policy mode (its forward is not the differentiated one).
    unroll_layers: the model's layer scans run unrolled (`Qwen3.__call__`; the
      learner's step resolves it: `moe.learner_unroll_layers`).

  Returns:
    float32 `[B, T]` log-probs, or `(log-probs, entropy)`; with `with_routing`,
    `(that, routing)`; with `with_aux`, `(that, aux loss)`.
  """
  if with_aux and (with_routing or scoring.true_on_policy):
    raise ValueError("with_aux takes neither with_routing nor the true on-policy mode.")
  if scoring.true_on_policy:
    lp, ent, routing = invariant_logprobs(
        model, tokens_BT, mask_BT, scoring, entropy_grad=entropy_grad,
        logits_chunk=logits_chunk, segment_ids_BT=segment_ids_BT, positions_BT=positions_BT,
        recompute_mlp=recompute_mlp, routing_BTLk=routing_BTLk, unroll_layers=unroll_layers)
    out = (lp, ent) if with_entropy else lp
    return (out, routing) if with_routing else out
  # U: the T - 1 positions that have a next token (targets shifted by one).
  targets_BU = tokens_BT[:, 1:]
  kwargs = dict(mask_BT=mask_BT, segment_ids_BT=segment_ids_BT,
                positions_BT=positions_BT, recompute_mlp=recompute_mlp,
                unroll_layers=unroll_layers)
  if routing_BTLk is not None:  # a dense model's call keeps its own signature
    kwargs["routing_BTLk"] = routing_BTLk
  if logits_chunk and not scoring.truncates:
    fwd = model(tokens_BT, logits=False, **kwargs)
    h_BUD = fwd.hidden[:, :-1]
    out = models.chunked_token_logprobs(
        model, h_BUD, targets_BU, scoring.temperature, chunk=logits_chunk,
        with_entropy=with_entropy, entropy_grad=entropy_grad)
    lp_BU, ent_BU = out if with_entropy else (out, None)
  else:
    fwd = model(tokens_BT, **kwargs)
    logits_BUV = fwd.logits[:, :-1]
    if scoring.truncates:
      lp_BU = sampling.truncated_logprobs(logits_BUV, targets_BU,
                                          scoring.temperature, scoring.top_k,
                                          scoring.top_p)
    else:
      lp_BU = models.token_logprobs(logits_BUV, targets_BU, scoring.temperature)
    ent_BU = None
    if with_entropy:
      if not entropy_grad:
        logits_BUV = jax.lax.stop_gradient(logits_BUV)
      ent_BU = models.entropy(logits_BUV, scoring.temperature)
  lp_BT = jnp.pad(lp_BU, ((0, 0), (1, 0)))
  out = lp_BT if not with_entropy else (lp_BT, jnp.pad(ent_BU, ((0, 0), (1, 0))))
  if with_aux:
    aux = (jnp.zeros([], jnp.float32) if fwd.moe_stats is None
           else moe.load_balancing_loss(fwd.moe_stats))
    return out, aux
  return (out, fwd.routing) if with_routing else out


def invariant_logprobs(model, tokens_BT: jax.Array, mask_BT: jax.Array, scoring: Scoring,
                       *, entropy_grad: bool = False, logits_chunk: int = 0,
                       segment_ids_BT: jax.Array | None = None,
                       positions_BT: jax.Array | None = None, recompute_mlp: bool | None = None,
                       routing_BTLk: jax.Array | None = None, unroll_layers: bool = False):
  """`(log-probs, entropy, routing)` as `policy_logprobs`, from the batch-invariant
  forward the sampler runs in the true on-policy mode (docs/method.md §7); the
  routing is None for a dense model.

  The values are that forward's, bitwise the sampler's `lp_mu` at the same
  weights; the gradient is the standard forward's (`policy_logprobs` with the
  mode off, recomputed in the backward pass as under remat): the same function,
  differentiable, where the invariant one loops over data-dependent key
  blocks. On a mesh each device runs the forward on its own rows with the
  whole weights (`invariant.per_row_shard`): a contraction split over devices
  would sum in another order.
  """
  graphdef, state = nnx.split(model)
  mask_BT = mask_BT.astype(bool)
  if positions_BT is None:  # `Qwen3`'s default: real tokens before each position
    positions_BT = jnp.maximum(jnp.cumsum(mask_BT, axis=1) - 1, 0)
  standard = dataclasses.replace(scoring, true_on_policy=False)

  def local(state, tokens_BT, mask_BT, positions_BT, routing_BTLk):
    model = nnx.merge(graphdef, state)
    b, t = tokens_BT.shape
    out = model(tokens_BT, mask_BT=mask_BT, positions_BT=positions_BT,
                inference=qwen3.Inference(invariant=True), logits=False,
                **({} if routing_BTLk is None else {"routing_BTLk": routing_BTLk}))
    h_BTD = out.hidden
    m = b * (t - 1)
    _, lp_M, ent_M = invariant.head_logprobs(
        model.logits, h_BTD[:, :-1].reshape(m, -1),
        jnp.full((m,), scoring.temperature, jnp.float32), tokens_BT[:, 1:].reshape(m))
    pad = lambda x_M: jnp.pad(x_M.reshape(b, t - 1), ((0, 0), (1, 0)))
    return pad(lp_M), pad(ent_M), out.routing

  def forward(state, tokens_BT, mask_BT, positions_BT, routing_BTLk):
    if routing_BTLk is None:
      return invariant.per_row_shard(
          lambda s, *rows: local(s, *rows, None), state, tokens_BT, mask_BT, positions_BT)
    return invariant.per_row_shard(local, state, tokens_BT, mask_BT, positions_BT,
                                   routing_BTLk)

  def reference(state, tokens_BT, mask_BT, segment_ids_BT, positions_BT, routing_BTLk):
    return policy_logprobs(nnx.merge(graphdef, state), tokens_BT, mask_BT, standard,
                           with_entropy=True, entropy_grad=entropy_grad,
                           logits_chunk=logits_chunk, segment_ids_BT=segment_ids_BT,
                           positions_BT=positions_BT, recompute_mlp=recompute_mlp,
                           routing_BTLk=routing_BTLk, unroll_layers=unroll_layers)

  @jax.custom_vjp
  def scored(state, tokens_BT, mask_BT, segment_ids_BT, positions_BT, routing_BTLk):
    del segment_ids_BT  # a packed segment is contiguous: its positions suffice
    return forward(state, tokens_BT, mask_BT, positions_BT, routing_BTLk)

  def scored_fwd(state, tokens_BT, mask_BT, segment_ids_BT, positions_BT, routing_BTLk):
    out = forward(state, tokens_BT, mask_BT, positions_BT, routing_BTLk)
    return out, (state, tokens_BT, mask_BT, segment_ids_BT, positions_BT, routing_BTLk)

  def scored_bwd(residuals, cotangents):
    state, *rest = residuals
    _, vjp = jax.vjp(lambda s: reference(s, *rest), state)
    return (vjp(cotangents[:2])[0], None, None, None, None, None)  # routing: no gradient

  scored.defvjp(scored_fwd, scored_bwd)
  return scored(state, tokens_BT, mask_BT, segment_ids_BT, positions_BT, routing_BTLk)


def chunked_logprobs(graphdef: nnx.GraphDef, params: Any, tokens_BT: jax.Array,
                     mask_BT: jax.Array, scoring: Scoring,
                     num_chunks: int, logits_chunk: int = 0,
                     routing_BTLk: jax.Array | None = None, with_routing: bool = False):
  """`policy_logprobs` over `num_chunks` row chunks (bounded activation memory).

  Pure; `lp_old` is a `stop_gradient` quantity (docs/method.md §0).
  `routing_BTLk` / `with_routing`: as `policy_logprobs` (MoE routing replay;
  the routing out is the forward's, `[B, T, L_moe, k]`).
  """
  model = nnx.merge(graphdef, params)
  b, l = tokens_BT.shape
  chunks = lambda x: x.reshape((num_chunks, b // num_chunks) + x.shape[1:])
  xs = (chunks(tokens_BT), chunks(mask_BT),
        None if routing_BTLk is None else chunks(routing_BTLk))
  out = jax.lax.map(
      lambda x: policy_logprobs(model, x[0], x[1], scoring, logits_chunk=logits_chunk,
                                routing_BTLk=x[2], with_routing=with_routing), xs)
  unchunk = lambda x: x.reshape((b,) + x.shape[2:])
  if with_routing:
    return jax.lax.stop_gradient(unchunk(out[0])), unchunk(out[1])
  return jax.lax.stop_gradient(unchunk(out))


def packed_logprobs(graphdef: nnx.GraphDef, params: Any, tokens_BT: jax.Array,
                    pack: packing.PackPlan, scoring: Scoring, rows_per_chunk: int,
                    logits_chunk: int = 0, routing_BTLk: jax.Array | None = None,
                    with_routing: bool = False):
  """`chunked_logprobs` on packed rows, scattered back to `[B, T]`.

  A segment's first token has no log-prob (0, as unpacked at t = 0): its
  preceding position belongs to the previous segment.
  """
  model = nnx.merge(graphdef, params)
  r, p = pack.src_RP.shape
  tokens_RP = packing.gather(tokens_BT, pack.src_RP)
  mask_RP = (pack.src_RP >= 0).astype(jnp.float32)
  routing_RP = (None if routing_BTLk is None
                else packing.gather(routing_BTLk, pack.src_RP, fill=-1))
  c = r // rows_per_chunk
  chunks = lambda x: x.reshape((c, rows_per_chunk) + x.shape[1:])
  xs = tuple(None if x is None else chunks(x) for x in
             (tokens_RP, mask_RP, pack.segment_ids_RP, pack.positions_RP, routing_RP))
  out = jax.lax.map(
      lambda x: policy_logprobs(model, x[0], x[1], scoring, logits_chunk=logits_chunk,
                                segment_ids_BT=x[2], positions_BT=x[3], routing_BTLk=x[4],
                                with_routing=with_routing), xs)
  lp_CRP = out[0] if with_routing else out
  lp_RP = jnp.where(pack.positions_RP > 0, lp_CRP.reshape(r, p), 0.0)
  lp_BT = jax.lax.stop_gradient(packing.scatter(lp_RP, pack.src_RP, tokens_BT.shape))
  if not with_routing:
    return lp_BT
  routing = out[1].reshape((r, p) + out[1].shape[3:])
  return lp_BT, packing.scatter(routing, pack.src_RP, tokens_BT.shape, fill=-1)
