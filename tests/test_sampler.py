"""Sampler: decoding equals the full forward, log-probs are the sampling distribution."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from mipu_jax.sampler import Sampler, mismatch, truncated_logprobs
from mipu_jax.sampler import engine as engine_lib
from mipu_jax.testing import models
from mipu_jax.sampler.sampling import draw, greedy, sample_logits, truncate_logits

pytestmark = pytest.mark.filterwarnings("ignore:top-k/top-p sampling")

CFG = models.SAMPLER_CFG
PROMPTS = models.PROMPTS


def make_model(seed=0, std=0.16):
  """The tests' tiny Qwen3, peaked like a trained one (`testing.models.peaked_qwen3`)."""
  return models.peaked_qwen3(CFG, seed, std)


@pytest.fixture(scope="module")
def model():
  return make_model()


@pytest.fixture(scope="module")
def sampler(model):
  return Sampler(model, max_prefill_length=32, max_decode_length=32)


def padded(prompts, generated, rows=8, width=48):
  """Right-padded `prompt + generated` rows in fixed shapes (one compile per test file)."""
  tok = np.zeros((rows, width), np.int32)
  mask = np.zeros((rows, width), np.int32)
  for i, (p, g) in enumerate(zip(prompts, generated)):
    tok[i, :len(p) + len(g)], mask[i, :len(p) + len(g)] = p + g, 1
  return jnp.asarray(tok), jnp.asarray(mask)


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tok, mask):
  return nnx.merge(graphdef, state)(tok, mask_BT=mask).logits


def full_logits(model, prompts, generated):
  """Per row, the full-forward logits predicting each generated token, `[len(g), V]`."""
  logits = np.asarray(_forward(*nnx.split(model), *padded(prompts, generated)))
  return [logits[i, len(p) - 1:len(p) - 1 + len(g)]
          for i, (p, g) in enumerate(zip(prompts, generated))]


def np_log_softmax(x):
  x = x - x.max(axis=-1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def np_truncated_logp(logits_V, temperature, top_k, top_p):
  """Independent numpy reference of the truncated, renormalised law (sampling.py)."""
  x = logits_V.astype(np.float64) / temperature
  order = np.argsort(-x, kind="stable")
  keep = np.zeros(x.shape, bool)
  k = top_k or x.size
  p_sorted = np.exp(np_log_softmax(x[order[:k]]))
  n = int(np.searchsorted(np.cumsum(p_sorted) - p_sorted, top_p, side="left")) if top_p < 1 else k
  keep[order[:max(n, 1)]] = True
  return np.where(keep, np_log_softmax(np.where(keep, x, -np.inf)), -np.inf)


def test_greedy_equals_argmax_of_full_forward(model, sampler):
  out = sampler.generate(PROMPTS, max_new_tokens=12, temperature=0.0)
  for logits, toks, lps in zip(full_logits(model, PROMPTS, out.tokens), out.tokens,
                               out.logprobs):
    assert len(toks) == 12
    np.testing.assert_array_equal(np.argmax(logits, axis=-1), toks)
    # Greedy reports the t = 1 log-prob (sampling.py).
    np.testing.assert_allclose(lps, np_log_softmax(logits)[np.arange(12), toks], atol=1e-5)


def test_logprobs_equal_sequence_logprobs(model, sampler):
  out = sampler.generate(PROMPTS, max_new_tokens=10, temperature=0.7, num_samples=2, seed=3)
  np.testing.assert_array_equal(out.prompt_index, [0, 0, 1, 1, 2, 2])
  # `sequence_logprobs` (the learner's function) on the same tokens, jitted.
  ref = mismatch.learner_logprobs(model, PROMPTS, out, temperature=0.7)
  np.testing.assert_allclose(out.logprobs_array, ref, atol=1e-5)
  np.testing.assert_array_equal(out.logprobs_array * out.mask, out.logprobs_array)
  assert len({tuple(t) for t in out.tokens}) == 6  # samples of one prompt differ


def test_truncated_logprobs_match_references(model, sampler):
  with pytest.warns(UserWarning, match="truncated_logprobs"):
    out = sampler.generate(PROMPTS, max_new_tokens=8, temperature=1.3, top_k=6, top_p=0.8,
                           num_samples=2, seed=5)
  prompts = [p for p in PROMPTS for _ in range(2)]
  all_logits = full_logits(model, prompts, out.tokens)
  for logits, toks, lps in zip(all_logits, out.tokens, out.logprobs):
    ref = [np_truncated_logp(l, 1.3, 6, 0.8)[t] for l, t in zip(logits, toks)]
    np.testing.assert_allclose(lps, ref, atol=1e-5)
  # The learner-side helper agrees with the sampler on the same tokens.
  learner = truncated_logprobs(jnp.asarray(all_logits[0])[None], jnp.asarray([out.tokens[0]]),
                               1.3, 6, 0.8)
  np.testing.assert_allclose(learner[0], out.logprobs[0], atol=1e-5)


def test_truncate_logits_hand_computed():
  logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]] * 3))
  kept = jax.jit(truncate_logits)(logits, jnp.asarray([2, 0, 0]), jnp.asarray([1.0, 0.7, 0.85]))
  finite = np.isfinite(np.asarray(kept))
  np.testing.assert_array_equal(finite, [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]])


@pytest.mark.parametrize("temperature,top_p", [(0.6, 1.0), (1.5, 0.7)])
def test_samples_follow_reported_distribution(model, sampler, temperature, top_p):
  prompt, n = [3, 1, 4], 4000
  out = sampler.generate([prompt], max_new_tokens=1, temperature=temperature,
                         top_p=top_p if top_p < 1 else None, num_samples=n, seed=11)
  first = np.asarray([t[0] for t in out.tokens])
  lps = np.asarray([lp[0] for lp in out.logprobs])
  v = CFG.vocab_size
  logits = full_logits(model, [prompt], [[0]])[0][0]
  ref_V = np_truncated_logp(logits, temperature, 0, top_p)
  np.testing.assert_allclose(lps, ref_V[first], atol=1e-5)  # lp is log p of the drawn token
  p_V = np.exp(ref_V)
  assert np.all(p_V[first] > 0)
  counts = np.bincount(first, minlength=v)
  big = p_V * n >= 5  # merge rare categories into one bin (chi-square validity)
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(p_V[big], p_V[~big].sum()) * n
  keep = exp > 0
  assert stats.chisquare(obs[keep], exp[keep] * obs.sum() / exp[keep].sum()).pvalue > 1e-3


def test_two_level_draw_is_the_categorical_law():
  # 13 tokens in blocks of 4 (the last one short), one token with probability 0.
  p_V = np.array([8, 1, 0, 3, 5, 5, 2, 1, 9, 4, 6, 2, 7], np.float64)
  p_V /= p_V.sum()
  n = 20000
  logits = jnp.broadcast_to(jnp.log(jnp.asarray(p_V, jnp.float32)), (n, 13))
  tokens, logz = jax.jit(lambda k, x: draw(k, x, block=4))(
      jax.random.split(jax.random.key(2), n), logits)
  np.testing.assert_allclose(logz, 0.0, atol=1e-6)
  counts = np.bincount(np.asarray(tokens), minlength=13)
  assert counts[2] == 0
  keep = p_V > 0
  assert stats.chisquare(counts[keep], p_V[keep] * n).pvalue > 1e-3


def test_blocked_greedy_is_argmax():
  """sampling.greedy (block maxima, then the block) is jnp.argmax to the index:
  ties (the first wins), a short last block, -inf, NaN (counted as the maximum),
  rows where the maximum sits in the padding-adjacent block."""
  rng = np.random.default_rng(0)
  x = rng.integers(-3, 4, size=(200, 13)).astype(np.float32)  # many ties
  x[0] = -np.inf
  x[1, 12] = 9.0  # the short last block
  x[2, 5] = np.nan
  x[3, [2, 9]] = np.nan
  x[4, 3] = np.inf
  x[5, :] = 7.0
  for block in (1, 4, 5, 13, 64):
    got = jax.jit(lambda v, b=block: greedy(v, block=b))(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.argmax(jnp.asarray(x), -1)))
  wide = jnp.asarray(rng.standard_normal((8, 1000)), jnp.float32)
  np.testing.assert_array_equal(np.asarray(greedy(wide)), np.asarray(jnp.argmax(wide, -1)))


def test_sample_logits_extreme_logits_stay_finite():
  logits = jnp.asarray([[1e30, -1e30, 0.0, 5.0], [-jnp.inf, 0.0, -jnp.inf, 1.0],
                        [0.0, 0.0, 0.0, 0.0], [-1e30, -1e30, -1e30, -1e30]])
  keys = jax.random.split(jax.random.key(0), 4)
  for top_k, top_p in [(0, 1.0), (2, 0.5)]:
    toks, lps = jax.jit(sample_logits)(logits, keys, jnp.full((4,), 0.5), jnp.full((4,), top_k),
                                       jnp.full((4,), top_p))
    assert np.all(np.isfinite(np.asarray(lps))) and np.all(np.asarray(lps) <= 0)
    assert int(toks[0]) == 0 and int(toks[1]) in (1, 3)


def test_no_recompilation_within_bucket(sampler):
  """Calls in the same buckets (prompt length, new tokens, slots) and with the same
  number of samples G run the programs compiled for the first such call. G is
  part of the key: the pool holds one prompt block per prompt of a wave of
  slots plus one (`Sampler._generate`), so a new G compiles its programs once."""
  sampler.generate(PROMPTS, max_new_tokens=12, temperature=1.0, seed=0)
  # A call with top-k / top-p runs programs that have them (a call without runs
  # faster-compiling ones without): compiled once, then every knob is traced.
  sampler.generate(PROMPTS, max_new_tokens=12, temperature=1.0, top_p=0.5, seed=0)
  before = dict(sampler.engine.trace_counts)
  sampler.generate(PROMPTS[:2], max_new_tokens=9, temperature=0.5, top_k=4, seed=1)
  sampler.generate([[1, 2], [3], [4, 5, 6]], max_new_tokens=16, top_p=0.9, seed=2,
                   eos_ids=[7, 8])
  sampler.generate([[1] * 16], max_new_tokens=1, temperature=0.0)
  assert dict(sampler.engine.trace_counts) == before
  sampler.generate([[1] * 16], max_new_tokens=4, num_samples=2, temperature=0.0)
  before = dict(sampler.engine.trace_counts)  # G = 2 compiled (here or by an earlier test)
  sampler.generate([[5, 6, 7]], max_new_tokens=3, num_samples=2, temperature=0.7, seed=3)
  sampler.generate([[2] * 9, [3]], max_new_tokens=16, num_samples=2, temperature=0.0)
  assert dict(sampler.engine.trace_counts) == before


def test_stop_and_length_edge_cases(sampler):
  greedy = sampler.generate(PROMPTS, max_new_tokens=6, temperature=0.0)
  # EOS as the very first token.
  out = sampler.generate(PROMPTS[:1], max_new_tokens=6, temperature=0.0,
                         eos_ids=[greedy.tokens[0][0]])
  assert out.tokens == [greedy.tokens[0][:1]] and out.finish_reasons == ["stop"]
  np.testing.assert_array_equal(out.mask[0], [1, 0, 0, 0, 0, 0])
  # max_new_tokens = 1.
  out = sampler.generate(PROMPTS, max_new_tokens=1, temperature=0.0)
  assert out.tokens == [t[:1] for t in greedy.tokens]
  assert out.finish_reasons == ["length"] * 3 and list(out.lengths) == [1, 1, 1]
  # Every row stops early, each on its own third token or earlier.
  stops = {t[2] for t in greedy.tokens}
  out = sampler.generate(PROMPTS, max_new_tokens=6, temperature=0.0, eos_ids=sorted(stops))
  for toks, ref, reason in zip(out.tokens, greedy.tokens, out.finish_reasons):
    end = min(i for i, t in enumerate(ref) if t in stops)
    assert toks == ref[:end + 1] and reason == "stop"
  assert out.tokens_array.shape == (3, 6)


def test_prompt_errors(sampler):
  with pytest.raises(ValueError, match="empty"):
    sampler.generate([[1, 2], []], max_new_tokens=4)
  with pytest.raises(ValueError, match="max_prefill_length"):
    sampler.generate([[1] * 33], max_new_tokens=4)
  with pytest.raises(ValueError, match="max_new_tokens"):
    sampler.generate([[1]], max_new_tokens=33)
  with pytest.raises(ValueError, match="outside"):
    sampler.generate([[1, CFG.vocab_size]], max_new_tokens=4)


def test_weight_sync_changes_outputs_without_recompiling(model, sampler):
  kwargs = dict(max_new_tokens=10, temperature=0.8, num_samples=2, seed=7)
  before = sampler.generate(PROMPTS, **kwargs)
  old_params = sampler.params
  traces = dict(sampler.engine.trace_counts)
  other = make_model(seed=1)
  sampler.update_weights(other)
  after = sampler.generate(PROMPTS, **kwargs)
  assert dict(sampler.engine.trace_counts) == traces
  assert sampler.last_sync_seconds > 0
  assert after.tokens != before.tokens
  fresh = Sampler(other, max_prefill_length=32, max_decode_length=32).generate(PROMPTS, **kwargs)
  assert after.tokens == fresh.tokens
  np.testing.assert_array_equal(after.logprobs_array, fresh.logprobs_array)
  # Rolling back (docs/method.md §5): syncing the old weights restores outputs bitwise.
  sampler.update_weights(model)
  jax.tree.map(np.testing.assert_array_equal, sampler.params, old_params)
  again = sampler.generate(PROMPTS, **kwargs)
  assert again.tokens == before.tokens
  np.testing.assert_array_equal(again.logprobs_array, before.logprobs_array)


def test_a_call_draws_the_same_whatever_the_sampler_ran_before(model):
  """A call without top-k / top-p runs programs without them, so it draws
  the same tokens and log-probs, bitwise, before and after calls with them."""
  kwargs = dict(max_new_tokens=10, temperature=0.8, num_samples=2, seed=3)
  sampler = Sampler(model, max_prefill_length=32, max_decode_length=32)
  before = sampler.generate(PROMPTS, **kwargs)
  with pytest.warns(UserWarning, match="truncated"):
    sampler.generate(PROMPTS, top_k=5, **kwargs)
  after = sampler.generate(PROMPTS, **kwargs)
  assert after.tokens == before.tokens
  np.testing.assert_array_equal(after.logprobs_array, before.logprobs_array)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU compile options")
# The int8 cache's case in the extended tier: the claim is the compile options'.
@pytest.mark.parametrize("kv", [None, pytest.param("int8", marks=pytest.mark.extended)])
def test_cpu_compile_options_draw_the_same(model, kv):
  """On CPU the sampler's programs compile with XLA:CPU's loop emitters and less
  LLVM optimization (engine.Program, for the first call's time): the
  same tokens as the default compilation, and log-probs within float32
  rounding (LLVM at -O1 rounds some float sums differently: up to 2.4e-6
  apart, measured on this model over two seeds, three cache dtypes and three
  temperatures; the loop emitters alone were bitwise), with refills, greedy
  and sampled rows."""
  kwargs = dict(max_new_tokens=12, num_samples=2, seed=5)
  sampler = Sampler(model, max_prefill_length=32, max_decode_length=32, kv_cache_dtype=kv,
                    max_concurrent_decodes=4, min_slot_bucket=4)
  assert sampler.engine.cpu_compile
  runs = []
  for cpu_compile in (True, False):
    sampler.engine.cpu_compile = cpu_compile
    runs.append([sampler.generate(PROMPTS, temperature=t, **kwargs) for t in (0.8, 0.0)])
  for cpu, default in zip(*runs):
    assert cpu.tokens == default.tokens
    np.testing.assert_allclose(cpu.logprobs_array, default.logprobs_array, rtol=0, atol=1e-5)


def test_insert_without_truncation_refuses_a_truncating_request(model):
  sampler = Sampler(model, max_prefill_length=32, max_decode_length=32)
  engine = sampler.engine
  prefix = engine.prefill(sampler.params, np.ones((1, 8), np.int32), 8, top_p=0.9)
  state = engine.init_decode_state(num_slots=4, prefill_length=8, decode_length=8)
  with pytest.raises(ValueError, match="truncation=False"):
    engine.insert(prefix, state, [0], truncation=False)
