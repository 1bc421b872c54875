"""MIPU Step 2's signal: how its accept / roll back decision relates to what
happens next (docs/method.md §5).

Per decision at step `t` of a run that logs `mipu/accepted` (MIPU, + Step 2,
random rollback), from its metrics:

- `next_reward_change`: training reward of step `t+1` minus that of step `t`.
  Step `t+1` samples from the candidate μ_{t+1} when it was accepted and
  from μ_t when it was rolled back, so this is what the decision did to the
  next batch.
- `probe_minus_reward` (rows that probe: Step 2 on): the candidate's reward on
  the probe prompts minus the training reward of step `t` (sampled from μ_t):
  a noisy estimate of how much the candidate changed μ's reward, known before
  the decision, that `T̂_post` does not use (its advantages are centred per
  probe group).

For each quantity: its mean after accepted and after rejected decisions,
pooled over seeds, and the difference (rejected − accepted) with a 95%
bootstrap interval over decisions (`stats.bootstrap_ci`). Random rollback
decides by a coin, so its difference estimates the null: Step 2 carries a
signal when its difference is outside random rollback's noise.
"""

import dataclasses
import math
import os
from typing import Mapping, Sequence

import numpy as np

from mipu_jax import rl
from mipu_jax.harness import stats
from mipu_jax.harness.summary import RunSummary
from studies.reproduce.spec import LABELS

QUANTITIES = ("next_reward_change", "probe_minus_reward")


def decisions(rows: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
  """One dict per Step 2 / random-rollback decision with a next step:
  `accepted` (0 / 1) and the `QUANTITIES` (NaN where not logged)."""
  by_step = {int(r["step"]): r for r in rows if "rollout/reward_mean" in r}
  out = []
  for t, r in sorted(by_step.items()):
    if "mipu/accepted" not in r or t + 1 not in by_step:
      continue
    reward = r["rollout/reward_mean"]
    out.append(dict(
        accepted=float(r["mipu/accepted"]),
        next_reward_change=by_step[t + 1]["rollout/reward_mean"] - reward,
        probe_minus_reward=r.get("mipu/probe_reward", math.nan) - reward))
  return out


@dataclasses.dataclass(frozen=True)
class SignalResult:
  """A row's decisions, pooled over seeds: per quantity, mean after accepted,
  after rejected, and the difference rejected − accepted with its interval."""
  row: str
  n_accepted: int
  n_rejected: int
  means: Mapping[str, tuple[float, float, float, tuple[float, float]]]


def row_signal(row: str, per_run: Sequence[Sequence[Mapping[str, float]]]) -> SignalResult:
  """`SignalResult` of one row from its runs' `decisions`."""
  ds = [d for run in per_run for d in run]
  acc = [d for d in ds if d["accepted"] >= 0.5]
  rej = [d for d in ds if d["accepted"] < 0.5]
  means = {}
  for q in QUANTITIES:
    a = np.array([d[q] for d in acc if not math.isnan(d[q])])
    r = np.array([d[q] for d in rej if not math.isnan(d[q])])
    if not a.size or not r.size:
      continue
    rng = np.random.default_rng(stats.BOOT_SEED)
    boots = (r[rng.integers(0, r.size, (stats.N_BOOT, r.size))].mean(1)
             - a[rng.integers(0, a.size, (stats.N_BOOT, a.size))].mean(1))
    tail = 100 * (1 - stats.CI_LEVEL) / 2
    lo, hi = np.percentile(boots, [tail, 100 - tail])
    means[q] = (float(a.mean()), float(r.mean()), float(r.mean() - a.mean()),
                (float(lo), float(hi)))
  return SignalResult(row=row, n_accepted=len(acc), n_rejected=len(rej), means=means)


def signal_markdown(runs: Sequence[RunSummary]) -> str:
  """The table of every row with decisions (empty when none)."""
  per_row: dict[str, list] = {}
  for r in runs:
    if r.note.startswith("same run"):
      continue
    ds = decisions(rl.read_jsonl(os.path.join(r.workdir, "metrics.jsonl")))
    if ds:
      per_row.setdefault(r.row, []).append(ds)
  if not per_row:
    return ""
  lines = ["| Row | decisions (rejected) | quantity | after accepted | after rejected | "
           "rejected − accepted [95% CI] |", "|---" * 6 + "|"]
  for row, per_run in per_row.items():
    s = row_signal(row, per_run)
    for q, (a, r, d, (lo, hi)) in s.means.items():
      lines.append(f"| {LABELS.get(row, row)} | {s.n_accepted + s.n_rejected} "
                   f"({s.n_rejected}) | {q} | {a:+.4f} | {r:+.4f} | "
                   f"{d:+.4f} [{lo:+.4f}, {hi:+.4f}] |")
  return "\n".join(lines)
