r"""MIPU Step 2's overhead per RL step, and the cost of a rollback (docs/method.md §5).

    python -m bench.perf.mipu [--prompts 16 --group 8 --tokens 64 --probe 8 --repeats 3]

One run (`studies/configs/small_cpu.py`'s shapes by default: N = 16 prompts x G = 8
responses, 64 new tokens, tiny Qwen3, fp32 sampler) built with `donate=False`
so that the same jitted learner serves every variant; RL steps
(`mipu_jax.rl.rl_step`) are timed, interleaved, at the same step index (same
prompts, same seeds) from the same state:

  * baseline: no gate;
  * step2: `MipuGate` with the default probe (`--probe` prompts x G fresh
    responses from μ_{k+1}), forced to accept (c = +1e9);
  * rollback: the same gate forced to reject (c = -1e9).

Overhead = (step2 - baseline) / baseline. A rollback's own cost (swapping the
learner trees and the sampler weights back) is (rollback - step2); its
real price is the wasted step (the whole step time buys no update).
Every figure is the fastest of `--repeats` after a warm-up (shared machine).
"""

import argparse
import time

import jax
from flax import nnx


from mipu_jax import config as config_lib
from mipu_jax.rl import build
from mipu_jax.rl import gates
from mipu_jax.rl import step as step_lib


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--prompts", type=int, default=16)
  ap.add_argument("--group", type=int, default=8)
  ap.add_argument("--tokens", type=int, default=64)
  ap.add_argument("--probe", type=int, default=config_lib.MipuConfig.num_probe_prompts)
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args()

  cfg = config_lib.TrainConfig(
      data=config_lib.DataConfig(prompts_per_step=args.prompts,
                                 group_size=args.group,
                                 train_tiers=("tier1", "tier2", "tier3")),
      sampling=config_lib.SamplingConfig(max_new_tokens=args.tokens),
      optim=config_lib.OptimConfig(learning_rate=1e-4),
      mipu=config_lib.MipuConfig(step2=True, num_probe_prompts=args.probe))
  run = build.build_run(cfg, donate=False)
  params = nnx.to_pure_dict(nnx.state(run.model, nnx.Param))
  state = run.learner.init_state(params, cfg.seed)
  sampler0 = None

  def mk(c):
    return gates.MipuGate(config_lib.MipuConfig(
        step2=True, c=c, num_probe_prompts=args.probe), seed=cfg.seed)

  variants = {"baseline": None, "step2": mk(1e9), "rollback": mk(-1e9)}
  times = {k: [] for k in variants}
  gate_s = {k: [] for k in variants}
  for rep in range(args.repeats + 1):  # rep 0: warm-up (compilation)
    for name, gate in variants.items():
      run.sampler.update_weights(state.params)
      sampler0 = run.sampler.params
      t0 = time.perf_counter()
      new, metrics = step_lib.rl_step(run, state, 1, gate)
      jax.block_until_ready(new)
      dt = time.perf_counter() - t0
      if rep:
        times[name].append(dt)
        gate_s[name].append(metrics.get("perf/gate_seconds", 0.0))
      if name == "rollback":
        assert metrics["mipu/accepted"] == 0.0 and run.sampler.params is sampler0
  best = {k: min(v) for k, v in times.items()}
  best_gate = {k: min(v) for k, v in gate_s.items()}
  base = best["baseline"]
  print(f"device: {jax.devices()[0].device_kind}  N={args.prompts} G={args.group} "
        f"T={args.tokens} probe={args.probe}x{args.group} repeats={args.repeats}")
  for k in variants:
    print(f"  {k:9s} step {best[k]:8.3f} s   gate {best_gate[k]:7.3f} s")
  print(f"Step 2 overhead: {(best['step2'] - base) / base:.1%} of the baseline "
        f"step (gate alone {best_gate['step2'] / base:.1%}; goal <= 15%)")
  # The rollback mechanics alone: the gate's tree swap and the loop's sampler
  # weight restore (no copies: the pre-update trees themselves are kept).
  gate, cand = variants["rollback"], new
  t0 = time.perf_counter()
  for _ in range(1000):
    gate._decide(False, cand, state, {})  # pylint: disable=protected-access
    run.sampler.params = sampler0
  swap_us = (time.perf_counter() - t0) / 1000 * 1e6
  print(f"rollback mechanics (state swap + sampler restore): {swap_us:.1f} us")
  print(f"rollback extra cost: {(best['rollback'] - best['step2']) * 1e3:+.1f} ms "
        f"({(best['rollback'] - best['step2']) / base:+.1%} of a step); a rolled-back "
        f"step wastes {best['rollback'] / base:.2f} baseline steps")


if __name__ == "__main__":
  main()
