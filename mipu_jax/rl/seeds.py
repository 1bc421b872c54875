"""Seeds of the RL loop's random streams: one 32-bit seed per tuple of integers.

Every random draw of step `k` (its prompts, its samples, the gate's probe and
coin) is seeded by a tuple such as `(run seed, k, round)`, so a run's data
position is its step counter and a resumed run draws exactly what an
uninterrupted one would.
"""

import numpy as np


def seed(*parts: int) -> int:
  """A 32-bit seed from integers (independent streams per tuple)."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])
