"""Tests for mipu_jax.mipu: MIPU Step 2 (docs/method.md §5)."""

import math

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from mipu_jax import mipu
from mipu_jax import schedules
from mipu_jax.learner import LearnerState

NAN_PAD = float("nan")


def hand_case():
  """4 probe responses in 2 groups of 2, T = 3, with a worked T̂_post."""
  lp_mu = np.full([4, 3], -1.0, np.float32)
  delta = np.array([
      [0.2, -0.1, -np.inf],  # mask 1 1 0: log ρ = 0.05; -inf pad ignored
      [0.3, 0.3, 0.3],       # mask 1 1 1: log ρ = 0.3
      [-30.0, 5.0, 5.0],     # mask 1 0 0: clamped to -20
      [NAN_PAD, 1.0, 2.0],   # mask 0 0 0: no token, ρ = 1; NaN pad ignored
  ], np.float32)
  mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0]], np.int32)
  rewards = np.array([1.0, 0.0, 0.0, 1.0], np.float32)
  # Both groups are {0, 1}: mean 0.5, population std 0.5, Â = ±0.5/(0.5+1e-6).
  a = 0.5 / (0.5 + 1e-6)
  rho = [math.exp(0.05), math.exp(0.3), math.exp(-20.0), 1.0]
  t_post = -(rho[0] * a - rho[1] * a - rho[2] * a + rho[3] * a) / 4
  return (lp_mu + delta, lp_mu, mask, rewards), t_post, rho


def test_gap_post_hand_computation():
  args, expected, rho = hand_case()
  for fn in (mipu.gap_post, jax.jit(mipu.gap_post, static_argnums=4)):
    t_post, metrics = fn(*map(jnp.asarray, args), 2)
    np.testing.assert_allclose(float(t_post), expected, rtol=1e-5)
    assert set(metrics) == {"mipu/gap_post", "mipu/gap_post_se",
                            "mipu/probe_reward", "mipu/probe_rho_mean"}
    assert float(metrics["mipu/gap_post"]) == float(t_post)
    assert float(metrics["mipu/probe_reward"]) == 0.5
    np.testing.assert_allclose(float(metrics["mipu/probe_rho_mean"]),
                               sum(rho[:3]) / 3, rtol=1e-5)


def test_gap_post_is_not_differentiated():
  (lp_new, lp_mu, mask, rewards), _, _ = hand_case()
  lp_new = np.where(mask > 0, lp_new, 0.0)
  grad = jax.grad(lambda lp: mipu.gap_post(lp, lp_mu, mask, rewards, 2)[0])(
      jnp.asarray(lp_new))
  np.testing.assert_array_equal(grad, 0.0)


def test_gap_post_standard_error_is_over_groups():
  """SE = sample sd of the per-group gaps / sqrt(#groups), by hand."""
  (lp_new, lp_mu, mask, rewards), expected, rho = hand_case()
  a = 0.5 / (0.5 + 1e-6)
  gaps = [-(rho[0] * a - rho[1] * a) / 2, -(-rho[2] * a + rho[3] * a) / 2]
  assert math.isclose(sum(gaps) / 2, expected, rel_tol=1e-6)
  se = abs(gaps[0] - gaps[1]) / math.sqrt(2) / math.sqrt(2)  # sd of 2 values
  _, metrics = mipu.gap_post(*map(jnp.asarray, (lp_new, lp_mu, mask, rewards)), 2)
  np.testing.assert_allclose(float(metrics["mipu/gap_post_se"]), se, rtol=1e-5)
  # One group: no spread to measure, SE 0.
  _, one = mipu.gap_post(*map(jnp.asarray, (lp_new, lp_mu, mask, rewards)), 4)
  assert float(one["mipu/gap_post_se"]) == 0.0
  with pytest.raises(ValueError, match="multiple of group_size"):
    mipu.gap_post(*map(jnp.asarray, (lp_new, lp_mu, mask, rewards)), 3)


@pytest.mark.parametrize("c,se,k,expected", [
    (1e-4, None, None, 1e-4),   # fixed margin
    (1e-4, 0.02, 2.0, 0.04),    # noise-scaled: k · SE, c unused
    (0.0, 0.0, 1.5, 0.0),
])
def test_margin(c, se, k, expected):
  np.testing.assert_allclose(float(mipu.margin(c, se, k)), expected, rtol=1e-6)
  # With a noise-scaled margin, a gap one SE below zero passes at k = 2.
  if k and se:
    assert bool(mipu.accept(-se, mipu.margin(c, se, k)))
    assert not bool(mipu.accept(-3 * se, mipu.margin(c, se, k)))


def test_margin_needs_the_standard_error():
  with pytest.raises(ValueError, match="gap_se"):
    mipu.margin(1e-4, None, 2.0)


def test_gap_post_degenerate_inputs_are_finite():
  lp = jnp.zeros([6, 5])
  # All rewards equal: no signal, T̂_post = 0 exactly.
  t_post, _ = mipu.gap_post(lp + 3.0, lp, jnp.ones([6, 5]), jnp.ones([6]), 3)
  assert float(t_post) == 0.0
  # No counted token anywhere.
  t_post, metrics = mipu.gap_post(lp, lp, jnp.zeros([6, 5]),
                                  jnp.arange(6.0), 3)
  assert abs(float(t_post)) < 1e-6
  assert all(np.isfinite(float(v)) for v in metrics.values())


_gap_post_jit = jax.jit(mipu.gap_post, static_argnums=4)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1),
       scale=st.sampled_from([1e-3, 1.0, 1e3, 1e30]))
def test_gap_post_extreme_log_probs_are_finite(seed, scale):
  rng = np.random.default_rng(seed)
  lp_new = -scale * rng.random([6, 5]).astype(np.float32)
  lp_mu = -scale * rng.random([6, 5]).astype(np.float32)
  lp_mu[0, 0] = -np.inf
  mask = rng.integers(0, 2, [6, 5])
  rewards = rng.integers(0, 2, [6]).astype(np.float32)
  t_post, metrics = _gap_post_jit(lp_new, lp_mu, mask, rewards, 3)
  assert all(np.isfinite(float(v)) for v in metrics.values())
  # ρ ≤ e^20 and, with a population std, |Â| ≤ √(G - 1).
  assert abs(float(t_post)) <= math.exp(20) * math.sqrt(2)


@pytest.mark.parametrize("t_post,c,expected", [
    (-1e-4, 1e-4, True),   # boundary: T̂_post ≥ -c
    (-2e-4, 1e-4, False),
    (0.0, 0.0, True),
    (-1e-9, 0.0, False),
    (3.0, -1e-4, True),
    (5e-5, -1e-4, False),
    (float("nan"), 1e-4, False),  # NaN rolls back
])
def test_accept(t_post, c, expected):
  assert bool(mipu.accept(jnp.float32(t_post), c)) is expected
  assert bool(jax.jit(mipu.accept)(jnp.float32(t_post), c)) is expected


def random_bits_tree(rng):
  """Leaves of many dtypes with arbitrary bits, NaN payloads included."""
  f32 = rng.integers(0, 2**32, [3, 7], dtype=np.uint32)
  f32[0, :4] = [0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000]  # NaNs, -0
  return {
      "f32": f32.view(np.float32),
      "bf16": rng.integers(0, 2**16, [5], dtype=np.uint16).view(
          ml_dtypes.bfloat16),
      "int8": rng.integers(-128, 128, [2, 3], dtype=np.int8),
      "int32": rng.integers(-2**31, 2**31, [4], dtype=np.int32),
      "bool": rng.integers(0, 2, [3]).astype(bool),
      "scalar": np.asarray(rng.integers(0, 2**32, dtype=np.uint32)),
  }


def as_bytes(tree):
  return [np.asarray(x).reshape(-1).view(np.uint8).tobytes()
          for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("accepted", [False, True])
def test_select_tree_is_bitwise(jit, accepted):
  rng = np.random.default_rng(7)
  new, old = random_bits_tree(rng), random_bits_tree(rng)
  new["key"], old["key"] = jax.random.key(1), jax.random.key(2)
  select = jax.jit(mipu.select_tree) if jit else mipu.select_tree
  out = select(jnp.asarray(accepted), new, old)
  want = new if accepted else old
  strip = lambda t: {k: v for k, v in t.items() if k != "key"}
  assert as_bytes(strip(out)) == as_bytes(strip(want))
  assert jax.tree.map(lambda x: x.dtype, strip(out)) == jax.tree.map(
      lambda x: np.asarray(x).dtype, strip(want))
  np.testing.assert_array_equal(jax.random.key_data(out["key"]),
                                jax.random.key_data(want["key"]))


def test_select_tree_rejects_mismatch():
  with pytest.raises(ValueError, match="leaf mismatch"):
    mipu.select_tree(jnp.bool_(True), {"a": jnp.zeros([2], jnp.int8)},
                     {"a": jnp.zeros([2], jnp.int32)})
  with pytest.raises(ValueError, match="boolean scalar"):
    mipu.select_tree(jnp.ones([2], bool), {"a": jnp.zeros([2])},
                     {"a": jnp.zeros([2])})


@pytest.mark.parametrize("accepted", [False, True])
def test_accept_and_reject_paths_restore_learner_and_sampler(accepted):
  """Params, Adam + schedule state and int8 sampler weights, both paths."""
  tx = optax.chain(optax.scale_by_adam(), schedules.length_surge(1e-3),
                   optax.scale(-1.0))

  def quantize(params):  # stand-in for the sampler sync (int8 + scale)
    scale = jnp.max(jnp.abs(params["w"])) / 127
    return {"q": jnp.round(params["w"] / scale).astype(jnp.int8),
            "scale": scale.astype(jnp.bfloat16)}

  @jax.jit
  def candidate(state, grads):
    params, opt_state, _ = state
    updates, opt_state = tx.update(grads, opt_state, params,
                                   response_length=512.0)
    params = optax.apply_updates(params, updates)
    return params, opt_state, quantize(params)

  rng = np.random.default_rng(3)
  params = {"w": jnp.asarray(rng.normal(size=[5, 3]), jnp.float32)}
  before = (params, tx.init(params), quantize(params))
  before_bytes = as_bytes(before)
  cand = candidate(before, {"w": jnp.asarray(rng.normal(size=[5, 3]),
                                             jnp.float32)})
  assert as_bytes(cand) != before_bytes
  after = jax.jit(mipu.select_tree)(jnp.asarray(accepted), cand, before)
  assert as_bytes(after) == as_bytes(cand if accepted else before)
  assert jax.tree.structure(after) == jax.tree.structure(before)


def test_random_accept_rate():
  n, p = 20_000, 0.3
  keys = jax.random.split(jax.random.key(0), n)
  accepted = np.asarray(jax.jit(jax.vmap(mipu.random_accept, (0, None)))(
      keys, p))
  reject_rate = 1 - accepted.mean()
  assert abs(reject_rate - p) < 5 * math.sqrt(p * (1 - p) / n)
  assert bool(mipu.random_accept(jax.random.key(1), 0.0))
  assert not bool(mipu.random_accept(jax.random.key(1), 1.0))


def test_counters():
  counters = mipu.init_counters()
  assert float(mipu.rollback_rate(counters)) == 0.0
  update = jax.jit(mipu.update_counters)
  for accepted in [True, False, False, True, True]:
    counters = update(counters, jnp.asarray(accepted))
  assert tuple(map(int, counters)) == (5, 3, 2)
  np.testing.assert_allclose(float(mipu.rollback_rate(counters)), 0.4)
  metrics = mipu.counter_metrics(counters, jnp.asarray(False))
  assert float(metrics["mipu/accepted"]) == 0.0
  np.testing.assert_allclose(float(metrics["mipu/rollback_rate"]), 0.4)


def _learner_states(tx):
  """A state before and after one update under `tx` (the schedule moves)."""
  params = {"w": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)}
  prev = LearnerState(params, tx.init(params), jnp.int32(4), jax.random.key(4))
  updates, opt_state = tx.update(jax.tree.map(jnp.ones_like, params),
                                 prev.opt_state, params, response_length=40.0)
  cand = LearnerState(optax.apply_updates(params, updates), opt_state,
                      jnp.int32(5), jax.random.key(5))
  return prev, cand


@pytest.mark.parametrize("traced", [False, True])
def test_resolve_update_rolls_back_moments_but_not_the_schedule(traced):
  """docs/method.md §5–6: params and Adam moments return bitwise; the step,
  the RNG and the schedule state (count, length EMA, rate) advance."""
  tx = optax.chain(optax.scale_by_adam(), schedules.length_surge(1e-3),
                   optax.scale(-1.0))
  prev, cand = _learner_states(tx)
  decision = jnp.asarray(False) if traced else False
  out = mipu.resolve_update(decision, cand, prev)
  chex.assert_trees_all_equal(out.params, prev.params)
  adam = lambda s: s[0]
  chex.assert_trees_all_equal(adam(out.opt_state), adam(prev.opt_state))
  chex.assert_trees_all_equal(schedules.find_schedule_state(out.opt_state),
                              schedules.find_schedule_state(cand.opt_state))
  assert int(schedules.find_schedule_state(out.opt_state).count) == 1
  assert int(out.step) == 5
  np.testing.assert_array_equal(jax.random.key_data(out.rng),
                                jax.random.key_data(cand.rng))
  if not traced:  # a host decision costs no copy
    assert out.params is prev.params
  accepted = mipu.resolve_update(jnp.asarray(True) if traced else True, cand, prev)
  chex.assert_trees_all_equal(accepted, cand)
