r"""RL post-training launcher.

    python experiments/train.py --config configs/small_cpu.py --workdir /tmp/run \
        --config.loss.correction.preset=mis_miles --config.num_steps=50

Parses flags, validates the config (`mipu_jax.config.from_config_dict`) and
calls `mipu_jax.rl.train`; the logic lives in the library.
"""

import os
import sys

# The configs import each other as `configs.*`, which lives beside this
# directory, not in the installed package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from mipu_jax import config as config_lib  # noqa: E402
from mipu_jax import rl  # noqa: E402

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
