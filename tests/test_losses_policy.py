"""Micro-batches of the policy objective sum to `losses.policy_loss` exactly (docs/method.md §2–3)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mipu_jax import config as config_lib
from mipu_jax import losses
from mipu_jax import schedules
from mipu_jax.learner import make_optimizer
from mipu_jax.learner import state as state_lib

B, T = 6, 7


def _arrays(seed=0):
  rng = np.random.default_rng(seed)
  lens = np.array([7, 3, 0, 5, 1, 6])  # row 2 has no counted token
  mask = (np.arange(T)[None, :] < lens[:, None]).astype(np.float32)
  lp_old = -rng.uniform(0.1, 3.0, (B, T)).astype(np.float32)
  lp_mu = lp_old + rng.normal(0, 0.4, (B, T)).astype(np.float32)
  lp = lp_old + rng.normal(0, 0.2, (B, T)).astype(np.float32)
  adv = rng.normal(size=B).astype(np.float32)
  ent = rng.uniform(0, 2, (B, T)).astype(np.float32)
  ref = lp_old + rng.normal(0, 0.1, (B, T)).astype(np.float32)
  return tuple(map(jnp.asarray, (lp, lp_old, lp_mu, adv, mask, ent, ref)))


def _split_loss(lp, lp_old, lp_mu, adv, mask, ent, ref, cfg, splits):
  """Σ over row chunks of `micro_loss`, with whole-batch corrections and coefficients."""
  corrected, _ = losses.correct_batch(lp_old, lp_mu, mask, cfg)
  coef = losses.token_coefficients(corrected.keep_BT, corrected.denom_BT, cfg, T)
  lp_ref = lp_old if cfg.mode == "on_policy_recompute" else lp_mu
  total = 0.0
  for rows in np.array_split(np.arange(B), splits):
    loss, _ = losses.micro_loss(
        lp[rows], ent[rows], lp_ref[rows], adv[rows], corrected.weights_BT[rows],
        corrected.keep_BT[rows], coef[rows], mask[rows],
        ref[rows] if cfg.kl_coef > 0 else None, cfg)
    total = total + loss
  return total


@pytest.mark.parametrize("aggregation, preset", (
    [(a, "mis_miles") for a in losses.AGGREGATIONS]  # RS + veto + SNIS
    + [("token_mean", "icepop"), ("seq_mean_token_mean", "seq_tis"),
       ("seq_mean_token_sum", "geo_rs"), ("token_mean", "none")]))
def test_split_objective_equals_policy_loss(aggregation, preset):
  """Three uneven micro-batches sum to the whole-batch loss and gradient."""
  cfg = losses.LossConfig(aggregation=aggregation, dual_clip=3.0, kl_coef=0.1,
                          entropy_coef=0.01, rejected_in_denominator=preset != "icepop",
                          correction=losses.CorrectionConfig.from_preset(preset))
  lp, lp_old, lp_mu, adv, mask, ent, ref = _arrays()

  def reference(lp):
    return losses.policy_loss(lp, lp_old, lp_mu, adv, mask, cfg, lp_ref_model=ref,
                              entropy=ent)[0]

  def ours(lp):
    return _split_loss(lp, lp_old, lp_mu, adv, mask, ent, ref, cfg, 3)

  value, grad = jax.value_and_grad(ours)(lp)
  ref_value, ref_grad = jax.value_and_grad(reference)(lp)
  np.testing.assert_allclose(value, ref_value, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)


def test_bypass_references_lp_mu_and_logs_no_mismatch():
  cfg = losses.LossConfig(mode="bypass",
                          correction=losses.CorrectionConfig.from_preset("none"))
  lp, lp_old, lp_mu, adv, mask, ent, ref = _arrays(1)
  _, metrics = losses.correct_batch(lp_mu, lp_mu, mask, cfg)
  assert not set(losses.MISMATCH_METRIC_NAMES) & set(metrics)
  expected = losses.policy_loss(lp, None, lp_mu, adv, mask, cfg)[0]
  np.testing.assert_allclose(
      _split_loss(lp, lp_mu, lp_mu, adv, mask, ent, ref, cfg, 2), expected, rtol=1e-6)


def test_on_policy_logs_every_mismatch_and_correction_metric():
  lp, lp_old, lp_mu, adv, mask, *_ = _arrays(2)
  _, metrics = losses.correct_batch(lp_old, lp_mu, mask, losses.LossConfig())
  assert set(losses.MISMATCH_METRIC_NAMES) <= set(metrics)
  assert set(losses.CORRECTION_METRIC_NAMES) <= set(metrics)
  assert all(np.isfinite(v) for v in jax.device_get(metrics).values())


def test_optimizer_is_clipped_adamw_with_the_rate_in_its_state():
  cfg = config_lib.OptimConfig(learning_rate=3e-2, weight_decay=0.01, clip_norm=0.5)
  ours = make_optimizer(cfg, num_steps=10)
  ref = optax.chain(optax.clip_by_global_norm(0.5),
                    optax.adamw(3e-2, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=0.01))
  params = {"w": jnp.arange(6.0).reshape(2, 3) / 7, "b": jnp.ones(5)}
  s_ours, s_ref = ours.init(params), ref.init(params)
  p_ours = p_ref = params
  for k in range(3):
    grads = jax.tree.map(lambda x: jnp.sin(x * (k + 1)) * 3.0, p_ours)
    u, s_ours = ours.update(grads, s_ours, p_ours, response_length=5.0)
    p_ours = optax.apply_updates(p_ours, u)
    u, s_ref = ref.update(grads, s_ref, p_ref)
    p_ref = optax.apply_updates(p_ref, u)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), p_ours, p_ref)


def _bf16(x):
  return np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16).astype(jnp.float32))


def test_bf16_first_moment_is_stored_rounded_and_stepped_with_as_stored():
  """mu_t = bf16(b1 mu_{t-1} + (1 - b1) g_t), nu_t fp32, and the step
  (mu_t / (1 - b1^t)) / (sqrt(nu_t / (1 - b2^t)) + eps) uses the stored mu_t:
  checked against numpy step by step, jitted; the run stays within bf16's rounding of
  the fp32-moment run, and differs from it."""
  b1, b2, eps = 0.9, 0.999, 1e-8
  tx = state_lib.scale_by_adam_bf16_mu(b1, b2, eps)
  # jitted, as in the learner: XLA's GPU compiler would drop the f32 -> bf16 -> f32
  # round trip inside a program without the barrier, and the step check fails
  update = jax.jit(tx.update)
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=[4, 33]), jnp.float32)}
  st, ref = tx.init(params), optax.scale_by_adam(b1, b2, eps)
  st_ref = ref.init(params)
  mu, nu = np.zeros([4, 33], np.float32), np.zeros([4, 33], np.float64)
  for t in range(1, 5):
    g = {"w": jnp.asarray(rng.normal(size=[4, 33]) * 10.0 ** (t - 2), jnp.float32)}
    u, st = update(g, st, params)
    u_ref, st_ref = ref.update(g, st_ref, params)
    gw = np.asarray(g["w"], np.float64)
    assert st.mu["w"].dtype == jnp.bfloat16 and st.nu["w"].dtype == jnp.float32
    stored = np.asarray(st.mu["w"].astype(jnp.float32))
    # the stored moment is the rounding of the fp32 one (one bf16 ulp: FMA contraction)
    np.testing.assert_allclose(stored, _bf16((1 - b1) * gw + b1 * mu), rtol=2 ** -7)
    mu = stored.astype(np.float64)
    nu = (1 - b2) * gw * gw + b2 * nu
    np.testing.assert_allclose(np.asarray(st.nu["w"]), nu, rtol=1e-6)
    step = (mu / (1 - b1 ** t)) / (np.sqrt(nu / (1 - b2 ** t)) + eps)
    # 1e-4: fp32's 1 - b2^t is 1.3e-5 off the exact 1e-3 at t = 1
    np.testing.assert_allclose(np.asarray(u["w"]), step, rtol=1e-4)
    # near the fp32-moment step: bf16's rounding, relative to the step's scale
    # (a moment near zero after a sign change is relatively far off)
    np.testing.assert_allclose(np.asarray(u["w"]), np.asarray(u_ref["w"]), rtol=0,
                               atol=2 ** -6 * float(np.abs(u_ref["w"]).max()))
    assert not np.array_equal(np.asarray(u["w"]), np.asarray(u_ref["w"]))
  assert int(st.count) == 4


def test_bf16_first_moment_lowers_the_compiled_update_s_memory():
  """A donated clipped-Adam update holds 2 bytes per parameter less with the bf16
  moment, and its temporaries do not grow back (optax's `mu_dtype` version's do)."""
  params = {"w": jnp.zeros([1 << 16], jnp.float32), "b": jnp.zeros([1 << 15], jnp.float32)}
  n = 3 << 15

  def memory(tx):
    st = jax.eval_shape(tx.init, params)

    def step(p, s, g):  # optax.chain drops `response_length` where nothing takes it
      u, s = tx.update(g, s, p, response_length=1.0)
      return optax.apply_updates(p, u), s

    return jax.jit(step, donate_argnums=(0, 1)).lower(params, st, params).compile(
        ).memory_analysis()

  fp32, bf16 = (memory(make_optimizer(config_lib.OptimConfig(learning_rate=1e-3, mu_dtype=d),
                                      num_steps=10)) for d in ("float32", "bfloat16"))
  assert fp32.argument_size_in_bytes - bf16.argument_size_in_bytes == 2 * n
  assert bf16.temp_size_in_bytes <= fp32.temp_size_in_bytes
  # the same chain with optax's bf16-moment Adam in its place: more temporaries
  cfg = config_lib.OptimConfig(learning_rate=1e-3)
  like_ours = optax.chain(
      optax.clip_by_global_norm(cfg.clip_norm),
      optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, mu_dtype=jnp.bfloat16),
      optax.add_decayed_weights(cfg.weight_decay), optax.scale(-cfg.learning_rate))
  assert memory(like_ours).temp_size_in_bytes > bf16.temp_size_in_bytes


def test_optimizer_rejects_other_moment_dtypes():
  with pytest.raises(ValueError, match="mu_dtype"):
    config_lib.OptimConfig(mu_dtype="float16")


def test_length_surge_schedule_receives_the_response_length():
  cfg = config_lib.OptimConfig(
      learning_rate=1.0, schedule="length_surge",
      length_surge=dataclasses.replace(config_lib.LengthSurgeConfig(), mode="fixed",
                                       decay_period=2))
  tx = make_optimizer(cfg, num_steps=10)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  rates = []
  for _ in range(4):
    _, state = tx.update(params, state, params, response_length=jnp.float32(12.0))
    rates.append(float(schedules.current_learning_rate(state)))
  assert rates == [1.0, 0.5, 0.5, 0.25]
