"""The learner's explicit state and its optimizer (docs/method.md §7).

`LearnerState` is everything a step reads and writes: fp32 master parameters
(a pure dict with the model's parameter paths), the optimizer state (which
holds the learning-rate schedule's state, so the rate is logged and
checkpointed with it), the update counter and an RNG key. It is a plain
pytree, so MIPU's rollback (`mipu_jax.mipu.select_tree`) and checkpoints treat
it as a whole.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from mipu_jax import schedules
from mipu_jax.config import OptimConfig
from mipu_jax.models import sharding as sharding_lib


class LearnerState(NamedTuple):
  """The learner's state.

  Attributes:
    params: pure dict of float32 parameters (train layout).
    opt_state: optax state of `make_optimizer`, schedule state inside.
    step: int32, learner steps taken (one per RL batch, whatever the number of
      optimizer updates in it).
    rng: typed PRNG key for mini-batch shuffling.
  """
  params: Any
  opt_state: Any
  step: jax.Array
  rng: jax.Array


def make_optimizer(cfg: OptimConfig,
                   num_steps: int) -> optax.GradientTransformationExtraArgs:
  """AdamW with global-norm clipping and the configured schedule.

  `clip → scale_by_adam → add_decayed_weights → schedule → scale(-1)`: the
  decoupled decay is scaled by the rate, as in `optax.adamw`, and the rate is
  the schedule's state (docs/method.md §6), which takes `response_length=` as an
  extra argument of `update`. `cfg.mu_dtype` "bfloat16" keeps Adam's first
  moment in bf16 (`scale_by_adam_bf16_mu`); "float32" is optax's Adam.

  Args:
    cfg: optimizer settings.
    num_steps: run length (the cosine schedule's default horizon).

  Returns:
    The transformation.
  """
  schedule = schedules.make_schedule(cfg.schedule, cfg.learning_rate,
                                     **cfg.schedule_kwargs(num_steps))
  return optax.chain(
      optax.clip_by_global_norm(cfg.clip_norm),
      (optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps) if cfg.mu_dtype == "float32"
       else scale_by_adam_bf16_mu(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)),
      optax.add_decayed_weights(cfg.weight_decay),
      schedule,
      optax.scale(-1.0),
  )


def scale_by_adam_bf16_mu(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """Adam whose first moment is stored in bf16, and stepped with as stored.

  mu_t = bf16(b1 mu_{t-1} + (1 - b1) g_t) in fp32 arithmetic; nu_t as optax's
  (fp32); the update is (mu_t / (1 - b1^t)) / (sqrt(nu_t / (1 - b2^t)) + eps).
  Ours, not optax's `scale_by_adam(mu_dtype=...)`, which steps with the
  unrounded fp32 moment: in XLA's plan its update's temporaries then grow by
  the 2 bytes per parameter the bf16 moment saves (docs/pods.md).
  """

  def init(params):
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                  mu=optax.tree.zeros_like(params, dtype=jnp.bfloat16),
                                  nu=optax.tree.zeros_like(params))

  def update(updates, state, params=None):
    del params
    mu = jax.tree.map(
        lambda g, m: ((1 - b1) * g + b1 * m.astype(jnp.float32)).astype(jnp.bfloat16),
        updates, state.mu)
    nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
    count = optax.safe_increment(state.count)
    c1 = (1 - b1 ** count).astype(jnp.float32)
    c2 = (1 - b2 ** count).astype(jnp.float32)
    # The barrier keeps the rounding: XLA's GPU compiler otherwise drops the
    # f32 -> bf16 -> f32 round trip inside a jitted step (as `keep_float8` says).
    stored = jax.lax.optimization_barrier(mu)
    step = jax.tree.map(lambda m, v: (m.astype(jnp.float32) / c1) / (jnp.sqrt(v / c2) + eps),
                        stored, nu)
    return step, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


def state_shardings(optimizer: optax.GradientTransformation, params: Any,
                    mesh: Mesh) -> LearnerState:
  """`NamedSharding`s of a `LearnerState`, from abstract parameters.

  Parameters follow the `train` table; optimizer leaves that mirror a parameter
  (Adam moments) take its sharding; scalars (counts, schedule state) and the
  RNG key are replicated.
  """
  param_sh = sharding_lib.param_shardings(params, mesh, "train")
  replicated = NamedSharding(mesh, P())
  abstract_opt = jax.eval_shape(optimizer.init, params)
  opt_sh = optax.tree_utils.tree_map_params(
      optimizer, lambda _, s: s, abstract_opt, param_sh,
      transform_non_params=lambda _: replicated)
  return LearnerState(params=param_sh, opt_state=opt_sh, step=replicated,
                      rng=replicated)


def init_state(params: Any, optimizer: optax.GradientTransformation, mesh: Mesh,
               seed: int) -> LearnerState:
  """A sharded `LearnerState` at step 0 from (host or device) parameters.

  The optimizer state is built by a jitted `init` with `out_shardings`, so it
  is born in place, never materialised whole on one device.
  """
  shardings = state_shardings(optimizer, params, mesh)
  params = jax.device_put(params, shardings.params)

  def init(params):
    return LearnerState(params=params, opt_state=optimizer.init(params),
                        step=jnp.zeros([], jnp.int32),
                        rng=jax.random.key(seed))

  return jax.jit(init, out_shardings=shardings)(params)
