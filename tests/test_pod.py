"""Pod readiness: the Qwen3-1.7B / 4B RL step (learner and sampler) fits a v5e chip.

Nothing is materialised (`mipu_jax.memory_plan`: abstract parameters with
their shardings). Settings come from `studies/configs/pod_qwen3_*.py` (its mesh
`data=1, fsdp=-1, tensor=1` over the 8 CPU devices of `conftest.py`, one row
per device per micro-batch, blockwise attention, chunked log-probs, per-layer
remat; the sampler's KV cache sharded over the slots). Per-device memory from
`compiled.memory_analysis()` is printed (`pytest tests/test_pod.py -s -m extended`) and
asserted ≤ 16 GiB; it is XLA:CPU's buffer assignment, an estimate of a TPU
compile's, and is quoted in `docs/pods.md` (`bench/perf/memory.py` prints the
before / after table).
"""

import jax
import numpy as np
import pytest
from flax import nnx


from mipu_jax import config as config_lib
from mipu_jax import memory_plan
from mipu_jax import models
from mipu_jax.learner import mesh_from_config
from mipu_jax.models import sharding
from studies.configs import pod_qwen3_1p7b
from studies.configs import pod_qwen3_4b

GIB = 2**30
PROMPT_LEN = 1024  # math prompts; the learner row is prompt + response budget
BUDGET = 16 * GIB  # a v5e chip


@pytest.mark.extended
@pytest.mark.long
@pytest.mark.parametrize("module", [pod_qwen3_1p7b, pod_qwen3_4b],
                         ids=["qwen3_1p7b", "qwen3_4b"])
def test_pod_rl_step_fits_a_v5e_chip(module, math_inputs):
  """Learner step, prefill and decode of the pod config, per device on the
  8-device mesh, one (1024 + 8192)-token row per device: ≤ 16 GiB each."""
  assert jax.device_count() == 8
  # MIPU's learner program is Step 1's (Step 2 acts between steps). The
  # checkpoint is the tiny test one: the programs are built from the preset.
  cfg = config_lib.from_config_dict(module.get_config(f"step1,chips=8,{math_inputs}"))
  mesh = mesh_from_config(cfg.learner.mesh)
  mcfg = models.get_config(cfg.model.preset)
  _, params = sharding.abstract_model(
      lambda: models.Qwen3(mcfg, rngs=nnx.Rngs(0)), mesh, "train")
  total = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(params))
  per_device = sharding.per_device_bytes(params)
  print(f"\n{cfg.model.preset}: {mcfg.num_params() / 1e9:.2f} B params, fp32 "
        f"{total / GIB:.2f} GiB, {per_device / GIB:.2f} GiB per device on mesh "
        f"{dict(mesh.shape)}; attention={cfg.model.attention}, remat={cfg.model.remat}, "
        f"logits_chunk={cfg.learner.logits_chunk}")
  assert per_device < total / 7

  learner = memory_plan.learner_memory(cfg, PROMPT_LEN)
  # The slots the config decodes at once (2 per device: one prompt's group of
  # 16 responses over the 8 devices).
  assert cfg.sampling.max_concurrent_decodes == 16
  prefill, decode = memory_plan.sampler_memory(cfg, PROMPT_LEN,
                                               cfg.sampling.max_concurrent_decodes)
  for name, m in (("learner", learner), ("prefill", prefill), ("decode", decode)):
    print(f"  {name:8s} per device: {m.gib()}")
    assert m.peak <= BUDGET, (name, m.gib())
  # The learner's state is donated: its update reuses the input buffers.
  assert learner.aliased > 0.9 * learner.outputs - 2**20
