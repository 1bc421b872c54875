"""The sampler's slot scheduler: which sample decodes in which slot (docs/method.md §7).

Continuous batching over fixed decode slots, host-side (tunix's
`generate/scheduler.py` plays the same part): samples are admitted in order
(prompt-major: sample k is sample `k % G` of prompt `k // G`) into free slots;
the G samples of a prompt share one of the decode state's prompt blocks,
which the prompt takes when its first sample is admitted (that insert fills
it) and gives back once its last sample is released.
"""

from typing import NamedTuple, Optional


class Admission(NamedTuple):
  """Sample `sample` goes into `slot`, its prompt in prompt block `block`, which
  this insert fills (`fill`) or which an earlier sample of the prompt filled."""
  slot: int
  sample: int
  block: int
  fill: bool


class SlotScheduler:
  """`total` samples, `group` per prompt, over `num_slots` slots and `num_blocks` prompt blocks."""

  def __init__(self, total: int, group: int, num_slots: int, num_blocks: int):
    self.total, self.group = total, group
    self.next_sample = 0  # samples before it have been admitted
    self._occupant: list[Optional[int]] = [None] * num_slots  # slot -> sample
    self._free_blocks = list(range(num_blocks))
    self._block_of: dict[int, int] = {}  # prompt -> its block, while it has samples out
    self._unreleased: dict[int, int] = {}  # prompt -> its samples not yet released

  @property
  def busy(self) -> list[int]:
    """The slots that hold a sample (decoding or finished, not yet released)."""
    return [b for b, k in enumerate(self._occupant) if k is not None]

  @property
  def all_admitted(self) -> bool:
    return self.next_sample >= self.total

  def admit(self) -> list[Admission]:
    """The next samples into the free slots, in order, until the slots run out,
    the samples do, or a new prompt finds no free block (it waits for a release)."""
    free = [b for b, k in enumerate(self._occupant) if k is None]
    out = []
    while free and not self.all_admitted:
      prompt = self.next_sample // self.group
      fill = prompt not in self._block_of
      if fill:
        if not self._free_blocks:
          break
        self._block_of[prompt] = self._free_blocks.pop(0)
        self._unreleased[prompt] = self.group
      slot = free.pop(0)
      self._occupant[slot] = self.next_sample
      out.append(Admission(slot, self.next_sample, self._block_of[prompt], fill))
      self.next_sample += 1
    return out

  def release(self, slot: int) -> int:
    """Frees `slot`, whose sample has finished and been read; returns that sample.
    The prompt's block is free again once all its samples are released."""
    sample, self._occupant[slot] = self._occupant[slot], None
    prompt = sample // self.group
    self._unreleased[prompt] -= 1
    if not self._unreleased[prompt]:
      self._free_blocks.append(self._block_of.pop(prompt))
    return sample
