"""Several processes: 2 CPU processes x 4 devices run the RL loop as 1 process x 8 does.

Each process samples its half of the prompts on its own devices, the rollouts
are gathered, the learner step runs over the global 8-device mesh, and the
MIPU decisions come out identical everywhere; only process 0 writes files.
This file is also the target: `python tests/test_multihost.py WORKDIR PID NPROC PORT`.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from mipu_jax.testing import multiprocess

_STEPS = 2


def _config():
  from mipu_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from mipu_jax import testing  # pylint: disable=g-import-not-at-top
  return testing.tiny_run_config(
      _STEPS, learner=dict(mesh=config_lib.MeshConfig(data=1, fsdp=-1, tensor=1)),
      eval=dict(num_samples=2), checkpoint=dict(keep=1), export=dict(final=True),
      mipu=dict(step2=True, c=0.0, num_probe_prompts=4))


def _target(workdir: str, pid: int, nproc: int, port: int) -> None:
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={8 // nproc}"
  from mipu_jax import distributed  # pylint: disable=g-import-not-at-top
  if nproc > 1:
    distributed.initialize("on", coordinator_address=f"127.0.0.1:{port}",
                           num_processes=nproc, process_id=pid)
  import jax  # pylint: disable=g-import-not-at-top
  from mipu_jax import rl  # pylint: disable=g-import-not-at-top
  assert jax.device_count() == 8 and jax.process_count() == nproc
  result = rl.train(_config(), workdir)
  params = distributed.to_host(result.state.params)
  leaves = jax.tree_util.tree_leaves_with_path(params)
  np.savez(os.path.join(workdir, f"params_{pid}.npz"),
           **{jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves})
  with open(os.path.join(workdir, f"result_{pid}.json"), "w") as f:
    json.dump({"files": result.files, "rows": result.rows}, f)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run(workdir, nproc):
  os.makedirs(workdir, exist_ok=True)
  port = _free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), workdir, str(pid),
                             str(nproc), str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for pid in range(nproc)]
  outs = [p.communicate(timeout=600)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-4000:]
  return multiprocess.read_results(workdir, nproc, "params", "params")


@pytest.mark.multiprocess  # a minute of three processes: on demand, as the fault tests
def test_two_processes_run_the_loop_as_one(tmp_path):
  (single,) = _run(str(tmp_path / "one"), 1)
  p0, p1 = _run(str(tmp_path / "two"), 2)
  # Every process holds the same state and took the same decisions.
  for k in p0["params"]:
    np.testing.assert_array_equal(p0["params"][k], p1["params"][k])
  decisions = lambda r: [row.get("mipu/accepted") for row in r["rows"]]
  assert decisions(p0) == decisions(p1) == decisions(single)
  # ... and the same as one process with the 8 devices: same prompts, same
  # samples (keys by global prompt index), the same learner program.
  for row_2, row_1 in zip(p0["rows"], single["rows"]):
    for name in ("rollout/reward_mean", "rollout/response_length_mean", "eval/avg"):
      if name in row_1:
        assert row_2[name] == row_1[name], name
  for k, v in single["params"].items():
    np.testing.assert_allclose(p0["params"][k], v, rtol=1e-5, atol=1e-5)
  # Only process 0 writes the run's files.
  assert p1["files"] == {} and "export_final" in p0["files"]
  workdir = tmp_path / "two"
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  assert len(lines) == _STEPS + 1
  assert (workdir / "export" / "final" / "model.safetensors").exists()
  assert (workdir / "checkpoints" / str(_STEPS)).is_dir()


if __name__ == "__main__":
  _target(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
