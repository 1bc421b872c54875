"""Several hosts: JAX's distributed runtime, and what each process does and owns.

The RL loop runs the same host program on every process (SPMD): all of them
compute the same prompts (a pure function of the seed and the step), each
samples its slice of them on its own devices (`process_slice`), and the
rollouts are gathered (`allgather`) so that every process holds the same
batch, makes the same learner step (one global program over the global mesh)
and the same MIPU decision. Only the main process writes logs, tables, plots
and exports (`is_main`); checkpoints go through orbax, which coordinates the
processes itself.

`initialize(mode)` starts the runtime: `off`; `on` (Cloud TPU, SLURM, Open
MPI and the like need no arguments; elsewhere give the coordinator, the
number of processes and this process's id); `auto` starts it when the
environment describes several processes. On CPU the cross-process
collectives use gloo.

The runtime's timeouts are the project's, not JAX's defaults: a process that
stops sending heartbeats for `heartbeat_timeout_s` is declared dead and the
runtime aborts every other process (from C++, with a message naming the dead
task); a process that exits waits at most `shutdown_timeout_s` for the others
at the shutdown barrier. `mipu_jax.rl.guard` ends the job earlier, and says
which checkpoint is intact (docs/reliability.md).
"""

from __future__ import annotations

import os
import signal
from typing import Any, Optional

import jax
import numpy as np

MODES = ("auto", "on", "off")
HEARTBEAT_TIMEOUT_S = 90
SHUTDOWN_TIMEOUT_S = 60
INITIALIZATION_TIMEOUT_S = 300


def _env_processes() -> int:
  """How many processes the environment describes (1 when it says nothing)."""
  for var in ("JAX_NUM_PROCESSES", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
    if os.environ.get(var, "").isdigit():
      return int(os.environ[var])
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  return len([h for h in hosts.split(",") if h]) or 1


def initialize(mode: str = "auto", *, coordinator_address: Optional[str] = None,
               num_processes: Optional[int] = None,
               process_id: Optional[int] = None,
               heartbeat_timeout_s: int = HEARTBEAT_TIMEOUT_S,
               shutdown_timeout_s: int = SHUTDOWN_TIMEOUT_S,
               initialization_timeout_s: int = INITIALIZATION_TIMEOUT_S) -> bool:
  """Starts JAX's distributed runtime if `mode` asks for it; returns whether it did.

  Must run before any other JAX call of the process. The timeouts (seconds)
  go to `jax.distributed.initialize`: `heartbeat_timeout_s` bounds how long a
  dead process goes unnoticed, `shutdown_timeout_s` how long an exiting one
  waits for the others, `initialization_timeout_s` how long the processes
  have to find each other.

  Raises:
    ValueError: an unknown mode.
  """
  if mode not in MODES:
    raise ValueError(f"unknown distributed mode {mode!r}; choose one of {MODES}.")
  explicit = coordinator_address is not None or num_processes is not None
  if mode == "off" or (mode == "auto" and not explicit and _env_processes() <= 1
                       and "JAX_COORDINATOR_ADDRESS" not in os.environ):
    return False
  if (os.environ.get("JAX_PLATFORMS", "") == "cpu"
      or jax.config.jax_platforms == "cpu"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             initialization_timeout=initialization_timeout_s,
                             heartbeat_timeout_seconds=heartbeat_timeout_s,
                             shutdown_timeout_seconds=shutdown_timeout_s)
  # When the coordination service reports an error (process 0, which hosts
  # it, is gone), JAX's client ends the process from C++: a fatal log, then
  # abort(). Measured here (jax 0.10.2), the SIGABRT handler installed in
  # the process then hung instead of ending it; with the default action the
  # process ends (status -6) at once.
  signal.signal(signal.SIGABRT, signal.SIG_DFL)
  return True


def kv_client():
  """The distributed runtime's client: the coordination service's key-value
  store and barriers, which work while a collective is stuck.

  JAX has no public accessor; orbax reaches it the same way
  (`orbax.checkpoint.multihost.get_jax_distributed_client`).

  Raises:
    RuntimeError: the distributed runtime is not started.
  """
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  client = jax_distributed.global_state.client
  if client is None:
    raise RuntimeError("JAX's distributed runtime is not started "
                       "(mipu_jax.distributed.initialize).")
  return client


def is_main() -> bool:
  """Whether this process writes the run's files (process 0)."""
  return jax.process_index() == 0


def process_slice(n: int) -> slice:
  """This process's contiguous share of `n` items (all of them when `n` does not
  split evenly: then every process does the whole, redundant but exact)."""
  count = jax.process_count()
  if count == 1 or n % count:
    return slice(0, n)
  per = n // count
  return slice(jax.process_index() * per, (jax.process_index() + 1) * per)


def allgather(x: np.ndarray, split: slice, n: int) -> np.ndarray:
  """The whole of an array whose rows `split` (of `n`) this process computed.

  A no-op with one process or when every process computed everything.
  """
  x = np.asarray(x)
  if jax.process_count() == 1 or (split.start == 0 and split.stop == n):
    return x
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def to_host(tree: Any) -> Any:
  """The value of a tree of (possibly multi-process) arrays, on every process's host."""
  def one(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jax.device_get(x)
  return jax.tree.map(one, tree)


def local_copy(x: jax.Array) -> jax.Array:
  """A process-local replica of a global array (its value on this process's
  first device), for programs that run on this process's devices only.
  Abstract values (under `jax.eval_shape` / tracing) pass through."""
  if isinstance(x, jax.core.Tracer) or x.is_fully_addressable:
    return x
  replicated = jax.jit(lambda a: a, out_shardings=jax.sharding.NamedSharding(
      x.sharding.mesh, jax.sharding.PartitionSpec()))(x)
  return replicated.addressable_data(0)
