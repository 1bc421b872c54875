"""Where a first `Sampler.generate` call's time goes: XLA compilation per program.

    python -m bench.perf.first_call [--model tiny|mid] [--prompt 64] [--new 64] [--rows 64]
                                    [--slots N]

Prints the first call's wall time, the second call's (no compilation), and from
JAX's compile log every program compiled during the first call with its XLA
compilation time, plus JAX's totals for tracing, lowering and compiling
(`jax.monitoring`). bench/perf/sampler.py measures the first call against tunix and
transformers; this says what it is made of. One process, CPU.
"""

import argparse
import collections
import logging
import os
import re
import time

import jax  # pylint: disable=g-import-not-at-top
import numpy as np
from flax import nnx
from jax import monitoring

from mipu_jax.models import Qwen3, get_config
from mipu_jax.sampler import Sampler
from bench.perf.sampler import CONFIGS

_COMPILED = re.compile(r"Finished XLA compilation of (jit\([^)]*\)) in ([0-9.e-]+) sec")


class _CompileLog(logging.Handler):
  """Collects `(program, seconds)` from JAX's "Finished XLA compilation" records."""

  def __init__(self):
    super().__init__(logging.DEBUG)
    self.programs = []

  def emit(self, record):
    m = _COMPILED.search(record.getMessage())
    if m:
      self.programs.append((m.group(1), float(m.group(2))))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="tiny", choices=sorted(CONFIGS))
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--new", type=int, default=64)
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--slots", type=int, default=None,
                      help="max_concurrent_decodes (default: the sampler's); fewer than "
                           "--rows refills slots as samples finish")
  args = parser.parse_args()

  totals = collections.Counter()
  monitoring.register_event_duration_secs_listener(
      lambda event, duration, **_: totals.update({event.rsplit("/", 1)[-1]: duration}))
  log = _CompileLog()
  for name in ("jax._src.dispatch", "jax._src.interpreters.pxla", "jax._src.compiler"):
    logging.getLogger(name).addHandler(log)
  model = Qwen3(get_config("tiny", tie_embeddings=True, **CONFIGS[args.model]),
                rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(1, 100, args.prompt)) for _ in range(args.rows)]
  sampler = Sampler(model, max_prefill_length=args.prompt, max_decode_length=args.new,
                    **({} if args.slots is None else {"max_concurrent_decodes": args.slots}))
  log.programs.clear()
  totals.clear()
  jax.config.update("jax_log_compiles", True)
  start = time.perf_counter()
  sampler.generate(prompts, max_new_tokens=args.new, temperature=1.0)
  first = time.perf_counter() - start
  jax.config.update("jax_log_compiles", False)
  programs, seen = list(log.programs), dict(totals)
  start = time.perf_counter()
  sampler.generate(prompts, max_new_tokens=args.new, temperature=1.0)
  second = time.perf_counter() - start

  print(f"{args.model}: {args.rows} prompts x {args.prompt} tokens, {args.new} new, "
        f"{sampler.config.max_concurrent_decodes} slots, "
        f"load {os.getloadavg()[0]:.2f}, jax {jax.__version__}")
  print(f"first call {first:.2f} s, second {second:.2f} s")
  print("XLA compilation per program (s):")
  for name, seconds in sorted(programs, key=lambda x: -x[1]):
    print(f"  {seconds:7.3f}  {name}")
  for key in ("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration",
              "backend_compile_duration"):
    print(f"{key}: {seen.get(key, 0.0):.3f} s")


if __name__ == "__main__":
  main()
