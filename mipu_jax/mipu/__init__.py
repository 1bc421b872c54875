"""MIPU Step 2: inference-gap-aware acceptance and exact rollback (docs/method.md §5).

Pure functions; the RL loop's gates (`mipu_jax.rl.gates`) compose them::

  t_post, metrics = gap_post(lp_new_BT, lp_mu_new_BT, mask_BT, rewards_B, G)
  c = margin(c, metrics["mipu/gap_post_se"], noise_multiple)  # fixed or k·SE
  accepted = accept(t_post, c)            # or random_accept(key, p)
  state = resolve_update(accepted, candidate_state, previous_state)
  counters = update_counters(counters, accepted)
  metrics |= counter_metrics(counters, accepted)

Rollback is a functional select over the learner state (see `acceptance`).
Step 1 is the ``mipu_step1`` correction preset, not part of this package.
"""

from mipu_jax.mipu.acceptance import accept
from mipu_jax.mipu.acceptance import DEFAULT_C
from mipu_jax.mipu.acceptance import margin
from mipu_jax.mipu.acceptance import random_accept
from mipu_jax.mipu.acceptance import resolve_opt_state
from mipu_jax.mipu.acceptance import resolve_update
from mipu_jax.mipu.acceptance import select_tree
from mipu_jax.mipu.counters import counter_metrics
from mipu_jax.mipu.counters import init_counters
from mipu_jax.mipu.counters import MipuCounters
from mipu_jax.mipu.counters import rollback_rate
from mipu_jax.mipu.counters import update_counters
from mipu_jax.mipu.gap import gap_post

__all__ = [
    "DEFAULT_C",
    "MipuCounters",
    "accept",
    "counter_metrics",
    "gap_post",
    "init_counters",
    "margin",
    "random_accept",
    "resolve_opt_state",
    "resolve_update",
    "rollback_rate",
    "select_tree",
    "update_counters",
]
