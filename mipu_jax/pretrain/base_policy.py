"""The base policy's evaluation by answer style, and the checkpoint directory it is shipped in.

`evaluate` samples the trained policy with the project's `Sampler` (the
inference policy the RL loop uses) on the held-out tiers and splits accuracy by
answer style: `direct` (the response starts with `A`), `step` (it starts with a
digit: work shown) and `other`. `run` trains (`sft.train`), evaluates and
writes the checkpoint with its README.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from mipu_jax import models
from mipu_jax import tasks
from mipu_jax.tokenizer import completion_text
from mipu_jax.pretrain.sft import PretrainConfig
from mipu_jax.pretrain.sft import train

STYLES = ("direct", "step", "other")


def response_style(completion: str) -> str:
  """`direct` (answers at once), `step` (shows work first) or `other`."""
  if completion.startswith("A"):
    return "direct"
  if completion[:1].isdigit():
    return "step"
  return "other"


def evaluate(model: models.Qwen3, *, seed: int = 0, n_per_tier: int = 128,
             temperature: float = 1.0,
             tiers: Sequence[str] = tasks.TIER_NAMES) -> dict[str, dict[str, Any]]:
  """Samples one response per held-out problem and scores it, by tier and style.

  Args:
    model: the policy.
    seed: seed of the evaluation sets and of the sampler.
    n_per_tier: problems per tier.
    temperature: sampling temperature (0: greedy).
    tiers: tiers to evaluate.

  Returns:
    Per tier: `accuracy`, `mean_length` (generated tokens, EOS included),
    `truncated` (share without EOS), and per style `<style>_share`,
    `<style>_accuracy` (None when the style never occurs) and
    `<style>_length`.
  """
  # Imported here: training alone needs neither the sampler nor its deps.
  from mipu_jax.sampler import Sampler  # pylint: disable=g-import-not-at-top

  tokenizer = tasks.make_tokenizer()
  max_new = tasks.max_completion_len(tiers) + 1
  sampler = Sampler(model, eos_ids=(tokenizer.eos_id,), pad_id=tokenizer.pad_id,
                    max_prefill_length=tasks.max_prompt_len(tiers) + 1,
                    max_decode_length=max_new)
  sets = tasks.eval_sets(seed, n_per_tier)
  results = {}
  for index, tier in enumerate(tiers):
    problems = sets[tier]
    prompts = [[tokenizer.bos_id] + tokenizer.encode(p.prompt) for p in problems]
    out = sampler.generate(prompts, max_new_tokens=max_new, temperature=temperature,
                           seed=seed * 1000 + index)
    completions = [completion_text(tokenizer, t) for t in out.tokens]
    rewards = tasks.reward_batch(problems, completions)
    styles = np.asarray([response_style(c) for c in completions])
    lengths = np.asarray(out.lengths, np.float64)
    row = {"accuracy": float(rewards.mean()), "mean_length": float(lengths.mean()),
           "truncated": float(np.mean([f == "length" for f in out.finish_reasons]))}
    for style in STYLES:
      sel = styles == style
      row[f"{style}_share"] = float(sel.mean())
      row[f"{style}_accuracy"] = float(rewards[sel].mean()) if sel.any() else None
      row[f"{style}_length"] = float(lengths[sel].mean()) if sel.any() else None
    results[tier] = row
  return results


def save(model: models.Qwen3, cfg: PretrainConfig, output_dir: str, *,
         eval_results: dict[str, dict[str, Any]], timing: dict[str, float],
         final_nll: float, command: str) -> None:
  """Writes the checkpoint, `tokenizer_meta.json`, `eval.json` and `README.md`."""
  os.makedirs(output_dir, exist_ok=True)
  models.save_pretrained(model, output_dir)
  tokenizer = tasks.make_tokenizer()
  meta = {
      "tokenizer": "CharTokenizer", "alphabet": tokenizer.alphabet,
      "vocab_size": tokenizer.vocab_size, "pad_id": tokenizer.pad_id,
      "eos_id": tokenizer.eos_id, "bos_id": tokenizer.bos_id, "add_bos": True,
      "task": "mipu_jax.tasks.arithmetic",
      "sequence_format": "[bos] + prompt + completion + [eos]",
      "pretrain_config": dataclasses.asdict(cfg),
  }
  with open(os.path.join(output_dir, "tokenizer_meta.json"), "w") as f:
    json.dump(meta, f, indent=2)
  with open(os.path.join(output_dir, "eval.json"), "w") as f:
    json.dump(eval_results, f, indent=2)
  with open(os.path.join(output_dir, "README.md"), "w") as f:
    f.write(_readme(cfg, eval_results, timing, final_nll, command))


def _pct(x: float | None) -> str:
  return "—" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None) -> str:
  return "—" if x is None else f"{x:.1f}"


def _readme(cfg: PretrainConfig, results: dict[str, dict[str, Any]],
            timing: dict[str, float], final_nll: float, command: str) -> str:
  m = cfg.model_config()
  rows = "\n".join(
      f"| {t} | {_pct(r['accuracy'])} | {_pct(r['step_share'])} "
      f"| {_pct(r['direct_accuracy'])} | {_pct(r['step_accuracy'])} "
      f"| {_num(r['mean_length'])} | {_num(r['direct_length'])} "
      f"| {_num(r['step_length'])} |" for t, r in results.items())
  dims = (f"vocab {m.vocab_size}, D={m.hidden_size}, L={m.num_layers}, "
          f"N={m.num_heads}, K={m.num_kv_heads}, H={m.head_dim}, "
          + (f"E={m.num_experts} experts of F={m.moe_intermediate_size}, top-"
             f"{m.num_experts_per_tok}, norm_topk_prob={m.norm_topk_prob}, "
             f"{m.num_active_params():,} active" if m.is_moe else f"F={m.intermediate_size}"))
  kind = "Qwen3-MoE" if m.is_moe else "Qwen3"
  return f"""# Base policy of the small CPU task

A {m.num_params():,}-parameter {kind} ({dims}; tied embeddings, fp32) pretrained
by supervised next-token prediction on the multi-operand addition task
(`mipu_jax.tasks.arithmetic`): the starting policy of the RL runs.
Written by `experiments/pretrain_base.py` (logic in `mipu_jax/pretrain/`).

- **Tokenizer**: `mipu_jax.tasks.make_tokenizer()` (characters; pad 0, eos 1,
  bos 2). Prompts are `[bos] + prompt`; the model continues with the
  completion and EOS. `tokenizer_meta.json` records this and the config.
- **Data**: `tasks.sft_examples` over {", ".join(cfg.tiers)}; loss on the
  completion and EOS tokens. Direct answers (`A104.`) are wrong
  {100 * cfg.direct_error_rate:.0f}% of the time by construction, step-by-step
  ones (`37+48=85;85+19=104;A104.`) never.
- **Curriculum**: steps 1–{cfg.skill_steps} draw step-by-step answers with
  probability {cfg.skill_cot_fraction} (the arithmetic is learnt from worked
  answers); the last {cfg.steps - cfg.skill_steps} steps use the final mix
  `cot_fraction={cfg.cot_fraction}`, which sets the prior over answer styles.
- **Training**: {cfg.steps} AdamW steps of {cfg.batch_size} sequences, peak LR
  {cfg.learning_rate}; final NLL per target token {final_nll:.3f} (mean of the
  last 20 steps, final mix). Time: {timing["wall_s"] / 60:.1f} min wall-clock,
  {timing["cpu_s"] / 60:.1f} CPU-min (training and evaluation, 2 CPU cores
  shared with other jobs).
- **Command**: `{command}`

## Accuracy of the base policy

One sample per held-out problem (`tasks.eval_sets(seed={cfg.eval_seed},
n_per_tier={cfg.eval_per_tier})`) at temperature {cfg.eval_temperature}, drawn
with `mipu_jax.sampler.Sampler` (fp32). A response is *step by step* when it
starts with a digit (work shown) and *direct* when it starts with `A`. Lengths
are generated tokens, EOS included.

| tier | accuracy | step-by-step share | direct acc. | step-by-step acc. | mean length | direct length | step length |
| --- | --- | --- | --- | --- | --- | --- | --- |
{rows}

What RL needs from it: accuracy clearly above zero but far from
one, and step-by-step answers more accurate than direct ones, so that a reward
for correctness moves the policy to show its work and response length grows
towards the "step length" column. `eval.json` holds these numbers and the
share of malformed (`other`) responses.
"""


def run(cfg: PretrainConfig, output_dir: str, *, command: str = "",
        progress: bool = True) -> dict[str, dict[str, Any]]:
  """Trains, evaluates and writes the base policy into `output_dir`.

  Returns:
    `evaluate`'s per-tier results.
  """
  wall, cpu = time.perf_counter(), time.process_time()
  model, nll = train(cfg, progress=progress)
  results = evaluate(model, seed=cfg.eval_seed, n_per_tier=cfg.eval_per_tier,
                     temperature=cfg.eval_temperature)
  # CPU time (all threads) is the figure that does not depend on other jobs.
  timing = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
  save(model, cfg, output_dir, eval_results=results, timing=timing,
       final_nll=float(np.mean(nll[-20:])), command=command)
  return results
