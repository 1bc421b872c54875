"""The Colab quickstart runs end to end in quick mode.

The notebook's code cells are executed in order, in one fresh Python process
started in `colab/` (as a local Jupyter would), with `MIPU_QUICK=1`; no
notebook server or kernel package is needed. IPython's `display` falls back
to printing outside a kernel.
"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "colab", "quickstart.ipynb")


def _code_cells(path):
  with open(path) as f:
    nb = json.load(f)
  assert nb["nbformat"] == 4
  cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
  for cell in cells:  # plain Python only, so the cells run outside a kernel too
    assert not any(line.lstrip().startswith(("!", "%")) for line in cell.splitlines())
  return cells


def test_notebook_runs_in_quick_mode(tmp_path):
  cells = _code_cells(NOTEBOOK)
  script = tmp_path / "quickstart.py"
  script.write_text("\n\n".join(cells) + "\nprint('FILES', result.files)\n")
  env = dict(os.environ, MIPU_QUICK="1", MIPU_WORKDIR=str(tmp_path / "work"),
             JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = ""  # one CPU device, as on a Colab CPU runtime
  proc = subprocess.run([sys.executable, str(script)], cwd=os.path.join(ROOT, "colab"),
                        env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "JAX" in proc.stdout and "| TIS |" in open(tmp_path / "work" / "table.md").read()
  assert os.path.getsize(tmp_path / "work" / "curves_main.png") > 10_000


def test_setup_cell_outside_a_checkout_asks_for_the_source(tmp_path):
  """On a clean runtime (no checkout around) with `MIPU_JAX_SOURCE` unset, the
  first cell stops with a message naming the value to set."""
  setup = _code_cells(NOTEBOOK)[0]
  assert 'MIPU_JAX_SOURCE = ""' in setup
  script = tmp_path / "setup_cell.py"
  script.write_text(setup)
  proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode != 0
  assert "Set MIPU_JAX_SOURCE" in proc.stderr
  # A path that is not a checkout is refused too.
  script.write_text(setup.replace('MIPU_JAX_SOURCE = ""', f'MIPU_JAX_SOURCE = "{tmp_path}"'))
  proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode != 0 and "is not a mipu_jax checkout" in proc.stderr
