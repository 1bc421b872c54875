"""`Sampler`: batched generation with log-probs for the RL loop (SPEC.md §0, §7).

`generate` is the engine's JetStream path and nothing else: one batched
`prefill` of the prompts, one `bulk_insert` of `num_samples` independent samples
per prompt into decode slots, then `generate_until_done` (the engine's decode
step in a `lax.while_loop`). Prompt length, slot count and `max_new_tokens` are
bucketed (`SamplerConfig`), so a run compiles each function once per bucket.

Randomness: sample `j` of prompt `i` draws its t-th token with key
`fold_in(fold_in(fold_in(key(seed), i), j), t)`, independent of batch size,
buckets and slot placement.
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
  """

  tokens: list[list[int]]
  logprobs: list[list[float]]
  lengths: np.ndarray
  finish_reasons: list[str]
  tokens_array: np.ndarray
  logprobs_array: np.ndarray
  mask: np.ndarray
  prompt_index: np.ndarray


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
               eos_ids: Optional[Sequence[int]] = None) -> SampleOutput:
    """Samples `num_samples` responses per prompt; see `SampleOutput` and `sampling.py`."""
    cfg = self.config
    _check_prompts(prompts, cfg, self.engine.model_config.vocab_size)
    if max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}.")
    if num_samples < 1:
      raise ValueError(f"num_samples must be ≥ 1, got {num_samples}.")
    if temperature < 0 or (top_k is not None and top_k < 1) or (
        top_p is not None and not 0 < top_p <= 1):
      raise ValueError("Need temperature ≥ 0, top_k ≥ 1 and 0 < top_p ≤ 1.")
    if top_k is not None or (top_p is not None and top_p < 1):
      warnings.warn(
          "top-k/top-p sampling: lp_mu is the log-prob of the truncated, renormalised "
          "distribution; compute lp_old with mipu_jax.sampler.truncated_logprobs, and note "
          "that the PPO ratio of truncated policies is biased (SPEC.md §0).", stacklevel=2)
    r, g = len(prompts), num_samples
    p = cfg.prefill_bucket(max(len(x) for x in prompts))
    n_bucket = cfg.decode_bucket(max_new_tokens)
    r_bucket, s_bucket = cfg.slot_bucket(r), cfg.slot_bucket(r * g)

    tokens_RP = np.full((r_bucket, p), cfg.pad_id, np.int32)
    lengths_R = np.ones((r_bucket,), np.int32)  # padding rows: a 1-token dummy, never inserted
    for i, x in enumerate(prompts):
      tokens_RP[i, :len(x)] = x
      lengths_R[i] = len(x)
    engine, params = self.engine, self._params
    prefix, _ = engine.prefill(params=params, padded_tokens=tokens_RP, true_length=lengths_R,
                               rng=jax.random.key(seed), temperature=temperature, top_k=top_k or 0,
                               top_p=1.0 if top_p is None else top_p,
                               max_new_tokens=max_new_tokens)
    state = engine.init_decode_state(num_slots=s_bucket, prefill_length=p, decode_length=n_bucket,
                                     stop_ids=eos_ids)
    sample_S = np.arange(s_bucket, dtype=np.int32)
    real = sample_S < r * g
    state = engine.bulk_insert(prefix, state, np.where(real, sample_S, s_bucket),
                               rows=np.where(real, sample_S // g, 0),
                               sample_ids=np.where(real, sample_S % g, 0))
    if max_new_tokens > 1:  # with one token, every slot is done after insert
      state = engine.generate_until_done(params, state)
    return self._output(state, r * g, g, max_new_tokens)

  def _output(self, state, s: int, g: int, max_new: int) -> SampleOutput:
    tokens_BN, lp_BN, lengths_B, finish_B = jax.device_get(
        (state.tokens_BN, state.logprobs_BN, state.num_generated_B, state.finish_B))
    tokens_SN, lp_SN = tokens_BN[:s, :max_new], lp_BN[:s, :max_new]
    lengths_S, finish_S = lengths_B[:s], finish_B[:s]
    mask_SN = (np.arange(max_new)[None, :] < lengths_S[:, None]).astype(np.float32)
    return SampleOutput(
        tokens=[tokens_SN[i, :lengths_S[i]].tolist() for i in range(s)],
        logprobs=[lp_SN[i, :lengths_S[i]].tolist() for i in range(s)],
        lengths=np.asarray(lengths_S), finish_reasons=[FINISH_NAMES[int(f)] for f in finish_S],
        tokens_array=np.asarray(tokens_SN), logprobs_array=np.asarray(lp_SN), mask=mask_SN,
        prompt_index=np.arange(s) // g)
