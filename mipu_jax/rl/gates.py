"""Update gates of the RL loop: MIPU Step 2 and the random-rollback baseline (docs/method.md §5).

Both implement `UpdateGate`; the formulas (gap, margin, decision,
rollback, counters) are `mipu_jax.mipu`'s, the gates only gather the probe.
The loop has already synced the candidate θ_{k+1} into the sampler (μ_{k+1})
when it calls `gate(run, candidate, previous, step)`; on rejection it puts the
sampler's pre-update weights back itself (the saved tree itself, bitwise). With
a gate the learner does not donate its input state, so `previous` is alive. A rollback (`mipu.resolve_update`) returns the `previous`
state's parameter and optimizer-moment trees themselves, so they are bitwise
the pre-update ones; the update counter `step`, the shuffling RNG and the
learning-rate schedule's state come from the candidate, i.e. they advance, as
does the loop's data position (its step index) (docs/method.md §5–6).

All gate randomness (probe prompts, probe samples, random-rollback coins)
derives from `(mipu.seed, step)`, so a resumed run decides exactly as an
uninterrupted one; the only gate state is `MipuCounters`, which the loop
checkpoints through `state_dict` / `load_state_dict`.

Probes:

- `fresh` (default, docs/method.md §5): `G = data.group_size` responses for each of
  `num_probe_prompts` prompts of the task's held-out "probe" split.
- `next_batch`: the prompts and sampling seed of the first dynamic-sampling
  round of the next training step (`step.collect(run, step + 1)` draws exactly
  these from μ_{k+1} when the update is accepted). Differences from the
  source's variant: the loop does not reuse the probe's responses for that
  training step (they are sampled again, identically when accepted), so this
  mode is not cheaper than `fresh` here; its probe has `prompts_per_step`
  groups and follows the training prompt distribution (train split) rather
  than the held-out probe split; all-equal groups are kept (they add 0 to
  `T̂_post`), no dynamic-sampling over-sampling is done.
"""

import time
from typing import Any, Mapping, NamedTuple, Optional, Protocol

import jax
import numpy as np

from mipu_jax import distributed
from mipu_jax import mipu
from mipu_jax.config import MipuConfig, TrainConfig
from mipu_jax.learner import LearnerState
from mipu_jax.models import sharding
from mipu_jax.rl import batching
from mipu_jax.rl import rollout as rollout_lib
from mipu_jax.rl import seeds
from mipu_jax.tasks import base

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


# Stream tags keeping the gate's randomness apart from the loop's.
_PROBE_STREAM = base.PROBE_STREAM
_COIN_STREAM = 0x636f696e  # "coin"


class _CountingGate:
  """The decision's bookkeeping, all through `mipu_jax.mipu`.

  Counters are `mipu.MipuCounters` (`update_counters`, `counter_metrics`),
  checkpointed as JSON by the loop (`state_dict` / `load_state_dict`, the
  `UpdateGate` protocol); the state to continue from is
  `mipu.resolve_update`'s.
  """

  def __init__(self):
    self.counters = mipu.init_counters()

  def state_dict(self) -> dict[str, int]:
    """JSON form of the `MipuCounters` (checkpoint metadata)."""
    return {k: int(v) for k, v in self.counters._asdict().items()}

  def load_state_dict(self, d: Mapping[str, int]) -> None:
    self.counters = mipu.MipuCounters(
        **{k: np.int32(d[k]) for k in mipu.MipuCounters._fields})

  def _decide(self, accepted: bool, candidate: LearnerState,
              previous: LearnerState, metrics: dict[str, float],
              ) -> GateDecision:
    """Counts the decision; returns the state to continue from (docs/method.md §5)."""
    self.counters = mipu.update_counters(self.counters, accepted)
    metrics.update({k: float(v) for k, v in
                    mipu.counter_metrics(self.counters, accepted).items()})
    state = mipu.resolve_update(accepted, candidate, previous)
    return GateDecision(state, accepted, metrics)


class MipuGate(_CountingGate):
  """MIPU Step 2: accept iff `T̂_post ≥ -c` on probes from μ_{k+1} (docs/method.md §5).

  Args:
    cfg: the `mipu` section.
    seed: the run seed (the `next_batch` probe uses the loop's data seeds).
  """

  def __init__(self, cfg: MipuConfig, seed: int = 0):
    super().__init__()
    self.cfg, self.run_seed = cfg, seed

  def probe(self, run: Any, step: int) -> rollout_lib.Rollout:
    """The probe rollout of step `step`, drawn from the sampler's current μ."""
    data, s = run.cfg.data, run.cfg.sampling
    if self.cfg.probe == "next_batch":
      problems = run.task.sample(data.prompts_per_step, seed=self.run_seed,
                                 step=step + 1, round=0)
      seed = seeds.seed(self.run_seed, step + 1, 0)
    else:
      problems = run.task.sample(self.cfg.num_probe_prompts, seed=self.cfg.seed,
                                 step=step, split="probe")
      seed = seeds.seed(self.cfg.seed, _PROBE_STREAM, step)
    return rollout_lib.sample_groups(
        run.sampler, run.task, problems, group_size=data.group_size,
        max_new_tokens=s.max_new_tokens, temperature=s.temperature,
        top_k=s.top_k, top_p=s.top_p, seed=seed)

  def gap(self, run: Any, params: Any, probe: rollout_lib.Rollout, old_params: Any = None,
          ) -> tuple[float, dict[str, float]]:
    """`T̂_post` of `probe` under the learner's `params` (docs/method.md §5).

    On an MoE policy under routing replay the probe's log-probs are routed as
    the update's are (docs/method.md §7a): R3 replays the probe's own sampler
    routing, R2 the routing the learner's `old_params` (the pre-update policy)
    give the probe.
    """
    tokens_BT, input_mask_BT, loss_mask_BT, lp_mu_BT = batching.pad_and_concat(
        probe, run.seq_len)
    b = tokens_BT.shape[0]
    padded = _row_multiple(run, b)
    pad = ((0, padded - b), (0, 0))
    tokens_BT, input_mask_BT = np.pad(tokens_BT, pad), np.pad(input_mask_BT, pad)
    replay, routing = run.cfg.moe.routing_replay, None
    if replay == "rollout":
      routing = np.pad(batching.routing_rows(probe, run.seq_len),
                       pad + ((0, 0), (0, 0)), constant_values=-1)
    elif replay == "learner":
      _, routing = run.learner.logprobs(old_params, tokens_BT, input_mask_BT,
                                        with_routing=True)
      routing = np.asarray(distributed.to_host(routing))
    if routing is None:
      lp_new_BT = run.learner.logprobs(params, tokens_BT, input_mask_BT)
    else:
      lp_new_BT = run.learner.logprobs(params, tokens_BT, input_mask_BT, routing_BTLk=routing)
    lp_new_BT = np.asarray(distributed.to_host(lp_new_BT))[:b]
    t_post, metrics = mipu.gap_post(lp_new_BT, lp_mu_BT, loss_mask_BT,
                                    probe.rewards_R, probe.group_size)
    return float(t_post), {k: float(v) for k, v in metrics.items()}

  def __call__(self, run: Any, candidate: LearnerState, previous: LearnerState,
               step: int) -> GateDecision:
    t0 = time.perf_counter()
    probe = self.probe(run, step)
    t1 = time.perf_counter()
    t_post, metrics = self.gap(run, candidate.params, probe, previous.params)
    c = mipu.margin(self.cfg.c, metrics["mipu/gap_post_se"],
                    self.cfg.c_noise_multiple)
    accepted = bool(mipu.accept(t_post, c))
    metrics.update({
        "mipu/c": float(c),
        "mipu/probe_response_length": float(probe.lengths_R.mean()),
        "perf/gate_probe_seconds": t1 - t0,
        "perf/gate_seconds": time.perf_counter() - t0,
    })
    return self._decide(accepted, candidate, previous, metrics)


class RandomRollbackGate(_CountingGate):
  """Rejects each update i.i.d. with probability `p` (docs/method.md §5 baseline).

  The coin of step `k` is `mipu.random_accept` with the key
  `fold_in(key(seed ^ "coin"), k)`: it does not depend on the history, so a
  resumed run flips the same coins.
  """

  def __init__(self, p: float, seed: int = 0):
    super().__init__()
    if not 0.0 <= p <= 1.0:
      raise ValueError(f"need 0 <= p <= 1, got {p}.")
    self.p, self.seed = float(p), int(seed)
    self._key = jax.random.key(seeds.seed(self.seed, _COIN_STREAM))

  def __call__(self, run: Any, candidate: LearnerState, previous: LearnerState,
               step: int) -> GateDecision:
    del run
    accepted = bool(_coin(jax.random.fold_in(self._key, int(step)), self.p))
    return self._decide(accepted, candidate, previous, {})


_coin = jax.jit(mipu.random_accept)


def _row_multiple(run: Any, b: int) -> int:
  """Smallest row count ≥ `b` that `Learner.logprobs` accepts."""
  learner = run.learner
  chunks = learner.spec.num_minibatches * learner.spec.num_microbatches
  dp = sharding.row_shards(learner.mesh)
  unit = chunks * dp
  return -(-b // unit) * unit


def from_config(cfg: TrainConfig) -> Optional[UpdateGate]:
  """The run's gate: `MipuGate`, `RandomRollbackGate`, or None (docs/method.md §5)."""
  m = cfg.mipu
  if m.step2:
    return MipuGate(m, seed=cfg.seed)
  if m.random_rollback_p > 0:
    return RandomRollbackGate(m.random_rollback_p, seed=m.seed)
  return None
