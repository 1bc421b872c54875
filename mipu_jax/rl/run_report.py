"""End-of-run summary: a small results table and PNG plots (matplotlib, Agg).

The plotted series are those of the sources' figures: reward, held-out
accuracy, `k3_kl` (the mismatch), response length, gradient norm and learning
rate over steps.
"""

import os
from typing import Mapping, Sequence

PANELS = (
    ("rollout/reward_mean", "reward"),
    ("eval/avg", "eval pass@1 (avg over sets)"),
    ("rollout_corr/k3_kl", "k3_kl (sampler vs learner)"),
    ("rollout/response_length_mean", "response length"),
    ("actor/grad_norm", "grad norm"),
    ("actor/lr", "learning rate"),
)


def _pyplot():
  """matplotlib's pyplot on the Agg backend, imported at the first plot: a run
  with `logging.plots=False` (and every process importing `mipu_jax.rl`) skips
  its import."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def _series(rows: Sequence[Mapping[str, float]], name: str):
  pts = [(r["step"], r[name]) for r in rows if name in r]
  return [p[0] for p in pts], [p[1] for p in pts]


def results_table(rows: Sequence[Mapping[str, float]],
                  names: Sequence[str]) -> str:
  """Markdown table in the MIPU table's layout: pass@1 per evaluation set
  (tiers or benchmarks) and Avg. ± its standard error, at the first, the last
  and the best evaluation; then the last step's training metrics."""
  evals = [r for r in rows if "eval/avg" in r]
  lines = ["| eval | step | " + " | ".join(names) + " | Avg. |",
           "|---" * (len(names) + 3) + "|"]
  picks = [("start", evals[0]), ("end", evals[-1])] if evals else []
  if len(evals) > 1:
    best = max(evals, key=lambda r: r["eval/avg"])
    picks.append(("best", best))
  for label, r in picks:
    cells = [f"{r.get(f'eval/{t}', float('nan')):.3f}" for t in names]
    se = r.get("eval/avg_se")
    avg = f"{r['eval/avg']:.3f}" + ("" if se is None else f" ± {se:.3f}")
    lines.append(f"| {label} | {int(r['step'])} | " + " | ".join(cells)
                 + f" | {avg} |")
  train = [r for r in rows if "rollout/reward_mean" in r]
  if train:
    last = train[-1]
    lines.append("")
    lines.append("| last step | reward | accuracy | resp. len | k3_kl | grad norm | lr |")
    lines.append("|---|---|---|---|---|---|---|")
    lines.append(
        f"| {int(last['step'])} | {last['rollout/reward_mean']:.3f} | "
        f"{last.get('rollout/accuracy', float('nan')):.3f} | "
        f"{last.get('rollout/response_length_mean', float('nan')):.1f} | "
        f"{last.get('rollout_corr/k3_kl', float('nan')):.2e} | "
        f"{last.get('actor/grad_norm', float('nan')):.3f} | "
        f"{last.get('actor/lr', float('nan')):.2e} |")
  return "\n".join(lines)


def save_figure(fig, path: str, title: str = "") -> str:
  """Titles, lays out, writes (creating the directory) and closes `fig`; returns `path`."""
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=100)
  _pyplot().close(fig)
  return path


def plot_run(rows: Sequence[Mapping[str, float]], path: str,
             title: str = "") -> str:
  """Six panels over steps, saved as a PNG at `path`; returns the path."""
  fig, axes = _pyplot().subplots(2, 3, figsize=(13, 6.5))
  for ax, (name, label) in zip(axes.flat, PANELS):
    xs, ys = _series(rows, name)
    ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3)
    ax.set_title(label, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  return save_figure(fig, path, title)
