"""Which process of a job is the stuck one, from the signs of life the job guard
publishes (`guard.JobGuard`).

A phase that lasted `step_timeout_s` ends its process unless another process
is the stuck one and this one only waits for it: a process behind it (fewer
phases entered), or, in the same phase, one running its own code while this
one waits inside JAX (a computation's result, a collective, a barrier: read
from the loop thread's innermost Python frame outside the standard library,
and published with each sign of life). Time between phases counts from the
last phase's end. Every watchdog has the same limit, so without that rule a
process waiting in a collective for the stuck one could end first and be
blamed. The waiting process defers for at most another `step_timeout_s`; when
every process waits inside JAX (a stalled device, a collective that never
completes) each ends, saying so.
"""

from typing import Optional


def stuck_verdict(age: float, progress: int, waits: bool, peers: list[str],
                  step_timeout_s: float) -> Optional[str]:
  """Whether a process whose phase has lasted `age` > `step_timeout_s` is the
  stuck one: None when it should defer to a peer, else the end of its message.

  Args:
    age: how long this process's current phase has lasted.
    progress: how many phase entries and exits this process has made.
    waits: whether its loop now waits inside JAX / for the others.
    peers: the other processes' latest signs of life,
      "beat progress step run|wait phase".
    step_timeout_s: the limit.
  """
  parsed = [v.split(" ", 4) for v in peers]
  if any(int(p[1]) < progress for p in parsed):
    return None  # a process behind this one: it is the stuck one (or slow)
  if not waits:
    return " in its own code, not waiting for another process."
  # A process ahead has passed what this one waits in; one in the same phase
  # running its own code is the stuck one when it never arrives.
  running = [p for p in parsed if int(p[1]) == progress and p[3] == "run"]
  if running and age <= 2 * step_timeout_s:
    return None  # waiting (in a collective) for a process running its own code
  if running:
    return (" waiting inside JAX while another process runs its own code past "
            "twice the limit; ending this one.")
  if not parsed:
    return " waiting inside JAX for a computation's result: a stalled device."
  if any(p[3] == "run" for p in parsed):
    return (" waiting inside JAX; no process in its phase runs its own code (those "
            "running are ahead of it).")
  return (" waiting inside JAX (a computation's result or a collective) like every "
          "other process: a stalled device, or a collective that never completes.")


def is_collective_error(error: BaseException) -> bool:
  """Whether `error` looks like a failed cross-process collective."""
  text = str(error)
  return any(s in text for s in ("Gloo", "gloo", "Connection reset", "UNAVAILABLE",
                                 "DEADLINE_EXCEEDED", "Barrier", "barrier"))
