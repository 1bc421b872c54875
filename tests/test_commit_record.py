"""Each session of a run records the git commit it ran from (rl.resume.record_commit),
so a committed result names the code that made it (docs/reliability.md)."""

import os
import subprocess

from mipu_jax.rl import resume

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args):
  return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                        check=True).stdout.strip()


def test_sessions_are_recorded_in_order_with_the_checkouts_commit(tmp_path):
  resume.record_commit(str(tmp_path), 0)
  resume.record_commit(str(tmp_path), 25)  # a resume after step 25
  first, second = resume.read_commits(str(tmp_path))
  dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
  assert first == {"commit": _git("rev-parse", "HEAD"), "dirty": dirty, "from_step": 0}
  assert second == dict(first, from_step=25)
  assert resume.read_commits(str(tmp_path / "elsewhere")) == []


def test_without_git_nothing_is_recorded(tmp_path, monkeypatch):
  def no_git(*args, **kwargs):
    raise FileNotFoundError("git")
  monkeypatch.setattr(subprocess, "run", no_git)
  assert resume.code_commit() is None
  resume.record_commit(str(tmp_path), 0)
  assert resume.read_commits(str(tmp_path)) == []


def test_a_package_inside_another_repositorys_tree_records_nothing(monkeypatch):
  # An installed copy (a venv's site-packages) inside some checkout: that
  # checkout's commit is not the code's.
  import mipu_jax  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(mipu_jax, "__file__", os.path.join(ROOT, "tests", "pkg", "__init__.py"))
  assert resume.code_commit() is None


def test_records_of_older_runs_are_rewritten_relative_to_the_repository(tmp_path):
  """experiments/compress_results.py readies a run for a commit: a config's
  packaged base policy and a summary's workdir written as absolute paths (by
  another machine) become the repository's relative names; nothing else moves."""
  import json  # pylint: disable=g-import-not-at-top

  from experiments import compress_results  # pylint: disable=g-import-not-at-top
  run = os.path.join(ROOT, "results", "_test_records_run")
  config = {"num_steps": 2, "model": {"preset": "tiny",
                                      "init_from": "/m/x/mipu_jax/tasks/assets/base_policy"}}
  summary = {"row": "r", "seed": 0, "workdir": "/m/x/results/s/runs/r_s0", "final": {"avg": 0.5}}
  try:
    os.makedirs(run)
    with open(os.path.join(run, "config.json"), "w") as f:
      f.write(json.dumps(config, indent=2))
    with open(os.path.join(run, "summary.json"), "w") as f:
      f.write(json.dumps(summary, indent=2) + "\n")
    assert compress_results.relative_records(run) == 2
    assert compress_results.relative_records(run) == 0
    with open(os.path.join(run, "config.json")) as f:
      text = f.read()
    assert text == json.dumps(dict(config, model=dict(
        config["model"], init_from="mipu_jax/tasks/assets/base_policy")), indent=2)
    with open(os.path.join(run, "summary.json")) as f:
      text = f.read()
    assert text == json.dumps(dict(summary, workdir="results/_test_records_run"), indent=2) + "\n"
  finally:
    import shutil  # pylint: disable=g-import-not-at-top
    shutil.rmtree(run, ignore_errors=True)
