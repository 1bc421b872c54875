"""Per-token log-probs of given tokens, shared by the learner and the sampler's tests."""

import jax
import jax.numpy as jnp


def token_logprobs(logits_BTV: jax.Array, targets_BT: jax.Array, temperature: float = 1.0):
  """log softmax(logits / temperature)[targets], float32, `[B, T]`.

  Temperature is applied on the learner side too, so that the ratio compares
  the same distribution the sampler drew from (SPEC.md §0).
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
                      temperature: float = 1.0, *, with_entropy: bool = False):
  """Log-prob of every token given its prefix, aligned with `tokens_BT`.

  `out[:, t] = log p(tokens[:, t] | tokens[:, :t])` for t >= 1; `out[:, 0] = 0`
  (the first token has no prefix). Padding may be on either side; `mask_BT`
  marks real tokens.
  """
  logits_BTV = model(tokens_BT, mask_BT=mask_BT)[:, :-1]
  lp_BT = token_logprobs(logits_BTV, tokens_BT[:, 1:], temperature)
  lp_BT = jnp.pad(lp_BT, ((0, 0), (1, 0)))
  if not with_entropy:
    return lp_BT
  ent_BT = jnp.pad(entropy(logits_BTV, temperature), ((0, 0), (1, 0)))
  return lp_BT, ent_BT
