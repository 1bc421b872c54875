"""One RL batch as the learner sees it (docs/method.md §0 notation).

Every response is one row: prompt and response tokens concatenated and
right-padded to a fixed length `T`, so a run compiles the step once. Per-token
arrays are aligned with `tokens_BT`: entry `t` belongs to the token at `t`
(its log-prob is that of `tokens[t]` given `tokens[:t]`), and `loss_mask_BT`
marks the generated tokens that count.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from mipu_jax.learner import packing
from mipu_jax.models import sharding as sharding_lib


class Batch(NamedTuple):
  """Learner input; `B` responses of `T` tokens.

  Attributes:
    tokens_BT: int32 prompt + response ids, right-padded.
    input_mask_BT: 1 on real (prompt or response) tokens.
    loss_mask_BT: m, 1 on counted response tokens.
    lp_mu_BT: sampler log-probs of the response tokens (0 elsewhere).
    lp_old_BT: learner log-probs at the synced weights (`on_policy_recompute`);
      equal to `lp_mu_BT` in `bypass` mode, which has no recompute.
    advantages_B: per-response advantage.
    response_length: float32 scalar, the step's mean response length (the
      length-surge schedule's extra argument, docs/method.md §6).
    lp_ref_model_BT: frozen reference-model log-probs, only with a KL term.
    pack: with sequence packing, where each packed token comes from
      (`packing.PackPlan`, set by `Learner.step`); None unpacked.
    routing_BTLk: MoE routing replay (docs/method.md §7a): int32
      `[B, T, L_moe, k]` experts each token is routed to in every MoE layer
      (-1: the learner's own routing there); None routes live.
  """
  tokens_BT: jax.Array
  input_mask_BT: jax.Array
  loss_mask_BT: jax.Array
  lp_mu_BT: jax.Array
  lp_old_BT: jax.Array
  advantages_B: jax.Array
  response_length: jax.Array
  lp_ref_model_BT: Optional[jax.Array] = None
  pack: Optional[packing.PackPlan] = None
  routing_BTLk: Optional[jax.Array] = None


def batch_shardings(mesh: Mesh, with_ref: bool, packed: bool = False,
                    routed: bool = False) -> Batch:
  """Rows (and packed rows) over (data, fsdp); the scalar replicated."""
  rows2 = sharding_lib.batch_sharding(mesh, 2)
  rows1 = sharding_lib.batch_sharding(mesh, 1)
  return Batch(tokens_BT=rows2, input_mask_BT=rows2, loss_mask_BT=rows2,
               lp_mu_BT=rows2, lp_old_BT=rows2, advantages_B=rows1,
               response_length=NamedSharding(mesh, P()),
               lp_ref_model_BT=rows2 if with_ref else None,
               pack=packing.PackPlan(rows2, rows2, rows2) if packed else None,
               routing_BTLk=sharding_lib.batch_sharding(mesh, 4) if routed else None)


def abstract_batch(batch_size: int, length: int, with_ref: bool,
                   packed_rows: Optional[tuple[int, int]] = None) -> Batch:
  """`ShapeDtypeStruct`s of a batch (for lowering without data).

  `packed_rows=(R, P)`: with a packing plan of R rows of P tokens.
  """
  pack = None
  if packed_rows is not None:
    i32 = jax.ShapeDtypeStruct(packed_rows, jnp.int32)
    pack = packing.PackPlan(i32, i32, i32)
  def f32(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)
  return Batch(tokens_BT=jax.ShapeDtypeStruct((batch_size, length), jnp.int32),
               input_mask_BT=f32(batch_size, length),
               loss_mask_BT=f32(batch_size, length),
               lp_mu_BT=f32(batch_size, length), lp_old_BT=f32(batch_size, length),
               advantages_B=f32(batch_size), response_length=f32(),
               lp_ref_model_BT=f32(batch_size, length) if with_ref else None,
               pack=pack)


def host_batch(tokens_BT, input_mask_BT, loss_mask_BT, lp_mu_BT, advantages_B,
               *, lp_old_BT=None, lp_ref_model_BT=None,
               response_length=None, routing_BTLk=None) -> Batch:
  """A numpy `Batch` with canonical dtypes; `lp_old` defaults to `lp_mu`."""
  loss_mask_BT = np.asarray(loss_mask_BT, np.float32)
  if response_length is None:
    response_length = loss_mask_BT.sum(axis=1).mean()
  lp_mu_BT = np.asarray(lp_mu_BT, np.float32)
  return Batch(
      tokens_BT=np.asarray(tokens_BT, np.int32),
      input_mask_BT=np.asarray(input_mask_BT, np.float32),
      loss_mask_BT=loss_mask_BT,
      lp_mu_BT=lp_mu_BT,
      lp_old_BT=lp_mu_BT if lp_old_BT is None else np.asarray(lp_old_BT, np.float32),
      advantages_B=np.asarray(advantages_B, np.float32),
      response_length=np.asarray(response_length, np.float32),
      lp_ref_model_BT=(None if lp_ref_model_BT is None
                       else np.asarray(lp_ref_model_BT, np.float32)),
      routing_BTLk=None if routing_BTLk is None else np.asarray(routing_BTLk, np.int32))
