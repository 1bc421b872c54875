r"""MoE against dense under the same samplers, on the same prompts (docs/method.md §7a).

    python -m experiments.moe_vs_dense --out_dir results/moe_study

For the two shipped base policies of the small task (the dense `base_policy` and
the tiny MoE `base_policy_moe`, about the same active parameters), each sampler
(`--precisions`) draws `--samples` responses to each of `--prompts` training
prompts (tiers 4-5, the same prompts and seeds for both models); the fp32
learner then scores them. Printed per (model, sampler): K3 between sampler and
learner (`rollout_corr/k3_kl`'s definition), for the MoE the share of (token,
layer) routing decisions and of tokens the two routed differently, and the K3
under rollout routing replay (the learner replaying the sampler's experts, R3).
The source's claim (Miles: K3 1e-5 to 1e-3 on dense models, 1e-3 to 1e-1 on
MoE) gets a verdict per sampler. Writes `moe_vs_dense.md` and `.json`.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags
from flax import nnx

from mipu_jax import losses
from mipu_jax import models
from mipu_jax import tasks
from mipu_jax.learner import logprobs as logprobs_lib
from mipu_jax.models import moe
from mipu_jax.tasks import arithmetic
from mipu_jax.sampler import Sampler
from studies.configs import base
from studies.configs import mismatch
from studies.configs import moe as moe_config

_OUT = flags.DEFINE_string("out_dir", "results/moe_study", "Output directory.")
_PRECISIONS = flags.DEFINE_list("precisions", ["bf16", "fp8", "int4_all"], "Samplers.")
_PROMPTS = flags.DEFINE_integer("prompts", 32, "Training prompts (tiers 4-5).")
_SAMPLES = flags.DEFINE_integer("samples", 4, "Responses per prompt.")
_MAX_NEW = flags.DEFINE_integer("max_new", 256, "Response budget.")
_SEED = flags.DEFINE_integer("seed", 0, "Prompt and sampling seed.")

SOURCE_RANGES = {"dense": (1e-5, 1e-3), "moe": (1e-3, 1e-1)}


def measure(model, precision: str, prompts, seed: int, max_new: int, samples: int) -> dict:
  """One (model, sampler) cell: sample, score with the fp32 learner, compare."""
  tok = tasks.make_tokenizer()
  sampler = Sampler(model, eos_ids=list(tok.stop_ids), pad_id=tok.pad_id,
                    max_decode_length=max_new, return_routing=True,
                    **mismatch.PRECISIONS[precision])
  out = sampler.generate(prompts, max_new_tokens=max_new, num_samples=samples, seed=seed)
  s, t = len(out.tokens), max(len(p) for p in prompts) + max_new + 1
  tokens, mask = np.zeros((s, t), np.int32), np.zeros((s, t), np.float32)
  lp_mu, loss_mask = np.zeros((s, t), np.float32), np.zeros((s, t), np.float32)
  routing = None
  if out.routing_array is not None:
    routing = np.full((s, t) + out.routing_array.shape[2:], -1, np.int32)
  for i, (resp, lp) in enumerate(zip(out.tokens, out.logprobs)):
    p = prompts[out.prompt_index[i]]
    n, r = len(p), len(resp)
    tokens[i, :n], tokens[i, n:n + r] = p, resp
    mask[i, :n + r], lp_mu[i, n:n + r], loss_mask[i, n:n + r] = 1, lp, 1
    if routing is not None:
      routing[i, :n] = out.prompt_routing[out.prompt_index[i]]
      routing[i, n:n + r] = out.routing_array[i, :r]
  score = nnx.jit(lambda m, x, k, r: logprobs_lib.policy_logprobs(
      m, x, k, logprobs_lib.Scoring(), routing_BTLk=r, with_routing=r is None))
  cell = {"precision": precision, "tokens": int(loss_mask.sum())}
  k3 = lambda lp: float(losses.mismatch_metrics(jnp.asarray(lp), jnp.asarray(lp_mu),
                                                jnp.asarray(loss_mask))
                        ["rollout_corr/k3_kl"])
  if routing is None:
    lp_pi = score(model, jnp.asarray(tokens), jnp.asarray(mask), None)[0]
    cell["k3_kl"] = k3(lp_pi)
    return cell
  lp_pi, pi_routing = score(model, jnp.asarray(tokens), jnp.asarray(mask), None)
  cell["k3_kl"] = k3(lp_pi)
  cell.update(moe.routing_mismatch(routing, np.asarray(pi_routing), loss_mask))
  lp_r3 = score(model, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(routing))
  cell["k3_kl_r3"] = k3(lp_r3)
  return cell


def main(argv):
  del argv
  tok = tasks.make_tokenizer()
  problems = arithmetic.sample_problems(np.random.default_rng(_SEED.value), _PROMPTS.value,
                                        ("tier4", "tier5"))
  prompts = [[tok.bos_id] + tok.encode(p.prompt) for p in problems]
  result = {}
  for kind, path in (("dense", base.BASE_POLICY), ("moe", moe_config.BASE_POLICY_MOE)):
    model = models.from_pretrained(path)
    for precision in _PRECISIONS.value:
      cell = measure(model, precision, prompts, _SEED.value, _MAX_NEW.value, _SAMPLES.value)
      lo, hi = SOURCE_RANGES[kind]
      cell["in_source_range"] = lo <= cell["k3_kl"] <= hi
      result[f"{kind}/{precision}"] = cell
      print(kind, json.dumps(cell))
  lines = ["| sampler | dense K3 | MoE K3 | MoE / dense | MoE K3 under R3 | routing flips "
           "(pair / token) | dense in 1e-5–1e-3 | MoE in 1e-3–1e-1 |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for p in _PRECISIONS.value:
    d, m = result[f"dense/{p}"], result[f"moe/{p}"]
    lines.append(
        f"| {p} | {d['k3_kl']:.2e} | {m['k3_kl']:.2e} | {m['k3_kl'] / d['k3_kl']:.2f}x | "
        f"{m['k3_kl_r3']:.2e} | {m.get('moe/routing_flip_rate', 0):.3f} / "
        f"{m.get('moe/token_flip_rate', 0):.3f} | {d['in_source_range']} | "
        f"{m['in_source_range']} |")
  text = "\n".join(lines)
  print(text)
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "moe_vs_dense.md"), "w") as f:
    f.write(text + "\n")
  with open(os.path.join(_OUT.value, "moe_vs_dense.json"), "w") as f:
    json.dump({"command": "python -m experiments.moe_vs_dense " + " ".join(
        f"--{k}={v}" for k, v in (("prompts", _PROMPTS.value), ("samples", _SAMPLES.value),
                                  ("max_new", _MAX_NEW.value), ("seed", _SEED.value))),
               "cells": result}, f, indent=1)


if __name__ == "__main__":
  app.run(main)
