"""Statistics over seeds: intervals of a mean and paired tests of claims.

Per setting (over seeds): the mean final eval Avg. and two 95% intervals of
it, the percentile bootstrap (`bootstrap_ci`) and Student's t (`t_ci`). At
n = 10 the bootstrap undercovers (its half-width is about 1.86 sd/√n against
t's 2.262 sd/√n), so the t interval is the one to read at ten seeds.

Per claim (`Claim`: `a` greater than, less than or different from `b`): runs
are paired by seed and the paired differences go through an exact sign-flip
permutation test (`sign_flip_p`): exact, no normality assumed, deterministic;
its smallest one-sided p is `2^-n`, so 3 seeds can never reach 0.05. Several
claims tested together are adjusted with Holm's step-down correction (`holm`;
Holm 1979), which keeps the family-wise error at `ALPHA` under any dependence.
A directional claim is **supported** when its adjusted p < `ALPHA`,
**contradicted** when the adjusted opposite p is, **not shown** otherwise.
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


@dataclasses.dataclass(frozen=True)
class Claim:
  """A claim about two settings (e.g. table rows): `a` `direction` `b`.

  `direction` is "greater" (a > b), "less" (a < b) or "two-sided" (a ≠ b).
  With `minus = (c, d)` the claim is about a difference of differences:
  `(a − b) − (c − d)` compared with 0, paired by seed (e.g. LR-decay's gain
  with mismatch against its gain without).
  """
  a: str
  b: str
  direction: str
  text: str
  minus: Optional[tuple[str, str]] = None

  @property
  def rows(self) -> tuple[str, ...]:
    return (self.a, self.b) + (self.minus or ())


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


def bootstrap_ratio_ci(num: Mapping[str, Sequence[float]], den: Mapping[str, Sequence[float]],
                       stat, *, level: float = CI_LEVEL, n_boot: int = N_BOOT,
                       seed: int = BOOT_SEED) -> tuple[float, float, float]:
  """`stat` of ratios of sums, with its percentile-bootstrap interval over units.

  `num[key]` and `den[key]` hold one sum per unit (e.g. a prompt's K3 summed over
  its response tokens, and the token count), the same units under every key, so
  one resample of units serves every key: the statistic `stat({key: Σnum / Σden})`
  keeps its pairing (two models on the same prompts). Returns
  `(value, lo, hi)`; deterministic for a given `seed`.
  """
  keys = list(num)
  n = len(num[keys[0]])
  if n == 0 or any(len(num[k]) != n or len(den[k]) != n for k in keys):
    raise ValueError("bootstrap_ratio_ci needs the same nonzero number of units per key.")
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, n, size=(n_boot, n))
  w = np.zeros((n_boot, n))
  np.add.at(w, (np.arange(n_boot)[:, None], idx), 1.0)  # how often each unit is drawn
  ratio = lambda weights: {k: (weights @ np.asarray(num[k], np.float64)) /
                           (weights @ np.asarray(den[k], np.float64)) for k in keys}
  value = float(stat(ratio(np.ones(n))))
  draws = np.asarray(stat(ratio(w)), np.float64)
  tail = 100 * (1 - level) / 2
  lo, hi = np.percentile(draws, [tail, 100 - tail])
  return value, float(lo), float(hi)


def t_ci(values: Sequence[float], *, level: float = CI_LEVEL) -> tuple[float, float]:
  """Student's t interval of the mean: mean ± t_{(1+level)/2, n-1} · sd / √n.

  Fewer than two values have no spread to estimate: (nan, nan).
  """
  from scipy import stats as scipy_stats  # pylint: disable=g-import-not-at-top
  x = np.asarray(values, np.float64)
  if x.size < 2:
    return math.nan, math.nan
  half = (scipy_stats.t.ppf((1 + level) / 2, x.size - 1)
          * x.std(ddof=1) / math.sqrt(x.size))
  return float(x.mean() - half), float(x.mean() + half)


def holm(p: Sequence[float]) -> list[float]:
  """Holm's step-down adjusted p-values, in the order given.

  With the m finite p's sorted ascending, p_(1) ≤ ... ≤ p_(m), the adjusted
  p_(i) is max_{j ≤ i} min(1, (m - j + 1) p_(j)); a claim is rejected at
  level α when its adjusted p < α. NaN entries (claims not tested) stay NaN
  and do not count in m.
  """
  p = np.asarray(p, np.float64)
  out = np.full(p.shape, math.nan)
  idx = np.flatnonzero(np.isfinite(p))
  order = idx[np.argsort(p[idx], kind="stable")]
  m, running = order.size, 0.0
  for j, i in enumerate(order):
    running = max(running, min(1.0, (m - j) * p[i]))
    out[i] = running
  return [float(v) for v in out]


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
  t_ci: tuple[float, float]
  frac_stable: float
  frac_collapsed: float


def row_stats(row: str, finals: Sequence[float], stable: Sequence[bool],
              collapsed: Sequence[bool]) -> RowStats:
  """Mean, bootstrap and t intervals and Stable / collapsed fractions of one row."""
  x = 100 * np.asarray(finals, np.float64)
  return RowStats(row=row, n=int(x.size), mean=float(x.mean()),
                  ci=bootstrap_ci(x), t_ci=t_ci(x), frac_stable=float(np.mean(stable)),
                  frac_collapsed=float(np.mean(collapsed)))


@dataclasses.dataclass(frozen=True)
class ClaimResult:
  """A claim's paired test; differences in points of pass@1.

  `p` and `p_opposite` are raw; `p_holm` and `p_opposite_holm` are adjusted
  across the claims tested together (`claim_results`); the verdict reads the
  adjusted ones. A claim tested alone is its own family (adjusted = raw).
  """
  claim: Claim
  seeds: tuple[int, ...]
  mean_diff: float
  diff_ci: tuple[float, float]
  diff_t_ci: tuple[float, float]
  d_z: float
  p: float
  p_opposite: Optional[float]
  p_holm: float
  p_opposite_holm: Optional[float]
  verdict: str

  def line(self) -> str:
    """The verdict in words, with effect size and p-value."""
    c = self.claim
    if not self.seeds:
      return f"- {c.text}: {self.verdict}."
    side = "two-sided" if c.direction == "two-sided" else "one-sided"
    if len(self.seeds) > 1:
      spread = (f"(95% CI bootstrap [{self.diff_ci[0]:+.2f}, {self.diff_ci[1]:+.2f}], "
                f"t [{self.diff_t_ci[0]:+.2f}, {self.diff_t_ci[1]:+.2f}]), "
                f"d_z = {self.d_z:+.2f}")
    else:  # One pair has no spread: no interval, no effect size.
      spread = "(one seed: no interval or d_z)"
    what = f"{c.a} − {c.b}" + (f" − ({c.minus[0]} − {c.minus[1]})" if c.minus else "")
    return (f"- {c.text}: {what} = {self.mean_diff:+.2f} points "
            f"{spread}, p = {self.p:.3g}, Holm-adjusted {self.p_holm:.3g} "
            f"({side} exact sign-flip, n = {len(self.seeds)} paired seeds) — "
            f"**{self.verdict}**.")


def verdict(direction: str, p: float, p_opposite: Optional[float], n: int,
            alpha: float = ALPHA) -> str:
  """The words of a claim's verdict (module docstring); `p` and `p_opposite`
  are the Holm-adjusted ones when the claim is one of several."""
  floor = 2.0 ** -n if direction != "two-sided" else 2.0 ** (1 - n)
  if floor >= alpha:
    return (f"undecidable with {n} seeds (the smallest possible p is "
            f"{floor:.3g} ≥ {alpha:g})")
  if p < alpha:
    return "supported" if direction != "two-sided" else "supported (they differ)"
  if p_opposite is not None and p_opposite < alpha:
    return "contradicted (significant in the opposite direction)"
  return f"not shown (Holm-adjusted p ≥ {alpha:g})"


def paired_test(claim: Claim, a: Mapping[int, float],
                b: Mapping[int, float], c: Optional[Mapping[int, float]] = None,
                d: Optional[Mapping[int, float]] = None) -> ClaimResult:
  """The claim's test on final eval Avg. (fractions in [0, 1]) keyed by seed.

  Only seeds present in every row are paired; `c`, `d`: the rows of
  `claim.minus`, whose difference is subtracted. The claim is its own family
  (Holm-adjusted p = raw p); `claim_results` adjusts across claims.
  """
  if (claim.minus is None) != (c is None or d is None):
    raise ValueError(f"claim {claim.text!r}: give c and d exactly when it has `minus`.")
  if claim.minus is not None:
    seeds = tuple(sorted(set(a) & set(b) & set(c) & set(d)))
    a = {s: a[s] - b[s] - (c[s] - d[s]) for s in seeds}
    b = {s: 0.0 for s in seeds}
  seeds = tuple(sorted(set(a) & set(b)))
  nan2 = (math.nan, math.nan)
  if not seeds:
    return ClaimResult(claim, (), math.nan, nan2, nan2, math.nan, math.nan,
                       None, math.nan, None, "no paired seeds yet")
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
                     diff_ci=bootstrap_ci(d), diff_t_ci=t_ci(d), d_z=d_z, p=p,
                     p_opposite=p_opp, p_holm=p, p_opposite_holm=p_opp,
                     verdict=verdict(claim.direction, p, p_opp, len(seeds)))


def claim_results(finals: Mapping[str, Mapping[int, float]],
                  claims: Sequence[Claim]) -> list[ClaimResult]:
  """Every claim whose two rows both ran (`finals`: row -> seed -> final Avg.),
  with Holm's correction across them and verdicts on the adjusted p."""
  raw = [paired_test(c, *(finals[r] for r in c.rows)) for c in claims
         if all(r in finals for r in c.rows)]
  adj = holm([r.p for r in raw])
  opp = holm([math.nan if r.p_opposite is None else r.p_opposite for r in raw])
  out = []
  for r, p, q in zip(raw, adj, opp):
    if not r.seeds:
      out.append(r)
      continue
    q = None if r.p_opposite is None else q
    out.append(dataclasses.replace(
        r, p_holm=p, p_opposite_holm=q,
        verdict=verdict(r.claim.direction, p, q, len(r.seeds))))
  return out
