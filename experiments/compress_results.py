r"""Stores the finished runs' metrics compressed: `metrics.jsonl` -> `metrics.jsonl.gz`.

    python -m experiments.compress_results --root results
    python -m experiments.compress_results --root results --dry_run

A run is finished when its `config.json` says `num_steps` and its metrics
hold that step; unfinished runs (a study still training) are left as they
are. The report code, the tests and `reproduce_tables.py` read either file
(`mipu_jax.rl.read_jsonl`); a compressed run that resumes (e.g. extended to
more steps) is decompressed first (`rl.resume.metrics_rows`). Same rows, same
bytes: the gzip header holds no time or name.
"""

import json
import os

from absl import app
from absl import flags

from mipu_jax import rl

_ROOT = flags.DEFINE_string("root", "results", "Directory to walk.")
_DRY = flags.DEFINE_bool("dry_run", False, "Only list what would be compressed.")


def finished(run_dir: str) -> bool:
  """Whether the run in `run_dir` logged its last step."""
  config = os.path.join(run_dir, "config.json")
  if not os.path.exists(config):
    return False
  with open(config) as f:
    steps = json.load(f).get("num_steps")
  rows = rl.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  return bool(rows) and steps is not None and rows[-1]["step"] >= steps


def main(argv):
  del argv
  before = after = count = 0
  for dirpath, _, files in sorted(os.walk(_ROOT.value)):
    if "metrics.jsonl" not in files or not finished(dirpath):
      continue
    path = os.path.join(dirpath, "metrics.jsonl")
    size = os.path.getsize(path)
    before += size
    count += 1
    if _DRY.value:
      print(f"would compress {path} ({size / 1e6:.2f} MB)")
      continue
    after += os.path.getsize(rl.compress_jsonl(path))
  verb = "would compress" if _DRY.value else "compressed"
  print(f"{verb} {count} runs' metrics: {before / 1e6:.1f} MB"
        + ("" if _DRY.value else f" -> {after / 1e6:.1f} MB"))


if __name__ == "__main__":
  app.run(main)
