"""Real-benchmark evaluation: local loaders, boxed-answer grading, pass@1."""

from mipu_jax.math_eval.grading import boxed_reward
from mipu_jax.math_eval.grading import extract_boxed
from mipu_jax.math_eval.grading import extract_final_answer
from mipu_jax.math_eval.grading import grade
from mipu_jax.math_eval.grading import is_equivalent
from mipu_jax.math_eval.grading import normalize_answer
from mipu_jax.math_eval.grading import pass_at_1
from mipu_jax.math_eval.grading import pass_at_1_se
from mipu_jax.math_eval.loaders import BenchmarkProblem
from mipu_jax.math_eval.loaders import BENCHMARKS
from mipu_jax.math_eval.loaders import canonical_name
from mipu_jax.math_eval.loaders import load_benchmark
from mipu_jax.math_eval.loaders import PROMPT_TEMPLATE

__all__ = [
    "BENCHMARKS",
    "BenchmarkProblem",
    "PROMPT_TEMPLATE",
    "boxed_reward",
    "canonical_name",
    "extract_boxed",
    "extract_final_answer",
    "grade",
    "is_equivalent",
    "load_benchmark",
    "normalize_answer",
    "pass_at_1",
    "pass_at_1_se",
]
