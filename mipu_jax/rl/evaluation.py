"""Periodic evaluation of the inference policy μ on the task's evaluation sets,
and optionally of the learner's policy π at full precision.

pass@1 over k samples: the fraction of k responses per problem whose final
answer is right (temperature as configured), averaged over the set's
problems; greedy decoding (temperature 0) uses k = 1. The sampler is the deployed policy, so this is
what the sources' tables report (`eval/*`). With `eval.pi` the same problems
are sampled with the same seeds from a full-precision sampler holding the
learner's parameters (`eval_pi/*`): μ's score minus π's is what serving the
quantized model costs at that point, apart from what training did to π.
"""

import time
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from mipu_jax.math_eval import grading
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


def evaluate_policies(sampler, pi_sampler: Optional[Any], params: Any, task: base.Task,
                      sets: Mapping[str, Sequence[base.ProblemLike]], *,
                      num_samples: int, temperature: float, max_new_tokens: int,
                      seed: int) -> dict[str, float]:
  """μ's evaluation (`evaluate`), and π's as `eval_pi/*` when `pi_sampler` is given.

  Args:
    sampler: the inference engine μ, holding the weights to evaluate.
    pi_sampler: a full-precision sampler for π (None: μ only). When it is
      `sampler` itself (μ is full precision), π's numbers are μ's, not
      sampled again.
    params: the learner's parameters, loaded into `pi_sampler` before it samples.
    task, sets, num_samples, temperature, max_new_tokens, seed: as `evaluate`.

  Returns:
    `evaluate`'s metrics, `perf/eval_seconds` (μ's wall time) and, with
    `pi_sampler`, the same metrics under `eval_pi/` and `perf/eval_pi_seconds`
    (the weight sync included; 0 when nothing was recomputed).
  """
  kw = dict(num_samples=num_samples, temperature=temperature,
            max_new_tokens=max_new_tokens, seed=seed)
  start = time.perf_counter()
  metrics = evaluate(sampler, task, sets, **kw)
  metrics["perf/eval_seconds"] = time.perf_counter() - start
  if pi_sampler is None:
    return metrics
  start = time.perf_counter()
  if pi_sampler is sampler:
    pi = metrics
  else:
    pi_sampler.update_weights(params)
    pi = evaluate(pi_sampler, task, sets, **kw)
  metrics.update({"eval_pi/" + k[len("eval/"):]: v for k, v in pi.items()
                  if k.startswith("eval/")})
  metrics["perf/eval_pi_seconds"] = time.perf_counter() - start
  return metrics
