"""Rollouts: prompts → sampler (G responses each, with lp_mu) → rewards (docs/method.md §0–1).

Host side. A `Rollout` holds `N` groups of `G` responses, group-major (response
`i` answers prompt `i // G`), as numpy arrays padded to the response budget
`T = max_new_tokens`. `dynamic_sampling` implements the docs/method.md §1 filter: it
drops groups whose rewards are all equal and over-samples prompts, in rounds of
`N` prompts (one sampler shape, so no recompilation), until the batch is full.
"""

import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from mipu_jax import distributed
from mipu_jax import losses
from mipu_jax import tokenizer as tokenizer_lib
from mipu_jax.tasks import base


@dataclasses.dataclass(frozen=True)
class Rollout:
  """`N` groups of `G` sampled responses with their rewards.

  Attributes:
    problems: `[N]` the prompts' problems.
    prompt_ids: `[N]` encoded prompts (BOS included when used).
    tokens_RT: `[N*G, T]` int32 response ids, padding after each response.
    lp_mu_RT: `[N*G, T]` sampler log-probs (0 on padding).
    mask_RT: `[N*G, T]` 1 on generated tokens (EOS included when emitted).
    lengths_R: `[N*G]` generated tokens per response.
    truncated_R: `[N*G]` bool, the response hit the length budget.
    rewards_R: `[N*G]` float32 rewards.
    group_size: `G`.
    keep_R: `[N*G]` bool, the response counts in the loss (False: filtered
      out by the task, e.g. a truncated response under `truncated=filter`).
    stats: the task's reward counters (`reward/*`), summed over the groups.
    score_seconds: wall time spent scoring the responses (rewards), summed
      over concatenated rollouts.
    routing_RT: MoE with the sampler's routing recorded: int32
      `[N*G, T, L_moe, k]`, each response token's experts (-1 where none);
      else None (docs/method.md §7a).
    prompt_routing_NP: with `routing_RT`: int32 `[N, P, L_moe, k]`, each prompt
      token's experts, -1 after the prompt.
  """
  problems: tuple[base.ProblemLike, ...]
  prompt_ids: tuple[tuple[int, ...], ...]
  tokens_RT: np.ndarray
  lp_mu_RT: np.ndarray
  mask_RT: np.ndarray
  lengths_R: np.ndarray
  truncated_R: np.ndarray
  rewards_R: np.ndarray
  group_size: int
  keep_R: np.ndarray | None = None
  stats: tuple[tuple[str, float], ...] = ()
  score_seconds: float = 0.0
  routing_RT: np.ndarray | None = None
  prompt_routing_NP: np.ndarray | None = None

  def __post_init__(self):
    if self.keep_R is None:
      object.__setattr__(self, "keep_R", np.ones(len(self.rewards_R), bool))

  @property
  def num_groups(self) -> int:
    return len(self.problems)

  def rewards_NG(self) -> np.ndarray:
    """The rewards as `[P, G]`: one row per prompt (group), its G responses."""
    return self.rewards_R.reshape(self.num_groups, self.group_size)

  def select(self, groups: Sequence[int]) -> "Rollout":
    """The rollout of the given groups, in that order."""
    groups = np.asarray(groups, np.int64)
    rows = (groups[:, None] * self.group_size
            + np.arange(self.group_size)[None, :]).reshape(-1)
    return dataclasses.replace(
        self, problems=tuple(self.problems[g] for g in groups),
        prompt_ids=tuple(self.prompt_ids[g] for g in groups),
        tokens_RT=self.tokens_RT[rows], lp_mu_RT=self.lp_mu_RT[rows],
        mask_RT=self.mask_RT[rows], lengths_R=self.lengths_R[rows],
        truncated_R=self.truncated_R[rows], rewards_R=self.rewards_R[rows],
        keep_R=self.keep_R[rows],
        routing_RT=None if self.routing_RT is None else self.routing_RT[rows],
        prompt_routing_NP=(None if self.prompt_routing_NP is None
                           else self.prompt_routing_NP[groups]))


def concat(rollouts: Sequence[Rollout]) -> Rollout:
  """The groups of several rollouts (same `G` and `T`), in order."""
  first = rollouts[0]
  cat = lambda name: np.concatenate([getattr(r, name) for r in rollouts])
  stats: dict[str, float] = {}
  for r in rollouts:
    for k, v in r.stats:
      stats[k] = stats.get(k, 0.0) + v
  routed = first.routing_RT is not None
  prompt_routing = None
  if routed:  # prompts padded to the longest
    p = max(r.prompt_routing_NP.shape[1] for r in rollouts)
    prompt_routing = np.concatenate([
        np.pad(r.prompt_routing_NP, ((0, 0), (0, p - r.prompt_routing_NP.shape[1]),
                                     (0, 0), (0, 0)), constant_values=-1) for r in rollouts])
  return Rollout(
      problems=sum((r.problems for r in rollouts), ()),
      prompt_ids=sum((r.prompt_ids for r in rollouts), ()),
      tokens_RT=cat("tokens_RT"), lp_mu_RT=cat("lp_mu_RT"),
      mask_RT=cat("mask_RT"), lengths_R=cat("lengths_R"),
      truncated_R=cat("truncated_R"), rewards_R=cat("rewards_R"),
      group_size=first.group_size, keep_R=cat("keep_R"),
      stats=tuple(sorted(stats.items())),
      score_seconds=sum(r.score_seconds for r in rollouts),
      routing_RT=cat("routing_RT") if routed else None, prompt_routing_NP=prompt_routing)


def sample_groups(sampler, task: base.Task, problems: Sequence[base.ProblemLike], *,
                  group_size: int, max_new_tokens: int, temperature: float,
                  top_k: int = 0, top_p: float = 1.0, seed: int,
                  score: str = "reward") -> Rollout:
  """Samples `group_size` responses per problem and scores them.

  Args:
    sampler: the inference engine μ.
    task: encodes the prompts and scores the completions (`base.Task`).
    problems: the prompts' problems.
    group_size: G.
    max_new_tokens, temperature, top_k, top_p, seed: sampling settings.
    score: "reward" (training: the task's rewards, truncation policy and
      counters) or "correct" (evaluation: 1.0 where the answer is right).
  """
  prompt_ids = tuple(task.encode(p) for p in problems)
  # Several processes: each samples and scores its share, then all gather.
  part = distributed.process_slice(len(problems))
  out = sampler.generate([list(p) for p in prompt_ids[part]],
                         max_new_tokens=max_new_tokens, temperature=temperature,
                         top_k=top_k or None, top_p=None if top_p >= 1 else top_p,
                         num_samples=group_size, seed=seed, first_prompt_index=part.start)
  completions = [tokenizer_lib.completion_text(task.tokenizer, t) for t in out.tokens]
  repeated = [problems[part.start + i] for i in out.prompt_index]
  truncated_R = np.asarray([f == "length" for f in out.finish_reasons])
  start = time.perf_counter()
  if score == "correct":
    rewards_R = np.asarray(task.correct(repeated, completions), np.float32)
    keep_R, stats = np.ones(len(rewards_R), bool), {}
  else:
    rewards_R, keep_R, stats = task.reward(repeated, completions, truncated_R)
  score_seconds = time.perf_counter() - start
  rows = slice(part.start * group_size, part.stop * group_size)
  total = len(problems) * group_size

  def gather(x, dtype):
    return distributed.allgather(np.asarray(x, dtype), rows, total)

  routing_RT = prompt_routing_NP = None
  if getattr(out, "routing_array", None) is not None:  # MoE with routing recorded
    routing_RT = gather(out.routing_array, np.int32)
    p = max(len(x) for x in prompt_ids)
    local = np.full((len(out.prompt_routing), p) + out.routing_array.shape[2:], -1, np.int32)
    for i, r in enumerate(out.prompt_routing):
      local[i, :len(r)] = r
    prompt_routing_NP = distributed.allgather(local, part, len(problems))
  stat_names = sorted(stats)
  stat_values = gather(np.asarray([[stats[k] for k in stat_names]], np.float64),
                       np.float64).sum(axis=0) if stat_names else []
  return Rollout(
      problems=tuple(problems), prompt_ids=prompt_ids,
      tokens_RT=gather(out.tokens_array, np.int32),
      lp_mu_RT=gather(np.asarray(out.logprobs_array, np.float32) * out.mask, np.float32),
      mask_RT=gather(out.mask, np.float32),
      lengths_R=gather(out.lengths, np.int32),
      truncated_R=gather(truncated_R, bool), rewards_R=gather(rewards_R, np.float32),
      group_size=group_size, keep_R=gather(keep_R, bool),
      stats=tuple(zip(stat_names, map(float, stat_values))), score_seconds=score_seconds,
      routing_RT=routing_RT, prompt_routing_NP=prompt_routing_NP)


def dynamic_sampling(draw: Callable[[int], Rollout], num_groups: int, *,
                     enabled: bool, max_rounds: int):
  """Fills a batch of `num_groups` informative groups (docs/method.md §1).

  Args:
    draw: `draw(round)` samples and rewards one round of `num_groups` fresh
      prompts.
    num_groups: N, groups in the batch.
    enabled: drop all-equal groups; if False one round is used as is.
    max_rounds: rounds before giving up; a batch still short is topped up
      with dropped groups, whose advantage is 0 (they add nothing but shape).

  Returns:
    `(batch_rollout, all_rollout, stats)`: the `num_groups` groups to train on,
    every group sampled this step (for reward and length metrics), and
    `data/*` counters.
  """
  rounds, kept, dropped = [], [], []
  while len(rounds) < (max_rounds if enabled else 1):
    r = draw(len(rounds))
    offset = sum(x.num_groups for x in rounds)
    rounds.append(r)
    flat = losses.all_equal_groups(r.rewards_NG())
    kept += [offset + g for g in np.flatnonzero(~flat)]
    dropped += [offset + g for g in np.flatnonzero(flat)]
    if not enabled or len(kept) >= num_groups:
      break
  everything = concat(rounds)
  chosen = (kept + dropped)[:num_groups] if enabled else list(range(num_groups))
  topped_up = max(num_groups - len(kept), 0) if enabled else 0
  stats = {
      **dict(everything.stats),
      "data/groups_sampled": float(everything.num_groups),
      "data/groups_all_equal": float(len(dropped)),
      "data/groups_dropped": float(len(dropped) - topped_up) if enabled else 0.0,
      "data/groups_topped_up": float(topped_up),
      "data/sampling_rounds": float(len(rounds)),
  }
  return everything.select(sorted(chosen)), everything, stats
