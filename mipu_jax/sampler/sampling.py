"""Token sampling that returns the log-prob of the distribution it drew from (docs/method.md §0).

`lp_mu` is the denominator of every importance weight (docs/method.md §3), so it must be
log μ(token) of exactly the distribution the token was drawn from:

- temperature `t > 0`: `softmax(logits / t)`;
- top-k / top-p: the truncated distribution, renormalised: `log_softmax(masked logits / t)`.
  The learner must compute `lp_old` of the same truncation (`truncated_logprobs`, on its own
  logits), else `lp_old - lp_mu` measures the truncation, not the mismatch; even then the PPO
  ratio is of truncated policies, which is biased (docs/method.md §0: warn);
- greedy (`t == 0`): a point mass, whose log-prob (0) carries no information, so the log-prob
  returned is the `t = 1` distribution's (truncated if top-k/p are set). Greedy is for evaluation.

Truncation order (as Hugging Face `generate`): temperature, top-k, then top-p on the
renormalised top-k distribution. Ties at the threshold are kept (top-k may keep more than k
tokens); top-p keeps the smallest sorted prefix whose mass reaches `top_p` (at least one token).
`top_k = 0` and `top_p >= 1` switch each off. The knobs are per-row traced arrays (changing them
never recompiles); a `lax.cond` skips the vocabulary sort when no row truncates, and static
`truncation=False` leaves truncation out of the program where no row uses it.

Shape letters: B rows, V vocab.
"""

import jax
import jax.numpy as jnp

_NEG_INF = -jnp.inf


def truncate_logits(scaled_BV: jax.Array, top_k_B: jax.Array, top_p_B: jax.Array) -> jax.Array:
  """Sets logits outside the top-k ∩ top-p set to -inf (temperature already applied)."""
  v = scaled_BV.shape[-1]
  sorted_BV = -jnp.sort(-scaled_BV, axis=-1)  # descending
  k_B = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, v), v)
  in_k_BV = jnp.arange(v)[None, :] < k_B[:, None]
  probs_BV = jax.nn.softmax(jnp.where(in_k_BV, sorted_BV, _NEG_INF), axis=-1)
  mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
  keep_BV = in_k_BV & ((mass_before_BV < top_p_B[:, None]) | (top_p_B[:, None] >= 1.0))
  n_keep_B = jnp.maximum(jnp.sum(keep_BV, axis=-1), 1)
  threshold_B = jnp.take_along_axis(sorted_BV, (n_keep_B - 1)[:, None], axis=-1)[:, 0]
  return jnp.where(scaled_BV >= threshold_B[:, None], scaled_BV, _NEG_INF)


def sampling_logits(logits_BV: jax.Array, temperature_B: jax.Array, top_k_B: jax.Array,
                    top_p_B: jax.Array, truncation: bool = True) -> jax.Array:
  """float32 logits of the distribution sampled from (greedy rows use t = 1); static
  `truncation=False` leaves top-k / top-p out (it compiles faster) where no row truncates."""
  t_B = jnp.where(temperature_B > 0, temperature_B, 1.0).astype(jnp.float32)
  scaled_BV = logits_BV.astype(jnp.float32) / t_B[:, None]
  if not truncation:
    return scaled_BV
  truncating = jnp.any((top_k_B > 0) | (top_p_B < 1.0))
  return jax.lax.cond(truncating, lambda x: truncate_logits(x, top_k_B, top_p_B),
                      lambda x: x, scaled_BV)


def _blocks(scaled_BV: jax.Array, block: int) -> jax.Array:
  """`[B, N, K]`: each row cut into N blocks of K = min(block, V) tokens, the last -inf-padded."""
  b, v = scaled_BV.shape
  k = min(block, v)
  n = -(-v // k)
  return jnp.pad(scaled_BV, ((0, 0), (0, n * k - v)),
                 constant_values=_NEG_INF).reshape(b, n, k)


def greedy(scaled_BV: jax.Array, block: int = 256) -> jax.Array:
  """`jnp.argmax(scaled_BV, axis=-1)` (first maximum; NaN counts as the maximum) through `draw`'s
  blocks: the first block holding the row's maximum, then the first maximum inside it. On XLA:CPU
  an argmax over the vocabulary is a scalar loop, a max vectorizes (bench/README.md, "Sampler")."""
  x_BNK = _blocks(scaled_BV, block)
  k = x_BNK.shape[-1]
  j_B = jnp.argmax(x_BNK.max(axis=-1), axis=-1)
  x_BK = jnp.take_along_axis(x_BNK, j_B[:, None, None], axis=1)[:, 0]
  return (j_B * k + jnp.argmax(x_BK, axis=-1)).astype(jnp.int32)


def draw(keys_B: jax.Array, scaled_BV: jax.Array, block: int = 256):
  """Exact categorical draw from `softmax(scaled_BV)`, in two Gumbel-max stages.

  First a block of `block` consecutive tokens with probability its total mass (block logit =
  logsumexp of its logits), then a token inside it with its renormalised probability:
  P(j) · P(i | j) = p_i, exactly categorical, with ~2√V random numbers per row instead of V (on
  CPU the random bits are what sampling costs). Both stages take independent Gumbel noise from
  one draw per row: one threefry in the compiled program instead of a split and two, each
  costing compile time on CPU (bench/README.md, "Sampler"). Returns `(tokens_B int32, logz_B)`
  with `logz_B = logsumexp(scaled_BV)`.
  """
  x_BNK = _blocks(scaled_BV, block)
  n, k = x_BNK.shape[1:]
  block_logz_BN = jax.nn.logsumexp(x_BNK, axis=-1)
  gumbel_BM = jax.vmap(lambda key: jax.random.gumbel(key, (n + k,), jnp.float32))(keys_B)
  j_B = jnp.argmax(block_logz_BN + gumbel_BM[:, :n], axis=-1)
  x_BK = jnp.take_along_axis(x_BNK, j_B[:, None, None], axis=1)[:, 0]
  i_B = jnp.argmax(x_BK + gumbel_BM[:, n:], axis=-1)
  return (j_B * k + i_B).astype(jnp.int32), jax.nn.logsumexp(block_logz_BN, axis=-1)


def sample_logits(logits_BV: jax.Array, keys_B: jax.Array, temperature_B: jax.Array,
                  top_k_B: jax.Array, top_p_B: jax.Array, truncation: bool = True):
  """Draws one token per row; returns `(tokens_B int32, logprobs_B float32)`, the log-prob being
  `log_softmax` of the distribution drawn from, at the token. `keys_B`: typed PRNG keys, one per
  row, so a row's draw does not depend on its batch; `truncation`: as in `sampling_logits`."""
  scaled_BV = sampling_logits(logits_BV, temperature_B, top_k_B, top_p_B, truncation)
  drawn_B, logz_B = draw(keys_B, scaled_BV)
  greedy_B = greedy(scaled_BV)
  tokens_B = jnp.where(temperature_B > 0, drawn_B, greedy_B)
  picked_B = jnp.take_along_axis(scaled_BV, tokens_B[:, None], axis=-1)[:, 0]
  return tokens_B, picked_B - logz_B


def truncated_logprobs(logits_BTV: jax.Array, tokens_BT: jax.Array, temperature: float = 1.0,
                       top_k: int = 0, top_p: float = 1.0) -> jax.Array:
  """Learner-side log-prob of `tokens_BT` under the sampler's truncated distribution: use it
  instead of `mipu_jax.models.token_logprobs` when the sampler ran with top-k / top-p, so `lp_old`
  and `lp_mu` describe one distribution. `logits_BTV[:, t]` predicts `tokens_BT[:, t]`."""
  b, t, v = logits_BTV.shape
  n = b * t
  scaled_NV = sampling_logits(
      logits_BTV.reshape(n, v), jnp.full((n,), temperature, jnp.float32),
      jnp.full((n,), top_k, jnp.int32), jnp.full((n,), top_p, jnp.float32))
  logp_NV = jax.nn.log_softmax(scaled_NV, axis=-1)
  lp_N = jnp.take_along_axis(logp_NV, tokens_BT.reshape(n, 1), axis=-1)[:, 0]
  return lp_N.reshape(b, t)
