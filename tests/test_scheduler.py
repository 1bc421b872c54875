"""The sampler's slot scheduler (mipu_jax/sampler/scheduler.py): host-side bookkeeping."""

import pytest

from mipu_jax.sampler.scheduler import Admission, SlotScheduler


def test_samples_fill_slots_in_order_and_a_prompt_shares_one_block():
  s = SlotScheduler(total=6, group=3, num_slots=4, num_blocks=2)
  assert s.admit() == [Admission(0, 0, 0, True), Admission(1, 1, 0, False),
                       Admission(2, 2, 0, False), Admission(3, 3, 1, True)]
  assert s.busy == [0, 1, 2, 3] and not s.all_admitted
  assert s.admit() == []  # no free slot
  assert s.release(2) == 2
  assert s.admit() == [Admission(2, 4, 1, False)]  # prompt 1's block again
  for slot in (0, 1):
    s.release(slot)
  assert s.admit() == [Admission(0, 5, 1, False)]
  assert s.all_admitted and s.admit() == []
  for slot in (0, 2, 3):
    s.release(slot)
  assert s.busy == []


def test_a_new_prompt_waits_for_a_free_block():
  """One block: prompt 1's first sample waits until every sample of prompt 0
  is released, though slots are free."""
  s = SlotScheduler(total=4, group=2, num_slots=3, num_blocks=1)
  assert [a.sample for a in s.admit()] == [0, 1]
  s.release(0)
  assert s.admit() == []  # slot 0 free, block 0 still read by sample 1
  s.release(1)
  assert s.admit() == [Admission(0, 2, 0, True), Admission(1, 3, 0, False)]


def test_a_released_slot_counts_as_emptied_until_it_is_refilled():
  """The decode state still counts a released slot finished: the sampler's
  wait for finished samples adds them (or it would return at once, forever)."""
  s = SlotScheduler(total=4, group=2, num_slots=3, num_blocks=1)
  s.admit()
  s.release(0)
  assert s.emptied == 1 and s.admit() == []  # no block for prompt 1
  s.release(1)
  assert s.emptied == 2
  s.admit()
  assert s.emptied == 0


def test_with_the_pool_in_parts_a_sample_block_is_in_its_slot_part():
  """Two parts of 2 slots and 1 block: a prompt's samples share its block in a
  part, take a block in another part when theirs is full, and a prompt waits
  where no free slot's part has a block; blocks come back when all of a
  prompt's samples are released."""
  s = SlotScheduler(total=6, group=3, num_slots=4, num_blocks=2, parts=2)
  assert s.admit() == [Admission(0, 0, 0, True), Admission(1, 1, 0, False),
                       Admission(2, 2, 1, True)]  # prompt 0 takes part 1's block too
  assert s.busy == [0, 1, 2]  # slot 3 is free, but prompt 1 finds no block
  s.release(2)
  s.release(0)
  assert s.admit() == []  # prompt 0 still holds both blocks (sample 1 decodes)
  s.release(1)
  assert s.admit() == [Admission(0, 3, 0, True), Admission(1, 4, 0, False),
                       Admission(2, 5, 1, True)]
  assert s.all_admitted and s.admit() == []
  for slot in (0, 1, 2):
    s.release(slot)
  assert s.busy == [] and s.emptied == 3
  with pytest.raises(ValueError, match="do not split"):
    SlotScheduler(total=6, group=3, num_slots=3, num_blocks=2, parts=2)
