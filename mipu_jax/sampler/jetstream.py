"""JetStream's engine interface, a thin adapter over `Engine` (docs/method.md §7).

`JetStreamEngine` has the method signatures of JetStream's main branch
(`jetstream/engine/engine_api.py`, as MaxText's `MaxEngine` implements them): `prefill`
(keyword-only), `insert`, `bulk_insert`, `generate`, `free_resource`, `load_params`,
`init_decode_state` and the capacity properties. Like MaxText it adds keyword-only extensions:
per-request `rng`, `temperature`, `top_k`, `top_p`, `max_new_tokens` and batched prompts
(`padded_tokens` `[R, P]`) on `prefill`; `rows` / `sample_ids` on `bulk_insert`. The library's
own path (`Sampler`) calls `Engine` directly.

`ResultTokens` has JetStream's layout and carries `log_prob` as a pytree field (JetStream's is
static and `get_result_at_slot` drops it). We do not depend on JetStream (its PyPI release has old
signatures and pulls TensorFlow; the project is archived; mipu_jax/sampler/README.md): when a
`jetstream` package is importable, `JetStreamEngine` and `ResultTokens` are registered as virtual
subclasses of its ABCs (`JETSTREAM_REGISTERED`).
"""

from typing import Any, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from mipu_jax.sampler.engine import Engine, Params
from mipu_jax.sampler.state import DecodeState, Prefix


@struct.dataclass
class SlotData:
  """Tokens, validity, lengths and log-probs of one slot's samples."""

  tokens: Union[jax.Array, np.ndarray]
  valid: Union[jax.Array, np.ndarray]
  lengths: Union[jax.Array, np.ndarray]
  log_prob: Union[jax.Array, np.ndarray, None] = None


@struct.dataclass
class ResultTokens:
  """One step's tokens for every slot, JetStream layout plus `log_prob`: `data[:, tokens_idx]`
  the tokens, `data[:, valid_idx]` 1 where the slot produced a token this step,
  `data[:, length_idx]` the slot's tokens so far (this one included), `log_prob[b, 0]` the token's
  log-prob under the distribution it was drawn from."""

  data: Union[jax.Array, np.ndarray]
  log_prob: Union[jax.Array, np.ndarray]
  tokens_idx: tuple[int, int] = struct.field(pytree_node=False, default=(0, 1))
  valid_idx: tuple[int, int] = struct.field(pytree_node=False, default=(1, 2))
  length_idx: tuple[int, int] = struct.field(pytree_node=False, default=(2, 3))
  samples_per_slot: int = struct.field(pytree_node=False, default=1)

  @classmethod
  def from_step(cls, tokens_B, valid_B, lengths_B, log_prob_B) -> "ResultTokens":
    data = jnp.stack([tokens_B.astype(jnp.int32), valid_B.astype(jnp.int32),
                      lengths_B.astype(jnp.int32)], axis=1)
    return cls(data=data, log_prob=log_prob_B.astype(jnp.float32)[:, None])

  def copy_to_host_async(self) -> None:
    for x in (self.data, self.log_prob):
      if isinstance(x, jax.Array):
        x.copy_to_host_async()

  def convert_to_numpy(self) -> "ResultTokens":
    return self.replace(data=np.asarray(self.data), log_prob=np.asarray(self.log_prob))

  def get_result_at_slot(self, slot: int) -> SlotData:
    lo, hi = slot * self.samples_per_slot, (slot + 1) * self.samples_per_slot
    return self._slot_data(slice(lo, hi))

  def get_result_at_slots(self, slots: Sequence[int]) -> SlotData:
    return self._slot_data(np.asarray(slots))

  def _slot_data(self, rows) -> SlotData:
    return SlotData(tokens=self.data[rows, self.tokens_idx[0]:self.tokens_idx[1]],
                    valid=self.data[rows, self.valid_idx[0]:self.valid_idx[1]],
                    lengths=self.data[rows, self.length_idx[0]:self.length_idx[1]][:, 0],
                    log_prob=self.log_prob[rows])


def _reject_unknown(method: str, args, kwargs) -> None:
  """JetStream declares `*args, **kwargs` on these methods; we take none."""
  if args or kwargs:
    raise TypeError(f"JetStreamEngine.{method} got unexpected arguments {args!r} "
                    f"{sorted(kwargs)}.")


class JetStreamEngine:
  """JetStream's engine API over `engine` (module docstring)."""

  def __init__(self, engine: Engine):
    self.engine = engine

  def load_params(self, params: Any = None, *args, **kwargs) -> Params:
    _reject_unknown("load_params", args, kwargs)
    return self.engine.load_params(params)

  def prefill(self, *, params: Params, existing_prefix: Optional[Prefix] = None,
              padded_tokens: Any, true_length: Any, sampler=None, request_id=None,
              **knobs) -> tuple[Prefix, ResultTokens]:
    """The KV cache of right-padded prompt(s) and sample 0's first token. `padded_tokens` is `[P]`
    (one request) or `[R, P]` (a batch), `true_length` an int or `[R]`; `knobs`:
    `Engine.prefill`'s `rng`, `temperature`, `top_k`, `top_p`, `max_new_tokens`."""
    del request_id
    if existing_prefix is not None:
      raise NotImplementedError("Chunked prefill is not supported (use_chunked_prefill=False).")
    if sampler is not None:
      raise NotImplementedError(
          "A custom `sampler` callable cannot report the log-prob of the distribution it "
          "draws from; use temperature / top_k / top_p.")
    tokens = np.asarray(padded_tokens)
    prefix, tokens_R, lp_R = self.engine.prefill(
        params, tokens[None] if tokens.ndim == 1 else tokens, true_length, sample_first=True,
        **knobs)
    ones_R = jnp.ones_like(tokens_R)
    return prefix, ResultTokens.from_step(tokens_R, ones_R, ones_R, lp_R)

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int,
             request_id=None) -> DecodeState:
    """Puts a one-request prefix into `slot` (its previous content is discarded)."""
    del request_id
    if prefix.logits_RV.shape[0] != 1:
      raise ValueError("insert takes a one-request prefix; use bulk_insert(rows=...) for a batch.")
    return self.engine.insert(prefix, decode_state, [slot])

  def bulk_insert(self, prefix: Prefix, decode_state: DecodeState, slots: Sequence[int],
                  **kwargs) -> DecodeState:
    """One request into every slot of `slots`, as samples 0, 1, ... (independent draws);
    `kwargs`: `Engine.insert`'s (`rows`, `sample_ids`, ...)."""
    return self.engine.insert(prefix, decode_state, slots, **kwargs)

  def generate(self, params: Params, decode_state: DecodeState,
               sampler=None) -> tuple[DecodeState, ResultTokens]:
    """One decode step for every live slot."""
    if sampler is not None:
      raise NotImplementedError("Custom samplers are not supported (no log-prob); see prefill.")
    ds, (tokens_B, lp_B, live_B) = self.engine.generate_step(params, decode_state)
    return ds, ResultTokens.from_step(tokens_B, live_B, ds.num_generated_B, lp_B)

  def free_resource(self, slot: int) -> None:
    """Nothing to free: slots are fixed buffers, and `insert` rebuilds a slot's whole row."""
    del slot

  def init_decode_state(self, *args, **kwargs) -> DecodeState:
    """`Engine.init_decode_state`'s keywords only (JetStream declares `*args, **kwargs`)."""
    known = ("num_slots", "prefill_length", "decode_length", "stop_ids", "prompt_blocks")
    _reject_unknown("init_decode_state", args, {k: v for k, v in kwargs.items()
                                                if k not in known})
    return self.engine.init_decode_state(**kwargs)

  def get_prefix_destination_sharding(self) -> Any:
    """Prefixes stay where prefill put them (one engine does prefill and decode)."""
    return None

  def get_tokenizer(self):
    raise NotImplementedError("Token ids in, token ids out; tokenizers live in mipu_jax.tokenizer.")

  def build_tokenizer(self, metadata):
    raise NotImplementedError("Token ids in, token ids out; tokenizers live in mipu_jax.tokenizer.")

  # JetStream's capacity properties.
  max_concurrent_decodes = property(lambda self: self.engine.config.max_concurrent_decodes)
  samples_per_slot = property(lambda self: 1)
  max_prefill_length = property(lambda self: self.engine.config.max_prefill_length)
  mesh = property(lambda self: self.engine.mesh)
  colocated_cpus = property(lambda self: None)
  use_chunked_prefill = property(lambda self: False)
  prefill_chunk_size = property(lambda self: self.engine.config.max_prefill_length)


def register(engine_cls: type) -> bool:
  """Registers `engine_cls` and `ResultTokens` with JetStream's ABCs, if importable;
  returns whether a `jetstream` package was found."""
  try:
    from jetstream.engine import engine_api  # pylint: disable=g-import-not-at-top
  except Exception:  # noqa: BLE001 - absent or broken install: nothing to register with
    return False
  engine_api.Engine.register(engine_cls)
  engine_api.ResultTokens.register(ResultTokens)
  return True


JETSTREAM_REGISTERED = register(JetStreamEngine)
