"""The run config's logging section: metric backends (JSONL, TensorBoard, W&B) and
the mismatch health checks (docs/method.md §8)."""

import dataclasses


LOGGING_BACKENDS = ("jsonl", "tensorboard", "wandb")


@dataclasses.dataclass(frozen=True)
class WandbConfig:
  """The Weights & Biases run of `logging.backends` "wandb" (`mipu_jax.rl.writer`).

  Attributes:
    project: W&B project.
    entity: W&B entity (team or user); "" for the account's default.
    name: the run's display name; "" for the workdir's name.
    group: W&B group (e.g. one per table row); "" for none.
    tags: W&B tags.
    mode: "online", "offline" (no network; `wandb sync` later) or
      "disabled"; "" leaves it to W&B (its `WANDB_MODE` environment variable).
  """
  project: str = "mipu_jax"
  entity: str = ""
  name: str = ""
  group: str = ""
  tags: tuple[str, ...] = ()
  mode: str = ""

  def __post_init__(self):
    tags = self.tags.split(",") if isinstance(self.tags, str) else self.tags
    object.__setattr__(self, "tags", tuple(t.strip() for t in tags if t.strip()))
    if self.mode not in ("", "online", "offline", "disabled"):
      raise ValueError(f"logging.wandb.mode must be '', 'online', 'offline' or "
                       f"'disabled', got {self.mode!r}.")
    if not self.project:
      raise ValueError("logging.wandb.project must not be empty.")


@dataclasses.dataclass(frozen=True)
class HealthConfig:
  """Mismatch health checks after every step (docs/method.md §8).

  The thresholds are verl's (its rollout-correction guide's health check);
  the gradient-norm spike and the `k3_kl` surge are ours. A check whose
  metric the step does not log (no IS weights, bypass mode) is not run.

  Attributes:
    enabled: run the checks (their `health/*` metrics, warnings and the
      progress-bar mark).
    is_mean_low: `rollout_is_mean` below this is unhealthy.
    is_mean_high: `rollout_is_mean` above this is unhealthy.
    ess_min: `rollout_is_eff_sample_size` below this is unhealthy.
    is_std_max: `rollout_is_std` above this is unhealthy.
    veto_fraction_max: `rollout_is_veto_fraction` above this is unhealthy.
    kl_abs_max: `|kl|` above this is unhealthy.
    chi2_token_max: `chi2_token` above this is unhealthy.
    k3_surge_ratio: `k3_kl` above this many times its median over the
      previous `k3_surge_window` steps is a surge ...
    k3_surge_floor: ... when it is also above this (a run without mismatch
      has `k3_kl` = 0, where any noise is a large ratio).
    k3_surge_window: steps in the running median.
    k3_surge_min_history: steps needed before the surge check runs.
    k3_surge_warns: print the surge as a warning too (else it shows in the
      bar's mark, `health/k3_kl_surge` and `health/unhealthy` only: it told
      no collapse apart, §8).
    grad_spike_ratio: `actor/grad_norm` above this many times its median
      over the previous `grad_spike_window` steps is a spike.
    grad_spike_window: steps in that running median.
    grad_spike_min_history: steps needed before the spike check runs.
    warn_every: a check that keeps failing warns again after this many steps.
  """
  enabled: bool = True
  is_mean_low: float = 0.5
  is_mean_high: float = 2.0
  ess_min: float = 0.3
  is_std_max: float = 1.0
  veto_fraction_max: float = 0.1
  kl_abs_max: float = 0.1
  chi2_token_max: float = 1.0
  k3_surge_ratio: float = 2.0
  k3_surge_floor: float = 1e-3
  k3_surge_window: int = 10
  k3_surge_min_history: int = 5
  k3_surge_warns: bool = False
  grad_spike_ratio: float = 10.0
  grad_spike_window: int = 10
  grad_spike_min_history: int = 5
  warn_every: int = 10

  def __post_init__(self):
    if not 0 <= self.is_mean_low < self.is_mean_high:
      raise ValueError(f"need 0 <= logging.health.is_mean_low < is_mean_high, got "
                       f"{self.is_mean_low}, {self.is_mean_high}.")
    if not self.k3_surge_ratio > 1:
      raise ValueError(f"logging.health.k3_surge_ratio must be > 1, got "
                       f"{self.k3_surge_ratio}.")
    if not 1 <= self.k3_surge_min_history <= self.k3_surge_window:
      raise ValueError("need 1 <= logging.health.k3_surge_min_history <= "
                       "k3_surge_window.")
    if not self.grad_spike_ratio > 1:
      raise ValueError(f"logging.health.grad_spike_ratio must be > 1, got "
                       f"{self.grad_spike_ratio}.")
    if not 1 <= self.grad_spike_min_history <= self.grad_spike_window:
      raise ValueError("need 1 <= logging.health.grad_spike_min_history <= "
                       "grad_spike_window.")
    if self.warn_every < 1:
      raise ValueError(f"logging.health.warn_every must be >= 1, got {self.warn_every}.")


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
  """Where metrics go, and the mismatch health checks.

  Attributes:
    backends: comma-separated metric sinks from `LOGGING_BACKENDS`
      ("jsonl,tensorboard,wandb"); JSONL (`metrics.jsonl`) is always written,
      named or not. Only process 0 writes.
    wandb: the W&B run, for the "wandb" backend.
    health: the mismatch health checks.
    plots: write `plots.png` at the end.
    progress_bar: a tqdm bar on the main process.
  """
  backends: str = "jsonl,tensorboard"
  wandb: WandbConfig = WandbConfig()
  health: HealthConfig = HealthConfig()
  plots: bool = True
  progress_bar: bool = True

  def __post_init__(self):
    names = self.backends.split(",") if isinstance(self.backends, str) else self.backends
    names = [n.strip().lower() for n in names if n.strip()]
    unknown = sorted(set(names) - set(LOGGING_BACKENDS))
    if unknown:
      raise ValueError(f"unknown logging.backends {unknown}; choose from "
                       f"{LOGGING_BACKENDS} (comma separated).")
    ordered = [n for n in LOGGING_BACKENDS if n == "jsonl" or n in names]
    object.__setattr__(self, "backends", ",".join(ordered))

  @property
  def backend_names(self) -> tuple[str, ...]:
    """The backends, "jsonl" first."""
    return tuple(self.backends.split(","))
