"""Both Colab notebooks run end to end in quick mode: the CPU quickstart, and the
GPU / TPU real-checkpoint notebook against the tiny offline Qwen3 checkpoint of
`mipu_jax.testing` (no accelerator, no download).

The notebook's code cells are executed in order, in one fresh Python process
started in `colab/` (as a local Jupyter would), with `MIPU_QUICK=1`; no
notebook server or kernel package is needed. IPython's `display` falls back
to printing outside a kernel.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "colab", "quickstart.ipynb")
REAL = os.path.join(ROOT, "colab", "real_checkpoint.ipynb")


def _code_cells(path):
  with open(path) as f:
    nb = json.load(f)
  assert nb["nbformat"] == 4
  cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
  for cell in cells:  # plain Python only, so the cells run outside a kernel too
    assert not any(line.lstrip().startswith(("!", "%")) for line in cell.splitlines())
  return cells


@pytest.mark.extended
@pytest.mark.long
def test_notebook_runs_in_quick_mode(tmp_path, main_job):
  """The quickstart's quick row is the main job's `tis` run (seed 0, quick, one
  CPU device: conftest's `main_job`, which trained it): the notebook reads that
  finished run back (`run_table` checks its config is the row's) and makes its
  table and curves from it."""
  cells = _code_cells(NOTEBOOK)
  script = tmp_path / "quickstart.py"
  script.write_text("\n\n".join(cells) + "\nprint('FILES', result.files)\n")
  assert main_job[1].returncode == 0, main_job[1].stderr[-3000:]
  shutil.copytree(main_job[0] / "runs" / "tis_s0", tmp_path / "work" / "runs" / "tis_s0")
  env = dict(os.environ, MIPU_QUICK="1", MIPU_WORKDIR=str(tmp_path / "work"),
             JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = ""  # one CPU device, as on a Colab CPU runtime
  proc = subprocess.run([sys.executable, str(script)], cwd=os.path.join(ROOT, "colab"),
                        env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "JAX" in proc.stdout and "| TIS |" in open(tmp_path / "work" / "table.md").read()
  assert os.path.getsize(tmp_path / "work" / "curves_main.png") > 10_000


@pytest.mark.extended
@pytest.mark.long
def test_real_checkpoint_notebook_runs_on_cpu_against_the_tiny_checkpoint(tmp_path):
  cells = _code_cells(REAL)
  assert any("DOWNLOAD = False" in c for c in cells)  # downloads only when the user says so
  script = tmp_path / "real_checkpoint.py"
  script.write_text("\n\n".join(cells) + "\nprint('ROWS', len(result.rows))\n")
  work = tmp_path / "work"
  env = dict(os.environ, MIPU_QUICK="1", MIPU_WORKDIR=str(work), JAX_PLATFORMS="cpu",
             HF_HUB_OFFLINE="1")
  env["XLA_FLAGS"] = ""
  proc = subprocess.run([sys.executable, str(script)], cwd=os.path.join(ROOT, "colab"),
                        env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "checkpoint: " + str(work / "tiny_qwen3") in proc.stdout
  assert "mismatch health (docs/method.md §8):" in proc.stdout
  rows = [json.loads(line) for line in open(work / "run" / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [0, 1, 2]
  assert "eval/avg" in rows[0] and "eval/avg" in rows[-1]
  assert all("rollout_corr/k3_kl" in r and "health/unhealthy" in r for r in rows[1:])
  assert os.path.getsize(work / "real_checkpoint_curves.png") > 10_000
  # The accelerator bench's cell finds the bench (skipped on a CPU, not missing).
  assert "bench/gpu/accelerator.py: skipped (CPU runtime" in proc.stdout


@pytest.mark.parametrize("notebook", [NOTEBOOK, REAL], ids=["quickstart", "real_checkpoint"])
def test_setup_cell_outside_a_checkout_asks_for_the_source(tmp_path, notebook):
  """On a clean runtime (no checkout around) with `MIPU_JAX_SOURCE` unset, the
  first cell stops with a message naming the value to set."""
  setup = _code_cells(notebook)[0]
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
