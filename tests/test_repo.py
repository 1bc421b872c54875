"""The repository's promises about itself: CI runs the README's test command."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands():
  text = (ROOT / "README.md").read_text()
  return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)


def test_ci_runs_the_readme_test_command():
  test_command = next(c for c in _readme_commands() if "pytest" in c)
  ci_lines = (ROOT / ".ci" / "run").read_text().strip().splitlines()
  assert ci_lines[-1] == test_command.strip()


def test_ci_uses_a_fresh_venv_without_system_packages():
  ci = (ROOT / ".ci" / "run").read_text()
  assert "python3 -m venv" in ci and "system-site-packages" not in ci


def test_readme_main_command_names_files_that_exist():
  main = _readme_commands()[0]
  for path in re.findall(r"(?:experiments|configs)/[\w/]+\.py", main):
    assert (ROOT / path).is_file(), path
