"""Per-token log-probs of given tokens, shared by the learner and the sampler's tests."""

import jax
import jax.numpy as jnp


def token_logprobs(logits_BTV: jax.Array, targets_BT: jax.Array, temperature: float = 1.0):
  """log softmax(logits / temperature)[targets], float32, `[B, T]`.

  Temperature is applied on the learner side too, so that the ratio compares
  the same distribution the sampler drew from (docs/method.md §0).
  """
  logits_BTV = logits_BTV.astype(jnp.float32) / temperature
  logz_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
  picked_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
  return picked_BT - logz_BT


def entropy(logits_BTV: jax.Array, temperature: float = 1.0):
  """Entropy of softmax(logits / temperature), float32, `[B, T]`."""
  logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32) / temperature, axis=-1)
  return -jnp.sum(jnp.exp(logp_BTV) * logp_BTV, axis=-1)


def sequence_logprobs(model, tokens_BT: jax.Array, mask_BT: jax.Array,
                      temperature: float = 1.0, *, with_entropy: bool = False,
                      recompute_mlp: bool | None = None):
  """Log-prob of every token given its prefix, aligned with `tokens_BT`.

  `out[:, t] = log p(tokens[:, t] | tokens[:, :t])` for t >= 1; `out[:, 0] = 0`
  (the first token has no prefix). Padding may be on either side; `mask_BT`
  marks real tokens. `recompute_mlp`: as `Qwen3.__call__`.
  """
  logits_BTV = model(tokens_BT, mask_BT=mask_BT, recompute_mlp=recompute_mlp).logits[:, :-1]
  lp_BT = token_logprobs(logits_BTV, tokens_BT[:, 1:], temperature)
  lp_BT = jnp.pad(lp_BT, ((0, 0), (1, 0)))
  if not with_entropy:
    return lp_BT
  ent_BT = jnp.pad(entropy(logits_BTV, temperature), ((0, 0), (1, 0)))
  return lp_BT, ent_BT


def chunked_token_logprobs(model, h_BTD: jax.Array, targets_BT: jax.Array,
                           temperature: float = 1.0, *, chunk: int = 1024,
                           with_entropy: bool = False, entropy_grad: bool = False):
  """`token_logprobs` (and `entropy`) of the LM head's logits, chunk by chunk.

  The `[B, T, V]` logits never exist at once: per chunk of `chunk` positions
  the head's logits are formed, reduced to the log-sum-exp, the picked logit
  (and the entropy), and dropped; the backward pass recomputes them per chunk
  (`jax.checkpoint`). With V = 151,936 this is the difference between ~5 GiB
  of fp32 logits per 9k-token row and `chunk / T` of it.

  Args:
    model: a `Qwen3` (its `logits` method is the LM head).
    h_BTD: the final normalised hidden states of the positions that predict.
    targets_BT: the predicted token of each position.
    temperature: as `token_logprobs`.
    chunk: positions per chunk (T is padded to a multiple).
    with_entropy: also return the entropy per position.
    entropy_grad: differentiate through the entropy (otherwise it is computed
      from stop-gradient logits, a logged metric).

  Returns:
    float32 `[B, T]` log-probs, or `(log-probs, entropy)`.
  """
  b, t, d = h_BTD.shape
  c = min(chunk, t)
  pad = -t % c
  h_NBCD = jnp.pad(h_BTD, ((0, 0), (0, pad), (0, 0))).reshape(b, -1, c, d).swapaxes(0, 1)
  y_NBC = jnp.pad(targets_BT, ((0, 0), (0, pad))).reshape(b, -1, c).swapaxes(0, 1)

  @jax.checkpoint
  def one(h_BCD, y_BC):
    logits_BCV = model.logits(h_BCD)
    lp_BC = token_logprobs(logits_BCV, y_BC, temperature)
    if not with_entropy:
      return lp_BC, jnp.zeros_like(lp_BC)
    if not entropy_grad:
      logits_BCV = jax.lax.stop_gradient(logits_BCV)
    return lp_BC, entropy(logits_BCV, temperature)

  lp_NBC, ent_NBC = jax.lax.map(lambda xs: one(*xs), (h_NBCD, y_NBC))
  unchunk = lambda x: x.swapaxes(0, 1).reshape(b, -1)[:, :t]
  if not with_entropy:
    return unchunk(lp_NBC)
  return unchunk(lp_NBC), unchunk(ent_NBC)
