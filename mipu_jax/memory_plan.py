"""Per-device memory of a run's programs, from XLA's buffer assignment, without weights.

`learner_memory(cfg, ...)` and `sampler_memory(cfg, ...)` build the learner
step and the sampler's prefill and decode loop of a validated `TrainConfig`
for its model preset on the current devices, from abstract parameters
(`ShapeDtypeStruct`s carrying their shardings: nothing is materialised), and
return `compiled.memory_analysis()` of each: argument, output, temporary and
aliased bytes per device. `tests/test_pod.py` asserts budgets with them;
`bench/perf/memory.py` prints the before / after table of `docs/pods.md`.

On CPU these are XLA:CPU's buffer assignments; a TPU or GPU compile assigns
differently (it usually reuses buffers more), so read them as estimates of a
pod's numbers.
"""

import dataclasses
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx

from mipu_jax import models
from mipu_jax.config import TrainConfig
from mipu_jax.learner import Learner
from mipu_jax.learner import make_optimizer
from mipu_jax.learner import mesh_from_config
from mipu_jax.learner import step_spec
from mipu_jax.models import sharding
from mipu_jax.sampler import Engine
from mipu_jax.sampler import SamplerConfig

GIB = 2**30


class Memory(NamedTuple):
  """Bytes per device of one compiled program.

  Attributes:
    arguments: inputs (parameters, optimizer state, batch, decode state).
    outputs: outputs.
    temporaries: everything else XLA allocates while it runs.
    aliased: outputs written into donated inputs.
  """
  arguments: int
  outputs: int
  temporaries: int
  aliased: int

  @property
  def peak(self) -> int:
    """Arguments + temporaries + outputs that do not alias an input."""
    return self.arguments + self.temporaries + self.outputs - self.aliased

  def gib(self) -> str:
    return (f"args {self.arguments / GIB:6.2f}, temp {self.temporaries / GIB:6.2f}, "
            f"peak {self.peak / GIB:6.2f} GiB")


# XLA:CPU computes bf16 matmuls in f32: it converts their operands, and its
# while-loop-invariant code motion then hoists the conversion of every layer's
# weights out of the layer loop, holding an f32 copy of the whole model. TPU
# and GPU multiply bf16 natively (no conversion to hoist), so on CPU the plan
# compiles without that pass; `cpu_artifacts=True` keeps it.
_NO_HOISTED_CONVERTS = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}


def _memory(lowered, cpu_artifacts: bool = False) -> Memory:
  options = None
  if jax.default_backend() == "cpu" and not cpu_artifacts:
    options = _NO_HOISTED_CONVERTS
  stats = lowered.compile(options).memory_analysis()
  return Memory(stats.argument_size_in_bytes, stats.output_size_in_bytes,
                stats.temp_size_in_bytes, stats.alias_size_in_bytes)


def _moe_impl(cpu_artifacts: bool) -> str:
  """The experts' grouped matmul to plan. XLA:CPU expands `ragged_dot` into a
  masked product over every expert (`[m, E, F]`) and the CPU's "blocked" form
  gathers an expert's weights per block of rows: neither is an accelerator's
  grouped-matmul kernel, which holds its operands and result only. On a CPU
  the plan compiles a stand-in of those shapes (`moe_impl="footprint"`);
  `cpu_artifacts=True` keeps the CPU's own form."""
  return "footprint" if jax.default_backend() == "cpu" and not cpu_artifacts else "auto"


def _attention(asked: str, cpu_artifacts: bool) -> str:
  """The attention to plan: "auto" is `dense` on an accelerator, so a plan made
  on a CPU for one plans `dense`, not the CPU's fused kernel (unless
  `cpu_artifacts`)."""
  return "dense" if asked == "auto" and not cpu_artifacts else asked


def _abstract_model(cfg: TrainConfig, mesh, layout: str, cpu_artifacts: bool = False):
  m = cfg.model
  mcfg = models.get_config(m.preset, dtype=m.dtype, remat=m.remat,
                           attention=_attention(m.attention, cpu_artifacts),
                           attention_block=m.attention_block,
                           moe_impl=_moe_impl(cpu_artifacts))
  return sharding.abstract_model(lambda: models.Qwen3(mcfg, rngs=nnx.Rngs(0)), mesh, layout)


def learner_memory(cfg: TrainConfig, prompt_len: int,
                   cpu_artifacts: bool = False) -> Memory:
  """The learner step of `cfg`: one micro-batch row of `prompt_len +
  max_new_tokens` tokens per data-parallel device (as the pod configs run;
  with packing, one micro-batch of `pack_rows` packed rows, beside the whole
  step's unpacked per-token arrays)."""
  mesh = mesh_from_config(cfg.learner.mesh)
  graphdef, params = _abstract_model(cfg, mesh, "train", cpu_artifacts)
  learner = Learner(graphdef, params, spec=step_spec(cfg),
                    optimizer=make_optimizer(cfg.optim, cfg.num_steps), mesh=mesh)
  dp = sharding.row_shards(mesh)
  length = prompt_len + cfg.sampling.max_new_tokens
  if learner.spec.pack_length:
    rows = -(-cfg.data.prompts_per_step * cfg.data.group_size // dp) * dp
    return _memory(learner.lower_step(rows, length, packed_rows=learner.spec.pack_rows),
                   cpu_artifacts)
  rows = cfg.learner.num_minibatches * cfg.learner.num_microbatches * dp
  return _memory(learner.lower_step(rows, length), cpu_artifacts)


def sampler_memory(cfg: TrainConfig, prompt_len: int, num_slots: int,
                   cpu_artifacts: bool = False,
                   **sampler_overrides: Any) -> tuple[Memory, Memory]:
  """`(prefill, decode)` of `cfg`'s sampler: one prompt of `prompt_len` tokens,
  and `num_slots` responses of `max_new_tokens` decoding at once."""
  mesh = mesh_from_config(cfg.learner.mesh)
  _, params = _abstract_model(cfg, mesh, "train")
  engine = Engine(nnx.eval_shape(lambda: models.Qwen3(models.get_config(
      cfg.model.preset, dtype=cfg.model.dtype, moe_impl=_moe_impl(cpu_artifacts)),
      rngs=nnx.Rngs(0))), SamplerConfig(
          **{**cfg.sampling.precision_kwargs(),
             **{k: v for k, v in sampler_overrides.items() if v is not None}},
          max_prefill_length=prompt_len, max_decode_length=cfg.sampling.max_new_tokens,
          kv_cache_storage="real"),  # an accelerator's cache, even when planned on CPU
      mesh=mesh)
  weights = jax.eval_shape(engine.load_params, params)
  weights = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), weights,
      sharding.param_shardings(weights, mesh, "sampling"),
      is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
  prompts = np.ones((1, prompt_len), np.int32)

  def prefill(w):
    return engine.prefill(w, prompts, [prompt_len], rng=jax.random.key(0),
                          temperature=cfg.sampling.temperature,
                          max_new_tokens=cfg.sampling.max_new_tokens)

  with engine.mesh_context():
    prefill_memory = _memory(jax.jit(prefill).lower(weights), cpu_artifacts)
  state = jax.eval_shape(lambda: engine.init_decode_state(
      num_slots=num_slots, prefill_length=prompt_len,
      decode_length=cfg.sampling.max_new_tokens))
  shardings = engine.decode_state_shardings(state)
  if shardings is not None:
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         state, shardings)
  with engine.mesh_context():
    decode = jax.jit(engine.generate_until_done, donate_argnums=1).lower(weights, state)
    return prefill_memory, _memory(decode, cpu_artifacts)


def with_model(cfg: TrainConfig, **changes: Any) -> TrainConfig:
  """`cfg` with `model` fields changed (e.g. the before-configuration)."""
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **changes))
