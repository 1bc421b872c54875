"""Learner log-probs of sampled tokens: `lp` inside the loss, `lp_old` recompute.

The learner must score the distribution the sampler drew from (docs/method.md §0):
the same temperature, and, when top-k / top-p truncation is on, the truncated
and renormalised distribution (`mipu_jax.sampler.truncated_logprobs`).
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from mipu_jax import models
from mipu_jax.sampler import sampling


@dataclasses.dataclass(frozen=True)
class Scoring:
  """The sampled distribution the learner scores (hashable, static under jit).

  Attributes:
    temperature: the sampler's temperature.
    top_k: 0 for off.
    top_p: 1.0 for off.
  """
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  @property
  def truncates(self) -> bool:
    return self.top_k > 0 or self.top_p < 1.0


def policy_logprobs(model, tokens_BL: jax.Array, mask_BL: jax.Array,
                    scoring: Scoring, *, with_entropy: bool = False,
                    entropy_grad: bool = False, logits_chunk: int = 0,
                    segment_ids_BL: jax.Array | None = None,
                    positions_BL: jax.Array | None = None):
  """`lp[:, t] = log π(tokens[t] | tokens[:t])` (0 at t = 0), and the entropy.

  Args:
    model: a `Qwen3`.
    tokens_BL: int token ids.
    mask_BL: 1 on real tokens.
    scoring: temperature and truncation of the sampled distribution.
    with_entropy: also return the per-token entropy of the tempered
      (untruncated) distribution.
    entropy_grad: differentiate through the entropy (an entropy bonus);
      otherwise it is a logged metric computed on stop-gradient logits, which
      keeps it out of the backward pass.
    logits_chunk: > 0: log-probs and entropy from the LM head chunk by chunk
      of this many positions, never holding `[B, L, V]` logits
      (`models.chunked_token_logprobs`); 0: the dense logits. Truncated
      scoring (top-k / top-p) needs the full distribution and uses the dense
      path.
    segment_ids_BL: packed rows: each token's segment (a position's log-prob
      is meaningful only within its segment; the loss mask drops the rest).
    positions_BL: packed rows: RoPE positions restarting in each segment.

  Returns:
    float32 `[B, L]` log-probs, or `(log-probs, entropy)`.
  """
  targets_BT = tokens_BL[:, 1:]
  kwargs = dict(mask_BT=mask_BL, segment_ids_BT=segment_ids_BL,
                positions_BT=positions_BL)
  if logits_chunk and not scoring.truncates:
    h_BTD = model(tokens_BL, compute_logits=False, **kwargs)[:, :-1]
    out = models.chunked_token_logprobs(
        model, h_BTD, targets_BT, scoring.temperature, chunk=logits_chunk,
        with_entropy=with_entropy, entropy_grad=entropy_grad)
    lp_BT, ent_BT = out if with_entropy else (out, None)
  else:
    logits_BTV = model(tokens_BL, **kwargs)[:, :-1]
    if scoring.truncates:
      lp_BT = sampling.truncated_logprobs(logits_BTV, targets_BT,
                                          scoring.temperature, scoring.top_k,
                                          scoring.top_p)
    else:
      lp_BT = models.token_logprobs(logits_BTV, targets_BT, scoring.temperature)
    ent_BT = None
    if with_entropy:
      if not entropy_grad:
        logits_BTV = jax.lax.stop_gradient(logits_BTV)
      ent_BT = models.entropy(logits_BTV, scoring.temperature)
  lp_BL = jnp.pad(lp_BT, ((0, 0), (1, 0)))
  if not with_entropy:
    return lp_BL
  return lp_BL, jnp.pad(ent_BT, ((0, 0), (1, 0)))


def chunked_logprobs(graphdef: nnx.GraphDef, params: Any, tokens_BL: jax.Array,
                     mask_BL: jax.Array, scoring: Scoring,
                     num_chunks: int, logits_chunk: int = 0) -> jax.Array:
  """`policy_logprobs` over `num_chunks` row chunks (bounded activation memory).

  Pure; `lp_old` is a `stop_gradient` quantity (docs/method.md §0).
  """
  model = nnx.merge(graphdef, params)
  b, l = tokens_BL.shape
  xs = (tokens_BL.reshape(num_chunks, b // num_chunks, l),
        mask_BL.reshape(num_chunks, b // num_chunks, l))
  lp_CbL = jax.lax.map(
      lambda x: policy_logprobs(model, x[0], x[1], scoring,
                                logits_chunk=logits_chunk), xs)
  return jax.lax.stop_gradient(lp_CbL.reshape(b, l))
