"""Pod readiness: Qwen3-1.7B / 4B RL step (learner and sampler) compiles on a fake 8-device mesh.

Nothing is materialised: parameters are `ShapeDtypeStruct`s carrying their
shardings (`mipu_jax.models.sharding.abstract_model`), the learner step is
lowered from `Learner.lower_step`, and the sampler's prefill and decode loop
(`mipu_jax.sampler.Engine`) are lowered on abstract sampling weights and an
abstract decode state. Settings come from `configs/pod_qwen3_*.py` (its mesh
`data=1, fsdp=-1, tensor=1` over the 8 CPU devices of `conftest.py`, one row
per device per micro-batch). Per-device memory from
`compiled.memory_analysis()` is printed (`pytest tests/test_pod.py -s`); it is
XLA:CPU's buffer assignment, an estimate of what a TPU compile assigns, and
is quoted in `docs/pods.md`.
"""


import jax
import numpy as np
import pytest
from flax import nnx


from configs import pod_qwen3_1p7b
from configs import pod_qwen3_4b
from mipu_jax import config as config_lib
from mipu_jax import models
from mipu_jax.learner import Learner
from mipu_jax.learner import make_optimizer
from mipu_jax.learner import mesh_from_config
from mipu_jax.learner import step_spec
from mipu_jax.models import sharding
from mipu_jax.sampler import Engine
from mipu_jax.sampler import SamplerConfig

GIB = 2**30
PROMPT_LEN = 1024  # math prompts; the learner row is prompt + response budget
DECODE_SLOTS = 16  # one prompt's group of responses


def _gib(stats) -> str:
  return (f"args {stats.argument_size_in_bytes / GIB:6.2f} GiB, "
          f"out {stats.output_size_in_bytes / GIB:6.2f} GiB, "
          f"temp {stats.temp_size_in_bytes / GIB:6.2f} GiB, "
          f"aliased {stats.alias_size_in_bytes / GIB:6.2f} GiB")


def _compile(name, lowered):
  compiled = lowered.compile()
  stats = compiled.memory_analysis()
  assert stats is not None and stats.argument_size_in_bytes > 0
  print(f"  {name:8s} per device: {_gib(stats)}")
  return stats


@pytest.mark.parametrize("module", [pod_qwen3_1p7b, pod_qwen3_4b],
                         ids=["qwen3_1p7b", "qwen3_4b"])
def test_pod_rl_step_compiles_with_abstract_params(module, math_inputs):
  assert jax.device_count() == 8
  # MIPU's learner program is Step 1's (Step 2 acts between steps). The
  # checkpoint is the tiny test one: the program is built from the preset.
  cfg = config_lib.from_config_dict(module.get_config(f"step1,chips=8,{math_inputs}"))
  mesh = mesh_from_config(cfg.learner.mesh)
  mcfg = models.get_config(cfg.model.preset, dtype=cfg.model.dtype, remat=cfg.model.remat)

  def model_fn():
    return models.Qwen3(mcfg, rngs=nnx.Rngs(0))

  graphdef, params = sharding.abstract_model(model_fn, mesh, "train")
  total = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(params))
  per_device = sharding.per_device_bytes(params)
  print(f"\n{cfg.model.preset}: {mcfg.num_params() / 1e9:.2f} B params, fp32 "
        f"{total / GIB:.2f} GiB, {per_device / GIB:.2f} GiB per device on mesh "
        f"{dict(mesh.shape)}")
  assert per_device < total / 7

  # Learner: one micro-batch row per device, prompt + 8192-token responses.
  learner = Learner(graphdef, params, spec=step_spec(cfg),
                    optimizer=make_optimizer(cfg.optim, cfg.num_steps), mesh=mesh)
  rows = cfg.learner.num_minibatches * cfg.learner.num_microbatches * mesh.size
  length = PROMPT_LEN + cfg.sampling.max_new_tokens
  print(f"  learner: {rows} rows x {length} tokens, "
        f"{cfg.learner.num_microbatches} micro-batches of {mesh.size} rows")
  stats = _compile("learner", learner.lower_step(rows, length))
  # The state is donated: the updated state reuses the input buffers.
  assert stats.alias_size_in_bytes > 0.9 * stats.output_size_in_bytes - 2**20

  # Sampler: FP8 weights + activations, sampling layout, abstract weights.
  engine = Engine(nnx.eval_shape(model_fn), SamplerConfig(
      **cfg.sampling.engine_kwargs(), max_prefill_length=PROMPT_LEN,
      max_decode_length=cfg.sampling.max_new_tokens), mesh=mesh)
  weights = jax.eval_shape(engine.load_params, params)
  weights = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         weights, sharding.param_shardings(weights, mesh, "sampling"))
  prompts = np.ones((1, PROMPT_LEN), np.int32)

  def prefill(w):
    return engine.prefill(params=w, padded_tokens=prompts, true_length=[PROMPT_LEN],
                          rng=jax.random.key(0), temperature=cfg.sampling.temperature,
                          max_new_tokens=cfg.sampling.max_new_tokens)

  _compile("prefill", jax.jit(prefill).lower(weights))
  state = jax.eval_shape(lambda: engine.init_decode_state(
      num_slots=DECODE_SLOTS, prefill_length=PROMPT_LEN,
      decode_length=cfg.sampling.max_new_tokens))
  print(f"  decode: {DECODE_SLOTS} slots x {PROMPT_LEN + cfg.sampling.max_new_tokens} "
        "cache positions (decode state as the sampler builds it: not sharded)")
  _compile("decode", jax.jit(engine.generate_until_done, donate_argnums=1).lower(weights, state))
