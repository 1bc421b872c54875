r"""MoE against dense under the same samplers, on the same prompts (docs/method.md §7a).

    python -m experiments.moe_vs_dense --out_dir results/moe_study [--report_only]

For the two shipped base policies of the small task (the dense `base_policy` and
the tiny MoE `base_policy_moe`, about the same active parameters), each sampler
(`--precisions`) draws `--samples` responses to each of `--prompts` training
prompts (tiers 4-5, the same prompts and seeds for both models); the fp32
learner then scores them. Printed per (model, sampler): K3 between sampler and
learner (`rollout_corr/k3_kl`'s definition), for the MoE the share of (token,
layer) routing decisions and of tokens the two routed differently, and the K3
under rollout routing replay (the learner replaying the sampler's experts, R3).
The source's claim (Miles: K3 1e-5 to 1e-3 on dense models, 1e-3 to 1e-1 on
MoE) gets a verdict per sampler. Intervals (95%, percentile bootstrap) resample
the prompts, once for both models, since they share prompts and not responses
(`stats.bootstrap_ratio_ci`). Writes `moe_vs_dense.md` and `.json` (with each
prompt's K3 sums, from which the intervals recompute).
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
from mipu_jax.harness import stats
from mipu_jax.learner import logprobs as logprobs_lib
from mipu_jax.models import moe
from mipu_jax.tasks import arithmetic
from mipu_jax.sampler import Sampler
from studies.configs import base
from studies.configs import mismatch
from studies.configs import moe as moe_config

_OUT = flags.DEFINE_string("out_dir", "results/moe_study", "Output directory.")
_PRECISIONS = flags.DEFINE_list("precisions", ["bf16", "fp8", "int4_all"], "Samplers.")
_PROMPTS = flags.DEFINE_integer("prompts", 256, "Training prompts (tiers 4-5).")
_SAMPLES = flags.DEFINE_integer("samples", 4, "Responses per prompt.")
_MAX_NEW = flags.DEFINE_integer("max_new", 256, "Response budget.")
_SEED = flags.DEFINE_integer("seed", 0, "Prompt and sampling seed.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False,
                                 "Sample nothing: rewrite the table from the json in --out_dir.")

SOURCE_RANGES = {"dense": (1e-5, 1e-3), "moe": (1e-3, 1e-1)}


def prompt_sums(lp_pi, lp_mu, loss_mask, prompt_index, n_prompts: int):
  """Per prompt, K3 summed over its responses' tokens and their count: the units
  the intervals resample."""
  sums, counts = [], []
  for p in range(n_prompts):
    rows = np.flatnonzero(np.asarray(prompt_index) == p)
    m = loss_mask[rows]
    k3 = losses.mismatch_metrics(jnp.asarray(np.asarray(lp_pi)[rows]), jnp.asarray(lp_mu[rows]),
                                 jnp.asarray(m))["rollout_corr/k3_kl"]
    sums.append(float(k3) * float(m.sum()))
    counts.append(float(m.sum()))
  return sums, counts


def in_range(lo: float, hi: float, kind: str) -> str:
  """Where an interval lies against the source's range for `kind`."""
  a, b = SOURCE_RANGES[kind]
  return "inside" if a <= lo and hi <= b else "outside" if hi < a or lo > b else "overlaps"


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
  sums = lambda lp: prompt_sums(lp, lp_mu, loss_mask, out.prompt_index, len(prompts))
  k3 = lambda lp: float(losses.mismatch_metrics(jnp.asarray(lp), jnp.asarray(lp_mu),
                                                jnp.asarray(loss_mask))
                        ["rollout_corr/k3_kl"])
  if routing is None:
    lp_pi = score(model, jnp.asarray(tokens), jnp.asarray(mask), None)[0]
    cell["k3_kl"] = k3(lp_pi)
    cell["k3_per_prompt"], cell["tokens_per_prompt"] = sums(lp_pi)
    return cell
  lp_pi, pi_routing = score(model, jnp.asarray(tokens), jnp.asarray(mask), None)
  cell["k3_kl"] = k3(lp_pi)
  cell["k3_per_prompt"], cell["tokens_per_prompt"] = sums(lp_pi)
  cell.update(moe.routing_mismatch(routing, np.asarray(pi_routing), loss_mask))
  lp_r3 = score(model, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(routing))
  cell["k3_kl_r3"] = k3(lp_r3)
  cell["k3_r3_per_prompt"] = sums(lp_r3)[0]
  return cell


def intervals(dense: dict, moe_cell: dict) -> dict:
  """One sampler's K3 per model, MoE / dense and the share R3 removes, each
  `(value, lo, hi)` over prompts resampled together."""
  num = {"dense": dense["k3_per_prompt"], "moe": moe_cell["k3_per_prompt"],
         "r3": moe_cell["k3_r3_per_prompt"]}
  den = {"dense": dense["tokens_per_prompt"], "moe": moe_cell["tokens_per_prompt"],
         "r3": moe_cell["tokens_per_prompt"]}
  ci = lambda f: stats.bootstrap_ratio_ci(num, den, f)
  return {"dense": ci(lambda r: r["dense"]), "moe": ci(lambda r: r["moe"]),
          "moe_over_dense": ci(lambda r: r["moe"] / r["dense"]),
          "r3_removes": ci(lambda r: 1 - r["r3"] / r["moe"])}


def main(argv):
  del argv
  if _REPORT_ONLY.value:
    with open(os.path.join(_OUT.value, "moe_vs_dense.json")) as f:
      write(_OUT.value, json.load(f))
    return
  tok = tasks.make_tokenizer()
  problems = arithmetic.sample_problems(np.random.default_rng(_SEED.value), _PROMPTS.value,
                                        ("tier4", "tier5"))
  prompts = [[tok.bos_id] + tok.encode(p.prompt) for p in problems]
  result = {}
  for kind, path in (("dense", base.BASE_POLICY), ("moe", moe_config.BASE_POLICY_MOE)):
    model = models.from_pretrained(path)
    for precision in _PRECISIONS.value:
      cell = measure(model, precision, prompts, _SEED.value, _MAX_NEW.value, _SAMPLES.value)
      cell["in_source_range"] = in_range(cell["k3_kl"], cell["k3_kl"], kind) == "inside"
      result[f"{kind}/{precision}"] = cell
      print(kind, json.dumps(cell))
  command = "python -m experiments.moe_vs_dense " + " ".join(
      f"--{k}={v}" for k, v in (("prompts", _PROMPTS.value), ("samples", _SAMPLES.value),
                                ("max_new", _MAX_NEW.value), ("seed", _SEED.value)))
  write(_OUT.value, {"command": command, "precisions": list(_PRECISIONS.value),
                     "prompts": _PROMPTS.value, "samples": _SAMPLES.value, "cells": result})


def top_share(cell: dict) -> float:
  """The largest single prompt's share of a cell's summed K3: how heavy the tail is."""
  sums = np.asarray(cell["k3_per_prompt"])
  return float(sums.max() / sums.sum()) if sums.sum() > 0 else 0.0


def write(out_dir: str, record: dict) -> str:
  """`moe_vs_dense.md` (the table, intervals included) and `.json` (the record,
  with the intervals) in `out_dir`; `--report_only` rewrites both from the json."""
  cells = record["cells"]
  lines = ["| sampler | dense K3 [95% CI] | MoE K3 [95% CI] | MoE / dense [95% CI] | "
           "R3 removes of the MoE's K3 [95% CI] | largest prompt's share (dense / MoE) | "
           "routing flips (pair / token) | dense in 1e-5–1e-3 | MoE in 1e-3–1e-1 |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  e = lambda v: f"{v[0]:.2e} [{v[1]:.2e}, {v[2]:.2e}]"
  record["intervals"] = {}
  for p in record["precisions"]:
    d, m = cells[f"dense/{p}"], cells[f"moe/{p}"]
    ci = record["intervals"][p] = intervals(d, m)
    lines.append(
        f"| {p} | {e(ci['dense'])} | {e(ci['moe'])} | {ci['moe_over_dense'][0]:.2f}x "
        f"[{ci['moe_over_dense'][1]:.2f}, {ci['moe_over_dense'][2]:.2f}] | "
        f"{ci['r3_removes'][0]:.0%} [{ci['r3_removes'][1]:.0%}, {ci['r3_removes'][2]:.0%}] | "
        f"{top_share(d):.0%} / {top_share(m):.0%} | "
        f"{m.get('moe/routing_flip_rate', 0):.3f} / {m.get('moe/token_flip_rate', 0):.3f} | "
        f"{in_range(*ci['dense'][1:], 'dense')} | {in_range(*ci['moe'][1:], 'moe')} |")
  lines += ["", f"{record['prompts']} prompts x {record['samples']} responses per cell; "
            "intervals resample prompts (the same draw for both models and R3). "
            f"`{record['command']}`"]
  text = "\n".join(lines)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "moe_vs_dense.md"), "w") as f:
    f.write(text + "\n")
  with open(os.path.join(out_dir, "moe_vs_dense.json"), "w") as f:
    json.dump(record, f, indent=1)
  print(text)
  return text


if __name__ == "__main__":
  app.run(main)
