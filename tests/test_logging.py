"""Metric backends by config (`logging.backends`), W&B offline included.

The W&B tests run with `WANDB_MODE=offline` (no network) and read W&B's own
files back (`mipu_jax.rl.wandb_run.history`). The kill-and-resume test
SIGKILLs a tiny `rl.train` run with `jsonl,tensorboard,wandb` mid-save and
reruns it: W&B's files must hold every step once, in order, with the values
of `metrics.jsonl`. This file is also that test's target:
`python tests/test_logging.py WORKDIR`.
"""

import json
import logging
import os
import sys
import time

import pytest

from mipu_jax import config as config_lib
from mipu_jax.rl import wandb_run
from mipu_jax.rl import writer as writer_lib
from mipu_jax.testing import kill_resume as harness

_STEPS = 3
_BACKENDS = "jsonl,tensorboard,wandb"


@pytest.fixture(autouse=True)
def _wandb_offline(monkeypatch):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.setenv("WANDB_CONSOLE", "off")


def _wandb_steps(workdir, run_id, expected=None, timeout=60.0):
  """The history steps of each attempt; with `expected`, polls until they match
  (W&B's service may still be writing its log when `finish()` returns: seen as
  an empty history on a loaded 2-core machine)."""
  deadline = time.monotonic() + timeout
  while True:
    steps = [wandb_run.history_steps(p) for p in wandb_run.offline_logs(workdir, run_id)]
    if expected is None or steps == expected or time.monotonic() > deadline:
      return steps
    time.sleep(0.5)


def _run_id(workdir):
  with open(os.path.join(workdir, wandb_run.ID_FILE)) as f:
    return json.load(f)["id"]


def test_backends_are_parsed_jsonl_first_and_always():
  cfg = config_lib.LoggingConfig(backends=" wandb,TensorBoard ")
  assert cfg.backend_names == ("jsonl", "tensorboard", "wandb")
  assert config_lib.LoggingConfig(backends="").backend_names == ("jsonl",)
  assert config_lib.LoggingConfig(backends=("wandb",)).backends == "jsonl,wandb"
  with pytest.raises(ValueError, match="unknown logging.backends.*mlflow"):
    config_lib.LoggingConfig(backends="jsonl,mlflow")
  assert config_lib.WandbConfig(tags="a, b,").tags == ("a", "b")
  with pytest.raises(ValueError, match="logging.wandb.mode"):
    config_lib.WandbConfig(mode="cloud")
  cd = config_lib.default_config()
  cd.logging.backends = _BACKENDS
  cd.logging.wandb.group = "table"
  cfg = config_lib.from_config_dict(cd)
  assert cfg.logging.backend_names == ("jsonl", "tensorboard", "wandb")
  assert cfg.logging.wandb.group == "table"


def test_wandb_records_the_config_and_continues_the_same_run(tmp_path):
  """A second writer in the same workdir (a resume) continues the W&B run of
  the first and logs only steps after those W&B holds."""
  workdir = str(tmp_path)
  wandb_cfg = config_lib.WandbConfig(project="p", name="n", group="g", tags=("t",))
  run_config = config_lib.as_json(config_lib.TrainConfig())
  writer = writer_lib.MetricWriter(workdir, backends=("jsonl", "wandb"),
                                   wandb_cfg=wandb_cfg, run_config=run_config)
  for step in range(4):
    writer.write(step, {"x": float(step)})
  writer.close()
  run_id = _run_id(workdir)
  assert _wandb_steps(workdir, run_id, expected=[[0, 1, 2, 3]]) == [[0, 1, 2, 3]]
  (first,) = wandb_run.offline_logs(workdir, run_id)
  # The run record carries the config, project, name, group and tags.
  run = wandb_run.run_record(first)
  assert (run.project, run.display_name, run.run_group, list(run.tags)) == ("p", "n", "g", ["t"])
  config = {item.key: json.loads(item.value_json) for item in run.config.update}
  assert config["loss"]["correction"] == run_config["loss"]["correction"]

  # Resumed after step 1: steps 0-3 are replayed from the log, 2-3 rerun.
  writer = writer_lib.MetricWriter(workdir, backends=("jsonl", "wandb"),
                                   wandb_cfg=wandb_cfg, start_step=1)
  for step in range(2):
    writer.write(step, {"x": float(step)}, replay=True)
  for step in range(2, 6):
    writer.write(step, {"x": float(step)})
  writer.close()
  assert _run_id(workdir) == run_id
  assert _wandb_steps(workdir, run_id, expected=[[0, 1, 2, 3], [4, 5]]) == [[0, 1, 2, 3], [4, 5]]


def test_a_backend_failing_mid_run_warns_and_keeps_the_jsonl_row(tmp_path, monkeypatch, caplog):
  writer = writer_lib.MetricWriter(str(tmp_path), backends=("jsonl", "wandb"),
                                   wandb_cfg=config_lib.WandbConfig())

  def down(self, step, metrics):
    raise ConnectionError("W&B is unreachable")

  monkeypatch.setattr(wandb_run.WandbSink, "write", down)
  with caplog.at_level(logging.WARNING):
    for step in range(3):
      writer.write(step, {"x": 1.0})
  writer.close()
  assert writer.failures == {"wandb": 3}
  warned = [r.getMessage() for r in caplog.records if "logging backend 'wandb' failed" in r.getMessage()]
  assert len(warned) == 1 and "W&B is unreachable" in warned[0]  # rate-limited
  rows = writer_lib.read_jsonl(writer.path)
  assert [r["step"] for r in rows] == [0, 1, 2]


def test_a_backend_that_cannot_start_is_an_error_at_start(tmp_path, monkeypatch):
  import wandb  # pylint: disable=g-import-not-at-top

  def no_login(**kwargs):
    raise wandb.errors.UsageError("api_key not configured (no-tty)")

  monkeypatch.setattr(wandb, "init", no_login)
  with pytest.raises(writer_lib.BackendStartError,
                     match=r"'wandb' could not start: UsageError.*leave it out of logging.backends"):
    writer_lib.MetricWriter(str(tmp_path), backends=("jsonl", "wandb"),
                            wandb_cfg=config_lib.WandbConfig())
  assert not os.path.exists(tmp_path / "metrics.jsonl")
  monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
  with pytest.raises(writer_lib.BackendStartError, match=r'pip install "mipu_jax\[wandb\]"'):
    writer_lib.check_backends(("jsonl", "wandb"))


def _config():
  from mipu_jax import testing  # pylint: disable=g-import-not-at-top
  return testing.tiny_run_config(_STEPS, logging=dict(backends=_BACKENDS))


def _target_main(workdir: str) -> None:
  """Trains `_config()` in `workdir`, resuming; reports saves for the harness."""
  from mipu_jax import checkpoint  # pylint: disable=g-import-not-at-top
  from mipu_jax import rl  # pylint: disable=g-import-not-at-top

  save = checkpoint.Checkpointer.save

  def save_and_report(self, step, *args, **kwargs):
    out = save(self, step, *args, **kwargs)
    print("SAVE_STARTED", step, flush=True)
    return out

  checkpoint.Checkpointer.save = save_and_report
  print("LOOP_STARTED", flush=True)
  rl.train(_config(), workdir)


@pytest.mark.extended
@pytest.mark.long
def test_killed_and_resumed_run_holds_every_step_once_in_wandb(tmp_path, monkeypatch):
  # W&B points child processes at this process's W&B service (if another test
  # started one); each attempt starts its own, as a separate command would.
  monkeypatch.delenv("WANDB_SERVICE", raising=False)
  workdir = str(tmp_path / "run")
  attempts = harness.kill_and_resume(
      [sys.executable, os.path.abspath(__file__), workdir], [harness.Kill(nth_save=2)],
      ckpt_dir=os.path.join(workdir, "checkpoints"), timeout_s=300)
  assert attempts[0].killed and not attempts[-1].killed, attempts

  run_id = _run_id(workdir)
  logs = wandb_run.offline_logs(workdir, run_id)
  assert len(logs) == 2  # one W&B run, two attempts
  history = [row for path in logs for row in wandb_run.history(path)]
  assert [int(r["_step"]) for r in history] == list(range(_STEPS + 1))
  rows = writer_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == list(range(_STEPS + 1))
  for got, want in zip(history, rows):
    for name, value in want.items():
      if name != "step" and not name.startswith("perf/"):  # timings of a rerun step differ
        assert got[name] == pytest.approx(value, rel=1e-6), (name, got["_step"])
  assert all("health/unhealthy" in r for r in rows[1:])
  assert os.listdir(os.path.join(workdir, "tensorboard"))


if __name__ == "__main__":
  _target_main(sys.argv[1])
