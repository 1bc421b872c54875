"""`Sampler`: batched generation with log-probs for the RL loop (docs/method.md §0, §7).

`generate` runs the engine (`engine.py`) and nothing else: prompts are
prefilled in chunks, their `num_samples` independent samples inserted into at
most `max_concurrent_decodes` decode slots, and the engine's decode step runs
in a `lax.while_loop` until enough slots finished; those are harvested and
refilled with the next samples (continuous batching, each slot with its own
cache write index), until every sample is done. Prompt length, slot count and
`max_new_tokens` are bucketed (`SamplerConfig`), so a run compiles each
function once per bucket. With a mesh, the decode state (the KV cache) is
sharded: slots over the data axes, KV heads over `tensor`.

Randomness: sample `j` of prompt `i` draws its t-th token with key
`fold_in(fold_in(fold_in(key(seed), i), j), t)`, independent of batch size,
buckets, chunking, slot placement and refill order.
"""

import dataclasses
import time
import warnings
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mipu_jax.models.qwen3 import Qwen3
from mipu_jax.sampler.config import SamplerConfig
from mipu_jax.sampler.engine import Engine, Params
from mipu_jax.sampler.scheduler import SlotScheduler
from mipu_jax.sampler.state import FINISH_NAMES


@dataclasses.dataclass(frozen=True)
class SampleOutput:
  """Generated samples, prompt-major: sample `s` is sample `s % G` of prompt `s // G`.

  Attributes:
    tokens: generated ids per sample (EOS / stop id included when hit).
    logprobs: `lp_mu` per generated token, aligned with `tokens`.
    lengths: `[S]` number of generated tokens.
    finish_reasons: 'stop' (a stop id) or 'length' (`max_new_tokens` or cache full).
    tokens_array: `[S, max_new_tokens]` int32, `pad_id` after the end.
    logprobs_array: `[S, max_new_tokens]` float32, 0 after the end.
    mask: `[S, max_new_tokens]` float32, 1 on generated tokens.
    prompt_index: `[S]` which prompt each sample answers.
    routing_array: MoE with `return_routing`: int32 `[S, max_new_tokens, L_moe, k]`,
      each generated token's experts per MoE layer (-1 after the end and at a
      response's last token, which the sampler never feeds back); else None.
    prompt_routing: with `routing_array`: per prompt, int32 `[len, L_moe, k]`,
      its tokens' experts at prefill (shared by its samples); else None.
  """

  tokens: list[list[int]]
  logprobs: list[list[float]]
  lengths: np.ndarray
  finish_reasons: list[str]
  tokens_array: np.ndarray
  logprobs_array: np.ndarray
  mask: np.ndarray
  prompt_index: np.ndarray
  routing_array: Optional[np.ndarray] = None
  prompt_routing: Optional[list[np.ndarray]] = None


def _check_prompts(prompts: Sequence[Sequence[int]], cfg: SamplerConfig, vocab: int):
  if not prompts:
    raise ValueError("generate() needs at least one prompt.")
  for i, p in enumerate(prompts):
    if len(p) == 0:
      raise ValueError(f"Prompt {i} is empty: every prompt needs at least one token.")
    if len(p) > cfg.max_prefill_length:
      raise ValueError(f"Prompt {i} has {len(p)} tokens, more than max_prefill_length="
                       f"{cfg.max_prefill_length}.")
    if min(p) < 0 or max(p) >= vocab:
      raise ValueError(f"Prompt {i} has token ids outside [0, {vocab}).")


class Sampler:
  """The inference policy μ: a Qwen3 at the sampler's precision, with its own log-probs.

  Args:
    model: the learner's Qwen3; its current weights are loaded.
    dtype: compute dtype ('float32' / 'bfloat16' / 'float16' or a dtype).
    weight_quant: None, 'int8', 'fp8_e4m3', 'fp8_e5m2', 'int4'.
    act_quant: None, 'int8', 'fp8'.
    kv_cache_dtype: None (= dtype), 'bf16', 'fp8', 'int8', ...
    eos_ids: stop ids (a generate call may override them).
    mesh: sampling mesh, or None.
    **config: any other `SamplerConfig` field (quant_lm_head, quant_storage,
      max_prefill_length, max_decode_length, pad_id, bucket floors, ...).
  """

  def __init__(self, model: Qwen3, *, dtype: Any = jnp.float32, weight_quant: Optional[str] = None,
               act_quant: Optional[str] = None, kv_cache_dtype: Any = None,
               eos_ids: Sequence[int] = (), mesh: Optional[jax.sharding.Mesh] = None, **config):
    self.config = SamplerConfig(dtype=dtype, weight_quant=weight_quant, act_quant=act_quant,
                                kv_cache_dtype=kv_cache_dtype, stop_ids=tuple(eos_ids), **config)
    self.engine = Engine(model, self.config, mesh=mesh)
    self.last_sync_seconds = 0.0
    self._params = None
    self.update_weights(model)

  @property
  def params(self) -> Params:
    """The sampling params (cast / quantized). Assign saved ones back to roll back bitwise."""
    return self._params

  @params.setter
  def params(self, value: Params) -> None:
    if jax.tree.structure(value) != jax.tree.structure(self._params):
      raise ValueError("Sampler.params must have the structure the sampler produced.")
    self._params = value

  def update_weights(self, learner: Any) -> None:
    """Weight sync: learner params → reshard → (re)quantize. Time in `last_sync_seconds`."""
    start = time.perf_counter()
    params = jax.block_until_ready(self.engine.load_params(learner))
    self._params = params
    self.last_sync_seconds = time.perf_counter() - start

  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               temperature: float = 1.0, top_k: Optional[int] = None,
               top_p: Optional[float] = None, num_samples: int = 1, seed: int = 0,
               eos_ids: Optional[Sequence[int]] = None,
               first_prompt_index: int = 0) -> SampleOutput:
    """Samples `num_samples` responses per prompt; see `SampleOutput` and `sampling.py`.

    `first_prompt_index`: the index of `prompts[0]` in a larger batch whose
    other prompts another process samples: prompt `i` here draws as prompt
    `first_prompt_index + i` of the whole batch.
    """
    cfg = self.config
    _check_prompts(prompts, cfg, self.engine.model_config.vocab_size)
    if max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}.")
    if num_samples < 1:
      raise ValueError(f"num_samples must be ≥ 1, got {num_samples}.")
    if temperature < 0 or (top_k is not None and top_k < 1) or (
        top_p is not None and not 0 < top_p <= 1):
      raise ValueError("Need temperature ≥ 0, top_k ≥ 1 and 0 < top_p ≤ 1.")
    truncates = top_k is not None or (top_p is not None and top_p < 1)
    if truncates and cfg.true_on_policy:
      raise ValueError("true_on_policy samples the full distribution: the learner's "
                       "log-softmax has no top-k / top-p (docs/method.md §7).")
    if truncates:
      warnings.warn(
          "top-k/top-p sampling: lp_mu is the log-prob of the truncated, renormalised "
          "distribution; compute lp_old with mipu_jax.sampler.truncated_logprobs, and note "
          "that the PPO ratio of truncated policies is biased (docs/method.md §0).", stacklevel=2)
    return self._generate(prompts, max_new_tokens, temperature, top_k, top_p,
                          num_samples, seed, eos_ids, first_prompt_index)

  def _generate(self, prompts, max_new_tokens, temperature, top_k, top_p, g, seed,
                eos_ids, offset) -> "SampleOutput":
    """The refill loop: at most `max_concurrent_decodes` samples decode at once.

    Prompts are prefilled in chunks when their first sample is due; the
    scheduler (`scheduler.py`) admits samples into free slots, and a slot whose
    sample finished is harvested and refilled. With every sample fitting in
    the slots this is one prefill, one insert and one decode loop.
    """
    cfg, engine, params = self.config, self.engine, self._params
    r = len(prompts)
    total = r * g
    p = cfg.prefill_bucket(max(len(x) for x in prompts))
    n_bucket = cfg.decode_bucket(max_new_tokens)
    parts = engine.pool_parts  # slots and prompt blocks split evenly over the row shards
    slots = -(-min(cfg.slot_bucket(total), max(cfg.max_concurrent_decodes, 1)) // parts) * parts
    chunk = max(1, slots // g)  # prompts per prefill call
    base_key = jax.random.key(seed)
    # Programs without top-k / top-p where this call has none: they compile
    # faster, and a call always runs the same programs (its draws never depend
    # on what the sampler ran before).
    truncation = bool(top_k) or (top_p is not None and top_p < 1.0)
    # The paged cache holds each prompt once for its g samples (prompt blocks):
    # room for the prompts of one full wave of a shard's slots and the next one's first.
    per = slots // parts
    num_blocks = min(per, -(-per // g) + 1) * parts
    state = engine.init_decode_state(num_slots=slots, prefill_length=p, decode_length=n_bucket,
                                     stop_ids=eos_ids, prompt_blocks=num_blocks)
    scheduler = SlotScheduler(total, g, slots, num_blocks, parts)
    prefixes: dict[int, Any] = {}  # chunk -> its prefix, until its samples are all admitted
    done: list[Any] = [None] * total  # sample -> (tokens, log-probs, finish reason[, routing])
    routed = engine.records_routing
    prompt_routing: list[Any] = [None] * r

    def prefix_of(c: int):
      if c not in prefixes:
        ids = list(range(c * chunk, min((c + 1) * chunk, r)))
        rb = cfg.slot_bucket(len(ids))
        tokens_RP = np.full((rb, p), cfg.pad_id, np.int32)
        lengths_R = np.ones((rb,), np.int32)  # padding rows: a 1-token dummy, never inserted
        for k, i in enumerate(ids):
          tokens_RP[k, :len(prompts[i])] = prompts[i]
          lengths_R[k] = len(prompts[i])
        # Request i draws with fold_in(key(seed), i) whatever its chunk.
        prefixes[c] = engine.prefill(
            params, tokens_RP, lengths_R, rng=base_key, first_request=offset + c * chunk,
            temperature=temperature, top_k=top_k or 0, top_p=1.0 if top_p is None else top_p,
            max_new_tokens=max_new_tokens)
        if routed:
          rp = np.asarray(jax.device_get(prefixes[c].routing_RPLk))
          for k, i in enumerate(ids):
            prompt_routing[i] = rp[k, :len(prompts[i])]
      return prefixes[c]

    while True:
      by_chunk: dict[int, list] = {}
      for a in scheduler.admit():
        by_chunk.setdefault(a.sample // g // chunk, []).append(a)
      for c, items in sorted(by_chunk.items()):
        state = engine.insert(
            prefix_of(c), state, [a.slot for a in items],
            rows=[a.sample // g - c * chunk for a in items],
            sample_ids=[a.sample % g for a in items], prompt_blocks=[a.block for a in items],
            fill=[a.fill for a in items], truncation=truncation)
      for c in [c for c in prefixes if (c + 1) * chunk * g <= scheduler.next_sample]:
        del prefixes[c]  # every sample of this chunk is in a slot
      busy = scheduler.busy
      if not busy:
        break
      if max_new_tokens > 1:  # with one token, every slot is done after insert
        if scheduler.all_admitted:
          state = engine.generate_until_done(params, state, truncation=truncation)
        else:
          want = scheduler.emptied + max(1, len(busy) // 4)  # a quarter of the busy slots
          state = engine.generate_until_free(params, state, want,
                                             truncation=truncation)
      done_B, n_B, fin_B = jax.device_get((state.done_B, state.num_generated_B,
                                           state.finish_B))
      harvest = [b for b in busy if done_B[b]]
      if harvest:
        # Every row (B x N x 8 bytes: 16 MB at 256 x 8,192) rather than a
        # gather of the finished ones: no eager op to compile on a first call.
        tok, lp = jax.device_get((state.tokens_BN, state.logprobs_BN))
        rt = np.asarray(jax.device_get(state.routing_BNLk)) if routed else None
        for b in harvest:
          n = int(n_B[b])
          done[scheduler.release(b)] = (tok[b, :n].tolist(), lp[b, :n].tolist(),
                                        FINISH_NAMES[int(fin_B[b])],
                                        None if rt is None else rt[b, :n])
    out = self._assemble(done, g, max_new_tokens)
    if not routed:
      return out
    routing = np.full((total, max_new_tokens) + done[0][3].shape[1:], -1, np.int32)
    for s, d in enumerate(done):
      routing[s, :len(d[3])] = d[3]
    return dataclasses.replace(out, routing_array=routing, prompt_routing=prompt_routing)

  def _assemble(self, done, g: int, max_new: int) -> "SampleOutput":
    tokens, logprobs, finish = (list(x) for x in list(zip(*done))[:3])
    s = len(tokens)
    lengths = np.asarray([len(t) for t in tokens], np.int32)
    tokens_SN = np.full((s, max_new), self.config.pad_id, np.int32)
    lp_SN = np.zeros((s, max_new), np.float32)
    for i in range(s):
      tokens_SN[i, :lengths[i]] = tokens[i]
      lp_SN[i, :lengths[i]] = logprobs[i]
    mask_SN = (np.arange(max_new)[None, :] < lengths[:, None]).astype(np.float32)
    return SampleOutput(
        tokens=tokens, logprobs=logprobs, lengths=lengths, finish_reasons=finish,
        tokens_array=tokens_SN, logprobs_array=lp_SN, mask=mask_SN,
        prompt_index=np.arange(s) // g)
