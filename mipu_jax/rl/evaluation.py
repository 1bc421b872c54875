"""Periodic evaluation of the inference policy μ on the task's evaluation sets.

pass@1 over k samples: the fraction of k responses per problem whose final
answer is right (temperature as configured), averaged over the set's
problems; greedy decoding (temperature 0) uses k = 1. The sampler is the deployed policy, so this is
what the sources' tables report.
"""

from typing import Mapping, Sequence

import numpy as np

from mipu_jax.eval import grading
from mipu_jax.rl.rollout import sample_groups
from mipu_jax.tasks import base


def evaluate(sampler, task: base.Task,
             sets: Mapping[str, Sequence[base.ProblemLike]], *, num_samples: int,
             temperature: float, max_new_tokens: int, seed: int) -> dict[str, float]:
  """pass@1 per set, their mean, its standard error, the mean response length.

  A sample counts as correct when the task says its final answer is right
  (`task.correct`), whatever the training reward's values.

  Returns:
    `{"eval/<set>": pass@1, "eval/avg": mean over sets, "eval/avg_se": the
    standard error of that mean (the sets' `pass_at_1_se`, independent:
    sqrt(Σ se²) / #sets), "eval/response_length": mean generated tokens}`.
  """
  k = 1 if temperature == 0 else num_samples
  metrics, ses, lengths = {}, [], []
  for index, (name, problems) in enumerate(sets.items()):
    r = sample_groups(sampler, task, problems, group_size=k,
                      max_new_tokens=max_new_tokens, temperature=temperature,
                      seed=seed + index, score="correct")
    correct_PG = r.rewards_NG()
    metrics[f"eval/{name}"] = grading.pass_at_1(correct_PG)
    ses.append(grading.pass_at_1_se(correct_PG))
    lengths.append(r.lengths_R)
  metrics["eval/avg"] = float(np.mean([metrics[f"eval/{n}"] for n in sets]))
  metrics["eval/avg_se"] = float(np.sqrt(np.sum(np.square(ses))) / len(ses))
  metrics["eval/response_length"] = float(np.concatenate(lengths).mean())
  return metrics
