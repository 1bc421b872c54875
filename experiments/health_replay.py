r"""Which health signal tells, before it happens, the committed runs that collapsed
from those that did not? A replay over every committed run's log.

    python -m experiments.health_replay --root results

A run collapsed when an evaluation fell more than 15 points below its best so
far (`harness.collapse_step`). Per run, each signal is read over the steps
before the collapse (a collapsed run) or over the whole run (the others):

- the `k3_kl` surge rule and the gradient-norm spike rule of docs/method.md
  §8 (`rl.health`, `HealthConfig` defaults and a grid of ratios, floors and
  first steps): a hit is a collapsed run it fired in before the collapse, a
  false alarm a run that did not collapse and where it fired;
- per-run signals, by the area under the ROC curve for telling the collapsed
  runs from the quantized ones that did not collapse, each pair compared over
  the same steps (those before the collapse; 0.5: chance; below 0.5: lower in
  the collapsed runs).

The fp32 control runs (`k3_kl` 0 throughout) count as runs that did not
collapse for the surge rule, and are left out of the AUCs.
"""

import glob
import itertools
import os

import numpy as np
from absl import app
from absl import flags

from mipu_jax import config as config_lib
from mipu_jax import rl
from mipu_jax.harness import collapse_step
from mipu_jax.rl import health

_ROOT = flags.DEFINE_string("root", "results", "Directory of committed runs.")


def _runs(root):
  out = []
  for path in sorted(glob.glob(os.path.join(root, "*", "runs", "*", "metrics.jsonl*"))):
    d = os.path.dirname(path)
    # Finished runs only; the float-sum perturbation repeats runs.
    if "ulp1" in d or (out and out[-1][0] == d) or not os.path.exists(
        os.path.join(d, "summary.json")):
      continue
    rows = rl.read_jsonl(os.path.join(d, "metrics.jsonl"))
    steps = [r for r in rows if r.get("step", 0) > 0 and "rollout_corr/k3_kl" in r]
    if len(steps) >= 15:
      out.append((d, rows, collapse_step(rows)))
  return out


def _fired_steps(rows, check, **kw):
  cfg = config_lib.HealthConfig(**kw)
  monitor = health.HealthMonitor(cfg)
  return [int(r["step"]) for r in rows if r.get("step", 0) > 0
          and monitor.check(int(r["step"]), r).metrics.get("health/" + check)]


def _score(runs, start=1, check=health.SURGE, **kw):
  hits = alarms = 0
  for _, rows, cs in runs:
    warned = [s for s in _fired_steps(rows, check, **kw) if s >= start]
    if cs is not None:
      hits += any(s < cs for s in warned)
    else:
      alarms += bool(warned)
  return hits, alarms


def _signals(rows, end):
  """Each signal over steps 1 .. end - 1."""
  w = [r for r in rows if 0 < r.get("step", 0) < end]
  get = lambda k: np.array([r.get(k, np.nan) for r in w], float)
  k3, ent, gn = get("rollout_corr/k3_kl"), get("actor/entropy"), get("actor/grad_norm")
  length = get("rollout/response_length_mean")
  with np.errstate(invalid="ignore", divide="ignore"):
    k3_ratio = np.nanmax(k3[10:]) / np.median(k3[:10])
  return {"k3_kl max": np.nanmax(k3),
          "k3_kl max / its median over steps 1-10": k3_ratio,
          "chi2_token max": np.nanmax(get("rollout_corr/chi2_token")),
          "|kl| max": np.nanmax(np.abs(get("rollout_corr/kl"))),
          "grad norm max / its median over steps 1-10": np.nanmax(gn) / np.nanmedian(gn[:10]),
          "entropy min / its median over steps 1-5": np.nanmin(ent) / np.nanmedian(ent[:5]),
          "response length max / its median over steps 1-5":
              np.nanmax(length) / np.nanmedian(length[:5])}


def main(argv):
  del argv
  runs = _runs(_ROOT.value)
  collapsed = [r for r in runs if r[2] is not None]
  print(f"{len(runs)} committed runs with 15+ steps, {len(collapsed)} collapsed\n")
  h, a = _score(runs)
  print(f"surge rule at its defaults: fires in {h}/{len(collapsed)} collapsed runs before the "
        f"collapse, and in {a}/{len(runs) - len(collapsed)} runs that did not collapse")
  h, a = _score(runs, check=health.SPIKE)
  print(f"gradient-norm spike at its defaults: fires in {h}/{len(collapsed)} collapsed runs "
        f"before the collapse, and in {a}/{len(runs) - len(collapsed)} runs that did not")
  for ratio in (3.0, 5.0, 20.0):
    h, a = _score(runs, check=health.SPIKE, grad_spike_ratio=ratio)
    print(f"  at ratio {ratio:g}: {h} hits, {a} false alarms")
  # Held out: the ratio chosen without the 600-step runs, then read on them.
  short = [r for r in runs if os.sep + "horizon" + os.sep not in r[0]]
  long_ = [r for r in runs if r not in short]
  if long_ and any(r[2] is not None for r in short):
    def j(rs, ratio):
      c = sum(r[2] is not None for r in rs)
      h, a = _score(rs, check=health.SPIKE, grad_spike_ratio=ratio)
      return h / max(c, 1) - a / max(len(rs) - c, 1), h, a, c
    best = max((3.0, 5.0, 8.0, 10.0, 15.0, 20.0, 30.0), key=lambda x: j(short, x)[0])
    _, h, a, c = j(long_, best)
    print(f"  chosen without the 600-step runs: ratio {best:g}; on those {len(long_)} runs "
          f"{h}/{c} collapses warned before, {a}/{len(long_) - c} others fired in")
  grid = []
  for ratio, floor, start in itertools.product((2.0, 3.0, 4.0, 6.0), (1e-3, 1e-2, 2e-2),
                                               (1, 11, 21)):
    h, a = _score(runs, start, k3_surge_ratio=ratio, k3_surge_floor=floor)
    grid.append((h / len(collapsed) - a / (len(runs) - len(collapsed)), h, a, ratio, floor, start))
  print("\nsurge rule, best of the grid (hit rate - false-alarm rate):")
  for j, h, a, ratio, floor, start in sorted(grid, reverse=True)[:5]:
    print(f"  ratio {ratio:g}, floor {floor:g}, from step {start}: {h} hits, {a} false alarms "
          f"(J = {j:.2f})")
  quantized = [r for r in runs if r[2] is None and max(
      x.get("rollout_corr/k3_kl", 0) for x in r[1]) > 0]
  # Matched windows: each collapsed run's steps before its collapse against the
  # same steps of every run that did not collapse (a longer window alone lowers
  # a minimum and raises a maximum).
  print(f"\nAUC, {len(collapsed)} collapsed against {len(quantized)} quantized runs that did "
        "not, each pair over the steps before the collapse:")
  wins = {}
  for _, rows, cs in collapsed:  # every run's signals once per collapsed run's window
    own = _signals(rows, cs)
    others = [_signals(q[1], cs) for q in quantized]
    for name, a in own.items():
      b = np.array([o[name] for o in others])
      b = b[np.isfinite(b)]
      if np.isfinite(a) and b.size:
        wins.setdefault(name, []).append(np.mean((a > b) + 0.5 * (a == b)))
  for name, w in wins.items():
    print(f"  {name}: {np.mean(w):.2f}")

if __name__ == "__main__":
  app.run(main)
