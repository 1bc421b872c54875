"""`Learner`: the pure step and the log-prob recompute, jitted once over a mesh.

The jitted functions carry explicit in/out shardings (parameters in the
`train` layout over (data, fsdp, tensor), rows over (data, fsdp)) and the step
donates the incoming state's buffers — except with `donate=False`, which the
MIPU Step 2 gate needs because a rollback returns to the pre-update state
(docs/method.md §5). Each jitted function counts its traces, so a test can check that
a second call does not recompile.
"""

import collections
import dataclasses
import functools
import math
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from mipu_jax.config import MeshConfig, TrainConfig
from mipu_jax.learner import batch as batch_lib
from mipu_jax.learner import logprobs as logprobs_lib
from mipu_jax.learner import packing
from mipu_jax.learner import state as state_lib
from mipu_jax.learner import step as step_lib
from mipu_jax.models import moe
from mipu_jax.models import qwen3
from mipu_jax.models import sharding as sharding_lib


def mesh_from_config(cfg: MeshConfig, devices=None) -> Mesh:
  """The (data, fsdp, tensor) mesh; a fully given shape uses the first devices."""
  devices = list(jax.devices() if devices is None else devices)
  shape = (cfg.data, cfg.fsdp, cfg.tensor)
  if -1 not in shape:
    need = math.prod(shape) * cfg.expert
    if need > len(devices):
      experts = f" x expert {cfg.expert}" if cfg.expert > 1 else ""
      raise ValueError(f"mesh {shape}{experts} needs {need} devices, have {len(devices)}.")
    devices = devices[:need]
  return sharding_lib.make_mesh(*shape, devices=devices, expert=cfg.expert)


def check_rows(b: int, chunks: int, dp: int) -> None:
  """A batch of `b` rows splits into `chunks` micro-batches over `dp` row shards."""
  if b % chunks or (b // chunks) % dp:
    raise ValueError(
        f"{b} rows (data.prompts_per_step x data.group_size): need a multiple of "
        f"learner.num_minibatches x num_microbatches ({chunks}) whose micro-batches "
        f"({b // max(chunks, 1)} rows) split over the {dp} data-parallel devices of "
        "learner.mesh.")


def step_spec(cfg: TrainConfig) -> step_lib.StepSpec:
  """The static step description of a run."""
  s = cfg.sampling
  return step_lib.StepSpec(
      loss=cfg.loss,
      scoring=logprobs_lib.Scoring(s.temperature, s.top_k, s.top_p, s.true_on_policy),
      ppo_epochs=cfg.learner.ppo_epochs,
      num_minibatches=cfg.learner.num_minibatches,
      num_microbatches=cfg.learner.num_microbatches,
      shuffle=cfg.learner.shuffle,
      with_entropy=cfg.learner.log_entropy or cfg.loss.entropy_coef > 0,
      max_response_len=s.max_new_tokens,
      logits_chunk=cfg.learner.logits_chunk,
      pack_length=cfg.learner.pack_length,
      pack_rows=cfg.learner.pack_rows,
      routing_replay=cfg.moe.routing_replay)


class Learner:
  """The training side π: state init, the jitted step, the jitted recompute.

  Args:
    graphdef: the policy's `nnx.GraphDef`.
    abstract_params: the parameter pure dict (arrays or `ShapeDtypeStruct`s).
    spec: the static step description; its `recompute_mlp` and `unroll_layers`,
      if None, are resolved here for the model and the mesh's platform
      (`qwen3.recompute_mlp_for`, `moe.learner_unroll_layers`).
    optimizer: from `make_optimizer`.
    mesh: the (data, fsdp, tensor) mesh.
    donate: donate the state passed to `step` (off for MIPU Step 2).
    compiler_options: XLA options of every jitted program; None: resolved here
      for the model and the mesh's platform (`moe.learner_compiler_options`).
  """

  def __init__(self, graphdef: nnx.GraphDef, abstract_params: Any, *,
               spec: step_lib.StepSpec,
               optimizer: optax.GradientTransformationExtraArgs, mesh: Mesh,
               donate: bool = True, compiler_options: Optional[dict] = None):
    dp = sharding_lib.row_shards(mesh)
    platform = mesh.devices.flat[0].platform
    if spec.recompute_mlp is None:  # where the platform is known: the mesh
      spec = dataclasses.replace(spec, recompute_mlp=qwen3.recompute_mlp_for(platform))
    model_cfg = nnx.merge(graphdef, abstract_params).config
    true_on_policy = spec.scoring.true_on_policy
    if compiler_options is None:
      compiler_options = moe.learner_compiler_options(model_cfg, platform, true_on_policy)
    if spec.unroll_layers is None:
      spec = dataclasses.replace(spec, unroll_layers=moe.learner_unroll_layers(
          model_cfg, platform, true_on_policy))
    self.compiler_options = dict(compiler_options)
    jit = functools.partial(jax.jit, compiler_options=self.compiler_options or None)
    if spec.pack_length and spec.pack_rows == 0:
      spec = dataclasses.replace(spec, pack_rows=dp)
    self.graphdef, self.spec, self.optimizer, self.mesh = (
        graphdef, spec, optimizer, mesh)
    self.donate = donate
    self.abstract_params = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), abstract_params)
    self.traces = collections.Counter()
    if spec.pack_length:
      if spec.pack_rows % dp:
        raise ValueError(f"learner.pack_rows={spec.pack_rows} must be a multiple "
                         f"of the {dp} data-parallel devices.")
    self.state_shardings = state_lib.state_shardings(optimizer, abstract_params,
                                                     mesh)
    with_ref = spec.loss.kl_coef > 0
    self.routed = spec.routing_replay != "none"
    self.batch_shardings = batch_lib.batch_shardings(mesh, with_ref,
                                                     packed=spec.pack_length > 0,
                                                     routed=self.routed)
    row_sh = sharding_lib.batch_sharding(mesh, 2)
    replicated = NamedSharding(mesh, P())
    self._row_constraint = NamedSharding(mesh, P(None, sharding_lib.row_axes(mesh)))

    def rows(x):
      return jax.lax.with_sharding_constraint(x, self._row_constraint)

    def step(state, batch):
      self.traces["step"] += 1
      return step_lib.learner_step(state, batch, graphdef=graphdef,
                                   optimizer=optimizer, spec=spec, rows=rows)

    def logprobs(params, tokens_BT, mask_BT, routing_BTLk=None, with_routing=False):
      self.traces["logprobs"] += 1
      return logprobs_lib.chunked_logprobs(
          graphdef, params, tokens_BT, mask_BT, spec.scoring,
          spec.num_minibatches * spec.num_microbatches, spec.logits_chunk,
          routing_BTLk=routing_BTLk, with_routing=with_routing)

    def packed_logprobs(params, tokens_BT, pack, routing_BTLk=None, with_routing=False):
      self.traces["logprobs"] += 1
      return logprobs_lib.packed_logprobs(graphdef, params, tokens_BT, pack,
                                          spec.scoring, spec.pack_rows,
                                          spec.logits_chunk, routing_BTLk=routing_BTLk,
                                          with_routing=with_routing)

    self._step = jit(step, in_shardings=(self.state_shardings, self.batch_shardings),
                     out_shardings=(self.state_shardings, replicated),
                     donate_argnums=(0,) if donate else ())
    self._logprobs = jit(
        logprobs, in_shardings=(self.state_shardings.params, row_sh, row_sh),
        out_shardings=row_sh)
    self._packed_logprobs = jit(
        packed_logprobs, in_shardings=(self.state_shardings.params, row_sh,
                                       packing.PackPlan(row_sh, row_sh, row_sh)),
        out_shardings=row_sh)
    # MoE: the recompute with forced routing in (R3) and / or its own routing out
    # (R2, the routing-mismatch metrics); `with_routing` static.
    row4 = sharding_lib.batch_sharding(mesh, 4)
    self._routed_logprobs = {
        (forced, out): jit(
            functools.partial(logprobs, with_routing=out),
            in_shardings=(self.state_shardings.params, row_sh, row_sh,
                          row4 if forced else None),
            out_shardings=(row_sh, row4) if out else row_sh)
        for forced in (False, True) for out in (False, True)}
    self._routed_packed_logprobs = {
        (forced, out): jit(
            functools.partial(packed_logprobs, with_routing=out),
            in_shardings=(self.state_shardings.params, row_sh,
                          packing.PackPlan(row_sh, row_sh, row_sh), row4 if forced else None),
            out_shardings=(row_sh, row4) if out else row_sh)
        for forced in (False, True) for out in (False, True)}

  @classmethod
  def from_config(cls, cfg: TrainConfig, model: nnx.Module, mesh: Mesh, *,
                  donate: bool = True, compiler_options: Optional[dict] = None,
                  unroll_layers: Optional[bool] = None) -> "Learner":
    """A learner for `model`'s architecture under the run config (`compiler_options`
    as the constructor's; `unroll_layers` as `StepSpec`'s, None: resolved)."""
    graphdef, state = nnx.split(model)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                            nnx.to_pure_dict(state))
    spec = dataclasses.replace(step_spec(cfg), unroll_layers=unroll_layers)
    if cfg.moe.aux_loss and model.config.is_moe:
      spec = dataclasses.replace(spec, aux_loss_coef=model.config.router_aux_loss_coef)
    return cls(graphdef, abstract, spec=spec,
               optimizer=state_lib.make_optimizer(cfg.optim, cfg.num_steps),
               mesh=mesh, donate=donate, compiler_options=compiler_options)

  def init_state(self, params: Any, seed: int) -> state_lib.LearnerState:
    """A sharded step-0 state from a parameter pure dict."""
    return state_lib.init_state(params, self.optimizer, self.mesh, seed)

  def shard_batch(self, batch: batch_lib.Batch) -> batch_lib.Batch:
    """Places a host batch with the step's input shardings (with its packing
    plan, made here from the input mask, when the learner packs)."""
    self._check_rows(batch.tokens_BT.shape[0])
    if self.routed and batch.routing_BTLk is None:
      raise ValueError(f"routing_replay={self.spec.routing_replay!r}: the batch has no "
                       "routing_BTLk to replay (the sampler's for 'rollout', the recompute's "
                       "for 'learner'); it is never silently routed live.")
    if not self.routed and batch.routing_BTLk is not None:
      raise ValueError("the batch carries routing_BTLk but routing_replay is 'none'.")
    if batch.routing_BTLk is not None:
      self._check_routing(batch.routing_BTLk, np.shape(batch.tokens_BT))
    if self.spec.pack_length and batch.pack is None:
      batch = batch._replace(pack=self.pack_plan(batch.input_mask_BT))
    return jax.device_put(batch, self.batch_shardings)

  def pack_plan(self, input_mask_BT) -> packing.PackPlan:
    """The host packing plan of a batch's rows (`learner/packing.py`)."""
    return packing.plan(np.asarray(input_mask_BT), self.spec.pack_length,
                        self.spec.pack_rows)

  def step(self, state: state_lib.LearnerState, batch: batch_lib.Batch,
           ) -> tuple[state_lib.LearnerState, dict[str, jax.Array]]:
    """`learner_step(state, batch)`; `state` is donated unless `donate=False`."""
    # The mesh is set while tracing, so the model pins its activations' rows
    # (`models.qwen3.shard_rows`).
    with jax.set_mesh(self.mesh):
      return self._step(state, self.shard_batch(batch))

  def logprobs(self, params: Any, tokens_BT, mask_BT, *, routing_BTLk=None,
               with_routing: bool = False):
    """Learner log-probs (`lp_old`, or reference / probe log-probs), `[B, T]`.

    MoE: `routing_BTLk` replays that routing (R3's recompute, docs/method.md
    §7a); `with_routing` also returns the forward's own routing
    `[B, T, L_moe, k]` (R2, and the routing-mismatch metrics): `(lp, routing)`.
    """
    self._check_rows(np.shape(tokens_BT)[0])
    rows = sharding_lib.batch_sharding(self.mesh, 2)
    pack = self.pack_plan(mask_BT) if self.spec.pack_length else None
    tokens_BT = jax.device_put(np.asarray(tokens_BT, np.int32), rows)
    routed = routing_BTLk is not None or with_routing
    if routing_BTLk is not None:
      self._check_routing(np.asarray(routing_BTLk), np.shape(tokens_BT))
      routing_BTLk = jax.device_put(np.asarray(routing_BTLk, np.int32),
                                    sharding_lib.batch_sharding(self.mesh, 4))
    with jax.set_mesh(self.mesh):
      if pack is not None:
        pack = jax.device_put(pack, rows)
        if routed:
          fn = self._routed_packed_logprobs[(routing_BTLk is not None, with_routing)]
          return fn(params, tokens_BT, pack, routing_BTLk)
        return self._packed_logprobs(params, tokens_BT, pack)
      mask_BT = jax.device_put(np.asarray(mask_BT, np.float32), rows)
      if routed:
        fn = self._routed_logprobs[(routing_BTLk is not None, with_routing)]
        return fn(params, tokens_BT, mask_BT, routing_BTLk)
      return self._logprobs(params, tokens_BT, mask_BT)

  def abstract_state(self) -> state_lib.LearnerState:
    """`ShapeDtypeStruct`s (with shardings) of a state, nothing materialised."""
    def init(params):
      return state_lib.LearnerState(params, self.optimizer.init(params),
                                    jnp.zeros([], jnp.int32), jax.random.key(0))
    shapes = jax.eval_shape(init, self.abstract_params)
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        shapes, self.state_shardings)

  def lower_step(self, batch_size: int, length: int,
                 packed_rows: int = 0) -> jax.stages.Lowered:
    """Lowers the step on abstract inputs (e.g. to read its memory analysis).

    With packing, `packed_rows` is the plan's row count (rows of
    `pack_length` tokens).
    """
    batch = batch_lib.abstract_batch(
        batch_size, length, self.spec.loss.kl_coef > 0,
        (packed_rows, self.spec.pack_length) if self.spec.pack_length else None)
    return self._lower(self.abstract_state(), batch)

  def lower_step_on(self, state: state_lib.LearnerState, batch: batch_lib.Batch
                    ) -> jax.stages.Lowered:
    """Lowers the step on these inputs: the program `step(state, batch)` runs, so
    compiling it (e.g. for its memory analysis) is the compile the step reuses."""
    return self._lower(state, self.shard_batch(batch))

  def _lower(self, state, batch) -> jax.stages.Lowered:
    with jax.set_mesh(self.mesh):
      return self._step.lower(state, batch)

  def _check_routing(self, routing_BTLk, tokens_shape) -> None:
    """Replayed routing against the batch and the model: `[B, T, L_moe, k]` with
    B, T the tokens' and L_moe the model's MoE layers, ids in [-1, E)."""
    router = self.abstract_params.get("layers", {}).get("router")
    if router is None:
      raise ValueError("routing_BTLk was given for a dense model (no MoE layers).")
    layers, experts = router.shape[0], router.shape[-1]
    shape = np.shape(routing_BTLk)
    if len(shape) != 4 or tuple(shape[:2]) != tuple(tokens_shape) or shape[2] != layers:
      raise ValueError(f"routing_BTLk has shape {tuple(shape)}; the batch's tokens "
                       f"{tuple(tokens_shape)} and the model's {layers} MoE layers need "
                       f"[{tokens_shape[0]}, {tokens_shape[1]}, {layers}, k].")
    if isinstance(routing_BTLk, np.ndarray) and routing_BTLk.size and (
        routing_BTLk.min() < -1 or routing_BTLk.max() >= experts):
      raise ValueError(f"routing_BTLk holds expert ids outside [-1, {experts}) "
                       f"({routing_BTLk.min()}..{routing_BTLk.max()}).")

  def _check_rows(self, b: int) -> None:
    check_rows(b, self.spec.num_minibatches * self.spec.num_microbatches,
               sharding_lib.row_shards(self.mesh))
