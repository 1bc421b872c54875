"""bench/perf/loop.py's checks: the before code is the revision asked for, and
"results unchanged" means bitwise the same metrics at every step."""

import functools
import importlib.util
import math
import os
import subprocess

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache  # its absl flags can be defined once per process
def _loop():
  spec = importlib.util.spec_from_file_location("bench_loop", os.path.join(ROOT, "bench", "perf",
                                                                          "loop.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_same_metrics():
  same = _loop().same_metrics
  a = [{"step": 1, "reward": 0.25, "perf/x": 1.0}, {"step": 2, "reward": math.nan}]
  assert same(a, [dict(r) for r in a]) == "identical"  # NaN == NaN here
  b = [dict(a[0]), {"step": 2, "reward": 0.5}]
  assert same(a, b) == "differ: row 1 (step 2) reward: nan vs 0.5"
  c = [dict(a[0], reward=0.25 + 1e-12), a[1]]  # one ulp-ish apart is a difference
  assert same(a, c).startswith("differ: row 0 (step 1) reward")
  assert same(a, a[:1]) == "2 vs 1 rows"
  assert same(a, [dict(a[0], extra=1), a[1]]).startswith("differ: row 0 (step 1) extra")
  assert same([{"x": 0.0}], [{"x": -0.0}]).startswith("differ")  # bits, not ==
  assert same([{"x": 1}], [{"x": 1.0}]) == "identical"  # JSON may write either
  assert same([{"x": np.float32("nan")}], [{"x": math.nan}]) == "identical"
  assert same([{"x": None}], [{}]).startswith("differ")  # a missing key is a difference


def test_extract_is_the_revision(tmp_path):
  if subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True,
                    check=False).returncode:
    pytest.skip("not a git checkout")
  out = _loop()._extract("HEAD", str(tmp_path))
  want = subprocess.run(["git", "-C", ROOT, "show", "HEAD:bench/perf/loop.py"], capture_output=True,
                        check=True, text=True).stdout
  with open(os.path.join(out, "bench", "perf", "loop.py")) as f:
    assert f.read() == want
  assert os.path.exists(os.path.join(out, "mipu_jax", "rl", "loop.py"))
