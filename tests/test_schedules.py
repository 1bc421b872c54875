"""Tests for mipu_jax.schedules (docs/method.md §6)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mipu_jax import schedules

LR0 = 1e-6


def algorithm1(lr0, lr_inf, decay_period, total_steps):
  """The source's Algorithm 1, verbatim: the rate used at steps 1..T."""
  rates = []
  lr = lr0
  for t in range(1, total_steps + 1):
    if t % decay_period == 0:
      lr = max(lr / 2, lr_inf)
    rates.append(lr)
  return np.asarray(rates, np.float32)


def run_schedule(tx, lengths):
  """Runs ``tx`` over a length series inside one scan; returns rates, state."""
  params = jnp.zeros([3], jnp.float32)

  def body(state, length):
    updates, state = tx.update(jnp.ones([3], jnp.float32), state, params,
                               response_length=length)
    return state, (updates[0], state.learning_rate)

  state, (scaled, rates) = jax.jit(
      lambda lengths: jax.lax.scan(body, tx.init(params), lengths))(
          jnp.asarray(lengths, jnp.float32))
  np.testing.assert_array_equal(scaled, rates)  # updates are scaled by rate
  return np.asarray(rates), state


def surge_series(surge_at, total, before=100.0, after=300.0):
  """Mean length ``before`` for steps < surge_at, ``after`` from it on."""
  steps = np.arange(1, total + 1)
  return np.where(steps < surge_at, before, after)


@pytest.mark.parametrize("surge_at", [12, 37, 110])
@pytest.mark.parametrize("baseline", ["window", "ema"])
def test_auto_decays_at_multiples_of_round_1p8_surge(surge_at, baseline):
  period = round(1.8 * surge_at)
  total = 5 * period + 7
  tx = schedules.length_surge(LR0, mode="auto", baseline=baseline)
  rates, state = run_schedule(tx, surge_series(surge_at, total))

  assert int(state.surge_step) == surge_at
  assert int(state.decay_period) == period
  np.testing.assert_array_equal(rates[:period - 1], np.float32(LR0))
  np.testing.assert_array_equal(rates[period - 1], np.float32(LR0 / 2))
  np.testing.assert_array_equal(rates[2 * period - 1], np.float32(LR0 / 4))
  np.testing.assert_array_equal(rates[3 * period - 1], np.float32(LR0 / 8))
  np.testing.assert_array_equal(rates[4 * period - 1:], np.float32(0.1 * LR0))
  np.testing.assert_array_equal(rates,
                                algorithm1(LR0, 0.1 * LR0, period, total))


def test_auto_ignores_slow_growth_and_jumps_before_min_steps():
  total = 200
  slow = 100.0 * 1.01 ** np.arange(total)  # 5 % per window: no surge
  rates, state = run_schedule(schedules.length_surge(LR0), slow)
  assert int(state.surge_step) == -1 and int(state.decay_period) == -1
  np.testing.assert_array_equal(rates, np.float32(LR0))

  # A jump at step 3 is before min_steps=10; by then the window is level.
  _, state = run_schedule(schedules.length_surge(LR0), surge_series(3, total))
  assert int(state.surge_step) == -1


def test_auto_keeps_first_surge():
  lengths = surge_series(20, 300)
  lengths[150:] *= 10  # a second surge changes nothing
  _, state = run_schedule(schedules.length_surge(LR0), lengths)
  assert int(state.surge_step) == 20
  assert int(state.decay_period) == 36


def test_zero_lengths_no_nan_no_surge():
  lengths = np.concatenate([np.zeros(30), np.full(30, 50.0)])
  rates, state = run_schedule(schedules.length_surge(LR0), lengths)
  assert np.isfinite(rates).all()
  for leaf in jax.tree.leaves(state):
    assert np.isfinite(np.asarray(leaf)).all()
  # The 0 -> 50 step has a baseline of 0, which never counts as a surge.
  assert int(state.surge_step) == -1
  np.testing.assert_allclose(float(state.length_ema), 50 * (1 - 0.9**30),
                             rtol=1e-5)


@pytest.mark.parametrize("decay_period", [1, 37, 204])
def test_fixed_mode_is_algorithm1(decay_period):
  total = 500
  tx = schedules.length_surge(LR0, mode="fixed", decay_period=decay_period)
  rates, state = run_schedule(tx, np.full(total, 1000.0))
  np.testing.assert_array_equal(
      rates, algorithm1(LR0, 0.1 * LR0, decay_period, total))
  assert int(state.surge_step) == -1
  assert int(state.decay_period) == decay_period


def test_fixed_mode_without_length():
  tx = schedules.length_surge(LR0, mode="fixed", decay_period=2)
  params = jnp.ones([2])
  state = tx.init(params)
  for _ in range(4):
    _, state = tx.update(params, state, params)
  assert float(state.learning_rate) == np.float32(LR0 / 4)
  assert float(state.length_ema) == 0.0


def test_chain_with_adam_equals_manual_adam_times_rate():
  b1, b2, eps, period, steps = 0.9, 0.999, 1e-8, 7, 30
  tx = optax.chain(optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
                   schedules.length_surge(1e-2, mode="fixed",
                                          decay_period=period),
                   optax.scale(-1.0))
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=(3, 5)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(7,)), jnp.float32)}
  grads = [jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32),
                        params) for _ in range(steps)]
  rates = algorithm1(1e-2, 1e-3, period, steps)

  state = tx.init(params)
  update = jax.jit(tx.update)
  m = jax.tree.map(np.zeros_like, params)
  v = jax.tree.map(np.zeros_like, params)
  for t, g in enumerate(grads, start=1):
    updates, state = update(g, state, params, response_length=100.0)
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
    expected = jax.tree.map(
        lambda m, v, lr=rates[t - 1], t=t: -lr * (m / (1 - b1**t)) / (
            np.sqrt(v / (1 - b2**t)) + eps), m, v)
    jax.tree.map(  # float32 vs float64: loose where m nearly cancels
        lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-8),
        updates, expected)
  assert float(schedules.current_learning_rate(state)) == rates[-1]


def test_jit_does_not_recompile():
  tx = optax.chain(optax.scale_by_adam(), schedules.length_surge(LR0),
                   optax.scale(-1.0))
  params = jnp.ones([5])
  traces = 0

  @jax.jit
  def step(state, length):
    nonlocal traces
    traces += 1
    return tx.update(params, state, params, response_length=length)

  state = tx.init(params)
  _, state = step(state, jnp.float32(10.0))
  _, state = step(state, jnp.float32(400.0))
  assert traces == 1


def test_auto_without_length_raises():
  tx = schedules.length_surge(LR0)
  params = jnp.ones([2])
  with pytest.raises(ValueError, match="response_length"):
    tx.update(params, tx.init(params), params)


@pytest.mark.parametrize("kwargs", [
    dict(mode="fixed"),
    dict(mode="fixed", decay_period=0),
    dict(mode="auto", decay_period=10),
    dict(mode="sometimes"),
    dict(baseline="median"),
    dict(min_ratio=1.5),
    dict(surge_ratio=1.0),
])
def test_length_surge_rejects_bad_config(kwargs):
  with pytest.raises(ValueError):
    schedules.length_surge(LR0, **kwargs)


def test_constant_and_cosine_ignore_length():
  const = schedules.make_schedule("constant", LR0)
  cos = schedules.make_schedule("cosine", LR0, total_steps=20, warmup=4,
                                min_ratio=0.1)
  const_rates, _ = run_schedule(const, np.arange(30.0))
  cos_rates, state = run_schedule(cos, np.arange(30.0))
  np.testing.assert_array_equal(const_rates, np.float32(LR0))

  t = np.arange(1, 31)
  frac = np.clip((t - 4) / 16, 0, 1)
  expected = np.where(t <= 4, LR0 * t / 4,
                      0.1 * LR0 + 0.9 * LR0 * 0.5 * (1 + np.cos(np.pi * frac)))
  np.testing.assert_allclose(cos_rates, expected, rtol=1e-5)
  np.testing.assert_allclose(cos_rates[19:], 0.1 * LR0, rtol=1e-6)
  assert set(schedules.schedule_metrics(state)) == {"schedule/learning_rate"}


def test_make_schedule_and_metrics():
  with pytest.raises(ValueError, match="unknown schedule"):
    schedules.make_schedule("step", LR0)
  tx = optax.chain(optax.scale_by_adam(),
                   schedules.make_schedule("length_surge", LR0),
                   optax.scale(-1.0))
  params = jnp.ones([2])
  _, state = tx.update(params, tx.init(params), params, response_length=7.0)
  metrics = schedules.schedule_metrics(state)
  assert set(metrics) == {"schedule/learning_rate", "schedule/length_ema",
                          "schedule/surge_step", "schedule/decay_period"}
  assert float(metrics["schedule/length_ema"]) == 7.0
  assert int(metrics["schedule/surge_step"]) == -1
  with pytest.raises(ValueError, match="one schedule state"):
    schedules.find_schedule_state((state, state))


@pytest.mark.parametrize("name,kwargs", [
    ("length_surge", dict(mode="fixed", decay_period=3)),
    ("length_surge", dict(mode="auto", min_steps=2, surge_window=1)),
    ("cosine", dict(total_steps=6, warmup=2)),
    ("constant", {}),
])
@pytest.mark.parametrize("updates_per_step", [1, 3])
def test_schedules_count_rl_steps_not_updates(name, kwargs, updates_per_step):
  """docs/method.md §6: with several updates per RL step, the rate and the
  schedule state change only on a step's first update (`new_step=True`); the
  others reuse the rate in force, so the per-step rates do not depend on the
  number of updates."""
  tx = schedules.make_schedule(name, LR0, **kwargs)
  lengths = np.array([10.0, 10.0, 30.0, 30.0, 30.0, 30.0, 30.0])
  per_step, _ = run_schedule(tx, lengths)  # one update per step
  params = jnp.zeros([2], jnp.float32)
  state = tx.init(params)
  update = jax.jit(tx.update)
  for step, length in enumerate(lengths):
    for u in range(updates_per_step):
      scaled, state = update(jnp.ones([2]), state, params,
                             response_length=length, new_step=jnp.asarray(u == 0))
      np.testing.assert_array_equal(scaled, per_step[step])
    assert int(state.count) == step + 1
  if name == "length_surge" and kwargs["mode"] == "auto":
    assert int(state.surge_step) == 3  # the length tripled at step 3
    assert float(per_step[-1]) < LR0  # and the rate decayed after it


def test_measured_surge_step_and_period():
  assert schedules.measured_surge_step([19.0, 45.0, 52.0]) == 2
  assert schedules.measured_surge_step([10.0, 15.0, 19.0, 21.0]) == 4
  assert schedules.measured_surge_step([10.0, 15.0, 19.0]) is None
  assert schedules.measured_surge_step([0.0, 5.0]) is None
  assert schedules.decay_period_from_surge(2) == 4        # round(3.6)
  assert schedules.decay_period_from_surge(110) == 198    # the paper's 4B: ~204
  assert schedules.decay_period_from_surge(1, period_factor=0.2) == 1


def test_table_lr_decay_row_acts_on_the_measured_surge():
  """The table's LR-decay row: T_decay from the surge step measured on the
  committed baseline runs, and a rate curve that leaves the baseline's."""
  import os  # pylint: disable=g-import-not-at-top
  from studies.configs import table  # pylint: disable=g-import-not-at-top
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax import rl  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for lr, (pattern, seeds) in table.BASELINE_RUNS.items():
    measured = []
    for seed in seeds:
      path = os.path.join(root, pattern.format(seed=seed), "metrics.jsonl")
      lengths = [r["rollout/response_length_mean"] for r in rl.read_jsonl(path)
                 if "rollout/response_length_mean" in r]
      measured.append(schedules.measured_surge_step(lengths))
    assert np.median(measured) == table.SURGE_STEPS[lr], (lr, measured)
  for lr, period in ((7e-4, 4), (2e-4, 7)):  # round(1.8 x 2), round(1.8 x 4)
    cfg = config_lib.from_config_dict(table.get_config(f"lr_decay,lr={lr}"))
    assert cfg.optim.schedule_kwargs(cfg.num_steps) == {"mode": "fixed", "decay_period": period}
    long = config_lib.from_config_dict(table.get_config(f"lr_decay_long,lr={lr}"))
    assert long.optim.length_surge.decay_period == 10 * table.SURGE_STEPS[lr]
  with pytest.raises(ValueError, match="surge step measured"):
    table.get_config("lr_decay,lr=3e-4")
  cfg = config_lib.from_config_dict(table.get_config("lr_decay,lr=7e-4"))
  assert cfg.optim.schedule == "length_surge"
  kw = cfg.optim.schedule_kwargs(cfg.num_steps)
  lr0 = cfg.optim.learning_rate
  rates, _ = run_schedule(schedules.length_surge(lr0, **kw), np.full(20, 50.0))
  # Halved at steps 4, 8, 12; the floor 0.1 x lr0 from step 16 on.
  want = [lr0] * 3 + [lr0 / 2] * 4 + [lr0 / 4] * 4 + [lr0 / 8] * 4 + [lr0 / 10] * 5
  np.testing.assert_allclose(rates, want, rtol=1e-6)
  base = config_lib.from_config_dict(table.get_config("baseline"))
  assert base.optim.schedule == "constant"


@pytest.mark.parametrize("period,steps", [(4, 120), (20, 120), (1, 7), (204, 500)])
def test_fixed_rates_are_the_transformations_rates(period, steps):
  lr0 = 7e-4
  rates, _ = run_schedule(schedules.length_surge(lr0, mode="fixed", decay_period=period),
                          np.full(steps, 50.0))
  np.testing.assert_allclose(schedules.fixed_rates(lr0, period, steps), rates, rtol=1e-6)


def test_isolating_rows_match_lr_decays_rates_by_hand():
  """The rate-matched baselines of the earlier tables' setting (lr 7e-4, T_decay 4,
  120 steps, floor 0.1): steps 1-3 at 7e-4, 4-7 at 3.5e-4, 8-11 at 1.75e-4,
  12-15 at 8.75e-5, 16-120 (105 steps) at 7e-5: mean 119e-4 / 120."""
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from studies import reproduce  # pylint: disable=g-import-not-at-top
  from studies.configs import table  # pylint: disable=g-import-not-at-top
  cfgs = {row: config_lib.from_config_dict(table.get_config(f"{row},lr=7e-4"))
          for row in reproduce.ISOLATE_ROWS}
  reproduce.check_like_with_like(cfgs)  # each differs only in what it compares
  mean = (3 * 7 + 4 * 3.5 + 4 * 1.75 + 4 * 0.875 + 105 * 0.7) * 1e-4 / 120
  assert cfgs["baseline_lr_mean"].optim.learning_rate == pytest.approx(mean, rel=1e-12)
  assert cfgs["baseline_lr_floor"].optim.learning_rate == pytest.approx(7e-5, rel=1e-12)
  for row in ("baseline_lr_mean", "baseline_lr_floor"):
    assert cfgs[row].optim.schedule == "constant"
    assert cfgs[row].optim.length_surge == cfgs["baseline"].optim.length_surge
  kw = lambda row: cfgs[row].optim.schedule_kwargs(cfgs[row].num_steps)
  assert kw("lr_decay") == kw("control_lr_decay") == {"mode": "fixed", "decay_period": 4}
  assert kw("lr_decay_long") == {"mode": "fixed", "decay_period": 20}  # 10 x surge step 2
  assert cfgs["control_lr_decay"].sampling == cfgs["control"].sampling
