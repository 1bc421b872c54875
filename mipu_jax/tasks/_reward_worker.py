"""A reward worker process: grades `{completion, gold}` JSON lines from stdin.

Started by `mipu_jax.tasks.math_reward.RewardPool` as
`python -m mipu_jax.tasks._reward_worker module:function`; answers one JSON
line per request, `{"correct": bool}` or `{"error": "..."}`. It runs in its
own process so that a pathological answer can be killed without touching the
training loop (and math-verify's SIGALRM timeouts work in its main thread).
"""

import importlib
import json
import sys


def _load(spec: str):
  module, _, name = spec.partition(":")
  return getattr(importlib.import_module(module), name)


def main() -> None:
  grade = _load(sys.argv[1])
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
