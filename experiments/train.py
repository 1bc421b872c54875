r"""RL post-training launcher.

    python experiments/train.py --config configs/small_cpu.py --workdir /tmp/run \
        --config.loss.correction.preset=mis_miles --config.num_steps=50

Parses flags, validates the config (`mipu_jax.config.from_config_dict`) and
calls `mipu_jax.rl.train`; the logic lives in the library.
"""

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from mipu_jax import config as config_lib
from mipu_jax import rl

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (a get_config() module).",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO.
  cfg = config_lib.from_config_dict(_CONFIG.value)
  result = rl.train(cfg, _WORKDIR.value)
  print(result.table)
  print("\n".join(f"{name}: {path}" for name, path in result.files.items()))


if __name__ == "__main__":
  app.run(main)
