r"""How far the native low-precision sampler is from the emulated one, per case, and why.

    python -m bench.probes.native_gap --json /tmp/gap.json            # any platform
    XLA_FLAGS=--xla_gpu_enable_triton_gemm=false python -m bench.probes.native_gap

tests/test_native_quant.py asks the native path (`quant_compute="native"`:
int8 / FP8 GEMMs, weights converted next to the dot) to give the emulated
path's prefill log-probs within 1e-4 in float32 compute, on the tests' tiny
random model. Where that fails (on a GPU: the FP8 and weight-only cases), this
prints by how much, for each case of the test, with float32 dots asked for
(`jax.default_matmul_precision("highest")`, as the tests do) and with the
platform's default precision, beside the quantization's own effect
(`emulated` vs the float sampler) and the kernels XLA made of the native
prefill's matmuls (cuBLAS / cuBLASLt calls, dots by operand type, in the
optimized HLO). A measurement, not a test: the numbers go in bench/README.md.
"""

import argparse
import json
import os
import shutil
import tempfile

_DUMP = tempfile.mkdtemp(prefix="native_gap_hlo_")
_USER_FLAGS = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = (_USER_FLAGS + f" --xla_dump_to={_DUMP}"
                           " --xla_dump_hlo_as_text"
                           " --xla_dump_hlo_module_re=.*prefill.*").strip()

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp
import numpy as np

from mipu_jax.sampler import Sampler
from mipu_jax.testing import models  # pylint: disable=g-import-not-at-top
from bench.gpu.sampler_table import _hlo_files, dot_kernels

# The sampler tests' model and prompts (mipu_jax/testing/models.py).
CFG, PROMPTS = models.SAMPLER_CFG, models.PROMPTS
CASES = [("fp8_e4m3", "fp8", False), ("fp8_e4m3", "fp8", True), ("int8", "int8", False),
         ("int8", "int8", True), ("int4", "fp8", False), ("int4", "int8", False),
         ("int4", None, True), ("int8", "fp8", False), ("fp8_e4m3", None, False)]
KW = dict(max_prefill_length=32, max_decode_length=32)


def log_probs(sampler):
  return np.asarray(jax.nn.log_softmax(jnp.asarray(models.prefill_logits(sampler, PROMPTS)), -1))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", default="")
  p.add_argument("--precisions", default="highest,default",
                 help="matmul precisions to run under ('default': the platform's)")
  args = p.parse_args()
  weights = {"tied": models.peaked_qwen3(CFG),
             "untied": models.peaked_qwen3(CFG.replace(tie_embeddings=False))}
  rows = []
  for precision in args.precisions.split(","):
    with jax.default_matmul_precision(None if precision == "default" else precision):
      floats = {k: log_probs(Sampler(m, **KW)) for k, m in weights.items()}
      for (wq, aq, head), tie in [(c, "tied") for c in CASES] + [
          (("fp8_e4m3", "fp8", True), "untied")]:
        kw = dict(weight_quant=wq, act_quant=aq, quant_lm_head=head, **KW)
        emulated = log_probs(Sampler(weights[tie], **kw))
        before = _hlo_files(_DUMP)
        native = log_probs(Sampler(weights[tie], quant_compute="native", **kw))
        row = dict(precision=precision, weight=wq, act=str(aq), lm_head=head, embed=tie,
                   native_vs_emulated=float(np.abs(native - emulated).max()),
                   emulated_vs_float=float(np.abs(emulated - floats[tie]).max()),
                   kernels=dot_kernels(_DUMP, _hlo_files(_DUMP) - before))
        rows.append(row)
        print(f"{precision:8s} {wq:9s} {str(aq):5s} head={int(head)} {tie:6s} "
              f"|native-emulated| {row['native_vs_emulated']:.2e}  "
              f"|emulated-float| {row['emulated_vs_float']:.2e}  {row['kernels']}",
              flush=True)
  env = dict(platform=jax.default_backend(), device=str(jax.devices()[0].device_kind),
             jax=jax.__version__, xla_flags=_USER_FLAGS)
  print(env)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(env=env, rows=rows), f, indent=1)
  shutil.rmtree(_DUMP, ignore_errors=True)


if __name__ == "__main__":
  main()
