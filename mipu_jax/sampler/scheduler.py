"""The sampler's slot scheduler: which sample decodes in which slot (docs/method.md §7).

Continuous batching over fixed decode slots, host-side (tunix's
`generate/scheduler.py` plays the same part): samples are admitted in order
(prompt-major: sample k is sample `k % G` of prompt `k // G`) into free slots;
the G samples of a prompt share a prompt block, which the prompt takes when
its first sample is admitted (that insert fills it) and gives back once its
last sample is released. With the pool in parts (one per row shard,
`_steps.PoolGeometry`), a sample's block is in its slot's part: a prompt
whose samples land on several shards takes a block in each.
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
  """`total` samples, `group` per prompt, over `num_slots` slots and `num_blocks`
  prompt blocks, both split evenly over `parts` parts."""

  def __init__(self, total: int, group: int, num_slots: int, num_blocks: int, parts: int = 1):
    if num_slots % parts or num_blocks % parts:
      raise ValueError(f"{num_slots} slots and {num_blocks} blocks do not split over "
                       f"{parts} parts.")
    self.total, self.group = total, group
    self.next_sample = 0  # samples before it have been admitted
    self._occupant: list[Optional[int]] = [None] * num_slots  # slot -> sample
    self._part_of = lambda slot: slot // (num_slots // parts)
    per = num_blocks // parts
    self._free_blocks = [list(range(d * per, (d + 1) * per)) for d in range(parts)]
    self._blocks_of: dict[int, dict[int, int]] = {}  # prompt -> part -> its block there
    self._unreleased: dict[int, int] = {}  # prompt -> its samples not yet released
    self._emptied: set[int] = set()  # released slots not refilled: finished in the decode state

  @property
  def busy(self) -> list[int]:
    """The slots that hold a sample (decoding or finished, not yet released)."""
    return [b for b, k in enumerate(self._occupant) if k is not None]

  @property
  def emptied(self) -> int:
    """Released slots not refilled since: the decode state still counts them
    finished, so a wait for k finished samples waits for `emptied + k`."""
    return len(self._emptied)

  @property
  def all_admitted(self) -> bool:
    return self.next_sample >= self.total

  def admit(self) -> list[Admission]:
    """The next samples into free slots, in order, until the slots run out, the
    samples do, or a prompt finds no block in a free slot's part (it waits for
    a release). A sample takes the first free slot in a part where its prompt
    has a block, else the first free slot whose part has a free block."""
    free = [b for b, k in enumerate(self._occupant) if k is None]
    out = []
    while free and not self.all_admitted:
      prompt = self.next_sample // self.group
      blocks = self._blocks_of.setdefault(prompt, {})
      slot = next((b for b in free if self._part_of(b) in blocks), None)
      if slot is None:
        slot = next((b for b in free if self._free_blocks[self._part_of(b)]), None)
        if slot is None:
          break
        blocks[self._part_of(slot)] = self._free_blocks[self._part_of(slot)].pop(0)
        self._unreleased.setdefault(prompt, self.group)
        fill = True
      else:
        fill = False
      free.remove(slot)
      self._emptied.discard(slot)
      self._occupant[slot] = self.next_sample
      out.append(Admission(slot, self.next_sample, blocks[self._part_of(slot)], fill))
      self.next_sample += 1
    return out

  def release(self, slot: int) -> int:
    """Frees `slot`, whose sample has finished and been read; returns that sample.
    The prompt's blocks are free again once all its samples are released."""
    sample, self._occupant[slot] = self._occupant[slot], None
    self._emptied.add(slot)
    prompt = sample // self.group
    self._unreleased[prompt] -= 1
    if not self._unreleased[prompt]:
      del self._unreleased[prompt]
      for part, block in self._blocks_of.pop(prompt).items():
        self._free_blocks[part].append(block)
    return sample
