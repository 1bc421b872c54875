"""bench/gpu/accelerator.py runs on CPU at a tiny shape, every part, so it cannot rot."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.extended
@pytest.mark.long
def test_accelerator_bench_tiny(tmp_path):
  out = tmp_path / "acc"
  proc = subprocess.run(
      [sys.executable, "-m", "bench.gpu.accelerator", "--tiny", "--out",
       str(out), "--sampler_modes", "bf16,fp8 native", "--dump_hlo", str(tmp_path / "hlo")],
      capture_output=True, text=True, check=False, cwd=ROOT,
      env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads((out / "accelerator.json").read_text())
  assert result["device"]["platform"] == "cpu" and result["peak_tflops"] > 0
  modes = {r["mode"]: r for r in result["sampler"]}
  assert set(modes) == {"bf16", "fp8 native"}
  for r in modes.values():
    assert "error" not in r and r["tokens"] == 4 * 16 and r["tokens_per_s"] > 0
    assert r["bound_tokens_per_s"] > 0 and r["vs_bound"] > 0 and r["step_gb"] >= 0
  # XLA:CPU upcasts fp8 dots; what reaches the compiler is checked in
  # tests/test_native_quant.py. Here: the kernel report reads the dumps.
  assert sum(modes["bf16"]["kernels"].values()) > 0
  (learner,) = result["learner"]
  assert "error" not in learner and learner["tokens"] == 16 + 48 and learner["plan_peak_bytes"] > 0
  impls = {(r["tokens"], r["implementation"]) for r in result["attention"] if "ms" in r}
  assert impls == {(64, "dense"), (64, "blockwise"), (128, "dense"), (128, "blockwise")}
  math = result["math"]
  assert "error" not in math, math
  assert math["steps"] == 2 and math["export"] and math["quant_compute"] == "native"
  phases = math["phases"]
  assert 0 < phases["rewards, per step"][0] < phases["rollout (sampling + rewards), per step"][0]
  assert phases["checkpoint save (previous step's), per step"][1] > 0
  assert phases["evaluation (mu), per step"][1] > 0 and phases["MIPU Step 2, per step"][0] > 0
  assert phases["outside the steps (setup, step-0 eval, final save, HF export)"] > 0
  assert all(0 < x < 1 for x in math["rollout_share_of_step"])
  table = (out / "accelerator.md").read_text()
  assert "## Sampler" in table and "## studies/configs/math.py" in table
