r"""Readies finished runs for a commit: their metrics compressed (`metrics.jsonl` ->
`metrics.jsonl.gz`) and their records naming paths as `config.record_path` does.

    python -m experiments.compress_results --root results
    python -m experiments.compress_results --root results --dry_run

A run is finished when its `config.json` says `num_steps` and its metrics
hold that step; unfinished runs (a study still training) are left as they
are. The report code, the tests and `reproduce_tables.py` read either file
(`mipu_jax.rl.read_jsonl`); a compressed run that resumes (e.g. extended to
more steps) is decompressed first (`rl.resume.metrics_rows`). Same rows, same
bytes: the gzip header holds no time or name.

Records written before runs named paths relative to the repository (a config's
`model.init_from`, a summary's `workdir`) are rewritten so: the same values
read back (`config.flatten` compares them so), in any clone.
"""

import json
import os

from absl import app
from absl import flags

from mipu_jax import config as config_lib
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


def _rewrite_json(path: str, edit) -> bool:
  """Applies `edit` (in place, to the parsed object) to the JSON file at `path`;
  rewrites it in the same layout when anything changed."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  data = json.loads(text)
  if not isinstance(data, dict) or not edit(data):
    return False
  with open(path, "w", encoding="utf-8") as f:
    f.write(json.dumps(data, indent=2) + ("\n" if text.endswith("\n") else ""))
  return True


def _relative_init_from(config: dict) -> bool:
  model = config.get("model")
  path = model.get("init_from") if isinstance(model, dict) else None
  if not isinstance(path, str):
    return False
  model["init_from"] = config_lib.record_path(path)
  return model["init_from"] != path


def _relative_workdir(summary: dict, run_dir: str) -> bool:
  # The run's workdir is the directory its summary is in (in this clone).
  path = summary.get("workdir")
  if not isinstance(path, str) or not os.path.isabs(path):
    return False
  summary["workdir"] = config_lib.record_path(os.path.abspath(run_dir))
  return summary["workdir"] != path


def relative_records(run_dir: str) -> int:
  """Rewrites the run's configs and summary to name paths as `config.record_path`
  does; returns how many files changed."""
  changed = 0
  for name in sorted(os.listdir(run_dir)):
    path = os.path.join(run_dir, name)
    if name == "config.json" or (name.startswith("config.from_step_") and name.endswith(".json")):
      changed += _rewrite_json(path, _relative_init_from)
    elif name == "summary.json":
      changed += _rewrite_json(path, lambda s: _relative_workdir(s, run_dir))
  return changed


def main(argv):
  del argv
  before = after = count = rewritten = 0
  for dirpath, _, files in sorted(os.walk(_ROOT.value)):
    if "config.json" in files and not _DRY.value:
      rewritten += relative_records(dirpath)
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
        + ("" if _DRY.value else f" -> {after / 1e6:.1f} MB; {rewritten} records now name "
           "paths relative to the repository"))


if __name__ == "__main__":
  app.run(main)
