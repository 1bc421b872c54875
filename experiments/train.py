r"""RL post-training launcher.

    python -m experiments.train --config studies/configs/small_cpu.py --workdir /tmp/run \
        --config.loss.correction.preset=mis_miles --config.num_steps=50

Parses flags, starts JAX's distributed runtime when the job has several
processes (`--distributed`, `mipu_jax.distributed`: on a TPU slice every host
runs this same command), validates the config
(`mipu_jax.config.from_config_dict`) and calls `mipu_jax.rl.train`; the logic
lives in the library. Rerunning the same command resumes the run from its
newest readable checkpoint. A SIGTERM (a preemption notice) stops every process
after the same step, checkpointed, with exit status 0; a lost or stuck process
ends the job with a non-zero status (docs/reliability.md).
"""

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from mipu_jax import config as config_lib
from mipu_jax import distributed
from mipu_jax import rl
from mipu_jax.rl import guard

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (a get_config() module).",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    "allow_config_change", False,
    "Resume WORKDIR with a config that changes what the run computes (both configs "
    "are kept and the step of the change recorded; docs/reliability.md).")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", distributed.MODES,
    "Start JAX's distributed runtime: auto (when the environment describes several "
    "processes: Cloud TPU, SLURM, Open MPI, JAX_COORDINATOR_ADDRESS), on, off.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 (where auto-detection cannot).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's id.")
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout_s", distributed.HEARTBEAT_TIMEOUT_S,
    "JAX's distributed runtime declares a silent process dead after this long and "
    "aborts the others; keep it above --peer_timeout_s.")
_SHUTDOWN = flags.DEFINE_integer(
    "shutdown_timeout_s", distributed.SHUTDOWN_TIMEOUT_S,
    "How long an exiting process waits for the others at the shutdown barrier.")
_PEER_TIMEOUT = flags.DEFINE_float(
    "peer_timeout_s", guard.JobLimits.peer_timeout_s,
    "A process without a sign of life for this long is lost: every other process "
    "exits non-zero naming it and the newest committed checkpoint.")
_STEP_TIMEOUT = flags.DEFINE_float(
    "step_timeout_s", None,
    "A phase of a step (rollout, learner step, probe, evaluation, save) that lasts "
    "longer ends its process with a message saying where it was (default: no limit).")
_GRACE = flags.DEFINE_float(
    "preemption_grace_s", guard.JobLimits.preemption_grace_s,
    "After a SIGTERM the job stops at the next step boundary with a checkpoint and "
    "exits 0; one still running after this long exits non-zero.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  distributed.initialize(_DISTRIBUTED.value, coordinator_address=_COORDINATOR.value,
                         num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value,
                         heartbeat_timeout_s=_HEARTBEAT.value,
                         shutdown_timeout_s=_SHUTDOWN.value)
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO.
  cfg = config_lib.from_config_dict(_CONFIG.value)
  limits = guard.JobLimits(peer_timeout_s=_PEER_TIMEOUT.value,
                           step_timeout_s=_STEP_TIMEOUT.value,
                           preemption_grace_s=_GRACE.value)
  result = rl.train(cfg, _WORKDIR.value, allow_config_change=_ALLOW_CONFIG_CHANGE.value,
                    limits=limits)
  if result.stopped_at is not None:  # a preemption notice: exit 0, rerun resumes
    if distributed.is_main():
      print(f"Stopped after step {result.stopped_at} on a preemption notice; "
            "checkpointed. Rerun the same command to resume.")
    return
  if distributed.is_main():
    print(result.table)
    print("\n".join(f"{name}: {path}" for name, path in result.files.items()))


if __name__ == "__main__":
  # A config file that cannot be loaded is one flag error, not a traceback.
  app.run(main, flags_parser=config_lib.parse_flags)
