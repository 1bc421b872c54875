"""The tables' statistics, fixed before the ten-seed runs: per-row intervals and
one paired test per claim of the sources.

Per row (over seeds): the mean final eval Avg., a 95% percentile-bootstrap
interval of that mean (`bootstrap_ci`), and the fractions of seeds that are
Stable and that collapsed (`spec.summarize`, `spec.collapse_step`).

Per claim (`CLAIMS`): the runs of the two rows are paired by seed (the same
seed is the same initial policy, training prompts and evaluation problems), and
the paired differences `d_s = A_s - B_s` of final eval Avg. go through an exact
sign-flip permutation test (`paired_test`): under the null hypothesis that the
row label does not matter, each `d_s` is as likely to be `+|d_s|` as `-|d_s|`,
so the p-value is the fraction of the `2^n` sign patterns whose mean is at
least as extreme as the observed one. It is exact, needs no normality, and is
deterministic. Its smallest possible p-value is `2^-n` one-sided (`2^(1-n)`
two-sided): 3 seeds can never reach 0.05, 10 seeds can (1/1024).

Effect size: the mean paired difference in points of pass@1, its 95%
bootstrap interval, and Cohen's `d_z = mean(d) / sd(d)`.

Verdict, at `ALPHA` = 0.05: a directional claim `A > B` is **supported** when
its one-sided p < 0.05, **contradicted** when the opposite one-sided p < 0.05,
and **not shown** otherwise; a two-sided claim `A ≠ B` is supported when the
two-sided p < 0.05. With too few seeds to ever reach 0.05 the verdict says so.
"""

import dataclasses
import itertools
import math
from typing import Mapping, Optional, Sequence

import numpy as np

ALPHA = 0.05
CI_LEVEL = 0.95
N_BOOT = 10_000
BOOT_SEED = 0
TABLE_SEEDS = tuple(range(10))  # seeds per row of the tables


@dataclasses.dataclass(frozen=True)
class Claim:
  """A claim of the sources about two rows: `a` `direction` `b`.

  `direction` is "greater" (a > b), "less" (a < b) or "two-sided" (a ≠ b).
  """
  a: str
  b: str
  direction: str
  text: str


# The sources' claims, each tested on final eval Avg. paired by seed. "+ Step 1"
# is token TIS (configs/rows.py), so its line repeats TIS vs baseline.
CLAIMS = (
    Claim("mipu", "baseline", "greater", "MIPU > baseline"),
    Claim("mipu", "tis", "greater", "MIPU > TIS"),
    Claim("mipu", "mis", "greater", "MIPU > MIS"),
    Claim("mis", "baseline", "less", "MIS < baseline"),
    Claim("lr_decay", "baseline", "greater", "LR-decay > baseline"),
    Claim("mipu", "random_rollback", "two-sided",
          "Step 2 ≠ random rollback at the same rate (MIPU vs random rollback)"),
    Claim("step1", "baseline", "greater", "+ Step 1 > baseline"),
    Claim("step2", "baseline", "greater", "+ Step 2 > baseline"),
)


def bootstrap_ci(values: Sequence[float], *, level: float = CI_LEVEL,
                 n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> tuple[float, float]:
  """Percentile-bootstrap interval of the mean of `values` (resampling seeds).

  Deterministic for a given `seed`. One value gives the degenerate interval
  (v, v).
  """
  x = np.asarray(values, np.float64)
  if x.size == 0:
    raise ValueError("bootstrap_ci needs at least one value.")
  rng = np.random.default_rng(seed)
  means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
  tail = 100 * (1 - level) / 2
  lo, hi = np.percentile(means, [tail, 100 - tail])
  return float(lo), float(hi)


def sign_flip_p(d: Sequence[float], direction: str) -> float:
  """Exact paired sign-flip permutation p-value of mean(d) (see module doc).

  Args:
    d: paired differences a_s - b_s.
    direction: "greater" (H1: mean > 0), "less" (H1: mean < 0) or
      "two-sided".
  """
  d = np.asarray(d, np.float64)
  if d.size == 0:
    raise ValueError("sign_flip_p needs at least one pair.")
  if d.size > 20:
    raise ValueError(f"exact enumeration of 2^{d.size} sign patterns is too big.")
  signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
  means = signs @ d / d.size
  obs = d.mean()
  tol = 1e-12 * max(1.0, float(np.abs(d).max()))
  if direction == "greater":
    hits = means >= obs - tol
  elif direction == "less":
    hits = means <= obs + tol
  elif direction == "two-sided":
    hits = np.abs(means) >= abs(obs) - tol
  else:
    raise ValueError(f"direction must be greater, less or two-sided, got {direction!r}.")
  return float(hits.mean())


@dataclasses.dataclass(frozen=True)
class RowStats:
  """One row over its seeds: final eval Avg. (points of pass@1)."""
  row: str
  n: int
  mean: float
  ci: tuple[float, float]
  frac_stable: float
  frac_collapsed: float


def row_stats(row: str, finals: Sequence[float], stable: Sequence[bool],
              collapsed: Sequence[bool]) -> RowStats:
  """Mean, bootstrap interval and Stable / collapsed fractions of one row."""
  x = 100 * np.asarray(finals, np.float64)
  return RowStats(row=row, n=int(x.size), mean=float(x.mean()),
                  ci=bootstrap_ci(x), frac_stable=float(np.mean(stable)),
                  frac_collapsed=float(np.mean(collapsed)))


@dataclasses.dataclass(frozen=True)
class ClaimResult:
  """A claim's paired test; differences in points of pass@1."""
  claim: Claim
  seeds: tuple[int, ...]
  mean_diff: float
  diff_ci: tuple[float, float]
  d_z: float
  p: float
  p_opposite: Optional[float]
  verdict: str

  def line(self) -> str:
    """The verdict in words, with effect size and p-value."""
    c = self.claim
    if not self.seeds:
      return f"- {c.text}: {self.verdict}."
    side = "two-sided" if c.direction == "two-sided" else "one-sided"
    if len(self.seeds) > 1:
      spread = (f"(95% CI [{self.diff_ci[0]:+.2f}, {self.diff_ci[1]:+.2f}]), "
                f"d_z = {self.d_z:+.2f}")
    else:  # One pair has no spread: no interval, no effect size.
      spread = "(one seed: no interval or d_z)"
    return (f"- {c.text}: {c.a} − {c.b} = {self.mean_diff:+.2f} points "
            f"{spread}, p = {self.p:.3g} ({side} exact sign-flip, "
            f"n = {len(self.seeds)} paired seeds) — **{self.verdict}**.")


def verdict(direction: str, p: float, p_opposite: Optional[float], n: int,
            alpha: float = ALPHA) -> str:
  """The words of a claim's verdict (module docstring)."""
  floor = 2.0 ** -n if direction != "two-sided" else 2.0 ** (1 - n)
  if floor >= alpha:
    return (f"undecidable with {n} seeds (the smallest possible p is "
            f"{floor:.3g} ≥ {alpha:g})")
  if p < alpha:
    return "supported" if direction != "two-sided" else "supported (they differ)"
  if p_opposite is not None and p_opposite < alpha:
    return "contradicted (significant in the opposite direction)"
  return f"not shown (p ≥ {alpha:g})"


def paired_test(claim: Claim, a: Mapping[int, float],
                b: Mapping[int, float]) -> ClaimResult:
  """The claim's test on final eval Avg. (fractions in [0, 1]) keyed by seed.

  Only seeds present in both rows are paired.
  """
  seeds = tuple(sorted(set(a) & set(b)))
  if not seeds:
    return ClaimResult(claim, (), math.nan, (math.nan, math.nan), math.nan,
                       math.nan, None, "no paired seeds yet")
  d = 100 * np.array([a[s] - b[s] for s in seeds], np.float64)
  p = sign_flip_p(d, claim.direction)
  opposite = {"greater": "less", "less": "greater"}.get(claim.direction)
  p_opp = sign_flip_p(d, opposite) if opposite else None
  sd = float(d.std(ddof=1)) if d.size > 1 else math.nan
  if d.size > 1 and sd == 0.0:
    d_z = 0.0 if d.mean() == 0.0 else math.copysign(math.inf, d.mean())
  else:
    d_z = float(d.mean()) / sd
  return ClaimResult(claim=claim, seeds=seeds, mean_diff=float(d.mean()),
                     diff_ci=bootstrap_ci(d), d_z=d_z, p=p, p_opposite=p_opp,
                     verdict=verdict(claim.direction, p, p_opp, len(seeds)))


def claim_results(finals: Mapping[str, Mapping[int, float]],
                claims: Sequence[Claim] = CLAIMS) -> list[ClaimResult]:
  """Every claim whose two rows both ran (`finals`: row -> seed -> final Avg.)."""
  return [paired_test(c, finals[c.a], finals[c.b]) for c in claims
          if c.a in finals and c.b in finals]
