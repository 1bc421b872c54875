"""One RL batch as the learner sees it (docs/method.md §0 notation).

Every response is one row: prompt and response tokens concatenated and
right-padded to a fixed length `L`, so a run compiles the step once. Per-token
arrays are aligned with `tokens_BL`: entry `t` belongs to the token at `t`
(its log-prob is that of `tokens[t]` given `tokens[:t]`), and `loss_mask_BL`
marks the generated tokens that count.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from mipu_jax.models import sharding as sharding_lib


class Batch(NamedTuple):
  """Learner input; `B` responses of `L` tokens.

  Attributes:
    tokens_BL: int32 prompt + response ids, right-padded.
    input_mask_BL: 1 on real (prompt or response) tokens.
    loss_mask_BL: m, 1 on counted response tokens.
    lp_mu_BL: sampler log-probs of the response tokens (0 elsewhere).
    lp_old_BL: learner log-probs at the synced weights (`on_policy_recompute`);
      equal to `lp_mu_BL` in `bypass` mode, which has no recompute.
    advantages_B: per-response advantage.
    response_length: float32 scalar, the step's mean response length (the
      length-surge schedule's extra argument, docs/method.md §6).
    lp_ref_model_BL: frozen reference-model log-probs, only with a KL term.
  """
  tokens_BL: jax.Array
  input_mask_BL: jax.Array
  loss_mask_BL: jax.Array
  lp_mu_BL: jax.Array
  lp_old_BL: jax.Array
  advantages_B: jax.Array
  response_length: jax.Array
  lp_ref_model_BL: Optional[jax.Array] = None


def batch_shardings(mesh: Mesh, with_ref: bool) -> Batch:
  """Rows over (data, fsdp); the scalar replicated."""
  rows2 = sharding_lib.batch_sharding(mesh, 2)
  rows1 = sharding_lib.batch_sharding(mesh, 1)
  return Batch(tokens_BL=rows2, input_mask_BL=rows2, loss_mask_BL=rows2,
               lp_mu_BL=rows2, lp_old_BL=rows2, advantages_B=rows1,
               response_length=NamedSharding(mesh, P()),
               lp_ref_model_BL=rows2 if with_ref else None)


def abstract_batch(batch_size: int, length: int, with_ref: bool) -> Batch:
  """`ShapeDtypeStruct`s of a batch (for lowering without data)."""
  def f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)
  return Batch(tokens_BL=jax.ShapeDtypeStruct((batch_size, length), jnp.int32),
               input_mask_BL=f32(batch_size, length),
               loss_mask_BL=f32(batch_size, length),
               lp_mu_BL=f32(batch_size, length), lp_old_BL=f32(batch_size, length),
               advantages_B=f32(batch_size), response_length=f32(),
               lp_ref_model_BL=f32(batch_size, length) if with_ref else None)


def host_batch(tokens_BL, input_mask_BL, loss_mask_BL, lp_mu_BL, advantages_B,
               *, lp_old_BL=None, lp_ref_model_BL=None,
               response_length=None) -> Batch:
  """A numpy `Batch` with canonical dtypes; `lp_old` defaults to `lp_mu`."""
  loss_mask_BL = np.asarray(loss_mask_BL, np.float32)
  if response_length is None:
    response_length = loss_mask_BL.sum(axis=1).mean()
  lp_mu_BL = np.asarray(lp_mu_BL, np.float32)
  return Batch(
      tokens_BL=np.asarray(tokens_BL, np.int32),
      input_mask_BL=np.asarray(input_mask_BL, np.float32),
      loss_mask_BL=loss_mask_BL,
      lp_mu_BL=lp_mu_BL,
      lp_old_BL=lp_mu_BL if lp_old_BL is None else np.asarray(lp_old_BL, np.float32),
      advantages_B=np.asarray(advantages_B, np.float32),
      response_length=np.asarray(response_length, np.float32),
      lp_ref_model_BL=(None if lp_ref_model_BL is None
                       else np.asarray(lp_ref_model_BL, np.float32)))
