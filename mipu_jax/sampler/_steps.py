"""Pure prefill / insert / decode functions of the engine (jitted in `engine.py`).

Every sampled token — the first one (drawn in `insert`) and every later one
(drawn in `advance`) — goes through `sampling.sample_logits`, so all log-probs
come from one function. Layout conventions are in `state.py`.
"""

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from mipu_jax.models import kv_cache
from mipu_jax.models.kv_cache import KVCache, init_cache
from mipu_jax.sampler import quant
from mipu_jax.sampler.sampling import sample_logits
from mipu_jax.sampler.state import LENGTH, RUNNING, STOP, DecodeState, Prefix


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
  """Static (compile-time) settings shared by the step functions.

  `kv_dtype` is the cache arrays' dtype; `kv_round`, when set, the float dtype
  whose values they hold (`SamplerConfig.kv_cache_storage='fake'`).
  """

  graphdef: nnx.GraphDef
  kv_dtype: jnp.dtype
  act_quant: Optional[Callable[[jax.Array], jax.Array]]
  quant_lm_head: bool
  pad_id: int
  kv_round: Optional[jnp.dtype] = None
  page_size: int = kv_cache.DEFAULT_PAGE_SIZE
  truncation: bool = True  # False: no row uses top-k / top-p (leaves them out)

  def page_size_for(self, *lengths: int) -> int:
    """The cache page size for rows (regions) of these lengths."""
    return kv_cache.page_size_for(*lengths, maximum=self.page_size)


def build_model(spec: DecodeSpec, params):
  """The sampling model from its params; `QArray`s (real PTQ storage) are dequantized here."""
  return nnx.merge(spec.graphdef, quant.dequantize_tree(params))


def _fold(keys, data_B):
  return jax.vmap(jax.random.fold_in)(keys, data_B)


def _is_stop(tokens_B, stop_ids_E):
  return jnp.any(tokens_B[:, None] == stop_ids_E[None, :], axis=-1)


def prefill(spec: DecodeSpec, params, tokens_RP, true_length_R, keys_R, temperature_R, top_k_R,
            top_p_R, max_new_R, first_request=0, sample_first: bool = True):
  """Prefills R right-padded prompts (JetStream's convention) into a `Prefix`.

  Returns the prefix and sample 0's first token and log-prob per request (the
  token `insert` will draw for sample 0, so JetStream's prefill result agrees;
  None and None with `sample_first=False`).
  """
  model = build_model(spec, params)
  r, p = tokens_RP.shape
  if keys_R.ndim == 0:  # one key for the batch: request r uses fold_in(key, first + r)
    keys_R = _fold(jnp.broadcast_to(keys_R, (r,)), first_request + jnp.arange(r))
  # The model's cache needs left padding: rotate each row right by its padding.
  shift_R = p - true_length_R
  src_RP = (jnp.arange(p)[None, :] - shift_R[:, None]) % p
  mask_RP = jnp.arange(p)[None, :] >= shift_R[:, None]
  left_RP = jnp.where(mask_RP, jnp.take_along_axis(tokens_RP, src_RP, axis=1), spec.pad_id)
  cache = init_cache(model.config, r, p, spec.kv_dtype, page_size=spec.page_size_for(p))
  (_, h_RPD), cache = model(left_RP, mask_BT=mask_RP, cache=cache, act_quant=spec.act_quant,
                            kv_round=spec.kv_round,
                            quant_lm_head=spec.quant_lm_head, return_hidden=True)
  # Only the last position's logits are needed: the model's own [R, P, V] logits
  # are dead code under jit and XLA drops them (P times fewer LM-head FLOPs).
  head_quant = spec.act_quant if spec.quant_lm_head else None
  logits_RV = model.logits(h_RPD[:, -1:], head_quant)[:, 0]
  prefix = Prefix(cache=cache, logits_RV=logits_RV, keys_R=keys_R,
                  true_length_R=true_length_R, temperature_R=temperature_R, top_k_R=top_k_R,
                  top_p_R=top_p_R, max_new_R=max_new_R)
  if not sample_first:
    return prefix, None, None
  first_keys_R = _fold(_fold(keys_R, jnp.zeros((r,), jnp.int32)), jnp.zeros((r,), jnp.int32))
  tokens_R, lp_R = sample_logits(prefix.logits_RV, first_keys_R, temperature_R, top_k_R, top_p_R,
                                 spec.truncation)
  return prefix, tokens_R, lp_R


def init_decode_state(spec: DecodeSpec, model_cfg, num_slots: int, prefill_length: int,
                      decode_length: int, stop_ids_E: jax.Array,
                      prompt_blocks: Optional[int] = None) -> DecodeState:
  """Empty slots: a paged cache of `prefill_length + decode_length` slots per row,
  index at the first generated slot.

  The pool holds `prompt_blocks` prompt blocks (the pages of one prefill
  region, `prefill_length` slots each; default one per slot) and each slot's
  own generation pages. A slot's page table points at one prompt block
  (shared by the slots decoding samples of the same prompt, `insert`) and its
  own generation pages, so the cache holds prompts + generated tokens, not
  samples x (prompt + generated).
  """
  b, n, p = num_slots, decode_length, prefill_length
  c = b if prompt_blocks is None else prompt_blocks
  if not 1 <= c <= b:
    raise ValueError(f"prompt_blocks must be in [1, num_slots={b}], got {c}.")
  g = spec.page_size_for(p, n)
  jp, jn = p // g, n // g
  k, v, ks, vs = kv_cache.init_pool(model_cfg, c * jp + b * jn, g, spec.kv_dtype)
  slots_B = jnp.arange(b, dtype=jnp.int32)
  pages_BJ = jnp.concatenate([_block_pages(slots_B % c, jp), _gen_pages(slots_B, c, jp, jn)], 1)
  cache = KVCache(k=k, v=v, k_scale=ks, v_scale=vs, pages=pages_BJ,
                  valid=jnp.zeros((b, p + n), bool), index=jnp.full((b,), p, jnp.int32))
  return DecodeState(
      cache=cache, last_token_B=jnp.zeros((b,), jnp.int32),
      keys_B=jax.random.split(jax.random.key(0), b),
      num_generated_B=jnp.zeros((b,), jnp.int32), active_B=jnp.zeros((b,), bool),
      done_B=jnp.ones((b,), bool), finish_B=jnp.full((b,), RUNNING, jnp.int32),
      temperature_B=jnp.ones((b,), jnp.float32), top_k_B=jnp.zeros((b,), jnp.int32),
      top_p_B=jnp.ones((b,), jnp.float32), max_new_B=jnp.zeros((b,), jnp.int32),
      stop_ids_E=stop_ids_E, tokens_BN=jnp.full((b, n), spec.pad_id, jnp.int32),
      logprobs_BN=jnp.zeros((b, n), jnp.float32))


def _block_pages(blocks_M, jp: int):
  """The pages (per layer) of prompt blocks: block c holds pages c*jp .. c*jp + jp - 1."""
  return blocks_M[:, None] * jp + jnp.arange(jp, dtype=jnp.int32)[None, :]


def _gen_pages(slots_M, c: int, jp: int, jn: int):
  """Slot b's own generation pages, after the `c` prompt blocks."""
  return c * jp + slots_M[:, None] * jn + jnp.arange(jn, dtype=jnp.int32)[None, :]


def cache_geometry(ds: DecodeState, num_layers: int) -> tuple[int, int, int, int]:
  """`(page size, prompt pages per block jp, generation pages per slot jn, blocks c)`."""
  cache = ds.cache
  g = cache.page_size
  b, n = ds.tokens_BN.shape
  s = cache.valid.shape[1]
  jp, jn = (s - n) // g, n // g
  per_layer = cache.pages_per_layer(num_layers)
  return g, jp, jn, (per_layer - b * jn) // jp


def insert(spec: DecodeSpec, prefix: Prefix, ds: DecodeState, slots_M, rows_M,
           samples_M, blocks_M=None, fill_M=None) -> DecodeState:
  """Inserts sample `samples_M[m]` of prefilled request `rows_M[m]` into slot `slots_M[m]`.

  The slot's page table points at prompt block `blocks_M[m]` (default: the
  slot's own index) and its own generation pages; where `fill_M[m]` (default:
  everywhere) the request's prompt K/V are copied into that block, right-
  aligned to end at the prefill region's end `P` (`S - N`). The G samples of
  one prompt thus share one copy of its K/V: the first insert fills the block,
  the others only point at it. The slot's validity row is rebuilt (the prompt
  window valid, the rest not) and its write index reset to `P`, so nothing of
  a slot's previous occupant is attended. Draws each slot's first token from
  the prefix logits with the slot's own key. Slot ids ≥ B are padding and
  ignored.
  """
  b = ds.last_token_B.shape[0]
  s = ds.cache.valid.shape[1]
  region = s - ds.tokens_BN.shape[1]
  p = prefix.cache.valid.shape[1]
  start = region - p  # ≥ 0: checked on the host (prefill region ≥ prompt bucket)
  c, pc = ds.cache, prefix.cache
  blocks_M = slots_M if blocks_M is None else blocks_M
  fill_M = jnp.ones(slots_M.shape, bool) if fill_M is None else fill_M
  fill_M = fill_M & (slots_M < b)
  num_layers = _prefix_layers(pc)
  g, jp, jn, nblocks = cache_geometry(ds, num_layers)
  cache = _fill_blocks(c, pc, rows_M, blocks_M, fill_M, start, num_layers, jp)
  pages_MJ = jnp.concatenate([_block_pages(blocks_M, jp), _gen_pages(slots_M, nblocks, jp, jn)],
                             axis=1)
  valid_MS = jnp.zeros((slots_M.shape[0], s), bool)
  valid_MS = jax.lax.dynamic_update_slice(valid_MS, pc.valid[rows_M], (0, start))
  cache = cache._replace(pages=c.pages.at[slots_M].set(pages_MJ, mode="drop"),
                         valid=c.valid.at[slots_M].set(valid_MS, mode="drop"),
                         index=c.index.at[slots_M].set(region, mode="drop"))

  keys_M = _fold(prefix.keys_R[rows_M], samples_M)
  temperature_M = prefix.temperature_R[rows_M]
  top_k_M, top_p_M = prefix.top_k_R[rows_M], prefix.top_p_R[rows_M]
  max_new_M = prefix.max_new_R[rows_M]
  tokens_M, lp_M = sample_logits(prefix.logits_RV[rows_M], _fold(keys_M, jnp.zeros_like(samples_M)),
                                 temperature_M, top_k_M, top_p_M, spec.truncation)
  stop_M = _is_stop(tokens_M, ds.stop_ids_E)
  done_M = stop_M | (max_new_M <= 1)
  finish_M = jnp.where(done_M, jnp.where(stop_M, STOP, LENGTH), RUNNING)
  n = ds.tokens_BN.shape[1]
  first_N = jnp.arange(n) == 0

  def put(x_B, v_M):
    return x_B.at[slots_M].set(v_M, mode="drop")

  return DecodeState(
      cache=cache, last_token_B=put(ds.last_token_B, tokens_M), keys_B=put(ds.keys_B, keys_M),
      num_generated_B=put(ds.num_generated_B, jnp.ones_like(tokens_M)),
      active_B=put(ds.active_B, jnp.ones_like(stop_M)), done_B=put(ds.done_B, done_M),
      finish_B=put(ds.finish_B, finish_M), temperature_B=put(ds.temperature_B, temperature_M),
      top_k_B=put(ds.top_k_B, top_k_M), top_p_B=put(ds.top_p_B, top_p_M),
      max_new_B=put(ds.max_new_B, max_new_M), stop_ids_E=ds.stop_ids_E,
      tokens_BN=put(ds.tokens_BN, jnp.where(first_N[None, :], tokens_M[:, None], spec.pad_id)),
      logprobs_BN=put(ds.logprobs_BN, jnp.where(first_N[None, :], lp_M[:, None], 0.0)))


def _prefix_layers(pc: KVCache) -> int:
  """L of a prefill's contiguous cache: its pool holds L x R x (P / G) pages."""
  r, p = pc.valid.shape
  return pc.k.shape[1] // (r * (p // pc.page_size))


def _fill_blocks(c: KVCache, pc: KVCache, rows_M, blocks_M, fill_M, start: int,
                 num_layers: int, jp: int) -> KVCache:
  """Copies prefill rows `rows_M` into prompt blocks `blocks_M` where `fill_M`:
  every layer's P prompt slots, at slots `start ..` of the block (one scatter
  per pool; the rest of the block is never valid for this prompt)."""
  r, p = pc.valid.shape
  g = c.page_size
  per_layer = c.pages_per_layer(num_layers)
  slots_P = start + jnp.arange(p, dtype=jnp.int32)
  page_LMP = (jnp.arange(num_layers, dtype=jnp.int32)[:, None, None] * per_layer
              + (blocks_M * jp)[None, :, None] + (slots_P // g)[None, None, :])
  page_LMP = jnp.where(fill_M[None, :, None], page_LMP, jnp.iinfo(jnp.int32).max)
  off_LMP = jnp.broadcast_to(slots_P % g, page_LMP.shape)

  def copy(pool, part):
    if pool is None:
      return None
    # The prefill pool is contiguous: [K, L * R * p/G', G', X] is [K, L, R, p, X].
    rows_KLRPX = part.reshape(part.shape[0], num_layers, r, p, part.shape[-1])
    new_KLMPX = rows_KLRPX[:, :, rows_M]
    return kv_cache.scatter_set(pool, (slice(None), page_LMP, off_LMP), new_KLMPX)

  return c._replace(k=copy(c.k, pc.k), v=copy(c.v, pc.v), k_scale=copy(c.k_scale, pc.k_scale),
                    v_scale=copy(c.v_scale, pc.v_scale))


def live_slots(ds: DecodeState) -> jax.Array:
  """Slots that still decode: occupied, not finished, and their cache row has room."""
  return ds.active_B & ~ds.done_B & (ds.cache.index < ds.cache.valid.shape[1])


def advance(spec: DecodeSpec, params, ds: DecodeState):
  """One decode step for all slots: feed each live slot's last token, draw the next.

  Returns the new state and `(tokens_B, logprobs_B, live_B)` of this step.
  Finished and empty slots write an invalid cache entry, keep their outputs
  and their write index.
  """
  model = build_model(spec, params)
  live_B = live_slots(ds)
  logits_B1V, cache = model(ds.last_token_B[:, None], mask_BT=live_B[:, None], cache=ds.cache,
                            act_quant=spec.act_quant, quant_lm_head=spec.quant_lm_head,
                            kv_round=spec.kv_round)
  cache = cache._replace(index=ds.cache.index + live_B.astype(jnp.int32))
  tokens_B, lp_B = sample_logits(logits_B1V[:, 0], _fold(ds.keys_B, ds.num_generated_B),
                                 ds.temperature_B, ds.top_k_B, ds.top_p_B, spec.truncation)
  b, n = ds.tokens_BN.shape
  at_B = jnp.where(live_B, ds.num_generated_B, n)  # n: out of range, dropped
  num_generated_B = ds.num_generated_B + live_B.astype(jnp.int32)
  stop_B = _is_stop(tokens_B, ds.stop_ids_E)
  full_B = cache.index >= cache.valid.shape[1]
  ended_B = live_B & (stop_B | (num_generated_B >= ds.max_new_B) | full_B)
  ds = ds._replace(
      cache=cache, last_token_B=jnp.where(live_B, tokens_B, ds.last_token_B),
      num_generated_B=num_generated_B, done_B=ds.done_B | ended_B,
      finish_B=jnp.where(ended_B, jnp.where(stop_B, STOP, LENGTH), ds.finish_B),
      tokens_BN=ds.tokens_BN.at[jnp.arange(b), at_B].set(tokens_B, mode="drop"),
      logprobs_BN=ds.logprobs_BN.at[jnp.arange(b), at_B].set(lp_B, mode="drop"))
  return ds, (tokens_B, lp_B, live_B)


def generate_step(spec: DecodeSpec, params, ds: DecodeState):
  """`advance` when some slot is live, else nothing (the cache index must not pass S)."""
  b = ds.last_token_B.shape[0]
  idle = (jnp.zeros((b,), jnp.int32), jnp.zeros((b,), jnp.float32), jnp.zeros((b,), bool))
  return jax.lax.cond(jnp.any(live_slots(ds)), lambda d: advance(spec, params, d),
                      lambda d: (d, idle), ds)


def generate_until_done(spec: DecodeSpec, params, ds: DecodeState) -> DecodeState:
  """Runs `advance` in one `lax.while_loop` until no slot is live."""
  return jax.lax.while_loop(lambda d: jnp.any(live_slots(d)),
                            lambda d: advance(spec, params, d)[0], ds)


def generate_until_free(spec: DecodeSpec, params, ds: DecodeState,
                        min_finished: jax.Array) -> DecodeState:
  """Runs `advance` until at least `min_finished` occupied slots have finished
  (or none is live): the point where a host loop harvests and refills them."""
  def more(d):
    finished = jnp.sum(d.active_B & d.done_B)
    return jnp.any(live_slots(d)) & (finished < min_finished)
  return jax.lax.while_loop(more, lambda d: advance(spec, params, d)[0], ds)
