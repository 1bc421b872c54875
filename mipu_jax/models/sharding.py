"""Sharding tables: parameter names -> `PartitionSpec` over a (data, fsdp, [expert,] tensor) mesh.

Two layouts (docs/method.md §7): `train` shards every matrix over `fsdp` (ZeRO-3
style) and `tensor` (Megatron style: heads / MLP width); `sampling` keeps only
the `tensor` split so decode never all-gathers weights. Batches are split over
(`data`, `fsdp`). `jit` over the mesh shards parameters too, which Qwen3-4B on a
TPU pod needs and `pmap` cannot do.

A mixture-of-experts policy may add an `expert` axis (expert parallelism,
docs/method.md §7a): each device along it holds E / `expert` experts of every
MoE layer (in both layouts), the batch's rows split over it too (so its devices
do not repeat each other's tokens), and in the `train` layout the dense
matrices' `fsdp` dimension splits over `fsdp` x `expert` (the axis is data
parallel for everything but the experts, as in Megatron's and MaxText's EP).
A mesh without experts has no `expert` axis at all (not one of size 1), so its
specs are exactly those of the three-axis table.
"""

import math
from typing import Any, Optional

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
EXPERT_AXES = ("data", "fsdp", "expert", "tensor")  # a mesh with expert parallelism
# The axes a batch's rows (and the decode pool's parts) split over, those a mesh has.
ROWS = ("data", "fsdp", "expert")
_ZERO3 = ("fsdp", "expert")  # a dense matrix's ZeRO-3 dimension in the `train` layout


def row_axes(mesh) -> tuple[str, ...]:
  """The `ROWS` axes `mesh` has."""
  return tuple(a for a in ROWS if a in mesh.shape)


def row_shards(mesh) -> int:
  """How many parts a batch's rows split into on `mesh` (its `ROWS` axes)."""
  return math.prod(mesh.shape[a] for a in row_axes(mesh))


def split_axes(mesh) -> tuple[str, ...]:
  """The row axes a `shard_map` over a batch's rows splits over on the active
  (abstract) `mesh`: none without a mesh or inside a split already."""
  return () if mesh.empty or mesh.manual_axes else row_axes(mesh)


# Parameter path -> per-dimension mesh axes (a name, or a tuple of names split
# in order), for the `train` layout.
TRAIN_RULES: dict[str, tuple[Optional[str] | tuple[str, ...], ...]] = {
    "embed": ("tensor", _ZERO3),                        # [V, D]
    "lm_head": (_ZERO3, "tensor"),                      # [D, V]
    "final_norm": (None,),                              # [D]
    "layers/attn_norm": (None, None),                   # [L, D]
    "layers/mlp_norm": (None, None),                    # [L, D]
    "layers/q_norm": (None, None),                      # [L, H]
    "layers/k_norm": (None, None),                      # [L, H]
    "layers/q": (None, _ZERO3, "tensor", None),         # [L, D, N, H]
    "layers/k": (None, _ZERO3, "tensor", None),         # [L, D, K, H]
    "layers/v": (None, _ZERO3, "tensor", None),         # [L, D, K, H]
    "layers/o": (None, "tensor", None, _ZERO3),         # [L, N, H, D]
    "layers/gate": (None, _ZERO3, "tensor"),            # [L, D, F]
    "layers/up": (None, _ZERO3, "tensor"),              # [L, D, F]
    "layers/down": (None, "tensor", _ZERO3),            # [L, F, D]
    # MoE layers (docs/method.md §7a): experts over `expert` (expert parallelism),
    # each expert's matrices as the dense MLP's; the router as a small matrix.
    "layers/router": (None, _ZERO3, None),              # [L, D, E]
    "layers/experts_gate": (None, "expert", "fsdp", "tensor"),  # [L, E, D, F]
    "layers/experts_up": (None, "expert", "fsdp", "tensor"),    # [L, E, D, F]
    "layers/experts_down": (None, "expert", "tensor", "fsdp"),  # [L, E, F, D]
}
LAYOUTS = ("train", "sampling")

# The sampler's quantized weights (`quantized.QuantizedWeight`, native compute):
# values `[L, O, I]` (outputs, then the contraction) and scales `[L, O]`; the
# `tensor` axis stays on the axis the float rule puts it on (fsdp is never used
# by the sampling layout).
_OUT, _IN = ((None, "tensor", None), (None, "tensor")), ((None, None, "tensor"), (None, None))
QUANTIZED_RULES: dict[str, tuple[tuple[Optional[str], ...], ...]] = {
    "embed": (("tensor", None), ("tensor",)),           # [V, D], [V]
    "lm_head": (("tensor", None), ("tensor",)),         # [V, D], [V]
    "layers/q": _OUT, "layers/k": _OUT, "layers/v": _OUT, "layers/gate": _OUT,
    "layers/up": _OUT, "layers/o": _IN, "layers/down": _IN,
    # Experts: values [L, E, O, I], scales [L, E, O].
    "layers/experts_gate": ((None, "expert", "tensor", None), (None, "expert", "tensor")),
    "layers/experts_up": ((None, "expert", "tensor", None), (None, "expert", "tensor")),
    "layers/experts_down": ((None, "expert", None, "tensor"), (None, "expert", None)),
}


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices=None, *,
              expert: int = 1) -> Mesh:
  """A (data, fsdp, tensor) mesh; one of those axes may be -1 to take the remaining
  devices. `expert` > 1 (a mixture-of-experts policy only) adds an `expert` axis
  between `fsdp` and `tensor`: (data, fsdp, expert, tensor)."""
  devices = list(jax.devices() if devices is None else devices)
  if isinstance(expert, bool) or not isinstance(expert, int) or expert < 1:
    raise ValueError(f"The expert axis must be an int >= 1, got {expert!r}.")
  shape = [data, fsdp, tensor]
  if shape.count(-1) > 1:
    raise ValueError(f"At most one mesh axis may be -1, got {shape}.")
  known = math.prod(s for s in shape if s != -1) * expert
  if -1 in shape:
    if len(devices) % known:
      experts = f" x expert {expert}" if expert > 1 else ""
      raise ValueError(f"{len(devices)} devices do not divide into mesh {shape}{experts}.")
    shape[shape.index(-1)] = len(devices) // known
  axes = AXES
  if expert > 1:
    shape.insert(2, expert)
    axes = EXPERT_AXES
  if math.prod(shape) != len(devices):
    raise ValueError(f"Mesh {dict(zip(axes, shape))} needs {math.prod(shape)} devices, "
                     f"have {len(devices)}.")
  return Mesh(np.asarray(devices).reshape(shape), axes)


def expert_shards(mesh) -> int:
  """Size of `mesh`'s `expert` axis (1 without one)."""
  return mesh.shape.get("expert", 1)


def check_experts(num_experts: int, expert: int) -> None:
  """A clear error, before anything compiles, where an expert axis of size
  `expert` cannot hold a model's experts: a dense model (`num_experts` 0), or a
  count the axis does not divide."""
  if expert == 1:
    return
  if num_experts == 0:
    raise ValueError(f"The mesh has an expert axis of size {expert} but the model is "
                     "dense (num_experts=0): expert parallelism needs a "
                     "mixture-of-experts policy; use expert=1.")
  if num_experts % expert:
    raise ValueError(f"num_experts={num_experts} is not divisible by the mesh's "
                     f"expert axis of size {expert}.")


def _path_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def spec_for(name: str, shape: tuple[int, ...], mesh: Mesh, layout: str = "train") -> P:
  """PartitionSpec of parameter `name`; an axis that does not divide its dim is dropped."""
  if layout not in LAYOUTS:
    raise ValueError(f"Unknown layout {layout!r}; expected one of {LAYOUTS}.")
  base, _, leaf = name.rpartition("/")
  if name in TRAIN_RULES:
    rule = TRAIN_RULES[name]
  elif leaf in ("qvalue", "scale") and base in TRAIN_RULES:  # a qwix QArray (same rank)
    rule = TRAIN_RULES[base]
  elif leaf in ("0", "1") and base in QUANTIZED_RULES:  # a QuantizedWeight's values / scale
    rule = QUANTIZED_RULES[base][int(leaf)]
  else:
    raise KeyError(f"No sharding rule for parameter {name!r}.")
  if len(rule) != len(shape):
    raise ValueError(f"Rule for {name!r} has rank {len(rule)}, parameter has shape {shape}.")
  if "expert" in rule:  # an expert-stacked weight: E is the dim `expert` names
    check_experts(shape[rule.index("expert")], expert_shards(mesh))
  return P(*(_mesh_axes(axis, dim, mesh, layout) for axis, dim in zip(rule, shape)))


def _mesh_axes(axis, dim: int, mesh: Mesh, layout: str):
  """One dimension's entry: the rule's axes (one name, or a tuple split in
  order) that `mesh` has and that divide `dim`, as a name, a tuple or None."""
  names = axis if isinstance(axis, tuple) else (axis,)
  if layout == "sampling" and "fsdp" in names:
    return None  # the sampling layout never splits a weight's ZeRO-3 dimension
  kept, size = [], 1
  for name in names:
    # A mesh without the axis (`expert` on a dense mesh), or one that does not divide.
    if name is not None and name in mesh.shape and dim % (size * mesh.shape[name]) == 0:
      kept.append(name)
      size *= mesh.shape[name]
  return None if not kept else kept[0] if len(kept) == 1 else tuple(kept)


def param_shardings(params: Any, mesh: Mesh, layout: str = "train") -> dict:
  """Pure dict of `NamedSharding`s for a parameter state / pure dict / model.

  A mesh with an expert axis needs expert weights to split (`check_experts`).
  """
  if isinstance(params, nnx.Module):
    params = nnx.state(params, nnx.Param)
  if isinstance(params, nnx.State):
    params = nnx.to_pure_dict(params)
  names = []

  def one(path, x):
    names.append(_path_name(path))
    return NamedSharding(mesh, spec_for(names[-1], x.shape, mesh, layout))

  shardings = jax.tree_util.tree_map_with_path(one, params)
  if not any("/experts_" in n for n in names):
    check_experts(0, expert_shards(mesh))
  return shardings


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Leading (batch) axis over the mesh's `ROWS` axes; the rest replicated."""
  return NamedSharding(mesh, P(row_axes(mesh), *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def shard_model(model: nnx.Module, mesh: Mesh, layout: str = "train") -> nnx.Module:
  """Places the model's parameters with the `layout` table (in place) and returns it."""
  state = nnx.state(model, nnx.Param)
  pure = jax.tree.map(jax.device_put, nnx.to_pure_dict(state),
                      param_shardings(state, mesh, layout))
  nnx.replace_by_pure_dict(state, pure)
  nnx.update(model, state)
  return model


def init_sharded(model_fn, mesh: Mesh, layout: str = "train") -> nnx.Module:
  """Builds `model_fn()` directly sharded: abstract shapes first, then a jitted init.

  No device ever holds the full unsharded parameters (`jax.eval_shape` ->
  shardings -> `jax.jit(init, out_shardings=...)`).
  """
  abstract = nnx.eval_shape(model_fn)
  graphdef, state = nnx.split(abstract)
  shardings = param_shardings(state, mesh, layout)

  def init():
    return nnx.to_pure_dict(nnx.state(model_fn()))

  init = jax.jit(init, out_shardings=shardings)
  nnx.replace_by_pure_dict(state, init())
  return nnx.merge(graphdef, state)


def abstract_model(model_fn, mesh: Mesh, layout: str = "train"):
  """(graphdef, pure dict of `ShapeDtypeStruct`s carrying their shardings)."""
  graphdef, state = nnx.split(nnx.eval_shape(model_fn))
  pure = nnx.to_pure_dict(state)
  shardings = param_shardings(pure, mesh, layout)
  return graphdef, jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), pure, shardings)


def per_device_bytes(abstract_params: Any) -> int:
  """Bytes of parameters held by one device, from shapes and shardings."""
  total = 0
  for x in jax.tree.leaves(abstract_params):
    shard = x.sharding.shard_shape(x.shape)
    total += math.prod(shard) * np.dtype(x.dtype).itemsize
  return total
