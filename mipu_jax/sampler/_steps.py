"""Pure prefill / insert / decode functions of the engine (jitted in `engine.py`).

Every sampled token — the first one (drawn in `insert`) and every later one
(drawn in `advance`) — goes through `_head` and `_draw`, so all log-probs
come from one function (`sampling.sample_logits`, or in the true on-policy
mode the batch-invariant head the learner runs; docs/method.md §7). Layout
conventions are in `state.py`.
"""

import dataclasses
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from mipu_jax.models import invariant
from mipu_jax.models import kv_cache
from mipu_jax.models.kv_cache import KVCache, init_cache
from mipu_jax.models.qwen3 import Inference
from mipu_jax.sampler import quant
from mipu_jax.sampler.sampling import sample_logits
from mipu_jax.sampler.state import LENGTH, RUNNING, STOP, DecodeState, Prefix


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
  """Static (compile-time) settings shared by the step functions.

  `kv_dtype` is the cache arrays' dtype; `inference` how the model runs (its
  decode attention, activation quantizer, `kv_round`: the float dtype whose
  values the cache holds with `SamplerConfig.kv_cache_storage='fake'`).
  """

  graphdef: nnx.GraphDef
  kv_dtype: jnp.dtype
  inference: Inference
  pad_id: int
  page_size: int = kv_cache.DEFAULT_PAGE_SIZE
  truncation: bool = True  # False: no row uses top-k / top-p (leaves them out)
  routing: bool = False  # record each token's MoE experts (SamplerConfig.return_routing)

  def page_size_for(self, *lengths: int) -> int:
    """The cache page size for rows (regions) of these lengths."""
    return kv_cache.page_size_for(*lengths, maximum=self.page_size)


def build_model(spec: DecodeSpec, params):
  """The sampling model from its params; `QArray`s (real PTQ storage) are dequantized here."""
  return nnx.merge(spec.graphdef, quant.dequantize_tree(params))


def _head(spec: DecodeSpec, model, h_BD, temperature_B):
  """The logits a draw starts from: the LM head's, or in the true on-policy mode
  the batch-invariant head's log-probs of the tempered distribution
  (`invariant.head_logprobs`, the learner's arithmetic; docs/method.md §7)."""
  if spec.inference.invariant:
    b = h_BD.shape[0]
    return invariant.head_logprobs(model.logits, h_BD, temperature_B,
                                   jnp.zeros((b,), jnp.int32))[0]
  head_quant = spec.inference.act_quant if spec.inference.quant_lm_head else None
  return model.logits(h_BD[:, None], head_quant)[:, 0]


def _draw(spec: DecodeSpec, logits_BV, keys_B, temperature_B, top_k_B, top_p_B):
  """`sample_logits`; in the true on-policy mode `logits_BV` are already the
  tempered log-probs (`_head`): drawn at temperature 1 (greedy stays greedy),
  the token's log-prob read from them, not recomputed."""
  if not spec.inference.invariant:
    return sample_logits(logits_BV, keys_B, temperature_B, top_k_B, top_p_B, spec.truncation)
  unit_B = jnp.where(temperature_B > 0, 1.0, 0.0).astype(jnp.float32)
  tokens_B, _ = sample_logits(logits_BV, keys_B, unit_B, top_k_B, top_p_B, False)
  return tokens_B, jnp.take_along_axis(logits_BV, tokens_B[:, None], axis=-1)[:, 0]


def _fold(keys, data_B):
  return jax.vmap(jax.random.fold_in)(keys, data_B)


def _is_stop(tokens_B, stop_ids_E):
  return jnp.any(tokens_B[:, None] == stop_ids_E[None, :], axis=-1)


def prefill(spec: DecodeSpec, params, tokens_RP, true_length_R, keys_R, temperature_R, top_k_R,
            top_p_R, max_new_R, first_request=0, sample_first: bool = True):
  """Prefills R right-padded prompts (JetStream's convention) into a `Prefix`.

  Each prompt sits at slots `[0, length)` of its row, as in the decode state
  (`state.py`). Returns the prefix and sample 0's first token and log-prob
  per request (the token `insert` will draw for sample 0, so JetStream's
  prefill result agrees; None and None with `sample_first=False`).
  """
  model = build_model(spec, params)
  r, p = tokens_RP.shape
  if keys_R.ndim == 0:  # one key for the batch: request r uses fold_in(key, first + r)
    keys_R = _fold(jnp.broadcast_to(keys_R, (r,)), first_request + jnp.arange(r))
  mask_RP = jnp.arange(p)[None, :] < true_length_R[:, None]
  tokens_RP = jnp.where(mask_RP, tokens_RP, spec.pad_id)
  cache = init_cache(model.config, r, p, spec.kv_dtype, page_size=spec.page_size_for(p))
  whole = dataclasses.replace(  # a prefill cache is one contiguous part
      spec.inference, decode=spec.inference.decode._replace(pool_parts=1))
  out = model(tokens_RP, mask_BT=mask_RP, cache=cache, inference=whole, logits=False)
  cache = out.cache
  # Only each prompt's last position's logits are needed (P times fewer
  # LM-head FLOPs than the model's own [R, P, V]).
  last_R11 = (true_length_R - 1)[:, None, None]
  h_R1D = jnp.take_along_axis(out.hidden, last_R11, axis=1)
  logits_RV = _head(spec, model, h_R1D[:, 0], temperature_R)
  prefix = Prefix(cache=cache, logits_RV=logits_RV, keys_R=keys_R,
                  true_length_R=true_length_R, temperature_R=temperature_R, top_k_R=top_k_R,
                  top_p_R=top_p_R, max_new_R=max_new_R,
                  routing_RPLk=out.routing if spec.routing else None)
  if not sample_first:
    return prefix, None, None
  first_keys_R = _fold(_fold(keys_R, jnp.zeros((r,), jnp.int32)), jnp.zeros((r,), jnp.int32))
  tokens_R, lp_R = _draw(spec, prefix.logits_RV, first_keys_R, temperature_R, top_k_R, top_p_R)
  return prefix, tokens_R, lp_R


class PoolGeometry(NamedTuple):
  """Where a decode state's pages are: pages of `g` slots; `c` prompt blocks of
  `jp` pages, then `own` pages for each of `b` slots, in `parts` parts of the
  pool (`kv_cache.py`), one per row shard: part d holds blocks `[d, d + 1) c /
  parts` and the own pages of slots `[d, d + 1) b / parts`, shard d's rows."""
  g: int
  jp: int
  own: int
  c: int
  b: int
  parts: int
  layers: int

  @property
  def per_layer(self) -> int:
    """P: the pages of a layer in a part, the layer stride of page ids."""
    return (self.c * self.jp + self.b * self.own) // self.parts

  def _base(self, part):
    return part * self.layers * self.per_layer

  def block_part(self, k):
    """The part that holds prompt block `k`."""
    return k // (self.c // self.parts)

  def slot_part(self, slot):
    """The part of slot `slot`'s row."""
    return slot // (self.b // self.parts)

  def block_page(self, k):
    """Layer 0's first page of prompt block `k`."""
    return self._base(self.block_part(k)) + k % (self.c // self.parts) * self.jp

  def own_page(self, slot):
    """Layer 0's first page of slot `slot`'s own pages."""
    bd, cd = self.b // self.parts, self.c // self.parts
    return self._base(self.slot_part(slot)) + cd * self.jp + slot % bd * self.own

  def part_block(self, slot):
    """A prompt block in the part of `slot`'s row (its shard's first blocks, in turn)."""
    bd, cd = self.b // self.parts, self.c // self.parts
    return self.slot_part(slot) * cd + slot % bd % cd


def init_decode_state(spec: DecodeSpec, model_cfg, num_slots: int, prefill_length: int,
                      decode_length: int, stop_ids_E: jax.Array,
                      prompt_blocks: Optional[int] = None) -> DecodeState:
  """Empty slots: a paged cache of `prefill_length + decode_length` slots per row.

  The pool holds `prompt_blocks` prompt blocks (the pages of one prefill
  region, `prefill_length` slots each; default one per slot) and each slot's
  own pages, one more than its generation needs. A slot's page table points
  at the full pages of its prompt in a block (shared by the slots decoding
  samples of the same prompt, `insert`), then at its own pages, the first of
  which holds its copy of the prompt's partly filled last page. So the cache
  holds prompts + generated tokens (+ a page per slot), not samples x
  (prompt + generated). With the pool in parts (one per row shard), slots and
  blocks are split evenly over them (`PoolGeometry`). Empty slots' tables
  are those of a prompt filling the region, index at the first generated slot.
  """
  b, n, p = num_slots, decode_length, prefill_length
  c = b if prompt_blocks is None else prompt_blocks
  parts = spec.inference.decode.pool_parts
  if not 1 <= c <= b:
    raise ValueError(f"prompt_blocks must be in [1, num_slots={b}], got {c}.")
  if b % parts or c % parts:
    raise ValueError(f"the rows are split over {parts} devices: num_slots ({b}) and "
                     f"prompt_blocks ({c}) must be multiples of {parts}.")
  g = spec.page_size_for(p, n)
  geo = PoolGeometry(g, p // g, n // g + 1, c, b, parts, model_cfg.num_layers)
  k, v, ks, vs = kv_cache.init_pool(model_cfg, geo.per_layer * parts, g, spec.kv_dtype)
  slots_B = jnp.arange(b, dtype=jnp.int32)
  pages_BJ = _row_pages(geo, geo.part_block(slots_B), slots_B, jnp.full((b,), geo.jp, jnp.int32),
                        geo.jp + n // g)
  cache = KVCache(k=k, v=v, k_scale=ks, v_scale=vs, pages=pages_BJ,
                  index=jnp.full((b,), p, jnp.int32))
  return DecodeState(
      cache=cache, last_token_B=jnp.zeros((b,), jnp.int32),
      keys_B=jax.random.split(jax.random.key(0), b),
      num_generated_B=jnp.zeros((b,), jnp.int32), active_B=jnp.zeros((b,), bool),
      done_B=jnp.ones((b,), bool), finish_B=jnp.full((b,), RUNNING, jnp.int32),
      temperature_B=jnp.ones((b,), jnp.float32), top_k_B=jnp.zeros((b,), jnp.int32),
      top_p_B=jnp.ones((b,), jnp.float32), max_new_B=jnp.zeros((b,), jnp.int32),
      stop_ids_E=stop_ids_E, tokens_BN=jnp.full((b, n), spec.pad_id, jnp.int32),
      logprobs_BN=jnp.zeros((b, n), jnp.float32),
      routing_BNLk=jnp.full((b, n, len(model_cfg.moe_layers), model_cfg.num_experts_per_tok),
                            -1, jnp.int32) if spec.routing else None)


def _row_pages(geo: PoolGeometry, blocks_M, slots_M, shared_M, j: int):
  """Page tables `[M, j]`: column j < `shared_M[m]` is page j of prompt
  block `blocks_M[m]`; the columns after it are slot `slots_M[m]`'s own pages."""
  j_J = jnp.arange(j, dtype=jnp.int32)[None, :]
  block_MJ = geo.block_page(blocks_M)[:, None] + j_J
  own_MJ = geo.own_page(slots_M)[:, None] + jnp.clip(j_J - shared_M[:, None], 0, geo.own - 1)
  return jnp.where(j_J < shared_M[:, None], block_MJ, own_MJ)


def cache_geometry(ds: DecodeState, num_layers: int, parts: int = 1) -> PoolGeometry:
  """The `PoolGeometry` of a decode state whose pool has `parts` parts."""
  cache = ds.cache
  g = cache.page_size
  b, n = ds.tokens_BN.shape
  jp, own = (cache.slots - n) // g, n // g + 1
  c = (cache.pages_per_layer(num_layers) - b * own) // jp
  return PoolGeometry(g, jp, own, c, b, parts, num_layers)


def insert(spec: DecodeSpec, prefix: Prefix, ds: DecodeState, slots_M, rows_M,
           samples_M, blocks_M=None, fill_M=None) -> DecodeState:
  """Inserts sample `samples_M[m]` of prefilled request `rows_M[m]` into slot `slots_M[m]`.

  The prompt's full pages live in prompt block `blocks_M[m]` (default: the
  slot's own index): where `fill_M[m]` (default: everywhere) they are copied
  there, so the G samples of one prompt share one copy (the first insert
  fills the block, the others only point at it). The partly filled last
  page is copied into the slot's own first page, where the sample's tokens
  follow it (vLLM's copy of a shared partial block, done at insert: at most
  one page per sample). The slot's page table is rebuilt and its length set
  to the prompt's, so nothing of a slot's previous occupant is attended.
  Draws each slot's first token from the prefix logits with the slot's own
  key. Slot ids ≥ B are padding and ignored.
  """
  b = ds.last_token_B.shape[0]
  c, pc = ds.cache, prefix.cache
  blocks_M = slots_M if blocks_M is None else blocks_M
  fill_M = jnp.ones(slots_M.shape, bool) if fill_M is None else fill_M
  real_M = slots_M < b
  num_layers = pc.k.shape[1] // pc.pages.size  # contiguous: L x R x (p / G') pages
  geo = cache_geometry(ds, num_layers, spec.inference.decode.pool_parts)
  length_M = prefix.true_length_R[rows_M]
  shared_M = length_M // geo.g
  prompt_pages_MJ = _row_pages(geo, blocks_M, slots_M, shared_M, geo.jp)
  cache = _copy_prompts(c, pc, rows_M, length_M, prompt_pages_MJ, fill_M & real_M, real_M,
                        geo)
  pages_MJ = _row_pages(geo, blocks_M, slots_M, shared_M, c.pages.shape[1])
  cache = cache._replace(pages=c.pages.at[slots_M].set(pages_MJ, mode="drop"),
                         index=c.index.at[slots_M].set(length_M, mode="drop"))

  keys_M = _fold(prefix.keys_R[rows_M], samples_M)
  temperature_M = prefix.temperature_R[rows_M]
  top_k_M, top_p_M = prefix.top_k_R[rows_M], prefix.top_p_R[rows_M]
  max_new_M = prefix.max_new_R[rows_M]
  tokens_M, lp_M = _draw(spec, prefix.logits_RV[rows_M], _fold(keys_M, jnp.zeros_like(samples_M)),
                         temperature_M, top_k_M, top_p_M)
  stop_M = _is_stop(tokens_M, ds.stop_ids_E)
  n = ds.tokens_BN.shape[1]
  done_M = stop_M | (jnp.minimum(max_new_M, n) <= 1)
  finish_M = jnp.where(done_M, jnp.where(stop_M, STOP, LENGTH), RUNNING)
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
      logprobs_BN=put(ds.logprobs_BN, jnp.where(first_N[None, :], lp_M[:, None], 0.0)),
      routing_BNLk=None if ds.routing_BNLk is None else ds.routing_BNLk.at[slots_M].set(
          -1, mode="drop"))


def _copy_prompts(c: KVCache, pc: KVCache, rows_M, length_M, pages_MJ, fill_M, real_M,
                  geo: PoolGeometry) -> KVCache:
  """Copies prefill rows `rows_M` into the decode pool, every layer, one
  scatter per pool: the prompt's slots on full pages into its block where
  `fill_M`, those of its partly filled last page into the slot's own first
  page where `real_M` (`pages_MJ`: the first `jp` columns of each slot's
  page table); the prefill's padding slots nowhere."""
  r, p = pc.pages.shape[0], pc.slots
  g, num_layers = c.page_size, geo.layers
  slots_P = jnp.arange(p, dtype=jnp.int32)
  page_MP = jnp.take(pages_MJ, slots_P // g, axis=1)
  on_full_MP = slots_P[None, :] < (length_M // g * g)[:, None]
  keep_MP = jnp.where(on_full_MP, fill_M[:, None], real_M[:, None]) & (
      slots_P[None, :] < length_M[:, None])
  page_LMP = jnp.arange(num_layers, dtype=jnp.int32)[:, None, None] * geo.per_layer + page_MP[None]
  page_LMP = jnp.where(keep_MP[None], page_LMP, jnp.iinfo(jnp.int32).max)
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
  """Slots that still decode: occupied and not finished."""
  return ds.active_B & ~ds.done_B


def advance(spec: DecodeSpec, params, ds: DecodeState):
  """One decode step for all slots: feed each live slot's last token, draw the next.

  Returns the new state and `(tokens_B, logprobs_B, live_B)` of this step.
  Finished and empty slots write nothing and keep their outputs and length.
  A row ends at a stop id, its budget or the token buffer's N tokens (its
  cache then holds its prompt and N - 1 of them).
  """
  model = build_model(spec, params)
  live_B = live_slots(ds)
  out = model(ds.last_token_B[:, None], mask_BT=live_B[:, None], cache=ds.cache,
              inference=spec.inference, logits=False)
  cache = out.cache
  logits_BV = _head(spec, model, out.hidden[:, 0], ds.temperature_B)
  tokens_B, lp_B = _draw(spec, logits_BV, _fold(ds.keys_B, ds.num_generated_B),
                         ds.temperature_B, ds.top_k_B, ds.top_p_B)
  b, n = ds.tokens_BN.shape
  at_B = jnp.where(live_B, ds.num_generated_B, n)  # n: out of range, dropped
  num_generated_B = ds.num_generated_B + live_B.astype(jnp.int32)
  stop_B = _is_stop(tokens_B, ds.stop_ids_E)
  ended_B = live_B & (stop_B | (num_generated_B >= jnp.minimum(ds.max_new_B, n)))
  ds = ds._replace(
      cache=cache, last_token_B=jnp.where(live_B, tokens_B, ds.last_token_B),
      num_generated_B=num_generated_B, done_B=ds.done_B | ended_B,
      finish_B=jnp.where(ended_B, jnp.where(stop_B, STOP, LENGTH), ds.finish_B),
      tokens_BN=ds.tokens_BN.at[jnp.arange(b), at_B].set(tokens_B, mode="drop"),
      logprobs_BN=ds.logprobs_BN.at[jnp.arange(b), at_B].set(lp_B, mode="drop"))
  if ds.routing_BNLk is not None:  # the fed token's experts, at its own position
    fed_B = jnp.where(live_B, num_generated_B - 2, n)
    ds = ds._replace(routing_BNLk=ds.routing_BNLk.at[jnp.arange(b), fed_B].set(
        out.routing[:, 0], mode="drop"))
  return ds, (tokens_B, lp_B, live_B)


def generate_step(spec: DecodeSpec, params, ds: DecodeState):
  """`advance` when some slot is live, else nothing (no model call)."""
  b = ds.last_token_B.shape[0]
  idle = (jnp.zeros((b,), jnp.int32), jnp.zeros((b,), jnp.float32), jnp.zeros((b,), bool))
  return jax.lax.cond(jnp.any(live_slots(ds)), lambda d: advance(spec, params, d),
                      lambda d: (d, idle), ds)


def generate_until_free(spec: DecodeSpec, params, ds: DecodeState,
                        min_finished: jax.Array) -> DecodeState:
  """Runs `advance` in one `lax.while_loop` until at least `min_finished` occupied
  slots have finished (the point where a host loop harvests and refills them) or
  none is live. With `min_finished` above the slot count: until none is live
  (`Engine.generate_until_done`), the same program, so a refilled run compiles
  one decode loop, not two."""
  def more(d):
    finished = jnp.sum(d.active_B & d.done_B)
    return jnp.any(live_slots(d)) & (finished < min_finished)
  return jax.lax.while_loop(more, lambda d: advance(spec, params, d)[0], ds)
