"""The fault matrix of docs/reliability.md, one test per row, each fault injected
for real: flipped bytes and a truncated file in saved checkpoints, a changed
config, NaN advantages reaching the gradient, `OSError(ENOSPC)` raised by a log
write and by orbax's background checkpoint write, and a metrics line cut short.

Every run is the same tiny `rl.train` config (1 tier, 4 prompts x 4 responses,
16 new tokens), so the XLA programs compile once per session; the tests that
start from a finished 2-step run fault copies of one (`two_step_run`).
"""

import dataclasses
import errno
import json
import os
import shutil

import chex
import jax
import numpy as np
import pytest

from mipu_jax import checkpoint
from mipu_jax import config as config_lib
from mipu_jax import rl
from mipu_jax import testing
from mipu_jax.rl import batching
from mipu_jax.rl import resume


def _config(steps, **learner):
  return testing.tiny_run_config(steps, learner=learner, checkpoint=dict(every=1, keep=5))


def _host(state):
  return jax.device_get((state.params, state.opt_state))


def _restore(workdir, step=None):
  """The learner state saved at `step` (newest readable if None), and its metadata."""
  run = rl.build_run(_config(1))
  with checkpoint.Checkpointer(os.path.join(workdir, "checkpoints")) as ckpt:
    state, meta = ckpt.restore(step, target=run.learner.abstract_state())
  return state, meta


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
  """A finished 2-step run's workdir, trained once for the module."""
  workdir = str(tmp_path_factory.mktemp("two_step_run") / "run")
  rl.train(_config(2), workdir)
  return workdir


def _copy(run_dir, tmp_path):
  """A copy of `run_dir` to fault, as `tmp_path / "run"`."""
  return shutil.copytree(run_dir, str(tmp_path / "run"))


def _steps(workdir):
  return [int(r["step"]) for r in rl.read_jsonl(os.path.join(workdir, "metrics.jsonl"))]


def _corrupt_data_files(step_dir):
  """Flips 8 bytes in the middle of every array-data file of a saved step."""
  for root, _, names in os.walk(os.path.join(step_dir, "state")):
    if os.path.basename(root) != "d":
      continue
    for name in names:
      path = os.path.join(root, name)
      data = bytearray(open(path, "rb").read())
      middle = len(data) // 2
      for i in range(middle, min(len(data), middle + 8)):
        data[i] ^= 0xFF
      with open(path, "wb") as f:
        f.write(data)


@pytest.mark.extended
def test_corrupt_and_partial_checkpoints_are_moved_aside_and_the_run_goes_on(tmp_path):
  workdir = str(tmp_path / "run")
  reference = rl.train(_config(3), workdir)
  ckpts = os.path.join(workdir, "checkpoints")
  assert sorted(os.listdir(ckpts)) == ["1", "2", "3"]
  _corrupt_data_files(os.path.join(ckpts, "3"))  # flipped bytes
  # A partial step: its array metadata cut to nothing.
  with open(os.path.join(ckpts, "2", "state", "_METADATA"), "r+b") as f:
    f.truncate(0)

  resumed = rl.train(_config(3), workdir)  # resumes from step 1, saves 2 and 3 again

  aside = sorted(os.listdir(ckpts + ".unreadable"))
  assert [name.split("-")[0] for name in aside] == ["2", "3"]
  assert sorted(os.listdir(ckpts)) == ["1", "2", "3"]
  chex.assert_trees_all_equal(_host(resumed.state), _host(reference.state))
  assert _steps(workdir) == [0, 1, 2, 3]
  state, meta = _restore(workdir)  # the re-saved step 3 reads back
  assert meta["step"] == 3
  chex.assert_trees_all_equal(_host(state), _host(reference.state))


def test_resume_with_another_config_is_an_error_unless_intended(tmp_path, two_step_run):
  workdir = _copy(two_step_run, tmp_path)
  first = open(os.path.join(workdir, "config.json")).read()
  # Changes to what a step computes that leave its XLA programs as they are
  # (the resumed step compiles nothing new).
  changed = dataclasses.replace(
      _config(3), seed=1,
      data=dataclasses.replace(_config(3).data, reward_wrong=-1.0))
  with pytest.raises(resume.ConfigChangedError) as e:
    rl.train(changed, workdir)
  assert "seed: 0 (saved) -> 1 (now)" in str(e.value)
  assert "data.reward_wrong: 0.0 (saved) -> -1.0 (now)" in str(e.value)
  assert open(os.path.join(workdir, "config.json")).read() == first
  assert _steps(workdir) == [0, 1, 2]  # nothing written

  rl.train(changed, workdir, allow_config_change=True)
  assert open(os.path.join(workdir, "config.json")).read() == first
  with open(os.path.join(workdir, "config.from_step_3.json")) as f:
    assert json.load(f)["seed"] == 1
  with open(os.path.join(workdir, resume.CHANGES_FILE)) as f:
    changes = json.load(f)
  assert changes == [{"step": 3, "file": "config.from_step_3.json", "differences": {
      "data.reward_wrong": {"before": 0.0, "after": -1.0},
      "seed": {"before": 0, "after": 1}}}]
  assert _steps(workdir) == [0, 1, 2, 3]


def test_resume_differences_ignore_what_does_not_change_the_run():
  base = _config(10)
  longer = dataclasses.replace(base, num_steps=20, eval=dataclasses.replace(base.eval, every=5),
                               logging=config_lib.LoggingConfig(plots=True))
  assert config_lib.resume_differences(base, longer) == {}
  # ... unless the cosine schedule takes its horizon from num_steps.
  cosine = dataclasses.replace(base, optim=config_lib.OptimConfig(schedule="cosine"))
  assert config_lib.resume_differences(cosine, dataclasses.replace(cosine, num_steps=20)) == {
      "num_steps": (10, 20)}
  assert config_lib.resume_differences(base, dataclasses.replace(base, seed=1)) == {
      "seed": (0, 1)}


def test_a_torn_metrics_line_is_repaired_on_resume(tmp_path, two_step_run):
  workdir = _copy(two_step_run, tmp_path)
  path = os.path.join(workdir, "metrics.jsonl")
  with open(path, "a") as f:
    f.write('{"step": 3, "rollout/reward_me')  # a kill mid-write
  with pytest.raises(ValueError, match="line 4"):
    rl.read_jsonl(path)
  result = rl.train(_config(3), workdir)  # num_steps may change on resume
  assert _steps(workdir) == [0, 1, 2, 3]
  assert [int(r["step"]) for r in result.rows] == [0, 1, 2, 3]
  assert open(path + ".before_resume").read().endswith("reward_me")


def test_a_fresh_start_moves_an_earlier_attempts_log_aside(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 0, "eval/avg": 0.5}\n{"step": 1, "x"')
  assert resume.metrics_rows(str(path), 0) == []
  assert not path.exists() and (tmp_path / "metrics.jsonl.before_restart").exists()
  path.write_text('{"step": 0, "a": 1}\n{"step": 1, "a": 2}\n{"step": 2, "a": 3}\n{"st')
  assert resume.metrics_rows(str(path), 1) == [{"step": 0, "a": 1}, {"step": 1, "a": 2}]


def test_compressed_metrics_read_back_and_resume(tmp_path):
  """Committed runs keep metrics.jsonl.gz: read as the plain file, the same
  bytes for the same rows, and decompressed when the run resumes."""
  text = '{"step": 0, "a": 1}\n{"step": 1, "a": NaN}\n{"step": 2, "a": 3}\n'
  blobs = []
  for name in ("x", "y"):
    path = tmp_path / name / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text(text)
    want = rl.read_jsonl(str(path))
    assert rl.compress_jsonl(str(path)) == str(path) + ".gz" and not path.exists()
    assert rl.jsonl_exists(str(path))
    got = rl.read_jsonl(str(path))
    assert [r["step"] for r in got] == [0, 1, 2] and np.isnan(got[1]["a"])
    assert [r["a"] for r in got if r["step"] != 1] == [r["a"] for r in want if r["step"] != 1]
    blobs.append((tmp_path / name / "metrics.jsonl.gz").read_bytes())
  assert blobs[0] == blobs[1]  # deterministic: no time or name in the header
  path = tmp_path / "x" / "metrics.jsonl"
  assert [r["step"] for r in resume.metrics_rows(str(path), 1)] == [0, 1]
  assert not os.path.exists(str(path) + ".gz")  # decompressed, then set aside
  assert os.path.exists(str(path) + ".before_resume")
  assert not rl.jsonl_exists(str(tmp_path / "z" / "metrics.jsonl"))


def test_nonfinite_updates_are_skipped_and_the_run_stops_after_a_streak(tmp_path, monkeypatch):
  workdir = str(tmp_path / "run")
  make_batch = batching.make_batch
  calls = []

  def nan_after_first_step(*args, **kwargs):
    batch = make_batch(*args, **kwargs)
    calls.append(1)
    if len(calls) > 1:  # steps 2, 3, ...: a NaN advantage reaches the gradient
      batch = batch._replace(advantages_B=batch.advantages_B * np.nan)
    return batch

  monkeypatch.setattr(batching, "make_batch", nan_after_first_step)
  with pytest.raises(FloatingPointError, match="2 consecutive RL steps") as e:
    rl.train(_config(5, max_nonfinite_steps=2), workdir)
  assert "step 2 in" in str(e.value)  # the newest checkpoint, named

  rows = rl.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["actor/nonfinite_skipped"] for r in rows[1:]] == [0.0, 1.0, 1.0]
  one, meta_one = _restore(workdir, 1)
  two, meta_two = _restore(workdir)
  assert meta_two["step"] == 2 and meta_two["nonfinite_streak"] == 1
  # Step 2's update was skipped: parameters and Adam moments as after step 1,
  # bitwise; the schedule still counted the step.
  chex.assert_trees_all_equal(two.params, one.params)
  mu_one = jax.tree.leaves(one.opt_state)
  mu_two = jax.tree.leaves(two.opt_state)
  assert all(np.array_equal(a, b) for a, b in zip(mu_one, mu_two) if np.ndim(a) > 0)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(two.params))


def test_a_full_disk_during_a_log_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
  workdir = str(tmp_path / "run")
  saved = {}
  save = checkpoint.Checkpointer.save

  def recording_save(self, step, state, metadata, **kw):
    saved[step] = _host(state)
    return save(self, step, state, metadata, **kw)

  monkeypatch.setattr(checkpoint.Checkpointer, "save", recording_save)
  write = rl.MetricWriter.write

  def full_at_step_3(self, step, metrics):
    if step == 3:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
    return write(self, step, metrics)

  monkeypatch.setattr(rl.MetricWriter, "write", full_at_step_3)
  with pytest.raises(OSError, match="no space left on the device") as e:
    rl.train(_config(4), workdir)
  assert e.value.errno == errno.ENOSPC
  assert "newest intact checkpoint is step 2" in str(e.value)
  state, meta = _restore(workdir)
  assert meta["step"] == 2
  chex.assert_trees_all_equal(_host(state), saved[2])


def test_a_full_disk_during_a_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch,
                                                                     two_step_run):
  from orbax.checkpoint._src.path import async_path  # pylint: disable=g-import-not-at-top
  workdir = _copy(two_step_run, tmp_path)
  before, _ = _restore(workdir)
  write_text = async_path.write_text

  async def full_disk(path, text):
    if "commit_success" in str(path):  # orbax's background commit of a step
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return await write_text(path, text)

  monkeypatch.setattr(async_path, "write_text", full_disk)
  with pytest.raises(checkpoint.CheckpointWriteError, match="no space left") as e:
    rl.train(_config(3), workdir)
  assert e.value.intact_step == 2 and "newest intact checkpoint is step 2" in str(e.value)
  monkeypatch.setattr(async_path, "write_text", write_text)
  state, meta = _restore(workdir)
  assert meta["step"] == 2
  chex.assert_trees_all_equal(_host(state), _host(before))
  result = rl.train(_config(3), workdir)  # space freed: the same command resumes
  assert int(result.state.step) == 3 and _steps(workdir) == [0, 1, 2, 3]


def test_a_packaged_base_policy_compares_alike_in_every_clone():
  """A committed run records init_from as an absolute path; another clone's
  path to the same packaged policy is not a difference, another policy is."""
  saved = {"model": {"init_from": "/work/main/mipu_jax/tasks/assets/base_policy"}}
  here = {"model": {"init_from": "/tmp/clone/mipu_jax/tasks/assets/base_policy"}}
  other = {"model": {"init_from": "/data/ckpt/base_policy"}}
  assert config_lib.config_diff(saved, here) == {}
  assert set(config_lib.config_diff(saved, other)) == {"model.init_from"}


def test_records_name_packaged_policies_and_checkout_paths_relative_to_the_repository():
  """`config.json` names the packaged base policy from the package on and a path
  inside the checkout relative to it (results read the same in every clone);
  a user's checkpoint elsewhere as it is. A run saved with an absolute path
  resumes under the relative one and back."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  assert config_lib.record_path("/elsewhere/mipu_jax/tasks/assets/base_policy_moe") == (
      "mipu_jax/tasks/assets/base_policy_moe")
  assert config_lib.record_path(os.path.join(root, "results", "x", "runs", "a")) == (
      os.path.join("results", "x", "runs", "a"))
  assert config_lib.record_path("/data/ckpt/base_policy") == "/data/ckpt/base_policy"
  assert config_lib.record_path(root + "_other/results") == root + "_other/results"
  cfg = _config(1)
  cfg = dataclasses.replace(cfg, model=dataclasses.replace(
      cfg.model, init_from=os.path.join(root, "mipu_jax", "tasks", "assets", "base_policy")))
  saved = config_lib.as_json(cfg)
  assert saved["model"]["init_from"] == "mipu_jax/tasks/assets/base_policy"
  assert config_lib.config_diff(saved, cfg) == {}
  old = dict(saved, model=dict(saved["model"], init_from="/work/x/mipu_jax/tasks/assets/base_policy"))
  assert config_lib.config_diff(old, saved) == {}
