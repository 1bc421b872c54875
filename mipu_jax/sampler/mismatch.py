"""Mismatch lab: how far each sampler precision mode is from the fp32 learner (docs/method.md §4).

For every precision mode the sampler μ draws responses and returns `lp_mu`; the learner π (the
model as given, normally fp32 master weights) recomputes `lp_old` of the same tokens with a full
forward, same temperature and truncation (front end: `experiments/measure_mismatch.py`). The
table reports, over all generated tokens:

- `k3_kl`, `log_ppl_abs_diff`: docs/method.md §4 definitions (per response, then averaged), from
  `mipu_jax.losses.mismatch_metrics`;
- `max_abs_diff`, `mean_abs_diff`: max and token mean of |lp_old - lp_mu|;
- `frac_abs_diff_gt_0p1`: share of tokens with |lp_old - lp_mu| > 0.1.
"""

import csv
import dataclasses
import functools
import os
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mipu_jax.losses import mismatch_metrics
from mipu_jax.models.config import get_config
from mipu_jax.models.logprobs import sequence_logprobs
from mipu_jax.models.qwen3 import Qwen3
from mipu_jax.sampler.config import bucket
from mipu_jax.sampler.sampler import SampleOutput, Sampler
from mipu_jax.sampler.sampling import truncated_logprobs

# Named precision modes: `Sampler` keyword arguments.
PRECISION_MODES: dict[str, dict[str, Any]] = {
    "fp32": {},
    "bf16": {"dtype": "bfloat16"},
    "fp16": {"dtype": "float16"},
    "int8": {"weight_quant": "int8"},
    "fp8": {"weight_quant": "fp8_e4m3"},
    "fp8_e5m2": {"weight_quant": "fp8_e5m2"},
    "int4": {"weight_quant": "int4"},
    "w8a8_int8": {"weight_quant": "int8", "act_quant": "int8"},
    "w8a8_fp8": {"weight_quant": "fp8_e4m3", "act_quant": "fp8"},
    "bf16_kv_fp8": {"dtype": "bfloat16", "kv_cache_dtype": "fp8"},
    "bf16_kv_int8": {"dtype": "bfloat16", "kv_cache_dtype": "int8"},
    "bf16_w8a8_kv8": {"dtype": "bfloat16", "weight_quant": "int8", "act_quant": "int8",
                      "kv_cache_dtype": "int8"},
}
# `<mode>_native`: each quantized mode on int8 x int8 -> int32 / fp8 x fp8 dots (`quant_compute`).
PRECISION_MODES.update({f"{name}_native": {**kwargs, "quant_compute": "native"}
                        for name, kwargs in list(PRECISION_MODES.items())
                        if "weight_quant" in kwargs})
DEFAULT_MODES = ("fp32", "bf16", "int8", "fp8", "int4", "w8a8_fp8", "w8a8_fp8_native",
                 "bf16_kv_fp8")
COLUMNS = ("mode", "k3_kl", "log_ppl_abs_diff", "max_abs_diff", "frac_abs_diff_gt_0p1",
           "mean_abs_diff", "num_tokens", "sample_seconds")


@dataclasses.dataclass(frozen=True)
class MismatchRow:
  mode: str
  k3_kl: float
  log_ppl_abs_diff: float
  max_abs_diff: float
  frac_abs_diff_gt_0p1: float
  mean_abs_diff: float
  num_tokens: int
  sample_seconds: float


@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _learner_logprobs(graphdef, state, tokens_BT, mask_BT, temperature, top_k, top_p):
  model = nnx.merge(graphdef, state)
  if not top_k and top_p >= 1.0:
    return sequence_logprobs(model, tokens_BT, mask_BT, temperature)
  logits_BTV = model(tokens_BT, mask_BT=mask_BT).logits[:, :-1]
  lp_BT = truncated_logprobs(logits_BTV, tokens_BT[:, 1:], temperature, top_k, top_p)
  return jnp.pad(lp_BT, ((0, 0), (1, 0)))


def learner_logprobs(model, prompts: Sequence[Sequence[int]], out: SampleOutput, *,
                     temperature: float, top_k: Optional[int] = None,
                     top_p: Optional[float] = None, chunk: int = 8) -> np.ndarray:
  """`lp_old`: the model's full-forward log-probs of the sampled tokens, `[S, max_new]`:
  `mipu_jax.models.sequence_logprobs` (the learner's own function) without truncation,
  `truncated_logprobs` of the same logits with top-k / top-p. Sequences are right-padded to a
  power-of-two width and run `chunk` rows at a time (bounded memory, one compilation)."""
  s, n = out.tokens_array.shape
  lens = [len(prompts[i]) for i in out.prompt_index]
  width = bucket(max(lens) + n, minimum=16)
  tokens = np.zeros((bucket(s, minimum=chunk), width), np.int32)
  mask = np.zeros_like(tokens)
  for i, (plen, gen) in enumerate(zip(lens, out.tokens)):
    tokens[i, :plen + len(gen)] = list(prompts[out.prompt_index[i]]) + gen
    mask[i, :plen + len(gen)] = 1
  graphdef, state = nnx.split(model)
  temp = 1.0 if temperature == 0 else float(temperature)
  lp = np.concatenate([np.asarray(_learner_logprobs(
      graphdef, state, tokens[i:i + chunk], mask[i:i + chunk], temp, int(top_k or 0),
      float(1.0 if top_p is None else top_p))) for i in range(0, tokens.shape[0], chunk)])
  lp_old = np.zeros((s, n), np.float32)
  for i, (plen, gen) in enumerate(zip(lens, out.tokens)):
    lp_old[i, :len(gen)] = lp[i, plen:plen + len(gen)]
  return lp_old


def summarize(mode: str, lp_old: np.ndarray, lp_mu: np.ndarray, mask: np.ndarray,
              seconds: float = 0.0) -> MismatchRow:
  """The table row of one mode (see module docstring)."""
  metrics = jax.jit(mismatch_metrics)(jnp.asarray(lp_old), jnp.asarray(lp_mu),
                                      jnp.asarray(mask))
  diff = np.abs(lp_old - lp_mu)[mask > 0]
  return MismatchRow(
      mode=mode, k3_kl=float(metrics["rollout_corr/k3_kl"]),
      log_ppl_abs_diff=float(metrics["rollout_corr/log_ppl_abs_diff"]),
      max_abs_diff=float(diff.max(initial=0.0)),
      frac_abs_diff_gt_0p1=float((diff > 0.1).mean()) if diff.size else 0.0,
      mean_abs_diff=float(diff.mean()) if diff.size else 0.0, num_tokens=int(diff.size),
      sample_seconds=seconds)


def measure_mismatch(model, prompts: Sequence[Sequence[int]], *,
                     modes: Sequence[str] = DEFAULT_MODES, max_new_tokens: int = 32,
                     num_samples: int = 4, temperature: float = 1.0,
                     top_k: Optional[int] = None, top_p: Optional[float] = None, seed: int = 0,
                     sampler_kwargs: Optional[dict] = None) -> list[MismatchRow]:
  """Samples with each precision mode and compares with the learner; one row per mode. Every mode
  uses the same seed, so modes whose distributions agree draw the same tokens."""
  unknown = [m for m in modes if m not in PRECISION_MODES]
  if unknown:
    raise ValueError(f"Unknown precision modes {unknown}; expected some of "
                     f"{sorted(PRECISION_MODES)}.")
  rows = []
  for mode in modes:
    sampler = Sampler(model, **PRECISION_MODES[mode], **(sampler_kwargs or {}))
    gen = functools.partial(sampler.generate, prompts, max_new_tokens=max_new_tokens,
                            temperature=temperature, top_k=top_k, top_p=top_p,
                            num_samples=num_samples, seed=seed)
    gen()  # compile outside the timing
    start = time.perf_counter()
    out = gen()
    seconds = time.perf_counter() - start
    lp_old = learner_logprobs(model, prompts, out, temperature=temperature, top_k=top_k,
                              top_p=top_p)
    rows.append(summarize(mode, lp_old, out.logprobs_array, out.mask, seconds))
  return rows


def format_table(rows: Sequence[MismatchRow]) -> str:
  header = f"{'mode':<16}" + "".join(f"{c:>22}" for c in COLUMNS[1:])
  lines = [header, "-" * len(header)]
  for r in rows:
    values = dataclasses.astuple(r)
    lines.append(f"{r.mode:<16}" + "".join(
        f"{v:>22d}" if isinstance(v, int) else f"{v:>22.3e}" for v in values[1:]))
  return "\n".join(lines)


def write_csv(rows: Sequence[MismatchRow], path: str) -> None:
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(COLUMNS)
    for r in rows:
      writer.writerow(dataclasses.astuple(r))


def plot(rows: Sequence[MismatchRow], path: str) -> None:
  """Bar charts of the four mismatch numbers per mode (log scale), written to `path`."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  names = ("k3_kl", "log_ppl_abs_diff", "max_abs_diff", "frac_abs_diff_gt_0p1")
  fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.5))
  modes = [r.mode for r in rows]
  for ax, name in zip(axes, names):
    values = [max(getattr(r, name), 1e-12) for r in rows]
    ax.bar(modes, values)
    ax.set_yscale("log")
    ax.set_title(name)
    ax.tick_params(axis="x", rotation=60)
  fig.suptitle("Sampler vs fp32 learner log-prob mismatch")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def load_model(checkpoint: Optional[str] = None, preset: str = "tiny", init_std: float = 0.16,
               seed: int = 0):
  """The fp32 learner: a Hugging Face checkpoint directory, or a randomly initialised preset with
  N(0, init_std) matmul weights (8x the model's init scale by default), so that its next-token
  law is peaked like a trained model's."""
  if checkpoint:
    from mipu_jax.models import hf  # pylint: disable=g-import-not-at-top
    return hf.from_pretrained(checkpoint, jnp.float32)
  graphdef, state = nnx.split(nnx.eval_shape(lambda: Qwen3(get_config(preset),
                                                           rngs=nnx.Rngs(0))))
  pure = nnx.to_pure_dict(state)
  keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(pure))))
  return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.ones(x.shape, x.dtype) if "norm" in jax.tree_util.keystr(p)
      else init_std * jax.random.normal(next(keys), x.shape, x.dtype), pure))


def run_lab(*, checkpoint: Optional[str], preset: str, init_std: float, modes: Sequence[str],
            num_prompts: int, prompt_len: int, max_new_tokens: int, num_samples: int,
            temperature: float, top_k: Optional[int], top_p: Optional[float], seed: int,
            out_dir: str) -> list[MismatchRow]:
  """Random prompts → `measure_mismatch` → table on stdout, CSV and PNG in `out_dir`."""
  model = load_model(checkpoint, preset, init_std, seed)
  prompts = np.random.default_rng(seed).integers(
      0, model.config.vocab_size, (num_prompts, prompt_len)).tolist()
  rows = measure_mismatch(
      model, prompts, modes=modes, max_new_tokens=max_new_tokens, num_samples=num_samples,
      temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
      sampler_kwargs=dict(max_prefill_length=max(16, prompt_len),
                          max_decode_length=max(16, max_new_tokens)))
  print(format_table(rows))
  os.makedirs(out_dir, exist_ok=True)
  write_csv(rows, os.path.join(out_dir, "mismatch.csv"))
  plot(rows, os.path.join(out_dir, "mismatch.png"))
  print(f"Wrote {out_dir}/mismatch.csv and {out_dir}/mismatch.png")
  return rows
