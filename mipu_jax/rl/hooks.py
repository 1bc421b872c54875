"""The loop's two extension points: the update gate and checkpoints.

**Update gate** (MIPU Step 2, docs/method.md §5). After the learner step the loop
syncs the candidate parameters into the sampler and calls
`gate(run, candidate, previous, step)`. The gate may probe the sampler (which
now holds μ_{k+1}) and returns a `GateDecision`; on rejection the loop puts
the sampler's pre-update weights back (bitwise: the saved tree itself), and
keeps whatever state the gate returned (`mipu_jax.mipu.resolve_update`:
the previous parameters and optimizer moments, the candidate's counters and
schedule state). With a gate the learner does not
donate its input state, so `previous` is still alive.

**Checkpoints** go through `mipu_jax.checkpoint` (orbax): the learner state
(parameters, optimizer and schedule state, step, RNG) plus JSON metadata (data
position, sampler-sync count, config). The sampler's weights are not saved:
they are a deterministic function of the parameters and are re-synced.
"""

import logging
import os
from typing import Any, Mapping, NamedTuple, Optional, Protocol

from mipu_jax import checkpoint
from mipu_jax.config import CheckpointConfig
from mipu_jax.learner import LearnerState

_log = logging.getLogger(__name__)


class GateDecision(NamedTuple):
  """What a gate decided.

  Attributes:
    state: the learner state to continue from.
    accepted: whether the candidate (and the sampler's new weights) stand.
    metrics: scalars to log (e.g. `mipu/gap_post`).
  """
  state: LearnerState
  accepted: bool
  metrics: Mapping[str, float]


class UpdateGate(Protocol):
  """Accepts or rolls back a candidate update (docs/method.md §5).

  A gate's state (e.g. its decision counters) is checkpointed with the run:
  `state_dict()` returns it as JSON-serialisable data and `load_state_dict`
  puts it back on resume, so a resumed run decides as an uninterrupted one.
  """

  def __call__(self, run: Any, candidate: LearnerState, previous: LearnerState,
               step: int) -> GateDecision:
    ...

  def state_dict(self) -> Mapping[str, Any]:
    ...

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    ...


def open_checkpoints(workdir: str, cfg: CheckpointConfig,
                     ) -> Optional[checkpoint.Checkpointer]:
  """The run's `mipu_jax.checkpoint.Checkpointer`, or None when disabled."""
  if not cfg.enabled:
    _log.info("Checkpoints are disabled (checkpoint.enabled=False).")
    return None
  return checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"),
                                 max_to_keep=cfg.keep)


def should_save(step: int, num_steps: int, cfg: CheckpointConfig) -> bool:
  """Every `cfg.every` steps (if > 0) and at the last step."""
  return step == num_steps or (cfg.every > 0 and step % cfg.every == 0)
