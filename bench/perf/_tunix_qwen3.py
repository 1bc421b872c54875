"""tunix's Qwen3 forward+backward timing; run by `bench/perf/learner.py` in tunix's venv.

    /tmp/tunix-venv/bin/python -m bench.perf._tunix_qwen3 '<json config>'

Prints one JSON line: {"seconds": median step time, "compile_seconds": ...}.
The loss is the same as the mipu_jax side: mean token log-prob of the batch
under the model (fp32), differentiated with respect to every parameter.
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.models.qwen3 import model as tunix_qwen3
from tunix.sft import utils as sft_utils


def main(spec):
  cfg = tunix_qwen3.ModelConfig(
      num_layers=spec["num_layers"], vocab_size=spec["vocab_size"],
      embed_dim=spec["hidden_size"], hidden_dim=spec["intermediate_size"],
      num_heads=spec["num_heads"], head_dim=spec["head_dim"],
      num_kv_heads=spec["num_kv_heads"], rope_theta=int(spec["rope_theta"]),
      norm_eps=1e-6, use_tied_embedding=True)
  model = tunix_qwen3.Qwen3(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  b, l = spec["batch"], spec["seq"]
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (b, l)),
                       jnp.int32)
  mask = jnp.ones((b, l), bool)

  def loss(params, tokens):
    m = nnx.merge(graphdef, params)
    logits, _ = m(tokens, sft_utils.build_positions_from_mask(mask), None,
                  sft_utils.make_causal_attn_mask(mask))
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

  step = jax.jit(jax.value_and_grad(loss))
  t0 = time.perf_counter()
  jax.block_until_ready(step(params, tokens))
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(spec["repeats"]):
    t0 = time.perf_counter()
    jax.block_until_ready(step(params, tokens))
    times.append(time.perf_counter() - t0)
  print(json.dumps({"seconds": float(np.median(times)), "compile_seconds": compile_s,
                    "jax": jax.__version__}))


if __name__ == "__main__":
  main(json.loads(sys.argv[1]))
