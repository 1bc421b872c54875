"""Tasks with verifiable answers: the small CPU arithmetic task and math RL on real checkpoints."""

from mipu_jax.tasks.arithmetic import ALPHABET
from mipu_jax.tasks.arithmetic import cot_completion
from mipu_jax.tasks.arithmetic import direct_completion
from mipu_jax.tasks.arithmetic import eval_sets
from mipu_jax.tasks.arithmetic import extract_answer
from mipu_jax.tasks.arithmetic import make_tokenizer
from mipu_jax.tasks.arithmetic import max_completion_len
from mipu_jax.tasks.arithmetic import max_prompt_len
from mipu_jax.tasks.arithmetic import parse_prompt
from mipu_jax.tasks.arithmetic import reward
from mipu_jax.tasks.arithmetic import reward_batch
from mipu_jax.tasks.arithmetic import sample_problems
from mipu_jax.tasks.arithmetic import sft_examples
from mipu_jax.tasks.arithmetic import split_of
from mipu_jax.tasks.arithmetic import SPLITS
from mipu_jax.tasks.arithmetic import Tier
from mipu_jax.tasks.arithmetic import TIER_NAMES
from mipu_jax.tasks.arithmetic import TIERS
from mipu_jax.tasks.arithmetic_task import ArithmeticTask
from mipu_jax.tasks.base import PROBE_STREAM
from mipu_jax.tasks.base import Problem
from mipu_jax.tasks.base import ProblemLike
from mipu_jax.tasks.base import RewardFn
from mipu_jax.tasks.base import Task
from mipu_jax.tasks.math_data import load_problems
from mipu_jax.tasks.math_data import MathProblem
from mipu_jax.tasks.math_reward import RewardPool
from mipu_jax.tasks.math_task import MathTask

__all__ = [
    "ALPHABET",
    "ArithmeticTask",
    "MathProblem",
    "MathTask",
    "PROBE_STREAM",
    "RewardPool",
    "Task",
    "load_problems",
    "Problem",
    "ProblemLike",
    "RewardFn",
    "SPLITS",
    "TIERS",
    "TIER_NAMES",
    "Tier",
    "cot_completion",
    "direct_completion",
    "eval_sets",
    "extract_answer",
    "make_tokenizer",
    "max_completion_len",
    "max_prompt_len",
    "parse_prompt",
    "reward",
    "reward_batch",
    "sample_problems",
    "sft_examples",
    "split_of",
]
