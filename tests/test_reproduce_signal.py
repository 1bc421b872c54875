"""Step 2's signal report (studies/reproduce/signal.py), hand-computed."""

import math

import pytest

from studies.reproduce import signal


def _rows():
  return [
      {"step": 0, "eval/avg": 0.2},
      {"step": 1, "rollout/reward_mean": 0.2, "mipu/accepted": 1.0, "mipu/probe_reward": 0.5},
      {"step": 2, "rollout/reward_mean": 0.4, "mipu/accepted": 0.0, "mipu/probe_reward": 0.1},
      {"step": 3, "rollout/reward_mean": 0.3, "mipu/accepted": 1.0, "mipu/probe_reward": 0.4},
      {"step": 4, "rollout/reward_mean": 0.5, "mipu/accepted": 0.0},  # no next step
  ]


def test_decisions_pair_each_decision_with_the_next_step():
  ds = signal.decisions(_rows())
  assert [d["accepted"] for d in ds] == [1.0, 0.0, 1.0]
  assert [d["next_reward_change"] for d in ds] == pytest.approx([0.2, -0.1, 0.2])
  assert [d["probe_minus_reward"] for d in ds] == pytest.approx([0.3, -0.3, 0.1])
  assert math.isnan(signal.decisions([
      {"step": 1, "rollout/reward_mean": 0.2, "mipu/accepted": 1.0},
      {"step": 2, "rollout/reward_mean": 0.2}])[0]["probe_minus_reward"])


def test_row_signal_means_and_difference():
  s = signal.row_signal("mipu", [signal.decisions(_rows())])
  assert (s.n_accepted, s.n_rejected) == (2, 1)
  a, r, d, (lo, hi) = s.means["probe_minus_reward"]
  assert (a, r, d) == pytest.approx((0.2, -0.3, -0.5))
  # One rejected value; the accepted mean resamples {0.3, 0.1}: 0.1 .. 0.3.
  assert (lo, hi) == pytest.approx((-0.6, -0.4))
  a, r, d, _ = s.means["next_reward_change"]
  assert (a, r, d) == pytest.approx((0.2, -0.1, -0.3))
