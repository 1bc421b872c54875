"""The sampler engine: prefill, insert and decode over fixed slots (docs/method.md §7).

`Engine` is what `Sampler` runs: `prefill` right-padded prompts into a
`Prefix`, `insert` samples of them into decode slots (a prompt's samples
share its pages), and decode in one `lax.while_loop` until every slot
(`generate_until_done`) or enough of them (`generate_until_free`) finished: one
program, the first with a count no slots reach.
JetStream's engine interface is a thin adapter over it (`jetstream.py`).

The engine is stateless with respect to weights (JetStream style): `params`
from `load_params` are passed to every call, so a weight sync never invalidates
a compiled function or leaves stale weights in one. Its programs are declared
once (`PROGRAMS`) and shared by every engine with the same static settings.
"""

import collections
import contextlib
import dataclasses
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mipu_jax.models import attention, sharding
from mipu_jax.models.qwen3 import Inference, Qwen3
from mipu_jax.sampler import _steps, quant, weights
from mipu_jax.sampler.config import SamplerConfig
from mipu_jax.sampler.state import DecodeState, Prefix

Params = Any

# Traces of each program, process-wide (a side effect that runs only while tracing).
TRACE_COUNTS = collections.Counter()


class Program:
  """One jitted engine function, compiled with jax's default options, and for
  an engine on CPU (where a first call is mostly compilation) with XLA:CPU's
  loop emitters instead of its fusion emitters and LLVM at -O`cpu_level`
  (None: the default compilation there too): a shorter compile (bench/README.md,
  "Sampler", `bench.perf.first_call`), the same tokens, log-probs within float
  rounding (LLVM at -O1 rounds some float sums differently; tests/test_sampler.py)."""

  def __init__(self, name: str, fn, cpu_level: Optional[int] = None, **jit_kwargs):
    def counted(*args, **kwargs):
      TRACE_COUNTS[name] += 1
      return fn(*args, **kwargs)
    counted.__name__ = counted.__qualname__ = name
    self.name = name
    self.default = self.cpu = jax.jit(counted, **jit_kwargs)
    if cpu_level is not None:
      self.cpu = jax.jit(counted, **jit_kwargs, compiler_options={
          "xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": cpu_level})

  def __call__(self, cpu: bool, *args, **kwargs):
    """The CPU compilation where `cpu`, unless traced into a caller's program
    (an argument is a tracer): jax takes compiler options at the top level only."""
    traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs)))
    return (self.cpu if cpu and not traced else self.default)(*args, **kwargs)


def _prefill_prefix(spec, *args):
  """`prefill` without sample 0's first token (insert draws every sample's): one
  program fewer that samples, so less to compile (bench/README.md, "Sampler")."""
  return _steps.prefill(spec, *args, sample_first=False)[0]


_STATE = dict(static_argnums=0, donate_argnums=2)  # (spec, params or prefix, decode state, ...)
PROGRAMS = {p.name: p for p in (
    Program("prepare", quant.quantize_params, static_argnames=(
        "weight_quant", "compute_dtype", "quant_lm_head", "tie_embeddings", "storage",
        "compute", "act_quant")),
    Program("prefill", _steps.prefill, static_argnums=0),  # and sample 0's first token
    Program("prefill_prefix", _prefill_prefix, 1, static_argnums=0),
    Program("insert", _steps.insert, 0, **_STATE),
    Program("generate_step", _steps.generate_step, **_STATE),
    Program("generate_until_free", _steps.generate_until_free, 1, **_STATE),
    Program("init_decode_state", _steps.init_decode_state, 0,
            static_argnums=(0, 1, 2, 3, 4, 6)),
)}


def _as_array(x, dtype, n: int, what: str) -> jax.Array:
  """A per-request knob as an `[n]` array (a scalar is broadcast)."""
  a = np.asarray(x, dtype=dtype)
  if a.ndim == 0:
    a = np.full((n,), a, dtype)
  if a.shape != (n,):
    raise ValueError(f"{what} must be a scalar or have shape ({n},), got {a.shape}.")
  return jnp.asarray(a)


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


class Engine:
  """Prefill / insert / decode over fixed decode slots, with log-probs.

  Args:
    model: the learner's Qwen3 (its architecture; its weights are the default
      `load_params` source).
    config: precision, quantization, capacities, stop ids.
    mesh: device mesh of the sampling layout, or None (single device).
  """

  def __init__(self, model: Qwen3, config: SamplerConfig = SamplerConfig(), *,
               mesh: Optional[jax.sharding.Mesh] = None):
    self.config = config
    self.mesh = mesh
    self._source = model
    platform = _platform(model, mesh)
    kv_round = config.kv_round(platform)
    kv_dtype = config.kv_cache_dtype if kv_round is None else config.dtype
    self.model_config = model.config.replace(dtype=config.dtype, remat=False)
    abstract = nnx.eval_shape(lambda: Qwen3(self.model_config, rngs=nnx.Rngs(0)))
    self._reference = jax.eval_shape(lambda: weights.learner_params(model))
    native = config.quant_compute == "native"  # the weights quantize their own inputs
    # `Program`'s CPU compilation; not in the true on-policy mode, whose
    # programs must compile as the learner's do (LLVM's level and XLA:CPU's
    # emitters change how float sums are rounded).
    self.cpu_compile = platform == "cpu" and not config.true_on_policy
    # Resolved once, here, where the platform, the mesh and the cache dtype are known; a
    # kernel off its device runs in Pallas' interpreter. A pool part per row shard (kv_cache.py).
    rows = 1 if mesh is None else sharding.row_shards(mesh)
    if config.max_concurrent_decodes % rows:
      raise ValueError(f"max_concurrent_decodes ({config.max_concurrent_decodes}) must be a "
                       f"multiple of the mesh's {rows} row shards (data x fsdp x expert): each "
                       "holds as many slots, in its part of the KV cache.")
    if config.true_on_policy and mesh is not None and mesh.shape.get("tensor", 1) > 1:
      raise ValueError("true_on_policy needs tensor=1: a tensor split sums each contraction "
                       "in parts, in another order than the learner's (docs/method.md §7).")
    decode = config.decode_attention_for(platform, kv_dtype=kv_dtype,
                                         head_dim=model.config.head_dim)
    device = {"pallas": "gpu", "pallas_tpu": "tpu"}.get(decode, platform)
    self._spec = _steps.DecodeSpec(
        graphdef=nnx.graphdef(abstract),
        kv_dtype=kv_dtype,
        inference=Inference(
            decode=attention.DecodeImpl(decode, interpret=platform != device,
                                        pool_parts=rows),
            act_quant=None if native else quant.make_act_quant(config.act_quant),
            quant_lm_head=config.quant_lm_head, kv_round=kv_round,
            invariant=config.true_on_policy),
        pad_id=config.pad_id, page_size=config.page_size,
        routing=config.return_routing and model.config.is_moe)
    self._quant_kwargs = dict(
        weight_quant=config.weight_quant, compute_dtype=config.dtype,
        quant_lm_head=config.quant_lm_head, tie_embeddings=self.model_config.tie_embeddings,
        storage=config.quant_storage, compute=config.quant_compute,
        act_quant=config.act_quant if native else None)  # a static key: only where used
    self._rng = jax.random.key(0)

  @property
  def records_routing(self) -> bool:
    """Whether prefill and decode record each token's MoE experts."""
    return self._spec.routing

  @property
  def decode_attention(self) -> str:
    """The decode attention this engine runs (`SamplerConfig.decode_attention` resolved)."""
    return self._spec.inference.decode.name

  @property
  def pool_parts(self) -> int:
    """The decode pool's parts: the row shards of the engine's mesh (`kv_cache.py`)."""
    return self._spec.inference.decode.pool_parts

  @property
  def trace_counts(self) -> collections.Counter:
    """How often each program was traced, process-wide: engines with the same
    static settings (architecture, compute dtype, activation and KV
    quantization) share compilations; weight-only quantization modes differ
    only in parameter values."""
    return TRACE_COUNTS

  @property
  def programs(self) -> dict[str, Any]:
    """The jitted programs as this engine compiles them when called at the top level."""
    return {name: p.cpu if self.cpu_compile else p.default for name, p in PROGRAMS.items()}

  def _run(self, name: str, *args, **kwargs):
    with self.mesh_context():
      return PROGRAMS[name](self.cpu_compile, *args, **kwargs)

  def load_params(self, params: Any = None) -> Params:
    """Sampling params from learner params (module / nnx.State / dict; default: the model).

    Reshards to the sampling layout (when a mesh is set) and casts or quantizes
    as configured. The result has the same structure every time, so engine
    functions compiled for one sync serve every later one.
    """
    pure = weights.learner_params(self._source if params is None else params)
    weights.check_structure(pure, self._reference)
    return PROGRAMS["prepare"](False, weights.reshard_for_sampling(pure, self.mesh),
                               **self._quant_kwargs)

  def prefill(self, params: Params, tokens_RP: Any, lengths_R: Any, *,
              rng: Optional[jax.Array] = None, temperature: Any = 1.0, top_k: Any = 0,
              top_p: Any = 1.0, max_new_tokens: Any = None, first_request: int = 0,
              sample_first: bool = False) -> Any:
    """The KV cache and first-token logits of R right-padded prompts (`Prefix`).

    `rng`: one typed key per request (`[R]`), or one key for all, request r
    then using `fold_in(rng, first_request + r)` (the requests' indices in a
    larger batch); by default the engine splits its own. Knobs are scalars or
    `[R]`; `temperature == 0` is greedy. `sample_first`: also draw sample 0's
    first token, returning `(prefix, tokens_R, logprobs_R)` (JetStream's
    prefill result; `insert` draws it again with the same key).
    """
    tokens = np.asarray(tokens_RP)
    if tokens.ndim != 2:
      raise ValueError(f"padded_tokens must be [P] or [R, P], got shape {tokens.shape}.")
    r, p = tokens.shape
    if p > self.config.prefill_bucket(self.config.max_prefill_length):
      raise ValueError(f"Prompt bucket {p} exceeds max_prefill_length "
                       f"{self.config.max_prefill_length}.")
    lengths = np.asarray(lengths_R, np.int32).reshape(-1) if np.ndim(lengths_R) else \
        np.full((r,), int(lengths_R), np.int32)
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
    if self.config.true_on_policy and (np.any(np.asarray(top_k) > 0)
                                       or np.any(np.asarray(top_p) < 1.0)):
      raise ValueError("true_on_policy samples the full distribution: no top-k / top-p.")
    max_new = self.config.max_decode_length if max_new_tokens is None else max_new_tokens
    return self._run(
        "prefill" if sample_first else "prefill_prefix",
        self._spec, params, jnp.asarray(tokens, jnp.int32), jnp.asarray(lengths), rng,
        _as_array(temperature, np.float32, r, "temperature"),
        _as_array(top_k, np.int32, r, "top_k"), _as_array(top_p, np.float32, r, "top_p"),
        _as_array(max_new, np.int32, r, "max_new_tokens"), jnp.asarray(first_request, jnp.int32))

  def insert(self, prefix: Prefix, decode_state: DecodeState, slots: Sequence[int], *,
             rows: Optional[Sequence[int]] = None, sample_ids: Optional[Sequence[int]] = None,
             prompt_blocks: Optional[Sequence[int]] = None,
             fill: Optional[Sequence[bool]] = None, truncation: bool = True) -> DecodeState:
    """Puts sample `sample_ids[m]` of prefilled request `rows[m]` into slot
    `slots[m]` (default: request 0, samples 0, 1, ...: independent draws);
    slot ids ≥ the number of slots are padding. Slot `slots[m]` reads its
    prompt from prompt block `prompt_blocks[m]` (default: block = slot),
    filled with the prompt's K/V where `fill[m]` (default: everywhere): the
    caller keeps each block's prompt (`scheduler.py`). `truncation=False`
    leaves top-k / top-p out of the program (it compiles faster; an error if
    a request uses them), for a state decoded with `truncation=False` too.
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
    if np.any(slots < 0) or np.any(rows < 0) or np.any(rows >= prefix.logits_RV.shape[0]):
      raise ValueError("Negative slot, or row outside the prefix.")
    geo = _steps.cache_geometry(decode_state, self.model_config.num_layers, self.pool_parts)
    b = decode_state.last_token_B.shape[0]
    real = slots < b
    if np.any(real & ((blocks < 0) | (blocks >= geo.c))):
      raise ValueError(f"prompt block outside [0, {geo.c}) (the decode state's "
                       "prompt_blocks); by default a slot uses block = slot, which needs one "
                       "block per slot.")
    if np.any(real & (geo.block_part(blocks) != geo.slot_part(slots))):
      raise ValueError(f"a slot's prompt block must be on its row's device: the pool has "
                       f"{geo.parts} parts, of {geo.c // geo.parts} blocks and "
                       f"{b // geo.parts} slots each.")
    # Pad to a bucket with out-of-range slot ids (dropped), so insert compiles
    # once per bucket rather than once per number of slots.
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
    return self._constrained(self._run(
        "insert", self._spec_for(truncation), prefix, decode_state, jnp.asarray(slots),
        jnp.asarray(rows), jnp.asarray(sample_ids), jnp.asarray(blocks), jnp.asarray(fill)))

  def generate_step(self, params: Params, decode_state: DecodeState):
    """One decode step for every live slot: `(state, (tokens_B, logprobs_B, live_B))`."""
    return self._run("generate_step", self._spec, params, decode_state)

  def generate_until_done(self, params: Params, decode_state: DecodeState, *,
                          truncation: bool = True) -> DecodeState:
    """Decode steps in one `lax.while_loop` until every slot has finished
    (`truncation`: as in `insert`)."""
    return self.generate_until_free(params, decode_state, decode_state.done_B.shape[0] + 1,
                                    truncation=truncation)

  def generate_until_free(self, params: Params, decode_state: DecodeState,
                          min_finished: int, *, truncation: bool = True) -> DecodeState:
    """Decode steps until `min_finished` occupied slots have finished (or none is
    live), for the host loop to harvest and refill them (`truncation`: as in `insert`)."""
    return self._constrained(self._run(
        "generate_until_free", self._spec_for(truncation), params, decode_state,
        jnp.asarray(min_finished, jnp.int32)))

  def init_decode_state(self, *, num_slots: Optional[int] = None,
                        prefill_length: Optional[int] = None,
                        decode_length: Optional[int] = None,
                        stop_ids: Optional[Sequence[int]] = None,
                        prompt_blocks: Optional[int] = None) -> DecodeState:
    """Empty slots (defaults: the config's capacities and stop ids).

    `prompt_blocks`: prompts the paged cache holds at once (default: one per
    slot); see `insert` and `_steps.init_decode_state`.
    """
    cfg = self.config
    stop = tuple(cfg.stop_ids if stop_ids is None else stop_ids)
    if len(stop) > cfg.max_stop_ids:
      raise ValueError(f"{len(stop)} stop ids, more than max_stop_ids={cfg.max_stop_ids}.")
    stop_E = jnp.asarray(list(stop) + [-1] * (cfg.max_stop_ids - len(stop)), jnp.int32)
    return self._constrained(PROGRAMS["init_decode_state"](
        self.cpu_compile, self._spec, self.model_config, num_slots or cfg.max_concurrent_decodes,
        prefill_length or cfg.prefill_bucket(cfg.max_prefill_length),
        decode_length or cfg.decode_bucket(cfg.max_decode_length),
        stop_E, prompt_blocks))

  def _spec_for(self, truncation: bool) -> _steps.DecodeSpec:
    return self._spec if truncation else dataclasses.replace(self._spec, truncation=False)

  def mesh_context(self):
    """`jax.set_mesh(mesh)` (a no-op context without a mesh): the engine's
    functions trace under it, so the model pins its activations' rows to the
    mesh (`models.qwen3.shard_rows`) and the sharded cache stays sharded."""
    if self.mesh is None or not jax.sharding.get_abstract_mesh().empty:
      return contextlib.nullcontext()  # no mesh, or one is set already
    return jax.set_mesh(self.mesh)

  def decode_state_shardings(self, decode_state: DecodeState) -> Any:
    """`NamedSharding`s of a decode state on the engine's mesh (None without one).

    Slots (rows) over the data axes (`data`, `fsdp`); the KV cache's page pool
    `[K, D * L * P, G, H]` with its D parts over the same axes (each device
    holds its rows' pages, `kv_cache.py`) and KV heads over `tensor`
    (`docs/pods.md`); a head count `tensor` does not divide stays whole.
    """
    if self.mesh is None:
      return None
    mesh = self.mesh
    rows = sharding.row_axes(mesh) if self.pool_parts > 1 else None
    tensor = mesh.shape.get("tensor", 1)

    def spec(x, pool: bool):
      shape = jnp.shape(x)
      axes = [None] * len(shape)
      if shape:
        axes[1 if pool else 0] = rows
      if pool and shape[0] % tensor == 0:
        axes[0] = "tensor"
      return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes))

    cache = decode_state.cache
    cache_sh = type(cache)(*[None if leaf is None else spec(leaf, jnp.ndim(leaf) == 4)
                             for leaf in cache])
    rest = {k: spec(v, False) for k, v in decode_state._asdict().items()
            if k not in ("cache", "stop_ids_E") and v is not None}
    return decode_state._replace(
        cache=cache_sh, stop_ids_E=jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec()), **rest)

  def _constrained(self, decode_state: DecodeState) -> DecodeState:
    """The decode state on its mesh shardings (a no-op when already there)."""
    shardings = self.decode_state_shardings(decode_state)
    return decode_state if shardings is None else jax.device_put(decode_state, shardings)
