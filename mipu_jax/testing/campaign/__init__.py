"""The bad-input campaign: generated configs, prompt files, evaluation sets, model
directories and workdirs, each taken to where a run would take its first step
and classified accepted / refused clearly / defect (docs/reliability.md, "Bad
inputs"). Hypothesis draws the cases, seeded and with its database off, so a
run of the campaign is the same cases on every machine.

    python -m mipu_jax.testing.campaign --cases 800     # the table of docs/reliability.md

`tests/test_bad_inputs.py` runs a sample in the default suite and the whole
campaign under the `campaign` marker.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from typing import Callable

from hypothesis import HealthCheck
from hypothesis import Phase
from hypothesis import given
from hypothesis import seed as hypothesis_seed
from hypothesis import settings

from mipu_jax.testing.campaign import configs
from mipu_jax.testing.campaign import core
from mipu_jax.testing.campaign import files
from mipu_jax.testing.campaign import model_dirs
from mipu_jax.testing.campaign import workdirs
from mipu_jax.testing.campaign.core import ACCEPTED, DEFECT, REFUSED, Case, Outcome
from mipu_jax.testing.campaign.world import World, make_world

__all__ = ["ACCEPTED", "DEFECT", "KINDS", "REFUSED", "Case", "Outcome", "World",
           "make_world", "run_kind", "strategies"]

KINDS = (configs.KIND, files.PROMPT_KIND, files.EVAL_KIND, model_dirs.KIND, workdirs.KIND)
# The distinct defects the campaign found, per kind, each fixed and kept as its
# own test in tests/test_bad_inputs.py (listed in docs/reliability.md).
FIXED = {configs.KIND: 11, files.PROMPT_KIND: 5, files.EVAL_KIND: 4, model_dirs.KIND: 11,
         workdirs.KIND: 5}


def strategies(world: World) -> dict[str, Callable]:
  """Each kind's Hypothesis strategy of cases."""
  templates = workdirs.make_templates(world)
  return {configs.KIND: configs.cases(world), files.PROMPT_KIND: files.prompt_cases(world),
          files.EVAL_KIND: files.eval_cases(world), model_dirs.KIND: model_dirs.cases(world),
          workdirs.KIND: workdirs.cases(world, templates)}


def run_kind(strategy, n: int, seed: int = 0) -> list[Outcome]:
  """`n` cases drawn from `strategy` (seeded, no example database, no shrinking)."""
  outcomes: list[Outcome] = []

  @hypothesis_seed(seed)
  @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate],
            suppress_health_check=list(HealthCheck))
  @given(strategy)
  def body(case: Case):
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      outcomes.append(core.run_case(case))

  logging.disable(logging.WARNING)   # every refused case would log its warnings
  try:
    body()
  finally:
    logging.disable(logging.NOTSET)
  return outcomes


def main(argv=None) -> None:
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", type=int, default=800, help="cases per input kind")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--kinds", default=",".join(KINDS))
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as root:
    world = make_world(root)
    strats = strategies(world)
    outcomes = []
    for kind in args.kinds.split(","):
      outcomes += run_kind(strats[kind], args.cases, args.seed)
  for o in outcomes:
    if o.verdict == DEFECT:
      print(f"DEFECT [{o.kind}] {o.what}: {o.detail}")
  print(core.table(outcomes, FIXED))
