"""Test-wide setup: 8 fake CPU devices (before JAX initialises), strict rank promotion,
and one persistent XLA compilation cache per test session.

The cache directory is shared by the xdist workers of a session and by the
subprocesses tests start (through the environment), so a program that several
tests compile (the tiny learner step, the sampler's decode loop) is compiled
once per session; it starts empty for every session, so a session's time does
not depend on earlier ones.
"""
import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
_session = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      os.path.join(tempfile.gettempdir(), f"mipu_jax_xla_cache_{_session}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402  (must follow the environment above)

jax.config.update("jax_numpy_rank_promotion", "raise")

import pathlib  # noqa: E402

import pytest  # noqa: E402

FIXTURES = pathlib.Path(__file__).parent / "fixtures"

# Modules whose tests share module fixtures that compile or run something (a
# tiny RL run, a learner run, sampled rows, the campaign's world): xdist sends
# each one whole to one worker, which builds its fixtures once.
WHOLE_MODULES = frozenset({
    "test_bad_inputs.py", "test_faults.py", "test_gates.py", "test_hf.py",
    "test_learner.py", "test_moe.py", "test_moe_rl.py", "test_true_on_policy.py"})

# Tests of several modules that share one session fixture (a run both check):
# xdist sends each group whole to one worker, which runs the fixture once.
SHARED_FIXTURE_GROUPS = {
    "test_reproduce.py::test_main_job_quick_then_the_tables_reuse_its_runs": "main_job",
    "test_colab.py::test_notebook_runs_in_quick_mode": "main_job",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """Under -n (xdist's `load`): the tests one at a time in collection order, two
  to each worker to start, then one more whenever a worker has two or fewer
  left, a module of `WHOLE_MODULES`, a group of `SHARED_FIXTURE_GROUPS` and
  the cases of one parametrized test as one unit each. (xdist's own
  `loadgroup` does not group on pytest 9.2, whose node ids it can no longer
  rewrite.)"""
  if config.getvalue("dist") != "load":
    return None
  from xdist.scheduler import LoadScopeScheduling  # pylint: disable=g-import-not-at-top

  class WholeModules(LoadScopeScheduling):

    def _split_scope(self, nodeid):
      module = nodeid.split("::", 1)[0]
      group = SHARED_FIXTURE_GROUPS.get(os.path.basename(nodeid))
      if group:
        return group
      if os.path.basename(module) in WHOLE_MODULES:
        return module
      # A parametrized test's cases share their compiles: one worker runs them.
      return nodeid.split("[", 1)[0]

  config.option.loadscopereorder = False  # keep pytest_collection_modifyitems' order
  return WholeModules(config, log)


def pytest_runtest_setup(item):
  """`@pytest.mark.devices(n)`: the test builds an n-device mesh, skipped where
  fewer devices exist (one GPU; the suite runs it on its 8 CPU devices)."""
  marker = item.get_closest_marker("devices")
  if marker and len(jax.devices()) < marker.args[0]:
    pytest.skip(f"needs {marker.args[0]} devices")


def pytest_collection_modifyitems(items):
  """The tests marked `long` and the modules of `WHOLE_MODULES` first (stable
  otherwise): xdist hands out tests in collection order, and a minute-long
  test or module drawn last leaves one core idle."""
  items.sort(key=lambda item: not (item.get_closest_marker("long")
                                   or item.path.name in WHOLE_MODULES))


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory):
  """A tiny random Qwen3 checkpoint directory in the Hugging Face layout, with a
  byte-level BPE tokenizer and Qwen's special tokens (`mipu_jax.testing`)."""
  from mipu_jax.testing import checkpoint  # pylint: disable=g-import-not-at-top
  return checkpoint.write_tiny_qwen3(str(tmp_path_factory.mktemp("tiny_qwen3")))


@pytest.fixture(scope="session")
def math_inputs(tiny_ckpt):
  """`ckpt=...,train=...,eval=...` for `studies/configs/math.py` and the pod configs."""
  return (f"ckpt={tiny_ckpt},train={FIXTURES / 'train' / 'dapo_math.jsonl'},"
          f"eval={FIXTURES / 'benchmarks'}")


@pytest.fixture(scope="session")
def main_job(tmp_path_factory):
  """The README's main command in quick mode (`experiments/compare.py --quick`, a
  real run per row, on one CPU device): its workdir and finished process. The
  main job's test checks it; the quickstart notebook's test reads back its
  `tis` run, the notebook's quick row (`SHARED_FIXTURE_GROUPS`)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  workdir = tmp_path_factory.mktemp("main_job") / "main"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.compare", f"--workdir={workdir}", "--quick"],
      capture_output=True, text=True, timeout=600, cwd=os.path.dirname(FIXTURES.parent),
      env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=""))
  return workdir, proc
