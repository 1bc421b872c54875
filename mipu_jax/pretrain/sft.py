"""Supervised pretraining of the small task's base policy: data, loss, training loop.

A small Qwen3 learns next-token prediction on `tasks.sft_examples`: prompts of
multi-operand additions answered either directly (often wrongly, by
construction) or step by step (always correctly). Each example is the sequence
`[bos] + prompt + completion + [eos]`, right-padded; the loss is the negative
log-likelihood of the completion tokens and the EOS only (`sft_loss`).

Curriculum: the first `skill_steps` steps train on (mostly) step-by-step
answers, where the arithmetic is learnt (a 3-layer model needs about a
thousand such steps before copying operands and adding "clicks"); the
remaining steps train on the final SFT mix, which sets the base policy's
prior over answer styles and its noisy direct answers. With the final mix
from the start, the skill arrives only after several times more steps. The result
is an RL starting point with clearly nonzero but imperfect accuracy whose long
answers beat its short ones, so RL that rewards correctness can grow response
length (the length surge of docs/method.md §6).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm
from flax import nnx

from mipu_jax import models
from mipu_jax import tasks
from mipu_jax.models import moe
from mipu_jax.models import qwen3
from mipu_jax.tokenizer import CharTokenizer

# Pool of batches grouped by length, so that short direct answers are not
# padded to the longest step-by-step one (about 2x less compute).
_POOL_BATCHES = 16
_LENGTH_BUCKETS = (32, 56)


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
  """Model, data and optimisation of the base-policy pretraining.

  Attributes:
    hidden_size: D.
    num_layers: L.
    num_heads: N query heads.
    num_kv_heads: K kv heads.
    head_dim: H.
    intermediate_size: F, the SwiGLU width.
    num_experts: E; > 0 makes every layer a Qwen3-MoE sparse block
      (docs/method.md §7a), 0 a dense model.
    num_experts_per_tok: k, experts per token.
    moe_intermediate_size: each expert's SwiGLU width.
    norm_topk_prob: renormalise the k gate weights (as the released Qwen3-MoE).
    router_aux_loss_coef: weight of the load-balancing loss added to the SFT
      loss of an MoE policy (keeps every expert in use).
    tiers: tiers the SFT prompts are drawn from (uniformly).
    cot_fraction: share of step-by-step completions in the final SFT mix
      (the base policy's prior of showing work).
    direct_error_rate: share of direct completions that are wrong.
    skill_steps: first steps of the curriculum, trained on the skill mix.
    skill_cot_fraction: share of step-by-step completions during the
      `skill_steps`.
    steps: optimiser steps in all (skill steps included).
    batch_size: sequences per step.
    learning_rate: peak AdamW learning rate (linear warmup, cosine decay to 10%).
    warmup_steps: warmup length.
    weight_decay: AdamW weight decay.
    grad_clip: global-norm gradient clip.
    seed: seed of the init and of the SFT data stream.
    eval_seed: seed of `tasks.eval_sets` and of the sampler.
    eval_per_tier: held-out problems per tier.
    eval_temperature: sampling temperature of the evaluation (1.0: the RL
      loop's sampling distribution).
  """

  hidden_size: int = 128
  num_layers: int = 3
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  intermediate_size: int = 256
  num_experts: int = 0
  num_experts_per_tok: int = 0
  moe_intermediate_size: int = 0
  norm_topk_prob: bool = True
  router_aux_loss_coef: float = 0.01
  tiers: tuple[str, ...] = tasks.TIER_NAMES
  cot_fraction: float = 0.3
  direct_error_rate: float = 0.4
  skill_steps: int = 2000
  skill_cot_fraction: float = 1.0
  steps: int = 2500
  batch_size: int = 32
  learning_rate: float = 3e-3
  warmup_steps: int = 100
  weight_decay: float = 0.01
  grad_clip: float = 1.0
  seed: int = 0
  eval_seed: int = 0
  eval_per_tier: int = 128
  eval_temperature: float = 1.0

  def __post_init__(self):
    object.__setattr__(self, "tiers", tuple(self.tiers))
    for name in ("steps", "batch_size", "eval_per_tier"):
      if getattr(self, name) < 1:
        raise ValueError(f"PretrainConfig.{name} must be >= 1, got {getattr(self, name)}.")
    if self.warmup_steps < 0 or self.learning_rate <= 0:
      raise ValueError("Need warmup_steps >= 0 and learning_rate > 0.")
    if not 0 <= self.skill_steps <= self.steps:
      raise ValueError(
          f"Need 0 <= skill_steps <= steps, got {self.skill_steps}, {self.steps}.")
    unknown = sorted(set(self.tiers) - set(tasks.TIER_NAMES))
    if unknown or not self.tiers:
      raise ValueError(f"Unknown or no tiers {unknown}; choose from {tasks.TIER_NAMES}.")
    self.model_config()  # Validates the dimensions.

  def model_config(self) -> models.Qwen3Config:
    """The policy's Qwen3 config: the task tokenizer's vocabulary, tied embeddings;
    `dense` attention, which made the shipped base policies (so this recipe
    rebuilds them)."""
    return models.Qwen3Config(
        attention="dense",
        vocab_size=tasks.make_tokenizer().vocab_size,
        hidden_size=self.hidden_size, num_layers=self.num_layers,
        num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
        head_dim=self.head_dim, intermediate_size=self.intermediate_size,
        tie_embeddings=True, rope_theta=10_000.0, num_experts=self.num_experts,
        num_experts_per_tok=self.num_experts_per_tok,
        moe_intermediate_size=self.moe_intermediate_size,
        norm_topk_prob=self.norm_topk_prob if self.num_experts else False,
        router_aux_loss_coef=self.router_aux_loss_coef if self.num_experts else 0.001)

  def norm_len(self) -> int:
    """Supervised tokens of the longest example: the loss's fixed length."""
    return tasks.max_completion_len(self.tiers) + 1

  def max_seq_len(self) -> int:
    """`[bos] + prompt + completion + [eos]` of the longest example."""
    return tasks.max_prompt_len(self.tiers) + tasks.max_completion_len(self.tiers) + 2


@dataclasses.dataclass(frozen=True)
class Batch:
  """One right-padded SFT batch.

  Attributes:
    tokens_BT: int32 ids, `pad_id` after the EOS.
    mask_BT: int32, 1 on real tokens.
    target_BT: float32, 1 on completion and EOS tokens (the supervised ones).
  """

  tokens_BT: np.ndarray
  mask_BT: np.ndarray
  target_BT: np.ndarray


def encode_examples(tokenizer: CharTokenizer, examples: Sequence[tuple[str, str]],
                    length: int) -> Batch:
  """`[bos] + prompt + completion + [eos]` per example, right-padded to `length`."""
  b = len(examples)
  tokens_BT = np.full((b, length), tokenizer.pad_id, np.int32)
  mask_BT = np.zeros((b, length), np.int32)
  target_BT = np.zeros((b, length), np.float32)
  for i, (prompt, completion) in enumerate(examples):
    head = [tokenizer.bos_id] + tokenizer.encode(prompt)
    tail = tokenizer.encode(completion) + [tokenizer.eos_id]
    ids = head + tail
    if len(ids) > length:
      raise ValueError(f"Example of {len(ids)} tokens does not fit length {length}.")
    tokens_BT[i, :len(ids)] = ids
    mask_BT[i, :len(ids)] = 1
    target_BT[i, len(head):len(ids)] = 1.0
  return Batch(tokens_BT, mask_BT, target_BT)


def sft_batches(cfg: PretrainConfig, tokenizer: CharTokenizer, *,
                cot_fraction: float, stream: int = 0) -> Iterator[Batch]:
  """Endless SFT batches: pools of `_POOL_BATCHES` batches grouped by length.

  Args:
    cfg: tiers, batch size, direct error rate and seed.
    tokenizer: the task tokenizer.
    cot_fraction: share of step-by-step completions.
    stream: index of an independent data stream of the same seed.
  """
  rng = np.random.default_rng([cfg.seed, stream])
  max_len = cfg.max_seq_len()
  buckets = sorted({b for b in _LENGTH_BUCKETS if b < max_len} | {max_len})
  n = cfg.batch_size
  while True:
    examples = tasks.sft_examples(
        rng, n * _POOL_BATCHES, tiers=cfg.tiers, cot_fraction=cot_fraction,
        direct_error_rate=cfg.direct_error_rate)
    examples.sort(key=lambda e: len(e[0]) + len(e[1]))
    for i in rng.permutation(_POOL_BATCHES):
      chunk = examples[i * n:(i + 1) * n]
      longest = max(len(p) + len(c) for p, c in chunk) + 2
      yield encode_examples(tokenizer, chunk, next(b for b in buckets if b >= longest))


def make_optimizer(cfg: PretrainConfig) -> optax.GradientTransformation:
  """AdamW with global-norm clipping, linear warmup and cosine decay to 10%."""
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, cfg.learning_rate, cfg.warmup_steps, max(cfg.steps, cfg.warmup_steps + 1),
      end_value=0.1 * cfg.learning_rate)
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                     optax.adamw(schedule, weight_decay=cfg.weight_decay))


def sft_loss(model: models.Qwen3, tokens_BT: jax.Array, mask_BT: jax.Array,
             target_BT: jax.Array, norm_len: int, *,
             recompute_mlp: bool = False) -> tuple[jax.Array, jax.Array]:
  """Summed NLL of the target (completion + EOS) tokens over `B * norm_len`.

  A fixed denominator (docs/method.md §2's `seq_mean_token_sum_norm`), not the batch's
  token count: batches are grouped by length, and a per-batch token mean would
  weigh a short direct answer's tokens (its style choice included) several
  times more than a long step-by-step one's, biasing the learnt prior towards
  direct answers (about 10x on tier5).

  `recompute_mlp`: as `models.Qwen3.__call__`.

  An MoE policy adds `router_aux_loss_coef` times the load-balancing loss
  (`moe.load_balancing_loss`, docs/method.md §7a).

  Returns:
    The loss and, for display, the mean NLL per target token.
  """
  out = model(tokens_BT, mask_BT=mask_BT, recompute_mlp=recompute_mlp)
  lp_BT = jnp.pad(models.token_logprobs(out.logits[:, :-1], tokens_BT[:, 1:]),
                  ((0, 0), (1, 0)))
  nll = -jnp.sum(lp_BT * target_BT)
  loss = nll / (tokens_BT.shape[0] * norm_len)
  if out.moe_stats is not None:
    loss = loss + model.config.router_aux_loss_coef * moe.load_balancing_loss(out.moe_stats)
  return loss, nll / jnp.maximum(jnp.sum(target_BT), 1.0)


def make_train_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
                    norm_len: int, *, recompute_mlp: bool = False):
  """A jitted `step(params, opt_state, batch) -> (params, opt_state, token_nll)`.

  Pure over explicit state (`params` is the model's `nnx.Param` state); the
  state buffers are donated. `norm_len` is `sft_loss`'s fixed length;
  `recompute_mlp`: as `models.Qwen3.__call__` (`train` resolves it for the
  platform).
  """

  def loss_fn(params, tokens_BT, mask_BT, target_BT):
    return sft_loss(nnx.merge(graphdef, params), tokens_BT, mask_BT, target_BT,
                    norm_len, recompute_mlp=recompute_mlp)

  def step(params, opt_state, tokens_BT, mask_BT, target_BT):
    (_, token_nll), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, tokens_BT, mask_BT, target_BT)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, token_nll

  return jax.jit(step, donate_argnums=(0, 1))


def train(cfg: PretrainConfig, *, progress: bool = True
          ) -> tuple[models.Qwen3, list[float]]:
  """Pretrains the base policy.

  Args:
    cfg: the run.
    progress: show a tqdm progress bar with the loss.

  Returns:
    The trained model and the per-step mean NLL per target token.
  """
  tokenizer = tasks.make_tokenizer()
  model = models.Qwen3(cfg.model_config(), rngs=nnx.Rngs(cfg.seed))
  graphdef, params = nnx.split(model, nnx.Param)
  optimizer = make_optimizer(cfg)
  opt_state = optimizer.init(params)
  platform = next(iter(jax.tree.leaves(params)[0].devices())).platform
  step_fn = make_train_step(graphdef, optimizer, cfg.norm_len(),
                            recompute_mlp=qwen3.recompute_mlp_for(platform))
  skill = sft_batches(cfg, tokenizer, cot_fraction=cfg.skill_cot_fraction, stream=0)
  final_mix = sft_batches(cfg, tokenizer, cot_fraction=cfg.cot_fraction, stream=1)
  losses, pending = [], None  # Per-token NLL: comparable across batches.
  with tqdm.tqdm(total=cfg.steps, desc="pretrain", disable=not progress) as bar:
    for i in range(cfg.steps):
      b = next(skill if i < cfg.skill_steps else final_mix)
      params, opt_state, loss = step_fn(params, opt_state, b.tokens_BT,
                                        b.mask_BT, b.target_BT)
      # Fetch step N-1's loss after dispatching step N: the host never waits on the device.
      if pending is not None:
        losses.append(float(pending))
        bar.set_postfix(nll=f"{losses[-1]:.4f}", refresh=False)
      pending = loss
      bar.update()
    losses.append(float(pending))
  return nnx.merge(graphdef, params), losses


