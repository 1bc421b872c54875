"""Table reproduction: row configs, the Stable criterion, the tables, and quick mode end to end."""

import dataclasses
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import pod_qwen3_1p7b  # noqa: E402
from configs import pod_qwen3_4b  # noqa: E402
from configs import rows  # noqa: E402
from configs import table  # noqa: E402
from mipu_jax import config as config_lib  # noqa: E402
from mipu_jax import losses  # noqa: E402
from mipu_jax import reproduce  # noqa: E402

HAS_MIPU = "mipu" in config_lib.default_config()
TIERS = ("tier1", "tier2", "tier3", "tier4", "tier5")


def _build(module, arg):
  return config_lib.from_config_dict(module.get_config(arg))


@pytest.mark.parametrize("module", [table, pod_qwen3_1p7b, pod_qwen3_4b])
@pytest.mark.parametrize("row", rows.ROWS)
def test_every_row_is_a_valid_config_or_waits_for_mipu(module, row):
  if row in rows.NEEDS_MIPU and not HAS_MIPU:
    with pytest.raises(ValueError, match="config.mipu"):
      module.get_config(row)
    return
  cfg = _build(module, row)
  corr = {"baseline": "none", "tis": "token_tis", "mis": "mis_miles", "lr_decay": "none",
          "mipu": "mipu_step1", "step1": "mipu_step1", "step2": "none",
          "random_rollback": "mipu_step1"}[row]
  assert cfg.loss.correction == losses.CorrectionConfig.from_preset(corr)
  assert cfg.optim.schedule == ("length_surge" if row == "lr_decay" else "constant")
  if HAS_MIPU:
    assert cfg.mipu.step2 == (row in ("mipu", "step2"))
    assert (cfg.mipu.random_rollback_p > 0) == (row == "random_rollback")


def test_small_task_rows_share_the_high_mismatch_base():
  base = _build(table, "baseline")
  assert (base.sampling.weight_quant, base.sampling.act_quant) == ("fp8_e4m3", "fp8")
  for row in ("tis", "mis", "lr_decay", "step1"):
    other = _build(table, f"{row},seed=3")
    assert other.seed == 3
    same = dict(loss=base.loss, optim=base.optim, seed=0)
    if HAS_MIPU:
      same["mipu"] = base.mipu  # its seed follows the run's
    assert dataclasses.replace(other, **same) == base
  # Step 1 is token TIS (SPEC.md §5): the two rows are one computation.
  assert _build(table, "tis") == _build(table, "step1")


def test_pod_configs_carry_the_sources_hyperparameters():
  for module, preset in ((pod_qwen3_1p7b, "qwen3_1p7b"), (pod_qwen3_4b, "qwen3_4b")):
    cfg = _build(module, "tis,chips=32")
    assert cfg.model.preset == preset and cfg.model.remat
    assert cfg.optim.learning_rate == 1e-6 and cfg.optim.weight_decay == 0.01
    assert cfg.optim.clip_norm == 1.0 and cfg.loss.advantage == "rloo"
    assert (cfg.loss.eps_low, cfg.loss.eps_high) == (0.2, 0.28)
    assert cfg.data.group_size == 16 and cfg.sampling.temperature == 1.0
    assert cfg.loss.correction.is_upper == 2.0
    assert cfg.sampling.weight_quant == "fp8_e4m3" and cfg.sampling.act_quant == "fp8"
    assert cfg.data.batch_size // cfg.learner.num_microbatches == 32
  lr4 = _build(pod_qwen3_4b, "lr_decay").optim.length_surge
  assert (lr4.mode, lr4.decay_period, lr4.min_ratio) == ("fixed", 204, 0.1)
  assert _build(pod_qwen3_1p7b, "lr_decay").optim.length_surge.mode == "auto"


def test_bad_row_arguments_fail_clearly():
  with pytest.raises(ValueError, match="unknown option"):
    table.get_config("baseline,lr=3")
  with pytest.raises(ValueError, match="only for the random_rollback"):
    table.get_config("tis,p=0.3")
  with pytest.raises(ValueError, match="does not divide"):
    pod_qwen3_4b.get_config("tis,chips=48")
  with pytest.raises(ValueError, match="unknown table row"):
    rows.apply(table.get_config(), "ours")
  assert rows.parse_arg("seed=2,quick", "mipu") == ("mipu", {"seed": "2", "quick": ""})


def _rows(avgs, rollback=None):
  out = []
  for step, a in enumerate(avgs):
    r = {"step": float(step), "eval/avg": a, **{f"eval/{t}": a for t in TIERS}}
    if rollback is not None:
      r["mipu/rollback_rate"] = rollback
    out.append(r)
  return out


def test_stable_is_final_within_margin_of_peak():
  s = reproduce.summarize(_rows([0.3, 0.5, 0.46]), TIERS, margin=0.05)
  assert s["stable"] and s["peak_avg"] == 0.5 and s["peak_step"] == 1
  s = reproduce.summarize(_rows([0.3, 0.5, 0.44], rollback=0.25), TIERS, margin=0.05)
  assert not s["stable"] and s["rollback_rate"] == 0.25
  assert s["final"]["avg"] == 0.44 and s["final"]["tier3"] == 0.44
  nan = _rows([0.3, 0.3])
  nan[-1]["actor/grad_norm"] = float("nan")
  assert not reproduce.summarize(nan, TIERS)["stable"]


def test_tables_have_the_sources_layout():
  def run(row, seed, avg, stable, rate=0.0):
    return reproduce.RunSummary(row=row, seed=seed, workdir="", final={
        **{t: avg for t in TIERS}, "avg": avg}, peak_avg=avg + 0.01, peak_step=3,
        stable=stable, rollback_rate=rate, seconds=1.0)
  runs = [run("baseline", 0, 0.40, False), run("baseline", 1, 0.50, True),
          run("mipu", 0, 0.6, True, 0.2), run("mipu", 1, 0.6, True, 0.3)]
  md = reproduce.tables_markdown(runs, {"step2": "needs config.mipu"}, TIERS)
  assert "| Method | tier1 | tier2 | tier3 | tier4 | tier5 | Avg. | Peak Avg. | Stable |" in md
  sd = np.std([40, 50], ddof=1)
  assert f"| Baseline | {' | '.join(['45.00'] * 5)} | 45.00 ± {sd:.2f} |" in md
  assert "| ✘ (1/2) |" in md and "| 60.00 ± 0.00 | 61.00 | ✔ | 25.0% |" in md
  assert "| + Step 2 | — |" in md and "pending — needs config.mipu" in md
  assert reproduce._order(["random_rollback", "baseline", "mipu"]) == [
      "mipu", "random_rollback", "baseline"]


def test_quick_mode_end_to_end(tmp_path):
  """`reproduce_tables.py --quick`'s path: a real run, a reused twin, pending rows."""
  want = ("tis", "step1", "mipu")

  def make_config(row, seed, p):
    return table.get_config(f"{row},seed={seed},quick" + (f",p={p}" if p else ""))

  result = reproduce.run_table(make_config, want, [0], str(tmp_path), log=lambda _: None)
  by_row = {r.row: r for r in result.runs}
  assert by_row["step1"].note == "same run as tis"
  assert by_row["step1"].final == by_row["tis"].final
  assert set(by_row["tis"].final) == set(TIERS) | {"avg"}
  assert ("mipu" in by_row) == HAS_MIPU and ("mipu" in result.pending) != HAS_MIPU
  md = open(result.files["table"]).read()
  assert "| TIS |" in md and "| + Step 1 |" in md and "Ours (MIPU)" in md
  assert os.path.getsize(result.files["curves_main"]) > 10_000
  assert os.path.exists(tmp_path / "runs" / "tis_s0" / "summary.json")
  # A second call reads the finished run back instead of training again.
  again = reproduce.run_table(make_config, ("tis", "baseline"), [0], str(tmp_path),
                              log=lambda _: None, train=False)
  assert again.runs[0].seconds == by_row["tis"].seconds
  assert "did not finish" in again.pending["baseline"]
