"""Mismatch health after every step: `health/*` metrics, a warning, a bar mark.

The checks and their thresholds are docs/method.md §8: verl's rollout-correction
health check on the step's `rollout_corr/*` metrics, a spike of the gradient
norm over its running median (as a rule, it told the committed runs' collapses
apart better than the surge did), and a surge of `k3_kl` (a notice that the
mismatch moved: in the bar and the metrics, warned only on request). A check
whose metric the step does not log is not run. Everything here is a pure
function of the logged rows, so a resumed run (whose monitor is rebuilt from
the kept rows) reports what an uninterrupted one would.
"""

import dataclasses
import logging
import math
import statistics
from collections import deque
from typing import Callable, Mapping, Optional, Sequence

from mipu_jax.config import HealthConfig

_log = logging.getLogger(__name__)

P = "rollout_corr/"
K3 = P + "k3_kl"
GRAD_NORM = "actor/grad_norm"


@dataclasses.dataclass(frozen=True)
class Check:
  """One threshold check.

  Attributes:
    name: the `health/<name>` flag.
    metric: the metric it reads.
    failing: `(value, cfg) -> bool`.
    describe: `(value, cfg) -> str`, for the warning.
  """
  name: str
  metric: str
  failing: Callable[[float, HealthConfig], bool]
  describe: Callable[[float, HealthConfig], str]


CHECKS = (
    Check("is_mean_out_of_range", P + "rollout_is_mean",
          lambda v, c: not c.is_mean_low <= v <= c.is_mean_high,
          lambda v, c: f"mean IS weight {v:.3g} outside [{c.is_mean_low:g}, {c.is_mean_high:g}]"),
    Check("is_ess_low", P + "rollout_is_eff_sample_size",
          lambda v, c: v < c.ess_min,
          lambda v, c: f"IS effective sample size {v:.3g} < {c.ess_min:g}"),
    Check("is_std_high", P + "rollout_is_std",
          lambda v, c: v > c.is_std_max,
          lambda v, c: f"IS weight std {v:.3g} > {c.is_std_max:g}"),
    Check("veto_fraction_high", P + "rollout_is_veto_fraction",
          lambda v, c: v > c.veto_fraction_max,
          lambda v, c: f"veto fraction {v:.3g} > {c.veto_fraction_max:g}"),
    Check("kl_high", P + "kl",
          lambda v, c: abs(v) > c.kl_abs_max,
          lambda v, c: f"|kl| {abs(v):.3g} > {c.kl_abs_max:g}"),
    Check("chi2_token_high", P + "chi2_token",
          lambda v, c: v > c.chi2_token_max,
          lambda v, c: f"chi2_token {v:.3g} > {c.chi2_token_max:g}"),
)
SURGE = "k3_kl_surge"
SPIKE = "grad_norm_spike"
NAMES = tuple(c.name for c in CHECKS) + (SPIKE, SURGE)


@dataclasses.dataclass(frozen=True)
class Report:
  """One step's health.

  Attributes:
    metrics: `health/<check>` (1 failing, 0 passing) for every check that ran,
      `health/k3_kl_surge_ratio` (`k3_kl` over its running median) when the
      median exists and is positive, and `health/unhealthy` (failing checks).
    failing: `{check: description}` of the failing checks.
    warning: the one-line warning to print now (rate-limited), or None.
  """
  metrics: dict[str, float]
  failing: dict[str, str]
  warning: Optional[str]

  @property
  def mark(self) -> str:
    """The progress bar's mark: "ok", or "!" and the failing checks."""
    return "!" + ",".join(self.failing) if self.failing else "ok"


class HealthMonitor:
  """Checks each step's metrics (docs/method.md §8).

  Args:
    cfg: the thresholds.
    rows: the rows logged so far (a resumed run's kept rows), in step order:
      the `k3_kl` history and the warning rate limit continue from them.
  """

  def __init__(self, cfg: HealthConfig, rows: Sequence[Mapping[str, float]] = ()):
    self.cfg = cfg
    self._k3 = deque(maxlen=cfg.k3_surge_window)
    self._grad = deque(maxlen=cfg.grad_spike_window)
    self._last_warned: dict[str, int] = {}
    self._failing_before: set[str] = set()
    for row in rows:
      if row.get("step", 0) > 0:
        self.check(int(row["step"]), row)

  @staticmethod
  def _median_before(window: deque, value: Optional[float], min_history: int):
    """`(value, median of the window before it, its length)`, the value then
    joining the window; None where the value is missing or the window short."""
    if value is None or not math.isfinite(value):
      return None
    history = list(window)
    window.append(value)
    return (value, statistics.median(history), len(history)) if len(
        history) >= min_history else None

  def _surge(self, metrics: Mapping[str, float]) -> tuple[dict[str, float], Optional[str]]:
    c = self.cfg
    seen = self._median_before(self._k3, metrics.get(K3), c.k3_surge_min_history)
    if seen is None:
      return {}, None
    value, median, n = seen
    out = {"health/" + SURGE: 0.0}
    if median > 0:
      out["health/k3_kl_surge_ratio"] = value / median
    if value > c.k3_surge_floor and value > c.k3_surge_ratio * median:
      out["health/" + SURGE] = 1.0
      return out, (f"k3_kl {value:.3g} is {value / median:.3g}x its median "
                   f"{median:.3g} over the last {n} steps"
                   if median > 0 else f"k3_kl {value:.3g} after {n} steps at 0")
    return out, None

  def _spike(self, metrics: Mapping[str, float]) -> tuple[dict[str, float], Optional[str]]:
    c = self.cfg
    seen = self._median_before(self._grad, metrics.get(GRAD_NORM), c.grad_spike_min_history)
    if seen is None:
      return {}, None
    value, median, n = seen
    spike = median > 0 and value > c.grad_spike_ratio * median
    return {"health/" + SPIKE: float(spike)}, (
        f"gradient norm {value:.3g} is {value / median:.3g}x its median {median:.3g} "
        f"over the last {n} steps" if spike else None)

  def check(self, step: int, metrics: Mapping[str, float]) -> Report:
    """The health of step `step` from its metrics; advances the history."""
    if not self.cfg.enabled:
      return Report({}, {}, None)
    out, failing = {}, {}
    for c in CHECKS:
      value = metrics.get(c.metric)
      if value is None or not math.isfinite(value):
        continue
      bad = c.failing(value, self.cfg)
      out["health/" + c.name] = float(bad)
      if bad:
        failing[c.name] = c.describe(value, self.cfg)
    for name, (more, why) in ((SPIKE, self._spike(metrics)), (SURGE, self._surge(metrics))):
      out.update(more)
      if why is not None:
        failing[name] = why
    if out:
      out["health/unhealthy"] = float(len(failing))
    warned = {n: w for n, w in failing.items() if n != SURGE or self.cfg.k3_surge_warns}
    return Report(out, failing, self._warning(step, warned))

  def _warning(self, step: int, failing: Mapping[str, str]) -> Optional[str]:
    """A check warns when it starts failing, then every `warn_every` steps."""
    due = [name for name in failing
           if name not in self._failing_before
           or step - self._last_warned.get(name, -10**9) >= self.cfg.warn_every]
    self._failing_before = set(failing)
    for name in due:
      self._last_warned[name] = step
    if not due:
      return None
    return (f"step {step}: mismatch health: " + "; ".join(failing[n] for n in due)
            + " (docs/method.md §8)")


def warn(report: Report) -> None:
  """Prints the report's warning, if any, through the `logging` module."""
  if report.warning:
    _log.warning("%s", report.warning)
