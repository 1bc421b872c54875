"""Sampler engine: the inference policy μ with its own log-probs (docs/method.md §0, §7)."""

from mipu_jax.sampler.config import SamplerConfig
from mipu_jax.sampler.engine import Engine
from mipu_jax.sampler.jetstream import JetStreamEngine, ResultTokens, SlotData
from mipu_jax.sampler.sampler import SampleOutput, Sampler
from mipu_jax.sampler.sampling import sample_logits, truncated_logprobs
from mipu_jax.sampler.state import DecodeState, Prefix
