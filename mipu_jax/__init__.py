"""mipu_jax: RL post-training of LLMs under training–inference mismatch, in JAX."""

__version__ = "0.1.0"
