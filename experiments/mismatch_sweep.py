r"""The mismatch study on the small CPU task: every cell of the grid, resumable.

    python -m experiments.mismatch_sweep --workdir results/mismatch_sweep
    python -m experiments.mismatch_sweep --workdir results/mismatch_sweep \
        --cells fp32_lr1e-3,int4_all_lr1e-3 --report_only

Cells are `studies/configs/mismatch.py` arguments (`studies/configs/mismatch.GRID`, or
`--extra name=arg` for more); the logic lives in `studies.mismatch_sweep`.
Writes `grid.md`, `summary.json`, `sweep.png` and one run per cell under
`runs/`; re-running resumes (finished cells are read back, if their config
still matches).
"""

from absl import app
from absl import flags
from absl import logging

from mipu_jax import harness
from studies import mismatch_sweep
from studies.configs import mismatch

_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
_CELLS = flags.DEFINE_list("cells", None, "Cells of the grid to run (default: all).")
_EXTRA = flags.DEFINE_multi_string("extra", [], "More cells, as name=config-arg.")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False,
                                 "Train nothing: tabulate the cells that finished.")
_CACHE = flags.DEFINE_string("jax_cache", None,
                             "Persistent compilation cache (default WORKDIR/.jax_cache; '' off).")
flags.mark_flag_as_required("workdir")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO.
  harness.enable_compilation_cache(_CACHE.value, _WORKDIR.value)
  cells = dict(mismatch.GRID)
  for item in _EXTRA.value:
    name, _, arg = item.partition("=")
    cells[name] = arg
  if _CELLS.value:
    unknown = set(_CELLS.value) - set(cells)
    if unknown:
      raise ValueError(f"unknown cells {sorted(unknown)}; known: {sorted(cells)}")
    cells = {k: cells[k] for k in _CELLS.value}
  results = mismatch_sweep.run_sweep(mismatch.get_config, cells, _WORKDIR.value,
                                     train=not _REPORT_ONLY.value)
  print(mismatch_sweep.grid_markdown(results))


if __name__ == "__main__":
  app.run(main)
