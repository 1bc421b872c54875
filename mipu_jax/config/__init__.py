"""The run configuration: `ml_collections.ConfigDict` in, frozen dataclasses out.

The ConfigDict stops here. `from_config_dict` converts it
once into a validated `TrainConfig`; everything below takes these frozen
dataclasses or explicit arguments. An impossible combination (bypass mode with
IS weights, an unknown correction preset, a lower bound above an upper one, a
batch that does not split into mini-batches, ...) raises `ValueError` here,
before any compute.

`default_config()` is the inverse direction: the ConfigDict of `TrainConfig()`,
with every field present (optional ones as typed placeholders), so a config
file can start from it and `lock_config=True` command-line overrides reach any
field. The loss section is `LossConfig`'s fields plus
`correction = {preset, <CorrectionConfig field overrides>}`; an override left
at None keeps the preset's value, and the levels accept the string "none" to
switch IS or RS off.
"""

from mipu_jax.config.training import CheckpointConfig
from mipu_jax.config.training import CosineConfig
from mipu_jax.config.sections import DataConfig
from mipu_jax.config.diff import as_json
from mipu_jax.config.diff import config_diff
from mipu_jax.config.diff import flatten
from mipu_jax.config.diff import record_path
from mipu_jax.config.diff import RESUME_NEUTRAL
from mipu_jax.config.diff import resume_differences
from mipu_jax.config._convert import default_config
from mipu_jax.config.training import EvalConfig
from mipu_jax.config.training import ExportConfig
from mipu_jax.config._convert import from_config_dict
from mipu_jax.config.training import LearnerConfig
from mipu_jax.config.training import LengthSurgeConfig
from mipu_jax.config.command_line import load_flags
from mipu_jax.config.command_line import parse_flags
from mipu_jax.config.logging_section import HealthConfig
from mipu_jax.config.logging_section import LOGGING_BACKENDS
from mipu_jax.config.logging_section import LoggingConfig
from mipu_jax.config.training import MeshConfig
from mipu_jax.config.training import MIPU_PROBES
from mipu_jax.config.training import MipuConfig
from mipu_jax.config.training import MoEConfig
from mipu_jax.config.training import ROUTING_REPLAYS
from mipu_jax.config.sections import ModelConfig
from mipu_jax.config.training import OptimConfig
from mipu_jax.config.sections import SamplingConfig
from mipu_jax.config.sections import TASKS
from mipu_jax.config.training import TrainConfig
from mipu_jax.config.logging_section import WandbConfig

__all__ = [
    "CheckpointConfig",
    "CosineConfig",
    "DataConfig",
    "EvalConfig",
    "ExportConfig",
    "LearnerConfig",
    "HealthConfig",
    "LOGGING_BACKENDS",
    "LengthSurgeConfig",
    "LoggingConfig",
    "MIPU_PROBES",
    "MeshConfig",
    "MipuConfig",
    "MoEConfig",
    "ROUTING_REPLAYS",
    "ModelConfig",
    "OptimConfig",
    "RESUME_NEUTRAL",
    "SamplingConfig",
    "TASKS",
    "TrainConfig",
    "WandbConfig",
    "as_json",
    "config_diff",
    "default_config",
    "flatten",
    "from_config_dict",
    "load_flags",
    "parse_flags",
    "record_path",
    "resume_differences",
]
