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
