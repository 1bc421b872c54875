r"""Sampler throughput: mipu_jax vs Hugging Face `generate` vs tunix's vanilla sampler.

Generated tokens per second for 64 sequences x 64 new tokens (prompts of 32 random
token ids), one small Qwen3 config with random weights, float32 on CPU, in one run:

- mipu_jax: `Sampler.generate` (temperature 1, log-probs always returned);
- transformers: `Qwen3ForCausalLM.generate(do_sample=True)` on CPU torch, same config;
- tunix 0.1.7: `tunix.generate.sampler.Sampler` (top_p=1 sampling, return_logprobs=True)
  on its own Qwen3, run in a separate venv through a subprocess (its pinned deps
  would clash with ours). Set it up once with

    python -m venv /tmp/tunix-venv && /tmp/tunix-venv/bin/pip install google-tunix==0.1.7

  (or pass --tunix_python=...; the column is skipped when that interpreter is missing).

Each engine is set up and warmed up (compiled) first; then the engines are timed
in turn, `--repeats` rounds, so that load from other processes on a shared
machine falls on all of them alike; best and median are printed, and the first
call (compilation included) separately. No
generation stops early: mipu_jax and tunix get no reachable EOS, transformers
gets `min_new_tokens=64`.

  python -m bench.perf.sampler            # ~3-5 min on 2 CPU cores
"""

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

from absl import app, flags
import numpy as np

_BATCH = flags.DEFINE_integer("batch", 64, "Sequences.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 32, "Prompt tokens.")
_NEW = flags.DEFINE_integer("new_tokens", 64, "Generated tokens per sequence.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per engine.")
_TUNIX_PYTHON = flags.DEFINE_string("tunix_python", "/tmp/tunix-venv/bin/python",
                                    "Interpreter of the tunix venv.")
_ENGINES = flags.DEFINE_list("engines", ["mipu_jax", "transformers", "tunix"], "What to run.")

# The small Qwen3 of the benchmark (same numbers in all three implementations).
CONFIGS = {
    "tiny": dict(vocab_size=8192, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4,
                 head_dim=32, intermediate_size=768, rope_theta=10_000.0, rms_eps=1e-6),
    # Wider and deeper: the weights, not the bookkeeping, are most of a step.
    "mid": dict(vocab_size=32768, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4,
                head_dim=64, intermediate_size=1536, rope_theta=10_000.0, rms_eps=1e-6),
}
_MODEL = flags.DEFINE_enum("model", "tiny", list(CONFIGS), "Model size (same in all engines).")


class _Config(dict):
  """The chosen model's numbers (read after flags are parsed)."""

  def __getitem__(self, key):
    return CONFIGS[_MODEL.value][key]

  def keys(self):
    return CONFIGS[_MODEL.value].keys()

  def __iter__(self):
    return iter(CONFIGS[_MODEL.value])

  def __repr__(self):
    return repr(CONFIGS[_MODEL.value])


CONFIG = _Config()


def _first_call(run):
  start = time.perf_counter()
  run()
  return time.perf_counter() - start


def setup_mipu_jax(prompts, new_tokens):
  """Returns (run, first-call seconds); `run()` generates once and returns its seconds."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from mipu_jax.models import Qwen3, get_config  # pylint: disable=g-import-not-at-top
  from mipu_jax.sampler import Sampler  # pylint: disable=g-import-not-at-top

  model = Qwen3(get_config("tiny", tie_embeddings=True, **CONFIGS[_MODEL.value]),
                rngs=nnx.Rngs(0))
  sampler = Sampler(model, max_prefill_length=len(prompts[0]), max_decode_length=new_tokens)

  def run():
    start = time.perf_counter()
    out = sampler.generate(prompts, max_new_tokens=new_tokens, temperature=1.0)
    assert int(out.lengths.sum()) == len(prompts) * new_tokens
    return time.perf_counter() - start

  return run, _first_call(run)


def setup_transformers(prompts, new_tokens):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  torch.manual_seed(0)
  cfg = transformers.Qwen3Config(
      vocab_size=CONFIG["vocab_size"], hidden_size=CONFIG["hidden_size"],
      num_hidden_layers=CONFIG["num_layers"], num_attention_heads=CONFIG["num_heads"],
      num_key_value_heads=CONFIG["num_kv_heads"], head_dim=CONFIG["head_dim"],
      intermediate_size=CONFIG["intermediate_size"], rope_theta=CONFIG["rope_theta"],
      rms_norm_eps=CONFIG["rms_eps"], tie_word_embeddings=True, max_position_embeddings=512,
      torch_dtype=torch.float32)
  model = transformers.Qwen3ForCausalLM(cfg).eval()
  ids = torch.tensor(prompts, dtype=torch.long)

  def run():
    start = time.perf_counter()
    with torch.no_grad():
      out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                           temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, pad_token_id=0, eos_token_id=None)
    assert out.shape == (len(prompts), len(prompts[0]) + new_tokens)
    return time.perf_counter() - start

  return run, _first_call(run)


# Runs in the tunix venv: builds the model and sampler, warms up, then times one
# generation per "run" line on stdin and answers "TIME <seconds>".
_TUNIX_WORKER = textwrap.dedent("""
    import json, sys, time
    from flax import nnx
    from tunix.generate import sampler as sampler_lib
    from tunix.models.qwen3 import model as qwen3

    args = json.loads(sys.argv[1])
    c, prompts, new = args["config"], args["prompts"], args["new"]

    class IdTokenizer:  # token ids as space-separated text
      def encode(self, text, **kw): return [int(t) for t in text.split()]
      def decode(self, ids, **kw): return " ".join(str(int(i)) for i in ids)
      def bos_id(self): return 0  # falsy: tunix then adds no BOS
      def eos_id(self): return -1
      def pad_id(self): return 0

    cfg = qwen3.ModelConfig(
        num_layers=c["num_layers"], vocab_size=c["vocab_size"], embed_dim=c["hidden_size"],
        hidden_dim=c["intermediate_size"], num_heads=c["num_heads"], head_dim=c["head_dim"],
        num_kv_heads=c["num_kv_heads"], rope_theta=int(c["rope_theta"]), norm_eps=c["rms_eps"],
        use_tied_embedding=True)
    model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
    plen = len(prompts[0])
    sampler = sampler_lib.Sampler(model, IdTokenizer(), sampler_lib.CacheConfig(
        cache_size=plen + new, num_layers=c["num_layers"], num_kv_heads=c["num_kv_heads"],
        head_dim=c["head_dim"]))
    texts = [" ".join(map(str, p)) for p in prompts]

    def run():
      start = time.perf_counter()
      out = sampler(texts, max_generation_steps=new, max_prompt_length=plen, temperature=1.0,
                    top_p=1.0, return_logprobs=True, eos_tokens=[-1], seed=0)
      seconds = time.perf_counter() - start
      assert sum(len(t) for t in out.tokens) == len(prompts) * new
      return seconds

    print("FIRST", run(), flush=True)
    for line in sys.stdin:
      print("TIME", run(), flush=True)
""")


def setup_tunix(prompts, new_tokens):
  if not os.path.exists(_TUNIX_PYTHON.value):
    print(f"tunix: {_TUNIX_PYTHON.value} not found; see the module docstring.", file=sys.stderr)
    return None
  args = json.dumps(dict(config=CONFIGS[_MODEL.value], prompts=prompts, new=new_tokens))
  proc = subprocess.Popen([_TUNIX_PYTHON.value, "-c", _TUNIX_WORKER, args],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))

  def answer(tag):
    for line in proc.stdout:
      if line.startswith(tag + " "):
        return float(line.split()[1])
    raise RuntimeError(f"tunix worker exited (code {proc.wait()}); see its stderr above.")

  first = answer("FIRST")

  def run():
    proc.stdin.write("run\n")
    proc.stdin.flush()
    return answer("TIME")

  return run, first


def main(argv):
  del argv
  rng = np.random.default_rng(0)
  prompts = rng.integers(2, CONFIG["vocab_size"], (_BATCH.value, _PROMPT_LEN.value)).tolist()
  tokens = _BATCH.value * _NEW.value
  setups = dict(mipu_jax=setup_mipu_jax, transformers=setup_transformers, tunix=setup_tunix)
  runs, first = {}, {}
  for name in _ENGINES.value:
    ready = setups[name](prompts, _NEW.value)
    if ready is not None:
      runs[name], first[name] = ready
      print(f"{name}: first call {first[name]:.1f} s", flush=True)
  # Interleaved repeats, so that load from other processes hits every engine alike.
  times = {name: [] for name in runs}
  for _ in range(_REPEATS.value):
    for name, run in runs.items():
      times[name].append(run())
  print(f"\n{_BATCH.value} seqs x {_NEW.value} new tokens, prompt {_PROMPT_LEN.value}, "
        f"fp32, {os.cpu_count()} CPUs, {_REPEATS.value} interleaved repeats\nconfig {CONFIG}")
  print(f"{'engine':>13} {'tok/s best':>11} {'tok/s median':>13} {'first call s':>13} "
        f"{'mipu_jax / engine (best, median)':>34}")
  best = {n: tokens / min(t) for n, t in times.items()}
  median = {n: tokens / statistics.median(t) for n, t in times.items()}
  for name in runs:
    ratio = (f"{best['mipu_jax'] / best[name]:.2f}x, {median['mipu_jax'] / median[name]:.2f}x"
             if "mipu_jax" in runs else "-")
    print(f"{name:>13} {best[name]:11.0f} {median[name]:13.0f} {first[name]:13.1f} {ratio:>34}")


if __name__ == "__main__":
  app.run(main)
