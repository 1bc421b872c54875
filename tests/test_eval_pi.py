"""Evaluation under both policies: μ's `eval/*` and, with `eval.pi`, the
learner's π at full precision as `eval_pi/*`."""

import dataclasses

import pytest

from mipu_jax import config as config_lib
from mipu_jax import rl
from mipu_jax.rl import build
from mipu_jax.rl import evaluation
from mipu_jax.testing import tiny_run_config

_QUANTIZED = dict(weight_quant="int4", act_quant="fp8", kv_cache_dtype="fp8",
                  quant_lm_head=True)


def _train(tmp_path, name, **sections):
  cfg = tiny_run_config(num_steps=1, checkpoint=dict(enabled=False), **sections)
  return cfg, rl.train(cfg, str(tmp_path / name))


@pytest.mark.extended
@pytest.mark.long
def test_pi_is_the_learners_policy_at_full_precision_and_changes_no_training_number(
    tmp_path):
  cfg, with_pi = _train(tmp_path, "pi", sampling=_QUANTIZED, eval=dict(pi=True))
  _, without = _train(tmp_path, "mu", sampling=_QUANTIZED)
  assert [r["step"] for r in with_pi.rows] == [0, 1]
  for a, b in zip(with_pi.rows, without.rows):
    # Every number the run without π logs is the same bit for bit (timings aside).
    assert {k: v for k, v in b.items() if not k.startswith("perf/")} == {
        k: v for k, v in a.items() if k in b and not k.startswith("perf/")}
    assert not any(k.startswith("eval_pi/") for k in b)
    assert {"eval_pi/tier1", "eval_pi/avg", "eval_pi/avg_se",
            "eval_pi/response_length", "perf/eval_pi_seconds"} <= set(a)
    assert a["perf/eval_pi_seconds"] > 0 and a["perf/eval_seconds"] > 0
  # π's evaluation is an fp32, unquantized sampler's (the control's μ) on the
  # learner's final parameters: the same problems and the same seeds.
  full = build.full_precision(cfg)
  assert full.sampling.weight_quant is None and full.sampling.dtype == "float32"
  run = build.build_run(dataclasses.replace(full, eval=dataclasses.replace(cfg.eval, pi=False)))
  assert run.pi_sampler is None
  run.sampler.update_weights(with_pi.state.params)
  e = cfg.eval
  want = evaluation.evaluate(run.sampler, run.task, run.task.eval_sets(e.seed),
                             num_samples=e.num_samples, temperature=e.temperature,
                             max_new_tokens=cfg.sampling.max_new_tokens, seed=e.seed)
  last = with_pi.rows[-1]
  assert {k: last["eval_pi/" + k[len("eval/"):]] for k in want} == want


def test_an_fp32_sampler_is_evaluated_once_for_both(tmp_path):
  cfg = tiny_run_config(num_steps=1, checkpoint=dict(enabled=False), eval=dict(pi=True))
  run = build.build_run(cfg)
  assert run.pi_sampler is run.sampler  # μ is already π at full precision
  result = rl.train(cfg, str(tmp_path / "fp32"))
  for row in (result.rows[0], result.rows[-1]):
    assert row["eval_pi/avg"] == row["eval/avg"] and row["eval_pi/tier1"] == row["eval/tier1"]


def test_a_run_saved_before_eval_pi_reads_back_with_it_on():
  cfg = tiny_run_config()
  saved = config_lib.as_json(cfg)
  del saved["eval"]["pi"]  # a run committed before the setting existed
  wanted = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, pi=True))
  assert config_lib.resume_differences(saved, wanted) == {}
  # Evaluating does not change what a step computes; the sampler's precision does.
  other = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling,
                                                                weight_quant="int4"))
  assert "sampling.weight_quant" in config_lib.resume_differences(saved, other)


def test_tables_show_pi_beside_mu_only_when_runs_evaluated_it():
  from mipu_jax import harness  # pylint: disable=g-import-not-at-top
  from studies import reproduce  # pylint: disable=g-import-not-at-top
  tiers = ("tier1",)

  def run(row, seed, avg, pi=None):
    return harness.RunSummary(
        row=row, seed=seed, workdir="", final={"tier1": avg, "avg": avg}, final_se=0.02,
        peak_avg=avg, peak_step=1, peak_se=0.02, stable=True, rollback_rate=0.0,
        k3_kl=1e-3, seconds=1.0, final_pi=pi, peak_pi=None if pi is None else pi + 0.1)

  old = [run("baseline", 0, 0.4), run("control", 0, 0.5)]
  assert "π" not in reproduce.tables_markdown(old, {}, tiers)
  # Two seeds of π at 50 and 60: mean 55, bootstrap means 50 / 55 / 60.
  new = [run("baseline", 0, 0.4, 0.5), run("baseline", 1, 0.4, 0.6), run("control", 0, 0.5)]
  md = reproduce.tables_markdown(new, {"tis": "not run"}, tiers)
  assert "| Rollback rate | π Avg. [95% CI] | π Peak Avg. |" in md
  assert "| 0.0% | 55.00 [50.00, 60.00] | 65.00 |" in md
  assert "| 0.0% | — | — |" in md  # the control's run did not evaluate π
  assert "| TIS | — | — | — | — | pending | — | — | — | — | — |" in md

