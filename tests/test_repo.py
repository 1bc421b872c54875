"""The repository's promises about itself: CI runs the README's test commands."""

import itertools
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ISSUE_NUMBER = re.compile(r"\bissue #?\d+", flags=re.I)  # history's, not the text's


def _readme_commands():
  text = (ROOT / "README.md").read_text()
  return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)


def test_ci_runs_the_readme_test_command():
  test_command = next(c for c in _readme_commands() if "pytest" in c)
  ci_lines = (ROOT / ".ci" / "run").read_text().strip().splitlines()
  assert ci_lines[-2] == test_command.strip()
  extended = re.search(r"then `(python -m pytest [^`]*-m extended tests)`",
                       (ROOT / "README.md").read_text())
  assert extended and ci_lines[-1] == extended[1]


def test_ci_runs_the_readme_multiprocess_command():
  command = next(c for c in _readme_commands() if "-m multiprocess" in c)
  ci_lines = (ROOT / ".ci" / "run_multiprocess").read_text().strip().splitlines()
  assert ci_lines[-1].endswith(f"&& {command.strip()}")


@pytest.mark.parametrize("script", ["run", "run_multiprocess"])
def test_ci_uses_a_fresh_venv_without_system_packages(script):
  ci = (ROOT / ".ci" / script).read_text()
  assert "python3 -m venv" in ci and "system-site-packages" not in ci


def test_readme_main_command_names_files_that_exist():
  main = _readme_commands()[0]
  modules = re.findall(r"python -m ((?:experiments|bench)[\w.]*)", main)
  assert modules, main
  for module in modules:
    assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module
  for path in re.findall(r"studies/[\w/]+\.py", main):
    assert (ROOT / path).is_file(), path


def test_docs_name_commands_and_files_that_exist():
  """The tracked Markdown (raw benchmark outputs aside: they record the command
  as it was run) runs scripts as modules that exist, and the Python and shell
  files it names in the tree's code folders exist."""
  docs = _tracked("*.md")
  if docs is None:
    pytest.skip("needs the git checkout")
  bad = []
  for doc in (d for d in docs if not d.startswith("bench/results/")):
    text = (ROOT / doc).read_text()
    bad += [(doc, m) for m in re.findall(r"python3? ((?:experiments|bench|studies)/\S+\.py)", text)]
    for module in re.findall(r"python3? -m ((?:experiments|bench|studies)[\w.]*)", text):
      path = ROOT / module.replace(".", "/")
      if not (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()):
        bad.append((doc, module))
    for path in re.findall(
        r"(?<![\w/.])((?:mipu_jax|studies|experiments|bench|tests|configs)/[\w/-]+\.(?:py|sh))",
        text):
      if not (ROOT / path).is_file():
        bad.append((doc, path))
  assert not bad, bad


def _tracked(pattern: str):
  """The files git tracks under `pattern` (`git ls-files`), or None outside a checkout."""
  import subprocess  # pylint: disable=g-import-not-at-top
  try:
    return subprocess.run(["git", "ls-files", pattern], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.split()
  except (OSError, subprocess.CalledProcessError):
    return None


def _tracked_run_dirs():
  """`results/<study>/runs/<run>` paths in the checkout: tracked ones where git
  is there (a study writing into results/ leaves half-written runs untracked),
  else every directory on disk."""
  out = _tracked("results")
  if out is None:
    return sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("results/*/runs/*"))
  return sorted({"/".join(p.split("/")[:4]) for p in out
                 if p.count("/") >= 3 and p.split("/")[2] == "runs"})


def test_committed_study_runs_are_finished():
  """A run directory is finished when it has its summary.json (the last file a
  run writes, `mipu_jax.train`); a half-written one must not be committed,
  because the tables and a resumed study would read it as a result. A link to
  another study's run (the shared rows) must reach a finished run."""
  runs = _tracked_run_dirs()
  assert len(runs) > 300, len(runs)  # the committed studies
  unfinished = [r for r in runs if not (ROOT / r / "summary.json").is_file()]
  assert not unfinished, unfinished


def test_committed_run_records_name_paths_relative_to_the_repository():
  """A committed run's config and summary name the base policy and the run's
  directory relative to the repository (`config.record_path`), not by the path
  of the machine that trained them."""
  import json  # pylint: disable=g-import-not-at-top
  checked, absolute = 0, []
  for run in _tracked_run_dirs():
    for name, key in (("config.json", ("model", "init_from")), ("summary.json", ("workdir",))):
      path = ROOT / run / name
      if not path.is_file():
        continue
      value = json.loads(path.read_text())
      for k in key:
        value = value.get(k) if isinstance(value, dict) else None
      checked += value is not None
      if isinstance(value, str) and value.startswith("/"):
        absolute.append(f"{run}/{name}: {value}")
  assert checked > 600, checked
  assert not absolute, absolute[:5]


def test_the_library_imports_no_study_code():
  """mipu_jax is what `pip install` ships: it must not import this repository's
  studies, experiments or benchmarks (a user's install has none of them)."""
  import ast  # pylint: disable=g-import-not-at-top
  outside = ("studies", "configs", "experiments", "bench")
  found = []
  for path in sorted((ROOT / "mipu_jax").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and not node.level:
        names = [node.module or ""]
      else:
        continue
      found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                if n.split(".")[0] in outside]
  assert not found, found


def test_only_the_library_is_installed():
  text = (ROOT / "setup.cfg").read_text()
  include = re.search(r"\[options\.packages\.find\]\ninclude = (.*)", text).group(1)
  assert [p.strip() for p in include.split(",")] == ["mipu_jax", "mipu_jax.*"]


def test_readme_fits_a_newcomers_reading():
  """The README is the front door (what it is, the two commands, where things
  are): short, and without the per-commit figures and hashes that belong in
  bench/README.md and results/README.md."""
  text = (ROOT / "README.md").read_text()
  assert len(text.splitlines()) <= 160
  assert not re.findall(r"`[0-9a-f]{7,40}`", text)
  assert not ISSUE_NUMBER.findall(text)


def test_code_cites_no_issue_numbers():
  """Code says what and why; which issue asked for it is the history's
  (git log), not the source's."""
  found = []
  for folder in ("mipu_jax", "studies", "experiments", "bench", "tests"):
    for path in sorted((ROOT / folder).rglob("*.py")):
      for n, line in enumerate(path.read_text().splitlines(), 1):
        if ISSUE_NUMBER.search(line):
          found.append(f"{path.relative_to(ROOT)}:{n}")
  assert not found, found


def test_gpu_checks_run_the_suite_default_with_the_extended_tests():
  """bench/gpu_checks.sh overrides setup.cfg's marker filter so that a device window
  runs the extended tests: the same filter without `not extended`, so a marker later
  left out of the default is left out there too."""
  default = re.search(r'addopts = .*-m "([^"]+)"', (ROOT / "setup.cfg").read_text())[1]
  device = re.search(r"PYTEST_ADDOPTS=.*-m '([^']+)'",
                     (ROOT / "bench" / "gpu_checks.sh").read_text())[1]
  assert device == default.replace(" and not extended", "")


def test_cited_sections_exist():
  """A citation of a Markdown file's section, `<doc>.md, "Section"` or `<doc>.md
  ("Section"` (the path from the repository root or from the citing file), is the
  start of a heading or of a bold lead-in of that file: an edit that drops a
  section others cite fails here."""
  files = _tracked("*.py")
  if files is None:
    pytest.skip("needs the git checkout")
  files += [d for d in _tracked("*.md") if not d.startswith(("bench/results/", "results/"))]
  cite = re.compile(r"([\w./-]+\.md)(?:, | \()[\"“]([^\"”\n]+)[\"”]")
  sections = {}
  bad = []
  for name in files:
    for number, line in enumerate((ROOT / name).read_text().splitlines(), 1):
      for doc, section in cite.findall(line):
        target = next((p for p in (ROOT / doc, (ROOT / name).parent / doc) if p.is_file()), None)
        if target is None:
          bad.append(f"{name}:{number}: {doc} (no such file)")
          continue
        if target not in sections:
          text = target.read_text()
          sections[target] = re.findall(r"^#+ (.*)$", text, flags=re.M) + re.findall(
              r"\*\*([^*]+)\*\*", text)
        if not any(s.lower().startswith(section.lower()) for s in sections[target]):
          bad.append(f"{name}:{number}: {doc}, \"{section}\"")
  assert not bad, bad


def _brace_expansions(path: str) -> list[str]:
  """`a_{x,y}_{1,2}.out` as the shell expands it: every combination of the alternatives."""
  parts = re.split(r"\{([^{}]*)\}", path)
  literals, choices = parts[0::2], [p.split(",") for p in parts[1::2]]
  return ["".join(l + c for l, c in zip(literals, list(combo) + [""]))
          for combo in itertools.product(*choices)]


def test_brace_expansions_take_every_combination():
  assert _brace_expansions("results/m_{a,b}_{1,2}.out") == [
      "results/m_a_1.out", "results/m_a_2.out", "results/m_b_1.out", "results/m_b_2.out"]
  assert _brace_expansions("results/m.out") == ["results/m.out"]


def test_cited_result_files_exist():
  """A raw output the docs cite (`results/...`, from the repository root or the citing
  file's folder, braces expanded as the shell would) is in the tree: a figure keeps the
  run that made it."""
  docs = _tracked("*.md")
  if docs is None:
    pytest.skip("needs the git checkout")
  cite = re.compile(
      r"(?<![\w/])(?:bench/)?results/[\w{},.\-/]+\.(?:out|json|jsonl|csv|txt|md|png)")
  bad = []
  for doc in (d for d in docs if not d.startswith(("bench/results/", "results/"))):
    folder = (ROOT / doc).parent
    for ref in set(cite.findall((ROOT / doc).read_text())):
      bad += [f"{doc}: {p}" for p in _brace_expansions(ref)
              if not ((ROOT / p).exists() or (folder / p).exists())]
  assert not bad, bad
