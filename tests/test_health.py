"""Mismatch health checks (docs/method.md §8): verl's thresholds, the `k3_kl`
surge, the rate-limited warning, and a resumed monitor equal to an
uninterrupted one. Each case is a hand-made metrics row."""

import json
import os

import pytest

from mipu_jax import config as config_lib
from mipu_jax.rl import health

P = "rollout_corr/"
HEALTHY = {P + "rollout_is_mean": 1.0, P + "rollout_is_eff_sample_size": 0.9,
           P + "rollout_is_std": 0.2, P + "rollout_is_veto_fraction": 0.0,
           P + "kl": 0.01, P + "chi2_token": 0.05}
CFG = config_lib.HealthConfig()


@pytest.mark.parametrize("metric,value,check", [
    ("rollout_is_mean", 0.49, "is_mean_out_of_range"),
    ("rollout_is_mean", 2.01, "is_mean_out_of_range"),
    ("rollout_is_eff_sample_size", 0.29, "is_ess_low"),
    ("rollout_is_std", 1.01, "is_std_high"),
    ("rollout_is_veto_fraction", 0.11, "veto_fraction_high"),
    ("kl", -0.11, "kl_high"),  # |kl|: a negative kl counts too
    ("kl", 0.11, "kl_high"),
    ("chi2_token", 1.01, "chi2_token_high"),
])
def test_each_verl_threshold(metric, value, check):
  report = health.HealthMonitor(CFG).check(1, {**HEALTHY, P + metric: value})
  assert list(report.failing) == [check]
  assert report.metrics["health/" + check] == 1.0
  assert report.metrics["health/unhealthy"] == 1.0
  assert report.mark == "!" + check
  assert report.warning.startswith("step 1: mismatch health: ")


def test_values_on_the_thresholds_are_healthy_and_absent_metrics_are_not_checked():
  edge = {P + "rollout_is_mean": 2.0, P + "rollout_is_eff_sample_size": 0.3,
          P + "rollout_is_std": 1.0, P + "rollout_is_veto_fraction": 0.1,
          P + "kl": -0.1, P + "chi2_token": 1.0}
  report = health.HealthMonitor(CFG).check(1, edge)
  assert not report.failing and report.warning is None and report.mark == "ok"
  assert report.metrics["health/unhealthy"] == 0.0
  # Bypass mode logs no kl / chi2: those checks do not run.
  report = health.HealthMonitor(CFG).check(1, {P + "rollout_is_mean": 1.0})
  assert set(report.metrics) == {"health/is_mean_out_of_range", "health/unhealthy"}


def test_k3_surge_over_the_running_median():
  cfg = config_lib.HealthConfig(k3_surge_ratio=2.0, k3_surge_window=4,
                                k3_surge_min_history=3, k3_surge_floor=1e-3,
                                k3_surge_warns=True)
  monitor = health.HealthMonitor(cfg)
  k3 = [0.01, 0.03, 0.02, 0.05, 0.02, 0.07]
  reports = [monitor.check(i + 1, {P + "k3_kl": v}) for i, v in enumerate(k3)]
  # Steps 1-3: fewer than 3 earlier values, no check.
  assert all("health/k3_kl_surge" not in r.metrics for r in reports[:3])
  # Step 4: median(.01, .03, .02) = .02; .05 > 2 x .02.
  assert reports[3].metrics["health/k3_kl_surge"] == 1.0
  assert reports[3].metrics["health/k3_kl_surge_ratio"] == pytest.approx(2.5)
  assert "k3_kl 0.05 is 2.5x its median 0.02" in reports[3].warning
  # Step 5: median(.01, .03, .02, .05) = .025; .02 is no surge.
  assert reports[4].metrics["health/k3_kl_surge"] == 0.0
  # Step 6: window of 4 drops .01: median(.03, .02, .05, .02) = .025; .07 > .05.
  assert reports[5].metrics["health/k3_kl_surge_ratio"] == pytest.approx(2.8)
  assert reports[5].failing == {"k3_kl_surge": reports[5].failing["k3_kl_surge"]}


def test_k3_surge_is_marked_but_not_warned_by_default():
  monitor = health.HealthMonitor(config_lib.HealthConfig(k3_surge_min_history=1))
  monitor.check(1, {P + "k3_kl": 0.01})
  report = monitor.check(2, {P + "k3_kl": 0.05})
  assert report.mark == "!k3_kl_surge" and report.metrics["health/unhealthy"] == 1.0
  assert report.warning is None


def test_grad_norm_spike_over_the_running_median():
  cfg = config_lib.HealthConfig(grad_spike_ratio=10.0, grad_spike_window=3,
                                grad_spike_min_history=2)
  monitor = health.HealthMonitor(cfg)
  norms = [1.0, 3.0, 21.0, 21.0, 2.0, 2.5, 30.0]
  reports = [monitor.check(i + 1, {health.GRAD_NORM: g}) for i, g in enumerate(norms)]
  assert all("health/grad_norm_spike" not in r.metrics for r in reports[:2])
  # Step 3: median(1, 3) = 2 (the step's own norm left out: with it, 3); 21 > 20.
  # Step 4: median(1, 3, 21) = 3; 21 < 30.
  assert [r.metrics["health/grad_norm_spike"] for r in reports[2:4]] == [1.0, 0.0]
  # Step 7: window of 3 (21, 2, 2.5): median 2.5; 30 > 25, and it warns.
  assert reports[6].metrics["health/grad_norm_spike"] == 1.0
  assert "gradient norm 30 is 12x its median 2.5 over the last 3 steps" in reports[6].warning
  assert monitor.check(8, {health.GRAD_NORM: float("nan")}).metrics == {}
  with pytest.raises(ValueError, match="grad_spike_ratio"):
    config_lib.HealthConfig(grad_spike_ratio=1.0)


def test_k3_below_the_floor_is_no_surge():
  monitor = health.HealthMonitor(config_lib.HealthConfig(k3_surge_min_history=1))
  monitor.check(1, {P + "k3_kl": 0.0})
  report = monitor.check(2, {P + "k3_kl": 5e-4})  # infinitely many times 0, below 1e-3
  assert report.metrics["health/k3_kl_surge"] == 0.0
  assert "health/k3_kl_surge_ratio" not in report.metrics
  assert monitor.check(3, {P + "k3_kl": 2e-3}).metrics["health/k3_kl_surge"] == 1.0


def test_warnings_are_rate_limited_per_check():
  monitor = health.HealthMonitor(config_lib.HealthConfig(warn_every=3))
  bad_kl, bad_both = {**HEALTHY, P + "kl": 0.2}, {**HEALTHY, P + "kl": 0.2, P + "chi2_token": 2.0}
  rows = [bad_kl, bad_kl, bad_both, bad_kl, HEALTHY, bad_kl]
  warnings = [monitor.check(step, m).warning for step, m in enumerate(rows, start=1)]
  assert warnings[0] is not None and "|kl| 0.2 > 0.1" in warnings[0]
  assert warnings[1] is None  # kl still failing, warned 1 step ago
  assert "chi2_token 2 > 1" in warnings[2] and "|kl|" not in warnings[2]  # only the new one
  assert "|kl|" in warnings[3]  # 3 steps after its last warning
  assert warnings[4] is None
  assert "|kl|" in warnings[5]  # failing again after a healthy step


def test_a_resumed_monitor_reports_like_an_uninterrupted_one():
  cfg = config_lib.HealthConfig(k3_surge_window=3, k3_surge_min_history=2, k3_surge_warns=True,
                                grad_spike_window=3, grad_spike_min_history=2)
  rows = [{"step": float(s), P + "k3_kl": v, P + "kl": kl, health.GRAD_NORM: g}
          for s, (v, kl, g) in enumerate([(.01, .0, 1.), (.02, .2, 2.), (.01, .0, 1.),
                                          (.05, .0, 30.), (.04, .3, 40.)])]
  whole = health.HealthMonitor(cfg)
  expected = [whole.check(int(r["step"]), r) for r in rows[1:]]
  resumed = health.HealthMonitor(cfg, rows[:3])  # rows of steps 0-2 kept
  got = [resumed.check(int(r["step"]), r) for r in rows[3:]]
  assert [g.metrics for g in got] == [e.metrics for e in expected[2:]]
  assert [g.warning for g in got] == [e.warning for e in expected[2:]]
  assert "k3_kl 0.05" in got[0].warning and "gradient norm 30" in got[0].warning


def test_health_thresholds_are_documented():
  method = open(os.path.join(os.path.dirname(__file__), "..", "docs", "method.md")).read()
  section = method[method.index("## §8"):]
  for check in health.NAMES:
    assert f"`health/{check}`" in section, check
  defaults = json.loads(json.dumps(config_lib.as_json(config_lib.TrainConfig())))
  for name, value in defaults["logging"]["health"].items():
    assert f"`{name}` ({value:g})" in section or f"`{name}` ({value})" in section, name


def test_results_readme_quotes_the_health_check_runs_maxima():
  """results/README.md's largest |kl| and chi2_token of the live health-check
  run, over the whole run and over steps 41-60, are the logged ones."""
  from mipu_jax import rl  # pylint: disable=g-import-not-at-top
  root = os.path.join(os.path.dirname(__file__), "..")
  rows = rl.read_jsonl(os.path.join(root, "results", "health_check", "metrics.jsonl"))
  readme = " ".join(open(os.path.join(root, "results", "README.md")).read().split())

  def largest(name, first=1):
    step, value = max(((r["step"], abs(r[name])) for r in rows
                       if name in r and r["step"] >= first), key=lambda p: p[1])
    return int(step), value

  kl_step, kl = largest("rollout_corr/kl")
  chi_step, chi = largest("rollout_corr/chi2_token")
  assert (f"the largest `|kl|` was {kl:.3f} (step {kl_step}, the opening length surge; "
          "threshold 0.1)") in readme
  assert f"the largest `chi2_token` {chi:.2f} (step {chi_step};" in readme
  assert (f"over steps 41–60, where the collapse came, {largest('rollout_corr/kl', 41)[1]:.3f} "
          f"and {largest('rollout_corr/chi2_token', 41)[1]:.3f}") in readme
  assert kl < 0.1 and chi < 1.0  # "never fired": below verl's thresholds
