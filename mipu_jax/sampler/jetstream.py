"""JetStream's result types, and the one place that imports `jetstream` (docs/method.md §7).

`ResultTokens` has JetStream's layout (`jetstream/engine/engine_api.py`) and
carries `log_prob` as a pytree field: JetStream's is a static field that
`get_result_at_slot` drops; here it also comes back through single-slot access,
because `lp_mu` is the point of the engine (`mipu_jax/sampler/engine.py`).

Why not depend on JetStream. The PyPI package `google-jetstream` (0.2.2, 2024)
has the old signatures (no `request_id`, `bulk_insert`, chunked prefill), no
log-probs in `ResultTokens`, pulls TensorFlow into the install, its orchestrator
does not run on current JAX, and the project is archived. So we own the
interface and, when a `jetstream` package is importable, `register` makes the
engine and `ResultTokens` virtual subclasses of its ABCs so JetStream-typed code
accepts them.
"""

from typing import Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class SlotData:
  """Tokens, validity, lengths and log-probs of one slot's samples."""

  tokens: Union[jax.Array, np.ndarray]
  valid: Union[jax.Array, np.ndarray]
  lengths: Union[jax.Array, np.ndarray]
  log_prob: Union[jax.Array, np.ndarray, None] = None


@struct.dataclass
class ResultTokens:
  """One step's tokens for every slot, JetStream layout plus `log_prob`.

  `data[:, tokens_idx]` are the tokens, `data[:, valid_idx]` 1 where the slot
  produced a token this step, `data[:, length_idx]` the number of tokens the
  slot has generated so far (including this one). `log_prob[b, 0]` is the
  token's log-prob under the distribution it was drawn from.
  """

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


def register(engine_cls: type) -> bool:
  """Registers `engine_cls` and `ResultTokens` with JetStream's ABCs, if importable.

  Args:
    engine_cls: the class implementing JetStream's `Engine` interface.

  Returns:
    Whether a `jetstream` package was found and the classes registered.
  """
  try:
    from jetstream.engine import engine_api  # pylint: disable=g-import-not-at-top
  except Exception:  # noqa: BLE001 - absent or broken install: nothing to register with
    return False
  engine_api.Engine.register(engine_cls)
  engine_api.ResultTokens.register(ResultTokens)
  return True
