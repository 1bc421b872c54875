"""Table reproduction: row configs, the Stable criterion, the tables, and quick mode end to end."""

import dataclasses
import os
import pathlib

import pytest


from mipu_jax import config as config_lib
from mipu_jax import harness
from mipu_jax import losses
from studies import reproduce
from studies.configs import common
from studies.configs import pod_qwen3_1p7b
from studies.configs import pod_qwen3_4b
from studies.configs import rows
from studies.configs import table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIERS = ("tier1", "tier2", "tier3", "tier4", "tier5")


def _build(module, arg, math_inputs=""):
  if module is not table:
    arg = f"{arg},{math_inputs}"
  return config_lib.from_config_dict(module.get_config(arg))


@pytest.mark.parametrize("module", [table, pod_qwen3_1p7b, pod_qwen3_4b])
@pytest.mark.parametrize("row", rows.ROWS)
def test_every_row_is_a_valid_config(module, row, math_inputs):
  arg = f"{row},p=0.3" if row == "random_rollback" else row
  if module is not table and row in ("baseline_lr_mean", "baseline_lr_floor"):
    # LR-decay's rates need its period before the row is built: only the
    # small task fixes it there (the pods' period is set after the row).
    with pytest.raises(ValueError, match="rate-matched baselines need"):
      _build(module, arg, math_inputs)
    return
  cfg = _build(module, arg, math_inputs)
  corr = {"control": "none", "baseline": "none", "tis": "token_tis", "mis": "mis_miles", "lr_decay": "none",
          "mipu": "mipu_step1", "step1": "mipu_step1", "step2": "none",
          "random_rollback": "mipu_step1", "mipu_probe32": "mipu_step1"}.get(row, "none")
  assert cfg.loss.correction == losses.CorrectionConfig.from_preset(corr)
  decays = ("lr_decay", "control_lr_decay", "lr_decay_long")
  assert cfg.optim.schedule == ("length_surge" if row in decays else "constant")
  assert cfg.mipu.step2 == (row in ("mipu", "step2", "mipu_probe32"))
  if row == "mipu_probe32":
    assert cfg.mipu.num_probe_prompts == 32
  assert cfg.mipu.random_rollback_p == (0.3 if row == "random_rollback" else 0.0)
  full = ("control", "control_lr_decay", "bf16", "bf16_true_on_policy")  # float samplers
  assert (cfg.sampling.weight_quant is None) == (row in full)
  if module is table:  # the pods' learners compute in bf16 anyway
    assert (cfg.model.dtype == "bfloat16") == (row in ("bf16", "bf16_true_on_policy"))
  assert cfg.sampling.true_on_policy == (row == "bf16_true_on_policy")
  if row in ("baseline_lr_mean", "baseline_lr_floor"):  # below LR-decay's η_0
    assert cfg.optim.learning_rate < _build(module, "lr_decay", math_inputs).optim.learning_rate
  assert tuple(rows.ROWS) == tuple(reproduce.LABELS)  # one table of labels


def test_small_task_rows_share_the_high_mismatch_base():
  base = _build(table, "baseline")
  assert (base.sampling.weight_quant, base.sampling.act_quant, base.sampling.kv_cache_dtype,
          base.sampling.quant_lm_head) == ("int4", "fp8", "fp8", True)
  for row in ("tis", "mis", "lr_decay", "step1"):
    other = _build(table, f"{row},seed=3")
    assert other.seed == 3
    same = dict(loss=base.loss, optim=base.optim, seed=0, mipu=base.mipu)
    assert dataclasses.replace(other, **same) == base
  # Step 1 is token TIS (docs/method.md §5): the two rows are one computation.
  assert _build(table, "tis") == _build(table, "step1")


def test_pod_configs_train_the_sources_experiment(math_inputs):
  for module, preset in ((pod_qwen3_1p7b, "qwen3_1p7b"), (pod_qwen3_4b, "qwen3_4b")):
    cfg = _build(module, "tis,chips=32", math_inputs)
    assert cfg.data.task == "math" and cfg.eval.benchmark_dir.endswith("benchmarks")
    assert cfg.sampling.max_new_tokens == 8192 and cfg.data.prompts_per_step == 64
    assert cfg.model.preset == preset and cfg.model.remat == "layer"
    assert cfg.optim.learning_rate == 1e-6 and cfg.optim.weight_decay == 0.01
    assert cfg.optim.clip_norm == 1.0 and cfg.loss.advantage == "rloo"
    assert (cfg.loss.eps_low, cfg.loss.eps_high) == (0.2, 0.28)
    assert cfg.data.group_size == 16 and cfg.sampling.temperature == 1.0
    assert cfg.loss.correction.is_upper == 2.0
    assert cfg.sampling.weight_quant == "fp8_e4m3" and cfg.sampling.act_quant == "fp8"
    # Packed by default: a micro-batch is one (1024 + 8192)-token row per device.
    assert cfg.learner.pack_length == 1024 + 8192 and cfg.learner.num_microbatches == 1
    # Unpacked: one response row per device per micro-batch (1024 rows / 32).
    unpacked = _build(module, "tis,chips=32,pack=False", math_inputs).learner
    assert unpacked.pack_length == 0 and unpacked.num_microbatches == 32
  lr4 = _build(pod_qwen3_4b, "lr_decay", math_inputs).optim.length_surge
  assert (lr4.mode, lr4.decay_period, lr4.min_ratio) == ("fixed", 204, 0.1)
  assert _build(pod_qwen3_1p7b, "lr_decay", math_inputs).optim.length_surge.mode == "auto"


def test_bad_row_arguments_fail_clearly():
  with pytest.raises(ValueError, match="unknown option"):
    table.get_config("baseline,beta=3")
  with pytest.raises(ValueError, match="not a int"):
    table.get_config("baseline,seed=x")
  with pytest.raises(ValueError, match="only for the random_rollback"):
    table.get_config("tis,p=0.3")
  with pytest.raises(ValueError, match="rejection rate MIPU measured"):
    table.get_config("random_rollback")
  with pytest.raises(ValueError, match="does not divide"):
    pod_qwen3_4b.get_config("tis,chips=48")
  with pytest.raises(ValueError, match="needs ckpt=DIR"):
    pod_qwen3_4b.get_config("tis")
  with pytest.raises(ValueError, match="unknown table row"):
    rows.apply(table.get_config(), "ours")


def test_parse_arg_types_defaults_and_flags():
  arg = common.parse_arg("mipu,seed=2,quick,p=0.25", row="baseline", seed=0,
                         steps=20, p=float, quick=False, name="x")
  assert (arg.row, arg.seed, arg.steps, arg.p, arg.quick, arg.name) == (
      "mipu", 2, 20, 0.25, True, "x")
  assert common.parse_arg(None, row="baseline", p=float).p is None
  assert common.parse_arg("quick=no", quick=True).quick is False
  with pytest.raises(ValueError, match="unknown option 'other'"):
    common.parse_arg("mipu,other", row="baseline")
  with pytest.raises(ValueError, match="not a bool"):
    common.parse_arg("quick=maybe", quick=False)
  with pytest.raises(AttributeError):
    arg.unknown = 1  # locked: a typo in a config file fails too


def _rows(avgs, se=0.01, rollback=None):
  out = []
  for step, a in enumerate(avgs):
    r = {"step": float(step), "eval/avg": a, "eval/avg_se": se,
         **{f"eval/{t}": a for t in TIERS}}
    if rollback is not None:
      r["mipu/rollback_rate"] = rollback
    out.append(r)
  return out


def test_stable_is_last_two_evals_within_two_standard_errors_of_the_best_so_far():
  # Peak 0.50 ± 0.01: the floor is 0.48; both of the last two evals count.
  s = harness.summarize(_rows([0.3, 0.5, 0.49, 0.48]), TIERS)
  assert s["stable"] and s["peak_avg"] == 0.5 and s["peak_step"] == 1
  assert s["k3_kl"] == 0.0  # not logged by these rows
  assert s["peak_se"] == 0.01 and s["final_se"] == 0.01
  s = harness.summarize(_rows([0.3, 0.5, 0.47, 0.49], rollback=0.25), TIERS)
  assert not s["stable"] and s["rollback_rate"] == 0.25  # a dip in the last two
  assert s["final"]["avg"] == 0.49 and s["final"]["tier3"] == 0.49
  # A noisier evaluation tolerates a larger fall; step 0 never counts.
  assert harness.summarize(_rows([0.3, 0.5, 0.44], se=0.04), TIERS)["stable"]
  assert harness.summarize(_rows([0.6, 0.2]), TIERS)["stable"] is False
  assert harness.summarize(_rows([0.2, 0.6]), TIERS)["stable"]
  # Still rising at the end: 0.40 is 20 SEs below the last evaluation, but
  # nothing came before it to fall from, so the run is Stable (the overall
  # peak's rule marked it not Stable).
  assert harness.summarize(_rows([0.2, 0.3, 0.4, 0.6]), TIERS)["stable"]
  # Fell back from an earlier peak and then rose past it: the second-to-last
  # evaluation (0.40) is below the best before it (0.5 - 0.02) -> not Stable.
  assert not harness.summarize(_rows([0.2, 0.5, 0.40, 0.6]), TIERS)["stable"]
  # Rose, then fell 3 SEs at the very end -> not Stable.
  assert not harness.summarize(_rows([0.2, 0.3, 0.5, 0.47]), TIERS)["stable"]
  nan = _rows([0.3, 0.3])
  nan[-1]["actor/grad_norm"] = float("nan")
  assert not harness.summarize(nan, TIERS)["stable"]
  with pytest.raises(ValueError, match="avg_se"):
    harness.summarize([{"step": 0.0, "eval/avg": 0.3}], TIERS)


def test_rows_must_differ_only_in_the_compared_setting():
  base = _build(table, "baseline")
  reproduce.check_like_with_like({
      "control": _build(table, "control"), "baseline": base, "mis": _build(table, "mis"), "lr_decay": _build(table, "lr_decay"),
      "mipu": _build(table, "mipu"), "random_rollback": _build(table, "random_rollback,p=0.2")})
  other = dataclasses.replace(base, learner=dataclasses.replace(base.learner,
                                                                num_minibatches=1))
  with pytest.raises(ValueError, match="learner.num_minibatches"):
    reproduce.check_like_with_like({"baseline": base, "mipu": other})
  assert config_lib.config_diff(base, other) == {"learner.num_minibatches": (2, 1)}
  # Only the control may change the sampler's precision.
  fp32 = dataclasses.replace(base, sampling=_build(table, "control").sampling)
  with pytest.raises(ValueError, match="sampling.weight_quant"):
    reproduce.check_like_with_like({"baseline": base, "tis": fp32})


def test_tables_have_the_sources_layout():
  def run(row, seed, avg, stable, rate=0.0):
    return harness.RunSummary(row=row, seed=seed, workdir="", final={
        **{t: avg for t in TIERS}, "avg": avg}, final_se=0.02, peak_avg=avg + 0.01,
        peak_step=3, peak_se=0.02, stable=stable, rollback_rate=rate, k3_kl=1e-3,
        seconds=1.0)
  runs = [run("baseline", 0, 0.40, False), run("baseline", 1, 0.50, True),
          run("mipu", 0, 0.6, True, 0.2), run("mipu", 1, 0.6, True, 0.3)]
  md = reproduce.tables_markdown(runs, {"step2": "not run"}, TIERS)
  assert ("| Method | tier1 | tier2 | tier3 | tier4 | tier5 | Avg. [95% CI] | Eval SE | "
          "Peak Avg. | Stable | Collapsed | k3_kl | Rollback rate |") in md
  # Two seeds at 40 and 50: the bootstrap means are 40, 45, 50.
  # t interval: 45 ± t_{.975,1} · 7.071 / √2 = 45 ± 12.706 · 5 = 45 ± 63.53.
  assert (f"| Baseline | {' | '.join(['45.00'] * 5)} | 45.00 [40.00, 50.00] "
          "t [-18.53, 108.53] | 2.00 | 46.00 | ✘ 1/2 | 0/2 |") in md
  assert ("| 60.00 [60.00, 60.00] t [60.00, 60.00] | 2.00 | 61.00 | ✔ 2/2 | 0/2 | "
          "1.00e-03 | 25.0% |") in md
  # MIPU > baseline on 2 seeds: +15 points, p = 1/4, undecidable.
  assert "- MIPU > baseline: mipu − baseline = +15.00 points" in md
  assert "p = 0.25" in md and "undecidable with 2 seeds" in md
  assert "| Baseline | 40.0* | 50.0 |" in md
  assert "| + Step 2 | — |" in md and "pending — not run" in md
  assert reproduce.order_rows(["random_rollback", "baseline", "mipu"]) == [
      "mipu", "random_rollback", "baseline"]
  # A table whose only run is the control's reference row is left out.
  md = reproduce.tables_markdown([run("control", 0, 0.7, True), run("bf16", 0, 0.6, True)],
                                 {}, TIERS)
  assert md.count("| No mismatch (fp32 sampler) |") == 1
  assert "### Mismatch or precision" in md and "### Main results" not in md


@pytest.mark.extended
@pytest.mark.long
def test_main_job_quick_then_the_tables_reuse_its_runs(main_job):
  """The README's main command in quick mode (a real run per row; conftest's
  `main_job`), then the sources' tables on the same workdir: finished runs are
  read back (their configs checked), twins reused, random rollback handed
  MIPU's measured rate (at a rate of 0, Step 1's run)."""
  workdir, proc = main_job
  assert proc.returncode == 0, proc.stderr[-3000:]
  md = (workdir / "table.md").read_text()
  assert "### Side by side under a high-mismatch sampler" in md
  for label in ("No mismatch (fp32 sampler)", "Baseline", "TIS", "Ours (MIPU)"):
    assert f"| {label} |" in md
  assert "Main results" not in md
  assert os.path.getsize(workdir / "curves_compare.png") > 10_000
  assert "4 runs:" in proc.stderr and "4/4" in proc.stderr  # the job's progress bar

  def make_config(row, seed, p):
    # Not the main job's logging settings: a finished run is read back when
    # what it computed matches (docs/reliability.md), however it logged.
    config = table.get_config(f"{row},seed={seed},quick" + (f",p={p}" if p else ""))
    config.logging.plots = True
    return config

  logs = []
  result = reproduce.run_table(make_config, ("tis", "step1", "mipu", "random_rollback"),
                               [0], str(workdir), log=logs.append)
  assert sum("read back" in line for line in logs) == 2  # tis and mipu
  by_row = {r.row: r for r in result.runs}
  assert by_row["step1"].note == "same run as tis"
  assert set(by_row["tis"].final) == set(TIERS) | {"avg"}
  rate = by_row["mipu"].rollback_rate
  if rate > 0:
    assert by_row["random_rollback"].note.startswith(f"p = {rate:.3f}")
  else:  # MIPU rejected nothing: random rollback is Step 1, here the same run as TIS.
    assert rate == 0 and by_row["random_rollback"].note == "same run as tis"
  assert {"curves_main", "curves_ablation", "curves_rollback",
          "gap_post"} <= set(result.files)

  # A finished run is read back only if the row still asks for its config.
  def changed(row, seed, p):
    config = make_config(row, seed, p)
    config.optim.learning_rate = 3e-4
    return config

  with pytest.raises(ValueError, match="optim.learning_rate"):
    reproduce.run_table(changed, ("tis",), [0], str(workdir), log=lambda _: None,
                        train=False)
  again = reproduce.run_table(make_config, ("tis", "mis"), [0], str(workdir),
                              log=lambda _: None, train=False)
  assert again.runs[0].seconds == by_row["tis"].seconds
  assert "no finished run (report only)" in again.pending["mis"]
  # A report of a seed whose MIPU run is unfinished leaves random rollback
  # (which needs MIPU's rate) unfinished too, instead of failing.
  partial = reproduce.run_table(make_config, ("tis", "mipu", "random_rollback"), [1],
                                str(workdir), log=lambda _: None, train=False)
  assert not partial.runs
  assert "no finished run (report only)" in partial.pending["random_rollback"]


@pytest.mark.parametrize("rate", [0.25, 0.0])
def test_random_rollback_gets_mipus_measured_rate(tmp_path, monkeypatch, rate):
  """Random rollback is configured with MIPU's rejection rate of the same seed
  (a rate of 0 makes it Step 1); the runs are stand-ins, not trained."""
  trained = {}

  def run_one(cfg, row, seed, workdir, log, train):
    del log, train
    trained[row] = cfg
    os.makedirs(workdir)
    pathlib.Path(workdir, "metrics.jsonl").touch()
    return harness.RunSummary(
        row=row, seed=seed, workdir=workdir,
        final={t: 0.5 for t in (*cfg.eval.tiers, "avg")}, final_se=0.02,
        peak_avg=0.5, peak_step=1, peak_se=0.02, stable=True,
        rollback_rate=rate if row == "mipu" else 0.0, k3_kl=1e-3, seconds=1.0)

  monkeypatch.setattr(reproduce.table_runs, "run_one", run_one)
  result = reproduce.run_table(
      lambda row, seed, p: table.get_config(
          f"{row},seed={seed},quick" + (f",p={p}" if p else "")),
      ("tis", "step1", "mipu", "random_rollback"), [0], str(tmp_path), log=lambda _: None)
  note = {r.row: r.note for r in result.runs}["random_rollback"]
  if rate:
    assert trained["random_rollback"].mipu.random_rollback_p == rate
    assert note == "p = 0.250 (MIPU's rejection rate)"
  else:  # Step 1's config, which is TIS's here: no run of its own.
    assert "random_rollback" not in trained and note == "same run as tis"


def test_read_back_ignores_settings_added_later_at_their_default(tmp_path):
  """A finished run saved before a setting existed is read back when the row
  asks for that setting's default, and refused when it asks for another value."""
  import json  # pylint: disable=g-import-not-at-top
  cfg = _build(table, "baseline")
  saved = config_lib.as_json(cfg)
  del saved["sampling"]["quant_compute"]  # as written before the field existed
  (tmp_path / "config.json").write_text(json.dumps(saved))
  (tmp_path / "summary.json").write_text(json.dumps({"seconds": 3.0}))
  rows_ = [{"step": s, "eval/avg": 0.3, "eval/avg_se": 0.02,
            **{f"eval/{t}": 0.3 for t in TIERS}} for s in (0, 20)]
  (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows_)))
  got = harness.run_one(cfg, "baseline", 0, str(tmp_path), log=lambda _: None,
                          train=False)
  assert got.seconds == 3.0 and got.final["avg"] == 0.3
  native = dataclasses.replace(cfg, sampling=dataclasses.replace(
      cfg.sampling, quant_compute="native"))
  with pytest.raises(ValueError, match="quant_compute"):
    harness.run_one(native, "baseline", 0, str(tmp_path), log=lambda _: None,
                      train=False)


def test_lr_decay_figure_needs_both_rows(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  runs = []
  for row, lrs in (("baseline", [1e-3] * 6), ("lr_decay", [1e-3] * 3 + [5e-4] * 3)):
    d = tmp_path / row
    d.mkdir()
    d.joinpath("metrics.jsonl").write_text("\n".join(json.dumps(
        {"step": s + 1, "actor/lr": lr, "rollout/response_length_mean": 20.0 + s})
        for s, lr in enumerate(lrs)))
    runs.append(harness.RunSummary(row=row, seed=0, workdir=str(d), final={"avg": 0.3},
                                     final_se=0.02, peak_avg=0.3, peak_step=0, peak_se=0.02,
                                     stable=True, rollback_rate=0.0, k3_kl=0.0, seconds=1.0))
  assert reproduce.plot_lr_decay(runs[:1], str(tmp_path / "a.png")) is None
  assert os.path.getsize(reproduce.plot_lr_decay(runs, str(tmp_path / "b.png"))) > 10_000


def test_every_message_of_a_run_names_its_row_and_seed(tmp_path, monkeypatch, caplog):
  """A run's health warnings, backend failures and Python warnings say which
  run they come from (the main job's workers share one terminal); messages
  after the run do not carry its label."""
  import logging  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top
  from mipu_jax.rl import health  # pylint: disable=g-import-not-at-top

  cfg = _build(table, "baseline")

  def fake_train(cfg, workdir):
    del cfg
    os.makedirs(workdir)
    health.warn(health.Report({}, {"k3_kl": "surge"},
                              "step 45: mismatch health: k3_kl 0.0213 is 2.03x its median"))
    logging.getLogger("mipu_jax.rl.writer").warning("Step %d: logging backend %r failed", 7, "wandb")
    warnings.warn("a library's warning")
    rows = [{"step": float(s), "eval/avg": 0.5, "eval/avg_se": 0.01,
             **{f"eval/{t}": 0.5 for t in cfg_tiers}} for s in (0, 1)]
    return types.SimpleNamespace(rows=rows, stopped_at=None)

  cfg_tiers = cfg.eval.tiers
  monkeypatch.setattr(harness.runs.rl, "train", fake_train)
  caplog.set_level(logging.WARNING)
  s = harness.run_one(cfg, "mipu", 3, str(tmp_path / "run"), log=lambda _: None)
  assert s.stable and s.seed == 3
  messages = [r.getMessage() for r in caplog.records]
  assert "[mipu seed 3] step 45: mismatch health: k3_kl 0.0213 is 2.03x its median" in messages
  assert "[mipu seed 3] Step 7: logging backend 'wandb' failed" in messages
  assert any(m.startswith("[mipu seed 3] ") and "a library's warning" in m for m in messages)
  assert len(messages) == 3
  # Outside the run nothing is labelled, and warnings go back to stderr.
  caplog.clear()
  logging.getLogger("mipu_jax.rl.health").warning("after the run")
  assert [r.getMessage() for r in caplog.records] == ["after the run"]
  with harness.run_label("base%line", 0):  # a '%' in a name does not break formatting
    logging.getLogger("x").warning("step %d", 5)
  assert caplog.records[-1].getMessage() == "[base%line seed 0] step 5"


def test_a_main_job_workers_error_names_its_run(tmp_path):
  """A worker's error reaches the main process with its row and seed."""
  from mipu_jax.harness import workers  # pylint: disable=g-import-not-at-top
  from studies.configs import table  # pylint: disable=g-import-not-at-top
  blocker = tmp_path / "a_file"
  blocker.write_text("")  # the run's directory cannot be made under a file
  cfg = config_lib.from_config_dict(table.get_config("baseline,seed=4,quick"))
  job = harness.Job("baseline", 4, cfg, str(blocker / "runs" / "baseline_s4"))
  with pytest.raises(RuntimeError, match=r"^\[baseline seed 4\] "):
    workers._train(job, "")


def test_placement_puts_a_users_run_among_the_committed_seeds():
  def run(row, seed, avg):
    return harness.RunSummary(row=row, seed=seed, workdir="", final={"avg": avg},
                                final_se=0.01, peak_avg=avg, peak_step=1, peak_se=0.01,
                                stable=True, rollback_rate=0.0, k3_kl=0.0, seconds=1.0)
  committed = [run("baseline", s, v) for s, v in enumerate([0.3, 0.5, 0.4, 0.6, 0.2])]
  md = reproduce.placement_markdown([run("baseline", 0, 0.45), run("tis", 0, 0.5)], committed)
  # 45 beats 30, 40, 20: 3 of 5; median of 20..60 is 40; the committed seed 0 had 30.
  assert "| Baseline | 0 | 45.0 | 20.0 / 40.0 / 60.0 (5) | 3 of 5 | 30.0 |" in md
  assert "TIS" not in md  # no committed run of that row
  assert reproduce.placement_markdown([run("tis", 0, 0.5)], committed) == ""


def test_the_main_job_places_its_runs_only_against_the_same_setting():
  """The committed runs are read back only when their config is the job's
  (seed aside): the committed seed 0 places at its own value; a quick job has
  nothing to be compared with."""
  root = os.path.join(ROOT, "results", "small_cpu")
  runs = [harness.run_one(_build(table, "control,seed=0,lr=7e-4"), "control", 0,
                            os.path.join(root, "runs", "control_s0"),
                            log=lambda _: None, train=False)]
  full = lambda row, seed, p: table.get_config(f"{row},seed={seed},lr=7e-4")
  text = reproduce.committed_placement(runs, full, root)
  assert "| No mismatch (fp32 sampler) | 0 | 55.6 | 51.6 / 58.1 / 63.6 (10) |" in text
  quick = lambda row, seed, p: table.get_config(f"{row},seed={seed},quick,lr=7e-4")
  assert reproduce.committed_placement(runs, quick, root).startswith(
      "Not placed among the committed runs, another setting")


def test_a_run_stopped_by_a_preemption_notice_is_not_finished(tmp_path, monkeypatch):
  """A SIGTERM stops rl.train after a checkpointed step (stopped_at): run_one
  must not write the summary that marks the run finished, and a worker stops."""
  import types  # pylint: disable=g-import-not-at-top
  from mipu_jax.harness import workers  # pylint: disable=g-import-not-at-top
  cfg = _build(table, "baseline")
  rows = [{"step": float(s), "eval/avg": 0.5, "eval/avg_se": 0.01,
           **{f"eval/{t}": 0.5 for t in cfg.eval.tiers}} for s in (0, 1)]
  monkeypatch.setattr(harness.runs.rl, "train",
                      lambda cfg, workdir: types.SimpleNamespace(rows=rows, stopped_at=1))
  workdir = tmp_path / "run"
  workdir.mkdir()
  assert harness.run_one(cfg, "baseline", 0, str(workdir), log=lambda _: None) is None
  assert not (workdir / "summary.json").exists()
  with pytest.raises(RuntimeError, match=r"\[baseline seed 0\] stopped on a preemption"):
    workers._train(harness.Job("baseline", 0, cfg, str(workdir)), "")
  # The tables' job (run_table, one process) starts no further run after it:
  # before, the next row of the seed started training and was stopped in turn.
  started, logs = [], []

  def train(cfg, workdir):
    started.append(workdir)
    return types.SimpleNamespace(rows=rows, stopped_at=1)

  monkeypatch.setattr(harness.runs.rl, "train", train)
  result = reproduce.run_table(lambda row, seed, p: table.get_config(f"{row},seed={seed}"),
                               ("baseline", "tis", "mis"), [0, 1], str(tmp_path / "t"),
                               log=logs.append)
  assert len(started) == 1 and started[0].endswith("baseline_s0")
  assert not result.runs and any("preemption notice" in line for line in logs)


def _fake_finished_run(directory, cfg, avg):
  """A finished run on disk as run_one writes it: config, summary, metrics."""
  import json  # pylint: disable=g-import-not-at-top
  directory.mkdir(parents=True)
  (directory / "config.json").write_text(json.dumps(config_lib.as_json(cfg)))
  (directory / "summary.json").write_text(json.dumps({"seconds": 1.0}))
  rows_ = [{"step": s, "eval/avg": v, "eval/avg_se": 0.02, **{f"eval/{t}": v for t in TIERS}}
           for s, v in ((0, 0.2), (20, avg))]
  (directory / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows_)))


def test_perturbation_report_pairs_the_same_runs_and_checks_like_with_like(tmp_path):
  """The perturbed runs (ulp=1) against the originals, read
  back by seed; hand-computed: originals 40, 50, 60 and perturbed 44, 50, 62
  give differences +4, 0, +2 (mean +2.0, two-sided sign-flip p: of the 8 sign
  patterns, those with |mean| >= 2 are (+,*,+) and (-,*,-): 4 of 8 = 0.5)."""
  make = lambda row, seed, p: table.get_config(f"{row},seed={seed},quick,ulp=1")
  for seed, (a, b) in enumerate([(0.40, 0.44), (0.50, 0.50), (0.60, 0.62)]):
    pert = _build(table, f"control,seed={seed},quick,ulp=1")
    orig = _build(table, f"control,seed={seed},quick")
    _fake_finished_run(tmp_path / "p" / "runs" / f"control_s{seed}", pert, b)
    _fake_finished_run(tmp_path / "o" / "runs" / f"control_s{seed}", orig, a)
  md = reproduce.perturbation_report(make, ["control"], [0, 1, 2], str(tmp_path / "p"),
                                     str(tmp_path / "o"))
  assert "| No mismatch (fp32 sampler) | 3 | 50.0 " in md
  assert "| 52.0 " in md and "| +2.0 " in md and "| 0.5 | 3 / 3 |" in md
  # Runs without the perturbation are refused as the perturbed side.
  with pytest.raises(ValueError, match="no perturbation"):
    reproduce.perturbation_report(
        lambda row, seed, p: table.get_config(f"{row},seed={seed},quick"), ["control"],
        [0], str(tmp_path / "o"), str(tmp_path / "o"))
  # So is a setting that is not the perturbed runs' (another lr): run_one's check.
  with pytest.raises(ValueError, match="another config"):
    reproduce.perturbation_report(
        lambda row, seed, p: table.get_config(f"{row},seed={seed},quick,ulp=1,lr=3e-4"),
        ["control"], [0], str(tmp_path / "p"), str(tmp_path / "o"))


def test_the_main_job_has_committed_tables_to_be_placed_among():
  """experiments/compare.py places a user's runs among studies/configs/table.py
  COMMITTED's tables for the lr it trained: each listed table is in the
  repository, and the job's default lr has one (else it prints 'Not placed')."""
  def seeds(lr):  # what compare.py reads back: each row's committed seeds
    runs = pathlib.Path(ROOT) / table.COMMITTED[lr] / "runs"
    return sorted(int(p.name.rsplit("_s", 1)[1]) for p in runs.glob("control_s*")
                  if (p / "summary.json").is_file())

  for lr, path in table.COMMITTED.items():
    assert (pathlib.Path(ROOT) / path / "summary.json").is_file(), (lr, path)
    assert seeds(lr)[:3] == [0, 1, 2], (lr, seeds(lr))
  default_lr = _build(table, "control,seed=0").optim.learning_rate
  assert default_lr in table.COMMITTED, default_lr
  assert seeds(default_lr) == list(range(10))
