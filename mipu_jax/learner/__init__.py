"""The training side π: explicit state, a pure sharded step, log-prob recompute.

docs/method.md §2–4 and §7. Shapes: `B` responses, `T` prompt + response tokens::

  learner = Learner.from_config(cfg, model, mesh)
  state = learner.init_state(params, seed)
  lp_old_BT = learner.logprobs(state.params, tokens_BT, input_mask_BT)
  state, metrics = learner.step(state, batch)
"""

from mipu_jax.learner.batch import abstract_batch
from mipu_jax.learner.batch import Batch
from mipu_jax.learner.batch import host_batch
from mipu_jax.learner.learner import Learner
from mipu_jax.learner.learner import mesh_from_config
from mipu_jax.learner.learner import step_spec
from mipu_jax.learner.logprobs import policy_logprobs
from mipu_jax.learner.logprobs import Scoring
from mipu_jax.learner.state import init_state
from mipu_jax.learner.state import LearnerState
from mipu_jax.learner.state import make_optimizer
from mipu_jax.learner.state import state_shardings
from mipu_jax.learner.step import learner_step
from mipu_jax.learner.step import StepSpec

__all__ = [
    "Batch",
    "Learner",
    "LearnerState",
    "Scoring",
    "StepSpec",
    "abstract_batch",
    "host_batch",
    "init_state",
    "learner_step",
    "make_optimizer",
    "mesh_from_config",
    "policy_logprobs",
    "state_shardings",
    "step_spec",
]
