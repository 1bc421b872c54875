"""The sampler engine behind the JetStream engine interface (docs/method.md §7).

`Engine` has the method signatures of JetStream's current main branch
(`jetstream/engine/engine_api.py`, as implemented by MaxText's `MaxEngine`):
keyword-only `prefill(*, params, existing_prefix=None, padded_tokens, true_length,
sampler=None, request_id=None) -> (Prefix, ResultTokens)`, `insert(prefix,
decode_state, slot, request_id=None)`, `bulk_insert(prefix, decode_state, slots)`,
`generate(params, decode_state, sampler=None) -> (DecodeState, ResultTokens)`,
`free_resource`, `load_params`, `init_decode_state`, and the capacity properties.
Like MaxText we add keyword-only extensions: per-request `rng`, `temperature`,
`top_k`, `top_p`, `max_new_tokens` on `prefill`; batched prefill (`padded_tokens`
of shape `[R, P]`); `rows` / `sample_ids` on `bulk_insert`; and
`generate_until_done`, the same decode step in one `lax.while_loop`.
`ResultTokens`, and why we do not depend on JetStream, are in `jetstream.py`,
which registers `Engine` with JetStream's ABCs when a `jetstream` package is
importable (`JETSTREAM_REGISTERED`).

The engine is stateless with respect to weights (JetStream style): `params`
from `load_params` are passed to every call, so a weight sync never invalidates
a compiled function or leaves stale weights in one.
"""

import collections
import contextlib
import dataclasses
import math
import types
from typing import Any, Optional, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mipu_jax.models import attention
from mipu_jax.models import paged_tpu
from mipu_jax.models.qwen3 import Inference, Qwen3
from mipu_jax.sampler import _steps, jetstream, quant, weights
from mipu_jax.sampler.config import SamplerConfig
from mipu_jax.sampler.jetstream import ResultTokens
from mipu_jax.sampler.state import DecodeState, Prefix

Params = Any


def _reject_unknown(method: str, args, kwargs) -> None:
  """JetStream declares `*args, **kwargs` on these methods; we take none."""
  if args or kwargs:
    raise TypeError(f"Engine.{method} got unexpected arguments {args!r} {sorted(kwargs)}.")


def _as_array(x, dtype, n: int, what: str) -> jax.Array:
  """A per-request knob as an `[n]` array (a scalar is broadcast)."""
  a = np.asarray(x, dtype=dtype)
  if a.ndim == 0:
    a = np.full((n,), a, dtype)
  if a.shape != (n,):
    raise ValueError(f"{what} must be a scalar or have shape ({n},), got {a.shape}.")
  return jnp.asarray(a)


# Jitted engine functions, shared by all engines: static settings travel in
# `_steps.DecodeSpec` (hashable), so two samplers that differ only in weight
# quantization hit the same compiled code. The counter records traces
# (a Python side effect that only runs while tracing).
TRACE_COUNTS = collections.Counter()


def _counted_jit(name, fn, **jit_kwargs):
  def counted(*args, **kwargs):
    TRACE_COUNTS[name] += 1
    return fn(*args, **kwargs)
  counted.__name__ = counted.__qualname__ = name
  return jax.jit(counted, **jit_kwargs)


def _prefill_with_result(spec, params, *args):
  prefix, tokens_R, lp_R = _steps.prefill(spec, params, *args)
  ones_R = jnp.ones_like(tokens_R)
  return prefix, ResultTokens.from_step(tokens_R, ones_R, ones_R, lp_R)


def _generate_with_result(spec, params, ds):
  ds, (tokens_B, lp_B, live_B) = _steps.generate_step(spec, params, ds)
  return ds, ResultTokens.from_step(tokens_B, live_B, ds.num_generated_B, lp_B)


_jit_prepare = _counted_jit("prepare", quant.quantize_params, static_argnames=(
    "weight_quant", "compute_dtype", "quant_lm_head", "tie_embeddings", "storage", "compute",
    "act_quant"))
_jit_prefill = _counted_jit("prefill", _prefill_with_result, static_argnums=0)
_jit_generate = _counted_jit("generate", _generate_with_result, static_argnums=0,
                             donate_argnums=2)


def _prefill_prefix(spec, *args):
  """`prefill` without sample 0's first token (insert draws every sample's):
  what `Sampler` calls, one program fewer that samples (0.4 s less to compile
  on CPU, tiny model)."""
  return _steps.prefill(spec, *args, sample_first=False)[0]


# The programs a `Sampler` call runs: (function, jit arguments, the LLVM
# optimization level they are compiled with on CPU).
_SAMPLER_STEPS = {
    "prefill_prefix": (_prefill_prefix, dict(static_argnums=0), 1),
    "insert": (_steps.insert, dict(static_argnums=0, donate_argnums=2), 0),
    "generate_until_done": (_steps.generate_until_done,
                            dict(static_argnums=0, donate_argnums=2), 1),
    "generate_until_free": (_steps.generate_until_free,
                            dict(static_argnums=0, donate_argnums=2), 1),
    "init_decode_state": (_steps.init_decode_state,
                          dict(static_argnums=(0, 1, 2, 3, 4, 6)), 0),
}


def _compiled(cpu: bool) -> types.MappingProxyType:
  """`_SAMPLER_STEPS` jitted: with jax's default compilation, or as compiled on
  CPU (`cpu`), where a first call is mostly their compilation: XLA:CPU's loop
  emitters instead of its fusion emitters, and LLVM at -O1 (prefill, the
  decode loop) or -O0 (insert, init_decode_state: scatters, one draw, zeros).
  The loop emitters alone gave bitwise the default compilation's tokens and
  log-probs where checked; at -O1 LLVM rounds some float sums differently: the
  same tokens, log-probs up to 2.4e-6 apart (tests/test_sampler.py, the
  sampler tests' model with float32 / int8 / FP8 caches and refills).
  bench/first_call.py (tiny model, idle machine): XLA compilation 1.81 s ->
  0.96 s, first call 2.72 s -> 1.82 s; decode tokens/s within a few percent
  (bench/sampler.py; bench/README.md)."""
  table = {}
  for name, (fn, jit_kwargs, cpu_level) in _SAMPLER_STEPS.items():
    if cpu:
      jit_kwargs = dict(jit_kwargs, compiler_options={
          "xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": cpu_level})
    table[name] = _counted_jit(name, fn, **jit_kwargs)
  return types.MappingProxyType(table)


_PROGRAMS = _compiled(cpu=False)
_CPU_PROGRAMS = _compiled(cpu=True)


def _platform(model: Qwen3, mesh: Optional[jax.sharding.Mesh]) -> str:
  """Where the engine computes: the mesh's devices, else the model weights' device,
  else JAX's default device."""
  if mesh is not None:
    return mesh.devices.flat[0].platform
  for leaf in jax.tree.leaves(nnx.state(model)):
    if isinstance(leaf, jax.Array):
      return next(iter(leaf.devices())).platform
  default = jax.config.jax_default_device
  return default.platform if default is not None else jax.devices()[0].platform


def _decode_impl(config: SamplerConfig, platform: str, mesh, kv_dtype,
                 head_dim: int) -> attention.DecodeImpl:
  """The decode attention this engine runs, resolved once here, where the
  platform, the mesh and the cache dtype are known (`decode_attention_for`,
  `paged_tpu.resolve`); a kernel off its device runs in Pallas' interpreter."""
  name = config.decode_attention_for(platform, 1 if mesh is None else mesh.size)
  if config.decode_attention not in ("auto", name):
    logging.warning("decode_attention=%r runs as %r: the GPU kernel takes a cache on one "
                    "device, and this one is sharded over %d.", config.decode_attention,
                    name, mesh.size)
  if name == "pallas_tpu":
    rows = 1 if mesh is None else math.prod(mesh.shape.get(a, 1) for a in ("data", "fsdp"))
    name = paged_tpu.resolve(config.decode_attention, kv_dtype, head_dim, platform, rows)
  device = {"pallas": "gpu", "pallas_tpu": "tpu"}.get(name, platform)
  return attention.DecodeImpl(name, interpret=platform != device)


class Engine:
  """Prefill / insert / generate over fixed decode slots, with log-probs.

  Args:
    model: the learner's Qwen3 (its architecture; its weights are the default
      `load_params` source).
    config: precision, quantization, capacities, stop ids.
    mesh: device mesh of the sampling layout, or None (single device).
  """

  def __init__(self, model: Qwen3, config: SamplerConfig = SamplerConfig(), *,
               mesh: Optional[jax.sharding.Mesh] = None):
    self.config = config
    self._mesh = mesh
    self._source = model
    platform = _platform(model, mesh)
    kv_round = config.kv_round(platform)
    kv_dtype = config.kv_cache_dtype if kv_round is None else config.dtype
    self.model_config = model.config.replace(dtype=config.dtype, remat=False)
    abstract = nnx.eval_shape(lambda: Qwen3(self.model_config, rngs=nnx.Rngs(0)))
    self._reference = jax.eval_shape(lambda: weights.learner_params(model))
    native = config.quant_compute == "native"  # the weights quantize their own inputs
    # The jitted programs this engine calls (a Sampler's: prefill, insert, decode).
    self.programs = _CPU_PROGRAMS if platform == "cpu" else _PROGRAMS
    self._spec = _steps.DecodeSpec(
        graphdef=nnx.graphdef(abstract),
        kv_dtype=kv_dtype,
        inference=Inference(
            decode=_decode_impl(config, platform, mesh, kv_dtype, model.config.head_dim),
            act_quant=None if native else quant.make_act_quant(config.act_quant),
            quant_lm_head=config.quant_lm_head, kv_round=kv_round),
        pad_id=config.pad_id, page_size=config.page_size)
    self._quant_kwargs = dict(
        weight_quant=config.weight_quant, compute_dtype=config.dtype,
        quant_lm_head=config.quant_lm_head, tie_embeddings=self.model_config.tie_embeddings,
        storage=config.quant_storage, compute=config.quant_compute,
        act_quant=config.act_quant if native else None)  # a static key: only where used
    self._rng = jax.random.key(0)

  @property
  def decode_attention(self) -> str:
    """The decode attention this engine runs (`SamplerConfig.decode_attention` resolved)."""
    return self._spec.inference.decode.name

  @property
  def trace_counts(self) -> collections.Counter:
    """How often each jitted engine function was traced, process-wide.

    Compiled functions are shared by every engine with the same static settings
    (architecture, compute dtype, activation and KV quantization): weight-only
    quantization modes differ only in parameter values and reuse one compilation.
    """
    return TRACE_COUNTS

  # --- Weights -------------------------------------------------------------

  def load_params(self, params: Any = None, *args, **kwargs) -> Params:
    """Sampling params from learner params (module / nnx.State / dict; default: the model).

    Reshards to the sampling layout (when a mesh is set) and casts or quantizes
    as configured. The result has the same structure every time, so engine
    functions compiled for one sync serve every later one.
    """
    _reject_unknown("load_params", args, kwargs)
    pure = weights.learner_params(self._source if params is None else params)
    weights.check_structure(pure, self._reference)
    return _jit_prepare(weights.reshard_for_sampling(pure, self._mesh), **self._quant_kwargs)

  # --- JetStream engine API ------------------------------------------------

  def prefill(self, *, params: Params, existing_prefix: Optional[Prefix] = None,
              padded_tokens: Any, true_length: Any, sampler=None, request_id=None,
              rng: Optional[jax.Array] = None, temperature: Any = 1.0, top_k: Any = 0,
              top_p: Any = 1.0, max_new_tokens: Any = None, first_request: int = 0,
              with_result: bool = True) -> Any:
    """Computes the KV cache of right-padded prompt(s); returns it and sample 0's first token.

    `padded_tokens` is `[P]` (one request, JetStream) or `[R, P]` (a batch);
    `true_length` an int or `[R]`. `rng`: one typed key per request (`[R]`), or
    one key for all, request r then using `fold_in(rng, first_request + r)`
    (the requests' indices in a larger batch); by default the engine splits
    its own. `temperature == 0` is greedy.

    Returns `(prefix, result)`; only the prefix with `with_result=False`
    (`prefill_prefix`).
    """
    del request_id
    if existing_prefix is not None:
      raise NotImplementedError("Chunked prefill is not supported (use_chunked_prefill=False).")
    if sampler is not None:
      raise NotImplementedError(
          "A custom `sampler` callable cannot report the log-prob of the distribution it "
          "draws from; use temperature / top_k / top_p.")
    tokens = np.asarray(padded_tokens)
    if tokens.ndim == 1:
      tokens = tokens[None]
    if tokens.ndim != 2:
      raise ValueError(f"padded_tokens must be [P] or [R, P], got shape {tokens.shape}.")
    r, p = tokens.shape
    if p > self.config.max_prefill_length:
      raise ValueError(f"Prompt bucket {p} exceeds max_prefill_length "
                       f"{self.config.max_prefill_length}.")
    lengths = np.asarray(true_length, np.int32).reshape(-1) if np.ndim(true_length) else \
        np.full((r,), int(true_length), np.int32)
    if lengths.shape != (r,):
      raise ValueError(f"true_length must be an int or have shape ({r},), got {lengths.shape}.")
    if np.any(lengths <= 0):
      raise ValueError("Empty prompt: every request needs at least one prompt token.")
    if np.any(lengths > p):
      raise ValueError(f"true_length {lengths.max()} exceeds the padded length {p}.")
    if rng is None:
      self._rng, rng = jax.random.split(self._rng)
    if not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
      rng = jax.random.wrap_key_data(rng)  # legacy uint32 key data
    if rng.ndim and rng.shape != (r,):
      raise ValueError(f"rng must be one key or one per request ({r}), got shape {rng.shape}.")
    max_new = self.config.max_decode_length if max_new_tokens is None else max_new_tokens
    with self.mesh_context():
      return (_jit_prefill if with_result else self._program("prefill_prefix"))(
        self._spec, params, jnp.asarray(tokens, jnp.int32), jnp.asarray(lengths), rng,
        _as_array(temperature, np.float32, r, "temperature"),
        _as_array(top_k, np.int32, r, "top_k"), _as_array(top_p, np.float32, r, "top_p"),
        _as_array(max_new, np.int32, r, "max_new_tokens"),
        jnp.asarray(first_request, jnp.int32))

  def prefill_prefix(self, **kwargs) -> Prefix:
    """`prefill` without its `ResultTokens` (sample 0's first token, which
    `insert` draws again with the same key; its log-prob equal to rounding, the
    programs being compiled apart): the same prefix, from a program that does
    not sample. Takes `prefill`'s keyword arguments."""
    return self.prefill(**kwargs, with_result=False)

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int,
             request_id=None) -> DecodeState:
    """Puts a one-request prefix into `slot` (its previous content is discarded)."""
    del request_id
    if prefix.logits_RV.shape[0] != 1:
      raise ValueError("insert takes a one-request prefix; use bulk_insert(rows=...) for a batch.")
    return self.bulk_insert(prefix, decode_state, [slot])

  def bulk_insert(self, prefix: Prefix, decode_state: DecodeState, slots: Sequence[int], *,
                  rows: Optional[Sequence[int]] = None,
                  sample_ids: Optional[Sequence[int]] = None,
                  prompt_blocks: Optional[Sequence[int]] = None,
                  fill: Optional[Sequence[bool]] = None,
                  truncation: bool = True) -> DecodeState:
    """Inserts into several slots at once.

    JetStream semantics by default: one request into every slot of `slots`,
    as samples 0, 1, ... (independent draws: multi-sampling). With `rows`,
    slot `slots[m]` gets sample `sample_ids[m]` of prefilled request `rows[m]`.
    Slot ids ≥ the number of slots are padding and ignored.

    Prompt sharing (`init_decode_state(prompt_blocks=...)`): slot `slots[m]`
    reads its prompt from prompt block `prompt_blocks[m]` (default: block =
    slot), and the prompt's K/V are copied into that block where `fill[m]`
    (default: everywhere). The caller keeps each block's prompt: samples of
    one prompt share a block, the first insert fills it, and a block is reused
    only once no slot decodes from it.

    `truncation=False` leaves top-k / top-p out of the program (it compiles
    faster; an error if a request inserted uses them): for a decode state
    whose requests never truncate, decoded with `truncation=False` too
    (`Sampler` does so when its call has no top-k / top-p).
    """
    slots = np.asarray(slots, np.int32).reshape(-1)
    m = slots.shape[0]
    rows = np.zeros((m,), np.int32) if rows is None else np.asarray(rows, np.int32)
    sample_ids = np.arange(m, dtype=np.int32) if sample_ids is None else np.asarray(
        sample_ids, np.int32)
    blocks = slots if prompt_blocks is None else np.asarray(prompt_blocks, np.int32).reshape(-1)
    fill = np.ones((m,), bool) if fill is None else np.asarray(fill, bool).reshape(-1)
    if rows.shape != (m,) or sample_ids.shape != (m,) or blocks.shape != (m,) or \
        fill.shape != (m,):
      raise ValueError("slots, rows, sample_ids, prompt_blocks and fill must have the same "
                       "length.")
    num_blocks = _steps.cache_geometry(decode_state, self.model_config.num_layers)[3]
    real = slots < decode_state.last_token_B.shape[0]
    if np.any(real & ((blocks < 0) | (blocks >= num_blocks))):
      raise ValueError(f"prompt block outside [0, {num_blocks}) (the decode state's "
                       "prompt_blocks); by default a slot uses block = slot, which needs one "
                       "block per slot.")
    if np.any(slots < 0) or np.any(rows < 0) or np.any(rows >= prefix.logits_RV.shape[0]):
      raise ValueError("Negative slot, or row outside the prefix.")
    # Pad to a bucket with out-of-range slot ids (dropped), so insert compiles
    # once per bucket rather than once per number of slots.
    b = decode_state.last_token_B.shape[0]
    pad = self.config.slot_bucket(m) - m
    slots = np.concatenate([slots, np.full((pad,), b, np.int32)])
    rows = np.concatenate([rows, np.zeros((pad,), np.int32)])
    sample_ids = np.concatenate([sample_ids, np.zeros((pad,), np.int32)])
    blocks = np.concatenate([np.where(real, blocks, 0), np.zeros((pad,), np.int32)])
    fill = np.concatenate([fill & real, np.zeros((pad,), bool)])
    region = decode_state.cache.slots - decode_state.tokens_BN.shape[1]
    if prefix.cache.slots > region:
      raise ValueError(f"Prefix of length {prefix.cache.slots} does not fit the decode "
                       f"state's prefill region of {region} slots.")
    if not truncation:
      top_k_R, top_p_R = jax.device_get((prefix.top_k_R, prefix.top_p_R))
      if np.any(top_k_R[rows] > 0) or np.any(top_p_R[rows] < 1.0):
        raise ValueError("truncation=False, but a request to insert uses top-k / top-p.")
    with self.mesh_context():
      return self._constrained(self._program("insert")(
          self._spec_for(truncation), prefix, decode_state, jnp.asarray(slots), jnp.asarray(rows),
          jnp.asarray(sample_ids), jnp.asarray(blocks), jnp.asarray(fill)))

  def generate(self, params: Params, decode_state: DecodeState,
               sampler=None) -> tuple[DecodeState, ResultTokens]:
    """One decode step for every live slot."""
    if sampler is not None:
      raise NotImplementedError("Custom samplers are not supported (no log-prob); see prefill.")
    with self.mesh_context():
      return _jit_generate(self._spec, params, decode_state)

  def generate_until_done(self, params: Params, decode_state: DecodeState, *,
                          truncation: bool = True) -> DecodeState:
    """Decode steps in one `lax.while_loop` until every slot has finished.

    `truncation=False`: only for a state filled by `bulk_insert(...,
    truncation=False)` (no row uses top-k / top-p).
    """
    with self.mesh_context():
      return self._constrained(self._program("generate_until_done")(
          self._spec_for(truncation), params, decode_state))

  def generate_until_free(self, params: Params, decode_state: DecodeState,
                          min_finished: int, *, truncation: bool = True) -> DecodeState:
    """Decode steps until `min_finished` occupied slots have finished (or none is
    live): the point where a host loop harvests them and refills the slots.
    `truncation`: as in `generate_until_done`."""
    with self.mesh_context():
      return self._constrained(self._program("generate_until_free")(
          self._spec_for(truncation), params, decode_state, jnp.asarray(min_finished, jnp.int32)))

  def _program(self, name: str):
    """The jitted program `name` as this engine compiles it (`programs`), or
    the default compilation when called inside another trace (a caller's jit,
    `memory_plan`'s eval_shape): jax takes compiler options at the top level
    only."""
    if self.programs is not _PROGRAMS and isinstance(jnp.zeros((), jnp.int32), jax.core.Tracer):
      return _PROGRAMS[name]
    return self.programs[name]

  def _spec_for(self, truncation: bool) -> _steps.DecodeSpec:
    return self._spec if truncation else dataclasses.replace(self._spec, truncation=False)

  def mesh_context(self):
    """`jax.set_mesh(mesh)` (a no-op context without a mesh): the engine's
    functions trace under it, so the model pins its activations' rows to the
    mesh (`models.qwen3.shard_rows`) and the sharded cache stays sharded."""
    if self._mesh is None or not jax.sharding.get_abstract_mesh().empty:
      return contextlib.nullcontext()  # no mesh, or one is set already
    return jax.set_mesh(self._mesh)

  def decode_state_shardings(self, decode_state: DecodeState) -> Any:
    """`NamedSharding`s of a decode state on the engine's mesh (None without one).

    Slots (rows) over the data axes (`data`, `fsdp`); the KV cache's page pool
    `[K, L * P, G, H]` with its pages over the data axes and KV heads over
    `tensor`; an axis that does not divide its dimension is left unsharded.
    The KV cache of 16 x 9,216 slots of Qwen3-4B is then split over the chips
    instead of held whole on each (`docs/pods.md`). A row's pages need not sit
    on the row's device (XLA's partitioner moves the gathered pages); a pool
    per device, with each row's pages on its own, is not built yet. So for
    jax's TPU kernel, which reads each shard's rows through global page ids
    (`paged_tpu`), the pool's pages stay whole on every device of a row shard.
    """
    if self._mesh is None:
      return None
    mesh = self._mesh
    rows = tuple(a for a in ("data", "fsdp") if a in mesh.shape)
    n_rows = int(np.prod([mesh.shape[a] for a in rows]))
    tensor = mesh.shape.get("tensor", 1)
    tpu_kernel = self.decode_attention == "pallas_tpu"

    def spec(x, cache_leaf: bool):
      shape = jnp.shape(x)
      if not shape:
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      axes = [None] * len(shape)
      pool = cache_leaf and len(shape) == 4  # [K, L * P, G, H]: pages over the rows' axes
      b_axis = 1 if pool else 0
      if shape[b_axis] % n_rows == 0 and not (pool and tpu_kernel):
        axes[b_axis] = rows
      if pool and shape[0] % tensor == 0:
        axes[0] = "tensor"
      return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes))

    cache = decode_state.cache
    cache_sh = type(cache)(*[None if leaf is None else spec(leaf, True) for leaf in cache])
    rest = {k: spec(v, False) for k, v in decode_state._asdict().items()
            if k not in ("cache", "stop_ids_E")}
    return decode_state._replace(
        cache=cache_sh, stop_ids_E=jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec()), **rest)

  def _constrained(self, decode_state: DecodeState) -> DecodeState:
    """The decode state on its mesh shardings (a no-op when already there)."""
    shardings = self.decode_state_shardings(decode_state)
    return decode_state if shardings is None else jax.device_put(decode_state, shardings)

  def free_resource(self, slot: int) -> None:
    """Nothing to free: slots are fixed buffers, and `insert` rebuilds a slot's whole row."""
    del slot

  def init_decode_state(self, *args, num_slots: Optional[int] = None,
                        prefill_length: Optional[int] = None,
                        decode_length: Optional[int] = None,
                        stop_ids: Optional[Sequence[int]] = None,
                        prompt_blocks: Optional[int] = None, **kwargs) -> DecodeState:
    """Empty slots (defaults: the config's capacities and stop ids).

    `prompt_blocks`: prompts the paged cache holds at once (default: one per
    slot); see `bulk_insert` and `_steps.init_decode_state`.
    """
    _reject_unknown("init_decode_state", args, kwargs)
    cfg = self.config
    stop = tuple(cfg.stop_ids if stop_ids is None else stop_ids)
    if len(stop) > cfg.max_stop_ids:
      raise ValueError(f"{len(stop)} stop ids, more than max_stop_ids={cfg.max_stop_ids}.")
    stop_E = jnp.asarray(list(stop) + [-1] * (cfg.max_stop_ids - len(stop)), jnp.int32)
    return self._constrained(self._program("init_decode_state")(
        self._spec, self.model_config, num_slots or cfg.max_concurrent_decodes,
        prefill_length or cfg.max_prefill_length, decode_length or cfg.max_decode_length,
        stop_E, prompt_blocks))

  def get_prefix_destination_sharding(self) -> Any:
    """Prefixes stay where prefill put them (one engine does prefill and decode)."""
    return None

  def get_tokenizer(self):
    raise NotImplementedError("Token ids in, token ids out; tokenizers live in mipu_jax.tokenizer.")

  def build_tokenizer(self, metadata):
    raise NotImplementedError("Token ids in, token ids out; tokenizers live in mipu_jax.tokenizer.")

  @property
  def max_concurrent_decodes(self) -> int:
    return self.config.max_concurrent_decodes

  @property
  def samples_per_slot(self) -> int:
    return 1

  @property
  def max_prefill_length(self) -> int:
    return self.config.max_prefill_length

  @property
  def mesh(self) -> Optional[jax.sharding.Mesh]:
    return self._mesh

  @property
  def colocated_cpus(self) -> None:
    return None

  @property
  def use_chunked_prefill(self) -> bool:
    return False

  @property
  def prefill_chunk_size(self) -> int:
    return self.config.max_prefill_length


JETSTREAM_REGISTERED = jetstream.register(Engine)
