"""The sampler engine's pytrees: `Prefix` (a prefill result) and `DecodeState`.

Both are fixed-shape buffers (gemma style), so the jitted prefill / insert /
decode functions see the same shapes for a whole RL run within a bucket.

Cache layout. The model's `KVCache` has one write index shared by all rows, so
every row must end its context at the same slot. A decode state of `S = P + N`
slots starts with `index = P` (its prefill region); `insert` places a prompt of
bucket length `p ≤ index` right-aligned in slots `[index - p, index)` (left
padding marked invalid) and clears the rest of that row, then every decode step
writes one token for all rows at `index`. A request inserted later (continuous
batching) simply starts at the current index; a slot is finished with reason
"length" when the shared index reaches `S`. RoPE positions come from the count
of valid slots (see `Qwen3.__call__`), so where a row starts does not matter.

Shape letters: R prefilled requests, B decode slots, P prompt bucket,
S cache slots, N token-buffer length, V vocab, E stop ids.
"""

from typing import NamedTuple

import jax

from mipu_jax.models.qwen3 import KVCache

# Finish reasons stored in `DecodeState.finish_B`.
RUNNING, STOP, LENGTH = 0, 1, 2
FINISH_NAMES = {RUNNING: "running", STOP: "stop", LENGTH: "length"}


class Prefix(NamedTuple):
  """Result of prefilling R requests, ready to be inserted into decode slots.

  Attributes:
    cache: KV cache of the R prompts, `[L, R, P, K, H]`, prompts left-aligned to
      the end (left padding invalid), `index == P`.
    logits_RV: float32 logits predicting the first new token.
    keys_R: typed PRNG key of each request; sample `j` of request `r` draws with
      `fold_in(keys_R[r], j)`, then `fold_in(·, t)` for its t-th token.
    true_length_R: prompt lengths.
    temperature_R, top_k_R, top_p_R: sampling knobs (see `sampling.py`).
    max_new_R: token budget of each request.
  """

  cache: KVCache
  logits_RV: jax.Array
  keys_R: jax.Array
  true_length_R: jax.Array
  temperature_R: jax.Array
  top_k_R: jax.Array
  top_p_R: jax.Array
  max_new_R: jax.Array


class DecodeState(NamedTuple):
  """Everything one decode step transforms, for B slots.

  Attributes:
    cache: KV cache `[L, B, S, K, H]`.
    last_token_B: the token each slot feeds next (its latest sample).
    keys_B: typed PRNG key of each slot's sample.
    num_generated_B: tokens generated so far (the first comes from `insert`).
    active_B: the slot holds a request.
    done_B: the slot's request has finished (or the slot is empty).
    finish_B: RUNNING / STOP / LENGTH.
    temperature_B, top_k_B, top_p_B, max_new_B: per-slot sampling knobs.
    stop_ids_E: stop token ids, padded with -1.
    tokens_BN: generated tokens, `pad_id` after the end.
    logprobs_BN: float32 log-prob of each generated token under the
      distribution it was drawn from (`lp_mu`), 0 after the end.
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
