"""RL losses under training–inference mismatch: pure JAX, no model dependency.

docs/method.md §1 advantages, §2 PPO policy loss, §3 mismatch corrections, §4 metrics.
Shapes: `B` responses, `T` response tokens, `N` groups of `G` responses.
"""

from mipu_jax.losses.advantages import ADVANTAGE_ESTIMATORS
from mipu_jax.losses.advantages import all_equal_groups
from mipu_jax.losses.advantages import compute_advantages
from mipu_jax.losses.advantages import drgrpo_advantages
from mipu_jax.losses.advantages import grpo_advantages
from mipu_jax.losses.advantages import rloo_advantages
from mipu_jax.losses._masked import clamp_log_ratio
from mipu_jax.losses.aggregation import aggregate
from mipu_jax.losses.aggregation import AGGREGATIONS
from mipu_jax.losses.config import CORRECTION_PRESETS
from mipu_jax.losses.config import CorrectionConfig
from mipu_jax.losses.config import LossConfig
from mipu_jax.losses.config import MODES
from mipu_jax.losses.corrections import correction_weights
from mipu_jax.losses.corrections import CRITERIA
from mipu_jax.losses.corrections import IS_LEVELS
from mipu_jax.losses.corrections import IS_MODES
from mipu_jax.losses.corrections import parse_criteria
from mipu_jax.losses.metrics import CORRECTION_METRIC_NAMES
from mipu_jax.losses.metrics import IS_METRIC_NAMES
from mipu_jax.losses.metrics import MISMATCH_METRIC_NAMES
from mipu_jax.losses.metrics import mismatch_metrics
from mipu_jax.losses.metrics import PROBABILITY_METRIC_NAMES
from mipu_jax.losses.metrics import probability_metrics
from mipu_jax.losses.policy import correct_batch
from mipu_jax.losses.policy import Corrected
from mipu_jax.losses.policy import denominator_mask
from mipu_jax.losses.policy import micro_loss
from mipu_jax.losses.policy import MicroTerms
from mipu_jax.losses.policy import policy_loss
from mipu_jax.losses.policy import reference_logprobs
from mipu_jax.losses.policy import token_coefficients
from mipu_jax.losses.ppo import kl_estimate
from mipu_jax.losses.ppo import KL_ESTIMATORS
from mipu_jax.losses.ppo import ppo_token_loss
from mipu_jax.losses.training_metrics import actor_metrics
from mipu_jax.losses.training_metrics import rollout_metrics

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "CORRECTION_METRIC_NAMES",
    "CORRECTION_PRESETS",
    "CRITERIA",
    "CorrectionConfig",
    "Corrected",
    "IS_LEVELS",
    "IS_METRIC_NAMES",
    "IS_MODES",
    "KL_ESTIMATORS",
    "LossConfig",
    "MISMATCH_METRIC_NAMES",
    "MODES",
    "MicroTerms",
    "PROBABILITY_METRIC_NAMES",
    "actor_metrics",
    "aggregate",
    "all_equal_groups",
    "clamp_log_ratio",
    "compute_advantages",
    "correct_batch",
    "correction_weights",
    "denominator_mask",
    "drgrpo_advantages",
    "grpo_advantages",
    "kl_estimate",
    "micro_loss",
    "mismatch_metrics",
    "parse_criteria",
    "policy_loss",
    "ppo_token_loss",
    "probability_metrics",
    "reference_logprobs",
    "rloo_advantages",
    "rollout_metrics",
    "token_coefficients",
]
