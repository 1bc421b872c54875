"""A reward worker process: grades `{completion, gold}` JSON lines from stdin.

Started by `mipu_jax.tasks.math_reward.RewardPool` as
`python -m mipu_jax.tasks._reward_worker module:function`; answers one JSON
line per request, `{"correct": bool}` or `{"error": "..."}`. It runs in its
own process so that a pathological answer can be killed without touching the
training loop (and math-verify's SIGALRM timeouts work in its main thread).

Before it says it is ready it grades one sample pair and drops the answer:
math-verify loads its parsers on the first call (about 0.4 s on an idle CPU,
seconds under load), and that is start-up, which the pool's start-up limit
covers, not the first item's time limit.
"""

import importlib
import json
import sys


def _load(spec: str):
  module, _, name = spec.partition(":")
  return getattr(importlib.import_module(module), name)


def main() -> None:
  grade = _load(sys.argv[1])
  try:
    grade("\\boxed{0}", "0")
  except Exception:  # noqa: BLE001 - a grader that fails here fails on the items too
    pass
  print(json.dumps({"ready": True}), flush=True)
  for line in sys.stdin:
    request = json.loads(line)
    try:
      reply = {"correct": bool(grade(request["completion"], request["gold"]))}
    except Exception as e:  # noqa: BLE001 - any grading failure scores 0
      reply = {"error": f"{type(e).__name__}: {e}"[:300]}
    print(json.dumps(reply), flush=True)


if __name__ == "__main__":
  main()
