"""Tests for mipu_jax.tasks: the multi-operand addition task."""

import numpy as np
import pytest

from mipu_jax import tasks
from mipu_jax import tokenizer as tokenizer_lib


def test_completion_formats():
  assert tasks.direct_completion(104) == "A104."
  assert tasks.cot_completion([37, 48, 19]) == "37+48=85;85+19=104;A104."
  assert tasks.cot_completion([37, 48]) == "37+48=85;A85."
  assert tasks.parse_prompt("Q:37+48+19=") == [37, 48, 19]
  with pytest.raises(ValueError, match="Not an addition prompt"):
    tasks.parse_prompt("Q:37*48=")


@pytest.mark.parametrize("completion, expected", [
    ("A104.", 1.0),
    ("37+48=85;85+19=104;A104.", 1.0),
    ("A104.<eos>junk;A999.", 1.0),    # Text after the closing '.' is ignored.
    ("xx;;=+A104.", 1.0),             # Junk before the answer is skipped.
    ("A0104.", 1.0),                  # Compared as integers.
    ("37+48=85;85+19=105;A104.", 1.0),  # Outcome reward: steps are not graded.
    ("A105.", 0.0),
    ("37+48=85;85+19=104;A10", 0.0),  # Cut off before '.': no answer.
    ("104.", 0.0),
    ("", 0.0),
    ("A.", 0.0),
])
def test_reward(completion, expected):
  problem = tasks.Problem("Q:37+48+19=", "104", "tier2")
  assert tasks.reward(problem, completion) == expected
  assert tasks.reward(problem.prompt, completion) == expected  # Prompt only.


def test_reward_batch_is_a_reward_fn():
  problems = tasks.sample_problems(np.random.default_rng(0), 6)
  completions = [tasks.direct_completion(int(p.answer) + (i % 2))
                 for i, p in enumerate(problems)]
  rewards = tasks.reward_batch(problems, completions)
  assert rewards.dtype == np.float32
  np.testing.assert_array_equal(rewards, [1, 0, 1, 0, 1, 0])
  assert isinstance(tasks.reward_batch, tasks.RewardFn)
  with pytest.raises(ValueError, match="completions"):
    tasks.reward_batch(problems, completions[:-1])


def test_tier_lengths_match_documented_table():
  table = {"tier1": (8, 15), "tier2": (11, 26), "tier3": (14, 37),
           "tier4": (17, 48), "tier5": (20, 59)}
  for name, (prompt_len, completion_len) in table.items():
    assert tasks.TIERS[name].max_prompt_len == prompt_len
    assert tasks.TIERS[name].max_completion_len == completion_len
  assert tasks.max_prompt_len(["tier1", "tier2", "tier3"]) <= 32
  assert tasks.max_completion_len(["tier1", "tier2", "tier3"]) <= 64
  assert tasks.max_completion_len() <= 64


def test_sampled_problems_respect_tier_lengths_and_alphabet():
  tok = tasks.make_tokenizer()
  assert isinstance(tok, tokenizer_lib.Tokenizer)
  assert tok.vocab_size == 3 + len(tasks.ALPHABET) == 20
  rng = np.random.default_rng(1)
  for name in tasks.TIER_NAMES:
    tier = tasks.TIERS[name]
    for p in tasks.sample_problems(rng, 50, [name]):
      operands = tasks.parse_prompt(p.prompt)
      assert p.tier == name and len(operands) == tier.num_operands
      assert all(10 <= x <= 99 for x in operands)
      assert int(p.answer) == sum(operands)
      completion = tasks.cot_completion(operands)
      assert len(p.prompt) <= tier.max_prompt_len
      assert len(completion) <= tier.max_completion_len
      ids = tok.encode(p.prompt + completion)
      assert tok.decode(ids) == p.prompt + completion


def test_splits_are_disjoint_and_eval_sets_deterministic():
  sets = tasks.eval_sets(seed=3, n_per_tier=40)
  assert list(sets) == list(tasks.TIER_NAMES)
  for name, problems in sets.items():
    assert len(problems) == 40
    assert len({p.prompt for p in problems}) == 40  # Distinct.
    assert all(p.tier == name and tasks.split_of(p.prompt) == "eval"
               for p in problems)
  assert tasks.eval_sets(seed=3, n_per_tier=40) == sets
  assert tasks.eval_sets(seed=4, n_per_tier=40) != sets
  rng = np.random.default_rng(0)
  for split in tasks.SPLITS:
    assert all(tasks.split_of(p.prompt) == split
               for p in tasks.sample_problems(rng, 100, split=split))
  train = {p.prompt for p in tasks.sample_problems(rng, 2000)}
  probe = {p.prompt for p in tasks.sample_problems(rng, 200, split="probe")}
  held_out = {p.prompt for s in sets.values() for p in s}
  assert not train & held_out and not train & probe and not probe & held_out


def test_split_sizes_on_tier1():
  counts = {s: 0 for s in tasks.SPLITS}
  for a in range(10, 100):
    for b in range(10, 100):
      counts[tasks.split_of(f"Q:{a}+{b}=")] += 1
  total = sum(counts.values())
  assert 0.07 < counts["eval"] / total < 0.13
  assert 0.03 < counts["probe"] / total < 0.07


def test_sampling_is_deterministic_given_rng():
  a = tasks.sft_examples(np.random.default_rng(7), 50)
  b = tasks.sft_examples(np.random.default_rng(7), 50)
  assert a == b
  assert tasks.sample_problems(np.random.default_rng(7), 20) == (
      tasks.sample_problems(np.random.default_rng(7), 20))


def _is_cot(completion: str) -> bool:
  return not completion.startswith("A")


def test_sft_mix_makes_step_by_step_more_accurate():
  examples = tasks.sft_examples(np.random.default_rng(0), 3000,
                                cot_fraction=0.3, direct_error_rate=0.4)
  cot = [tasks.reward(p, c) for p, c in examples if _is_cot(c)]
  direct = [tasks.reward(p, c) for p, c in examples if not _is_cot(c)]
  assert 0.25 < len(cot) / len(examples) < 0.35
  assert np.mean(cot) == 1.0
  assert 0.55 < np.mean(direct) < 0.65
  cot_len = np.mean([len(c) for p, c in examples if _is_cot(c)])
  direct_len = np.mean([len(c) for p, c in examples if not _is_cot(c)])
  assert cot_len > 3 * direct_len  # Room for the length surge under RL.


def test_sft_extremes_and_validation():
  rng = np.random.default_rng(0)
  assert all(_is_cot(c) for _, c in tasks.sft_examples(rng, 50,
                                                        cot_fraction=1.0))
  direct = tasks.sft_examples(rng, 50, cot_fraction=0.0, direct_error_rate=0.0)
  assert all(not _is_cot(c) and tasks.reward(p, c) == 1.0 for p, c in direct)
  wrong = tasks.sft_examples(rng, 50, cot_fraction=0.0, direct_error_rate=1.0)
  assert all(tasks.reward(p, c) == 0.0 for p, c in wrong)
  with pytest.raises(ValueError, match="cot_fraction"):
    tasks.sft_examples(rng, 1, cot_fraction=1.5)
  with pytest.raises(ValueError, match="direct_error_rate"):
    tasks.sft_examples(rng, 1, direct_error_rate=-0.1)


def test_unknown_tier_or_split():
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="tier9"):
    tasks.sample_problems(rng, 1, ["tier9"])
  with pytest.raises(ValueError, match="valid"):
    tasks.sample_problems(rng, 1, split="valid")
