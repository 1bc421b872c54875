"""The JetStream-style engine, driven slot by slot, agrees with `Sampler.generate`."""

import importlib.util
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mipu_jax.models import kv_cache, sharding
from mipu_jax.sampler import JetStreamEngine, ResultTokens, Sampler
from mipu_jax.sampler import jetstream
from test_sampler import PROMPTS, make_model


@pytest.fixture(scope="module")
def sampler():
  return Sampler(make_model(), max_prefill_length=32, max_decode_length=32)


def _right_padded(prompt, width=16):
  tokens = np.zeros((width,), np.int32)
  tokens[:len(prompt)] = prompt
  return tokens


def _drain(engine, params, ds, slots, got, max_steps=40):
  """Calls `generate` until no slot produces a token, appending each slot's output."""
  for _ in range(max_steps):
    ds, result = engine.generate(params, ds)
    result = result.convert_to_numpy()
    if not result.data[:, result.valid_idx[0]].any():
      return ds
    for slot in slots:
      one = result.get_result_at_slot(slot)
      if one.valid[0, 0]:
        got[slot][0].append(int(one.tokens[0, 0]))
        got[slot][1].append(float(one.log_prob[0, 0]))
  raise AssertionError("decode did not finish")


def test_engine_slot_by_slot_matches_sampler(sampler):
  engine, params = JetStreamEngine(sampler.engine), sampler.params
  ref = sampler.generate(PROMPTS, max_new_tokens=6, temperature=0.9, seed=4)
  ds = engine.init_decode_state(num_slots=8, prefill_length=16, decode_length=16)
  slots, got = [5, 0, 3], {}
  for i, (prompt, slot) in enumerate(zip(PROMPTS, slots)):
    prefix, first = engine.prefill(params=params, padded_tokens=_right_padded(prompt),
                                   true_length=len(prompt), temperature=0.9, max_new_tokens=6,
                                   rng=jax.random.fold_in(jax.random.key(4), i)[None])
    one = first.get_result_at_slot(0)
    got[slot] = ([int(one.tokens[0, 0])], [float(one.log_prob[0, 0])])
    ds = engine.insert(prefix, ds, slot)
  ds = _drain(engine, params, ds, slots, got)
  for i, slot in enumerate(slots):
    assert got[slot][0] == ref.tokens[i]
    np.testing.assert_allclose(got[slot][1], ref.logprobs[i], atol=1e-5)

  # Continuous batching: a new request in a freed slot restarts that slot's
  # row (its length back to its prompt's, room for its whole budget);
  # nothing of the slot's previous occupant may leak into it.
  engine.free_resource(0)
  new_prompt = [9, 8, 7, 6]
  ref_new = sampler.generate([new_prompt], max_new_tokens=10, temperature=0.9, seed=9)
  prefix, first = engine.prefill(params=params, padded_tokens=_right_padded(new_prompt),
                                 true_length=4, temperature=0.9, max_new_tokens=10,
                                 rng=jax.random.fold_in(jax.random.key(9), 0)[None])
  got = {0: ([int(first.data[0, 0])], [float(first.log_prob[0, 0])])}
  ds = _drain(engine, params, engine.insert(prefix, ds, 0), [0], got)
  assert got[0][0] == ref_new.tokens[0]
  np.testing.assert_allclose(got[0][1], ref_new.logprobs[0], atol=1e-5)


def test_bulk_insert_draws_independent_samples(sampler):
  engine, params = JetStreamEngine(sampler.engine), sampler.params
  ref = sampler.generate(PROMPTS[1:2], max_new_tokens=1, num_samples=3, temperature=2.0, seed=6)
  prefix, first = engine.prefill(params=params, padded_tokens=_right_padded(PROMPTS[1]),
                                 true_length=len(PROMPTS[1]), temperature=2.0,
                                 rng=jax.random.fold_in(jax.random.key(6), 0)[None])
  ds = engine.init_decode_state(num_slots=8, prefill_length=16, decode_length=16)
  ds = engine.bulk_insert(prefix, ds, [2, 4, 6])
  np.testing.assert_array_equal(np.asarray(ds.tokens_BN)[[2, 4, 6], 0],
                                [t[0] for t in ref.tokens])
  assert int(first.data[0, 0]) == ref.tokens[0][0]  # prefill's token is sample 0


def test_generate_until_done_stops_when_every_slot_has_finished(sampler):
  greedy = sampler.generate(PROMPTS, max_new_tokens=12, temperature=0.0)
  stop = greedy.tokens[1][4]
  engine, params = JetStreamEngine(sampler.engine), sampler.params
  tokens = np.stack([_right_padded(p) for p in PROMPTS] + [_right_padded([1])] * 5)
  prefix, _ = engine.prefill(params=params, padded_tokens=tokens,
                             true_length=[len(p) for p in PROMPTS] + [1] * 5, temperature=0.0,
                             max_new_tokens=12, rng=jax.random.key(0))
  ds = engine.init_decode_state(num_slots=8, prefill_length=16, decode_length=16,
                                stop_ids=[stop])
  ds = engine.bulk_insert(prefix, ds, [0, 1, 2, 8, 8, 8, 8, 8], rows=[0, 1, 2, 0, 0, 0, 0, 0],
                          sample_ids=[0] * 8)
  ds = sampler.engine.generate_until_done(params, ds)
  lengths = np.asarray(ds.num_generated_B)[:3]
  assert lengths[1] <= 5 and np.asarray(ds.tokens_BN)[1, lengths[1] - 1] == stop
  # One cache slot per decode step of each row, after its prompt: every row
  # stopped writing when it finished (its own length).
  prompt_lengths = np.array([len(p) for p in PROMPTS])
  np.testing.assert_array_equal(np.asarray(ds.cache.index)[:3], prompt_lengths + lengths - 1)
  assert not np.asarray(ds.active_B)[3:].any()


def test_samples_share_full_prompt_pages_and_copy_the_partial_one():
  """Four samples of an 11-token prompt in pages of 4 slots: their page
  tables point at the prompt block's two full pages, each at its own copy of
  the third (partly filled) page, and every row reads back the prefill's K/V
  at slots [0, 11). The pool holds one block of prompt pages and each slot's
  own pages (generation + one): 4 + 4 x 5 = 24 pages per layer, not 4 x 8.
  Decoding from the shared block draws bitwise what a block per sample does."""
  sampler = Sampler(make_model(), max_prefill_length=16, max_decode_length=16, page_size=4)
  engine, params = sampler.engine, sampler.params
  prompt = PROMPTS[2]
  prefix = engine.prefill(params, _right_padded(prompt)[None], [len(prompt)], temperature=0.9,
                          rng=jax.random.key(1))
  shared = engine.init_decode_state(num_slots=4, prefill_length=16, decode_length=16,
                                    prompt_blocks=1)
  layers = engine.model_config.num_layers
  assert shared.cache.k.shape[1] == layers * (4 + 4 * 5)
  shared = engine.insert(prefix, shared, [0, 1, 2, 3], rows=[0] * 4, sample_ids=[0, 1, 2, 3],
                         prompt_blocks=[0] * 4, fill=[True, False, False, False])
  pages = np.asarray(shared.cache.pages)
  assert (pages[:, :2] == pages[:1, :2]).all() and len(set(pages[:, 2])) == 4
  np.testing.assert_array_equal(np.asarray(shared.cache.index), len(prompt))
  want = np.asarray(kv_cache.logical_view(prefix.cache.k, prefix.cache.k_scale,
                                          prefix.cache.pages, jnp.float32))[0, :len(prompt)]
  for row in range(4):  # layer 0: page ids without an offset
    got = np.asarray(kv_cache.logical_view(shared.cache.k, shared.cache.k_scale,
                                           shared.cache.pages[row:row + 1], jnp.float32))
    np.testing.assert_array_equal(got[0, :len(prompt)], want)
  own = engine.init_decode_state(num_slots=4, prefill_length=16, decode_length=16)
  own = engine.insert(prefix, own, [0, 1, 2, 3], rows=[0] * 4, sample_ids=[0, 1, 2, 3])
  shared = engine.generate_until_done(params, shared)
  own = engine.generate_until_done(params, own)
  np.testing.assert_array_equal(np.asarray(shared.tokens_BN), np.asarray(own.tokens_BN))
  np.testing.assert_array_equal(np.asarray(shared.logprobs_BN), np.asarray(own.logprobs_BN))


@pytest.mark.extended
def test_on_a_pod_each_row_pages_are_in_its_device_part():
  """On the 8-device mesh (4 row shards) the pool has a part per row shard
  (kv_cache.py): 8 samples of a prompt in 8 slots, a prompt block in each
  slot's part (the first sample there fills it), and every row's pages are
  in its part, holding the prefill's K/V. Sharing a block per part decodes
  bitwise what a block per sample does. A block in another part, or slots
  that do not split over the shards, are errors."""
  mesh = sharding.make_mesh(2, 2, 2)
  sampler = Sampler(make_model(), mesh=mesh, max_prefill_length=16, max_decode_length=16,
                    page_size=4)
  engine, params = sampler.engine, sampler.params
  assert engine.pool_parts == 4
  prompt = PROMPTS[2]
  prefix = engine.prefill(params, _right_padded(prompt)[None], [len(prompt)], temperature=0.9,
                          rng=jax.random.key(1))
  slots, part = list(range(8)), [b // 2 for b in range(8)]
  shared = engine.init_decode_state(num_slots=8, prefill_length=16, decode_length=16,
                                    prompt_blocks=4)
  layers = engine.model_config.num_layers
  per_part = layers * (1 * 4 + 2 * 5)  # a block of 4 pages, 2 slots' 5 own pages, each layer
  assert shared.cache.k.shape[1] == 4 * per_part
  assert shared.cache.k.addressable_shards[0].data.shape[1] == per_part
  shared = engine.insert(prefix, shared, slots, rows=[0] * 8, sample_ids=slots,
                         prompt_blocks=part, fill=[b % 2 == 0 for b in slots])
  pages = np.asarray(shared.cache.pages)
  np.testing.assert_array_equal(pages // per_part, np.broadcast_to(np.asarray(part)[:, None],
                                                                  pages.shape))
  want = np.asarray(kv_cache.logical_view(prefix.cache.k, prefix.cache.k_scale,
                                          prefix.cache.pages, jnp.float32))[0, :len(prompt)]
  got = np.asarray(kv_cache.logical_view(shared.cache.k, shared.cache.k_scale,
                                         shared.cache.pages, jnp.float32))[:, :len(prompt)]
  np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))
  own = engine.init_decode_state(num_slots=8, prefill_length=16, decode_length=16)
  own = engine.insert(prefix, own, slots, rows=[0] * 8, sample_ids=slots)
  shared = engine.generate_until_done(params, shared)
  own = engine.generate_until_done(params, own)
  np.testing.assert_array_equal(np.asarray(shared.tokens_BN), np.asarray(own.tokens_BN))
  np.testing.assert_array_equal(np.asarray(shared.logprobs_BN), np.asarray(own.logprobs_BN))
  with pytest.raises(ValueError, match="on its row's device"):
    engine.insert(prefix, engine.init_decode_state(num_slots=8, prefill_length=16,
                                                   decode_length=16, prompt_blocks=4),
                  [2], prompt_blocks=[0])
  with pytest.raises(ValueError, match="multiples of 4"):
    engine.init_decode_state(num_slots=6, prefill_length=16, decode_length=16)
  with pytest.raises(ValueError, match="multiple of the mesh's 4 row shards"):
    Sampler(make_model(), mesh=mesh, max_concurrent_decodes=6)


def test_result_tokens_carry_log_prob_through_slot_access():
  result = ResultTokens.from_step(np.array([4, 5, 6]), np.array([1, 0, 1]),
                                  np.array([2, 2, 3]), np.array([-0.5, 0.0, -1.5]))
  assert len(jax.tree.leaves(result)) == 2  # data and log_prob are pytree leaves
  one = result.convert_to_numpy().get_result_at_slot(2)
  assert one.tokens[0, 0] == 6 and one.valid[0, 0] == 1 and one.lengths[0] == 3
  np.testing.assert_allclose(one.log_prob, [[-1.5]])
  many = result.get_result_at_slots([0, 2])
  np.testing.assert_allclose(many.log_prob[:, 0], [-0.5, -1.5])


def test_jetstream_signatures():
  prefill = inspect.signature(JetStreamEngine.prefill).parameters
  for name in ("params", "existing_prefix", "padded_tokens", "true_length", "sampler",
               "request_id"):
    assert prefill[name].kind is inspect.Parameter.KEYWORD_ONLY
  assert list(inspect.signature(JetStreamEngine.insert).parameters)[1:] == [
      "prefix", "decode_state", "slot", "request_id"]
  assert list(inspect.signature(JetStreamEngine.generate).parameters)[1:] == [
      "params", "decode_state", "sampler"]
  for prop in ("max_concurrent_decodes", "samples_per_slot", "max_prefill_length", "mesh",
               "colocated_cpus", "use_chunked_prefill", "prefill_chunk_size"):
    assert isinstance(getattr(JetStreamEngine, prop), property)
  assert jetstream.JETSTREAM_REGISTERED == (importlib.util.find_spec("jetstream") is not None)


def test_engine_errors(sampler):
  engine, params = JetStreamEngine(sampler.engine), sampler.params
  kwargs = dict(params=params, padded_tokens=_right_padded([1, 2]))
  with pytest.raises(ValueError, match="Empty prompt"):
    engine.prefill(true_length=0, **kwargs)
  with pytest.raises(NotImplementedError, match="Chunked"):
    engine.prefill(true_length=2, existing_prefix=object(), **kwargs)
  with pytest.raises(NotImplementedError, match="log-prob"):
    engine.prefill(true_length=2, sampler=lambda x: x, **kwargs)
  with pytest.raises(ValueError, match="max_prefill_length"):
    engine.prefill(params=params, padded_tokens=np.zeros((64,), np.int32), true_length=3)
  prefix, _ = jax.eval_shape(lambda: engine.prefill(  # shapes only: no compile needed
      params=params, padded_tokens=np.ones((32,), np.int32), true_length=20))
  ds = engine.init_decode_state(num_slots=8, prefill_length=16, decode_length=16)
  with pytest.raises(ValueError, match="prefill region"):
    engine.insert(prefix, ds, 0)


def test_jetstream_catch_all_arguments_are_rejected(sampler):
  # JetStream declares `*args, **kwargs` on these two; a misspelt keyword must
  # not be swallowed silently.
  engine = JetStreamEngine(sampler.engine)
  with pytest.raises(TypeError, match="load_params"):
    engine.load_params(None, "extra")
  with pytest.raises(TypeError, match="load_params"):
    engine.load_params(dtype="bfloat16")
  with pytest.raises(TypeError, match="init_decode_state"):
    engine.init_decode_state(8)
  with pytest.raises(TypeError, match="init_decode_state"):
    engine.init_decode_state(num_slots=8, max_slots=8)


def test_load_params_reshards_to_the_sampling_layout():
  mesh = sharding.make_mesh(data=1, fsdp=-1, tensor=2)
  model = make_model()
  params = Sampler(model, mesh=mesh, weight_quant="int8", max_prefill_length=32,
                   max_decode_length=32).params
  for name, x in params["layers"].items():
    spec = sharding.spec_for(f"layers/{name}", x.shape, mesh, layout="sampling")
    assert x.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, spec), x.ndim), name
    assert "fsdp" not in str(x.sharding.spec)  # decode never all-gathers weights
