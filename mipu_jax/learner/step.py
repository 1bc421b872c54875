"""The pure learner step: PPO epochs × mini-batches × micro-batches (docs/method.md §2–4).

`learner_step(state, batch, spec) -> (state, metrics)` is a pure function of
its inputs; `Learner` jits it once with shardings and donation. Structure:

1. the §3 correction and the §4 metrics over the whole batch, once;
2. per epoch a permutation of the rows (from `state.rng`), cut into
   `num_minibatches` mini-batches of `num_microbatches` micro-batches;
3. one `lax.scan` over the `epochs × minibatches` optimizer updates, each a
   `lax.scan` accumulating micro-batch gradients (`losses.policy` makes the
   sum exact), then one optimizer update with the step's mean response length
   (the LR schedule advances once per RL step, on its first update); an update
   with a non-finite loss or gradient is skipped (docs/reliability.md).
"""

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from mipu_jax import losses
from mipu_jax import schedules
from mipu_jax.learner.batch import Batch
from mipu_jax.learner import packing
from mipu_jax.learner.logprobs import policy_logprobs, Scoring
from mipu_jax.learner.state import LearnerState

Constrain = Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """Static description of a learner step (hashable).

  Attributes:
    loss: the validated loss config.
    scoring: the sampled distribution (temperature, truncation).
    ppo_epochs: passes over the batch.
    num_minibatches: optimizer updates per epoch.
    num_microbatches: gradient-accumulation chunks per update.
    shuffle: permute rows every epoch.
    with_entropy: compute the policy entropy.
    max_response_len: the `seq_mean_token_sum_norm` length by default.
    logits_chunk: positions per LM-head chunk of the log-probs (0: dense
      logits; `policy_logprobs`).
    pack_length: tokens per packed row (0: no sequence packing).
    pack_rows: packed rows per micro-batch (with `pack_length`).
    recompute_mlp: the backward pass recomputes each layer's MLP input
      (`models.qwen3.recompute_mlp_for`); None: `Learner` resolves it for its
      mesh's platform.
    unroll_layers: the differentiated forward runs the layer scans unrolled
      (`models.moe.learner_unroll_layers`); None: `Learner` resolves it for its
      model and mesh's platform.
    routing_replay: MoE routing replay (docs/method.md §7a): "none" (live
      routing), "learner" (R2: the recompute's routing) or "rollout" (R3: the
      sampler's); with either, every batch carries `routing_BTLk`.
    aux_loss_coef: > 0 adds this times the MoE load-balancing loss to each
      update's loss (`MoEConfig.aux_loss`; `Learner.from_config` sets the
      model's `router_aux_loss_coef`).
  """
  loss: losses.LossConfig
  scoring: Scoring = Scoring()
  ppo_epochs: int = 1
  num_minibatches: int = 1
  num_microbatches: int = 1
  shuffle: bool = True
  with_entropy: bool = True
  max_response_len: int = 1
  logits_chunk: int = 0
  pack_length: int = 0
  pack_rows: int = 1
  recompute_mlp: Optional[bool] = None
  unroll_layers: Optional[bool] = None
  routing_replay: str = "none"
  aux_loss_coef: float = 0.0

  @property
  def num_updates(self) -> int:
    return self.ppo_epochs * self.num_minibatches


def _identity(x):
  return x


def learner_step(state: LearnerState, batch: Batch, *, graphdef: nnx.GraphDef,
                 optimizer: optax.GradientTransformationExtraArgs,
                 spec: StepSpec, rows: Constrain = _identity,
                 ) -> tuple[LearnerState, dict[str, jax.Array]]:
  """One RL batch of PPO updates. Pure.

  Args:
    state: the learner state before the step.
    batch: the RL batch, `B` rows (B divisible by minibatches × microbatches).
    graphdef: the model's graph definition (`nnx.split`).
    optimizer: from `make_optimizer`.
    spec: the static step description.
    rows: sharding constraint for arrays whose second axis is the row axis
      (micro-batch arrays `[num_micro, rows, ...]`); identity off-mesh.

  Returns:
    `(new_state, metrics)`: float32 scalars — `actor/*` (loss, PPO clip
    fractions, ratio statistics over all updates and over the first one),
    `actor/grad_norm` (before clipping, mean over updates), `actor/entropy`,
    `actor/nonfinite_skipped` (updates skipped for a non-finite loss or
    gradient: parameters and moments kept),
    `actor/lr` and the `schedule/*` state, `rollout_corr/*` (docs/method.md §4).
  """
  cfg = spec.loss
  b = batch.tokens_BT.shape[0]
  n_mini, n_micro = spec.num_minibatches, spec.num_microbatches
  b_micro = b // (n_mini * n_micro)

  corrected, corr_metrics = losses.correct_batch(
      batch.lp_old_BT, batch.lp_mu_BT, batch.loss_mask_BT, cfg)
  rows_data = {
      "tokens": batch.tokens_BT, "input_mask": batch.input_mask_BT,
      "loss_mask": batch.loss_mask_BT,
      "lp_ref": losses.reference_logprobs(cfg, batch.lp_old_BT, batch.lp_mu_BT),
      "adv": batch.advantages_B, "weights": corrected.weights_BT,
      "keep": corrected.keep_BT, "denom": corrected.denom_BT,
  }
  if batch.lp_ref_model_BT is not None:
    rows_data["lp_ref_model"] = batch.lp_ref_model_BT
  if batch.routing_BTLk is not None:  # MoE routing replay (docs/method.md §7a)
    rows_data["routing"] = batch.routing_BTLk

  rng, perm_key = jax.random.split(state.rng)
  if batch.pack is not None:
    rows_data, order_UCR = _packed_rows(rows_data, batch.pack, corrected, spec,
                                        batch.tokens_BT.shape[1])
  else:
    if spec.shuffle:
      keys = jax.random.split(perm_key, spec.ppo_epochs)
      order_EB = jax.vmap(lambda k: jax.random.permutation(k, b))(keys)
    else:
      order_EB = jnp.broadcast_to(jnp.arange(b), (spec.ppo_epochs, b))
    # [updates, micro, rows, ...]: update u is mini-batch u % M of epoch u // M.
    order_UCR = order_EB.reshape(spec.num_updates, n_micro, b_micro)

  def loss_fn(params, mb):
    model = nnx.merge(graphdef, params)
    aux = spec.aux_loss_coef > 0
    out = policy_logprobs(model, mb["tokens"], mb["input_mask"], spec.scoring,
                          with_entropy=spec.with_entropy,
                          entropy_grad=cfg.entropy_coef > 0,
                          logits_chunk=spec.logits_chunk,
                          segment_ids_BT=mb.get("segment_ids"),
                          positions_BT=mb.get("positions"),
                          recompute_mlp=bool(spec.recompute_mlp),
                          unroll_layers=bool(spec.unroll_layers),
                          routing_BTLk=mb.get("routing"), with_aux=aux)
    out, aux_loss = out if aux else (out, None)
    lp_BT, ent_BT = out if spec.with_entropy else (out, None)
    loss, sums = losses.micro_loss(
        lp_BT, ent_BT, mb["lp_ref"], mb["adv"], mb["weights"], mb["keep"],
        mb["coef"], mb["loss_mask"], mb.get("lp_ref_model"), cfg)
    if aux:  # each micro-batch's share of the update's load-balancing term (§7a)
      loss = loss + spec.aux_loss_coef * aux_loss / n_micro
    return loss, sums

  grad_fn = jax.grad(loss_fn, has_aux=True)

  def update(carry, xs):
    params, opt_state = carry
    order_CR, index = xs
    mb = {k: rows(v[order_CR]) for k, v in rows_data.items()}
    if "coef" not in mb:
      flat = lambda x: x.reshape((-1,) + x.shape[2:])
      coef_BT = losses.token_coefficients(
          flat(mb["keep"]), flat(mb["denom"]), cfg, spec.max_response_len)
      mb["coef"] = rows(coef_BT.reshape(mb["keep"].shape))

    def micro(grads, x):
      g, sums = grad_fn(params, x)
      return jax.tree.map(jnp.add, grads, g), sums

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, sums = jax.lax.scan(micro, zeros, mb)
    sums = _reduce_micro(sums)
    grad_norm = optax.tree.norm(grads)
    # The LR schedule counts RL steps: only the step's first update advances
    # it; the others use the rate in force (docs/method.md §6).
    def optimizer_update(operands):
      grads, params, opt_state = operands
      return optimizer.update(grads, opt_state, params,
                              response_length=batch.response_length,
                              new_step=index == 0)

    def apply(operands):
      updates, new_opt_state = optimizer_update(operands)
      return optax.apply_updates(operands[1], updates), new_opt_state

    def skip(operands):
      # Only the schedule's state is taken from the update (XLA drops the rest).
      _, new_opt_state = optimizer_update(operands)
      return operands[1], schedules.keep_schedule_state(operands[2], new_opt_state)

    # Non-finite guard (docs/reliability.md): an update whose loss or gradient
    # is NaN / inf leaves the parameters and moments as they were (bitwise);
    # the schedule still counts the step, as on a Step 2 rollback. A `cond`,
    # not a select: the update still writes in place (no second copy).
    finite = jnp.isfinite(grad_norm) & jnp.isfinite(sums.loss)
    params, opt_state = jax.lax.cond(finite, apply, skip, (grads, params, opt_state))
    skipped = 1.0 - finite.astype(jnp.float32)
    return (params, opt_state), (sums, grad_norm, skipped)

  carry = (state.params, state.opt_state)
  if spec.num_updates == 1:
    # Fully on-policy (one update per step, the sources' setting): no scan, so
    # the update writes into the donated state in place instead of into a
    # second copy of the parameters and moments (a scan carry is double
    # buffered).
    carry, out = update(carry, (order_UCR[0], jnp.zeros([], jnp.int32)))
    (params, opt_state), (per_update, grad_norm_U, skipped_U) = carry, jax.tree.map(
        lambda x: x[None], out)
  else:
    (params, opt_state), (per_update, grad_norm_U, skipped_U) = jax.lax.scan(
        update, carry, (order_UCR, jnp.arange(spec.num_updates)))

  metrics = losses.actor_metrics(per_update)
  if not spec.with_entropy:
    del metrics["actor/entropy"]
  if cfg.kl_coef == 0:
    del metrics["actor/kl_loss"]
  metrics["actor/grad_norm"] = jnp.mean(grad_norm_U)
  metrics["actor/nonfinite_skipped"] = jnp.sum(skipped_U)
  metrics.update(schedules.schedule_metrics(opt_state))
  metrics["actor/lr"] = schedules.current_learning_rate(opt_state)
  metrics.update(corr_metrics)
  new_state = LearnerState(params=params, opt_state=opt_state,
                           step=state.step + 1, rng=rng)
  return new_state, jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), metrics)


def _packed_rows(rows_data, pack: packing.PackPlan, corrected: losses.Corrected,
                 spec: StepSpec, length: int):
  """The per-token arrays on the packed rows, and the micro-batch order.

  The coefficients are the whole batch's (one mini-batch), taken on the
  unpacked layout; `keep` / `denom` are then no longer needed.
  """
  src_RP = pack.src_RP
  coef_BT = losses.token_coefficients(corrected.keep_BT, corrected.denom_BT,
                                      spec.loss, spec.max_response_len)
  packed = {k: (packing.gather_rows(v, src_RP, length) if k == "adv"
                else packing.gather(v, src_RP, fill=-1 if k == "routing" else 0))
            for k, v in rows_data.items() if k != "denom"}
  packed["coef"] = packing.gather(coef_BT, src_RP)
  packed["input_mask"] = (src_RP >= 0).astype(jnp.float32)
  packed["segment_ids"] = pack.segment_ids_RP
  packed["positions"] = pack.positions_RP
  r = src_RP.shape[0]
  order_CR = jnp.arange(r).reshape(r // spec.pack_rows, spec.pack_rows)
  return packed, jnp.broadcast_to(order_CR, (spec.num_updates,) + order_CR.shape)


def _reduce_micro(sums: losses.MicroTerms) -> losses.MicroTerms:
  """Micro-batch sums → one update's sums (min/max kept as such)."""
  return losses.MicroTerms(**{
      k: (jnp.min(v) if k == "ratio_min" else
          jnp.max(v) if k == "ratio_max" else jnp.sum(v))
      for k, v in sums._asdict().items()})
