"""Weight sync: learner params → (reshard) → quantize → sampler (docs/method.md §7).

The sampler's params are a pure nested dict with the model's paths (`{'embed': ..., 'layers':
{'q': ...}, ...}`), leaves in the compute dtype or qwix `QArray`s (real PTQ storage). Every sync
gives the same tree structure, shapes and dtypes, so the jitted engine functions never recompile.
"""

from typing import Any, Optional

import jax
from flax import nnx

from mipu_jax import distributed
from mipu_jax.models import sharding


def learner_params(source: Any) -> dict:
  """A pure param dict from a Qwen3 module, an `nnx.State`, or a pure dict."""
  if isinstance(source, nnx.Module):
    source = nnx.state(source, nnx.Param)
  if isinstance(source, nnx.State):
    return nnx.to_pure_dict(source)
  if isinstance(source, dict):
    return source
  raise TypeError(f"Cannot take sampler weights from a {type(source).__name__}; pass the "
                  "learner's Qwen3 module, its nnx.State or a pure param dict.")


def check_structure(params: dict, reference: dict) -> None:
  """Raises a clear error unless `params` has the reference's paths and shapes."""
  got = jax.tree_util.tree_flatten_with_path(params)[0]
  want = jax.tree_util.tree_flatten_with_path(reference)[0]
  got_map = {jax.tree_util.keystr(k): v.shape for k, v in got}
  want_map = {jax.tree_util.keystr(k): v.shape for k, v in want}
  if got_map.keys() != want_map.keys():
    missing = sorted(want_map.keys() - got_map.keys())
    extra = sorted(got_map.keys() - want_map.keys())
    raise ValueError(f"Weight sync: parameter paths differ (missing {missing}, extra {extra}).")
  for path, shape in want_map.items():
    if tuple(got_map[path]) != tuple(shape):
      raise ValueError(f"Weight sync: {path} has shape {got_map[path]}, expected {shape}.")


def reshard_for_sampling(params: dict, mesh: Optional[jax.sharding.Mesh]) -> dict:
  """Moves float learner params to the sampling layout on `mesh` (this process's devices; no-op
  without a mesh on one process): `sharding.param_shardings(params, mesh, layout="sampling")`.
  Quantization then runs under `jit` on them, so quantized values and scales inherit the layout."""
  # Several processes: the learner's arrays span every host; take this process's replica first.
  params = jax.tree.map(
      lambda x: distributed.local_copy(x) if isinstance(x, jax.Array) else x, params)
  if mesh is None:
    return params
  return jax.device_put(params, sharding.param_shardings(params, mesh, layout="sampling"))
