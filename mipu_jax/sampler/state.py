"""The sampler engine's pytrees: `Prefix` (a prefill result) and `DecodeState` (docs/method.md §7).

Both are fixed-shape buffers (gemma style): the jitted prefill / insert / decode functions see
the same shapes for a whole RL run within a bucket.

Cache layout (`models/kv_cache.py`): a row's cache is its slots `[0, length)`, its prompt from
slot 0, then one generated token per decode step at its write index (`cache.index`, the length):
no holes, so attention masks by length; RoPE positions are slots. The S = P + N slots per row
hold a prompt of up to P (the prefill region) and N generated tokens. The G samples of a prompt
share its full pages (a prompt block), each with its own copy of the prompt's partly filled last
page (`_steps.insert`). A request inserted later (continuous batching) restarts its slot's row.

Shape letters: R prefilled requests, B decode slots, P prompt bucket, S cache slots, N
token-buffer length, V vocab, E stop ids.
"""

from typing import NamedTuple, Optional

import jax

from mipu_jax.models.qwen3 import KVCache

# Finish reasons stored in `DecodeState.finish_B`.
RUNNING, STOP, LENGTH = 0, 1, 2
FINISH_NAMES = {RUNNING: "running", STOP: "stop", LENGTH: "length"}


class Prefix(NamedTuple):
  """Result of prefilling R requests, ready to be inserted into decode slots.

  Attributes:
    cache: contiguous KV cache of the R prompts, each at slots `[0, length)`
      of its row of P (the rest padding, never attended), `index` the lengths.
    logits_RV: float32 logits predicting the first new token (in the true
      on-policy mode, their tempered log-probs: `_steps._head`).
    keys_R: typed PRNG key of each request; sample `j` of request `r` draws with
      `fold_in(keys_R[r], j)`, then `fold_in(·, t)` for its t-th token.
    true_length_R: prompt lengths.
    temperature_R, top_k_R, top_p_R, max_new_R: sampling knobs (`sampling.py`), token budget.
    routing_RPLk: MoE models with routing recorded (`SamplerConfig.return_routing`):
      int32 `[R, P, L_moe, k]`, each prompt token's experts per MoE layer (-1 on
      padding); None otherwise.
  """

  cache: KVCache
  logits_RV: jax.Array
  keys_R: jax.Array
  true_length_R: jax.Array
  temperature_R: jax.Array
  top_k_R: jax.Array
  top_p_R: jax.Array
  max_new_R: jax.Array
  routing_RPLk: Optional[jax.Array] = None


class DecodeState(NamedTuple):
  """Everything one decode step transforms, for B slots.

  Attributes:
    cache: the paged KV cache of the B slots, S slots per row (`kv_cache.KVCache`).
    last_token_B: the token each slot feeds next (its latest sample).
    keys_B: typed PRNG key of each slot's sample.
    num_generated_B: tokens generated so far (the first comes from `insert`).
    active_B: the slot holds a request.
    done_B: the slot's request has finished (or the slot is empty).
    finish_B: RUNNING / STOP / LENGTH.
    temperature_B, top_k_B, top_p_B, max_new_B: per-slot sampling knobs.
    stop_ids_E: stop token ids, padded with -1.
    tokens_BN: generated tokens, `pad_id` after the end.
    logprobs_BN: float32 log-prob of each token under its drawn distribution (`lp_mu`), 0 after.
    routing_BNLk: with routing recorded (`Prefix.routing_RPLk`): int32
      `[B, N, L_moe, k]`, the experts of generated token n in each MoE layer,
      written when the token is fed back (the row's last token never is: -1).
  """

  cache: KVCache
  last_token_B: jax.Array
  keys_B: jax.Array
  num_generated_B: jax.Array
  active_B: jax.Array
  done_B: jax.Array
  finish_B: jax.Array
  temperature_B: jax.Array
  top_k_B: jax.Array
  top_p_B: jax.Array
  max_new_B: jax.Array
  stop_ids_E: jax.Array
  tokens_BN: jax.Array
  logprobs_BN: jax.Array
  routing_BNLk: Optional[jax.Array] = None
