"""The Qwen3-MoE sparse block: top-k routing, dropless experts, routing replay (docs/method.md §7a).

A token's router logits `h W_router` (compute dtype) go through a float32
softmax over the E experts; the top k are its experts and their
probabilities its gate weights (renormalised to sum 1 when `norm_topk_prob`),
cast to the compute dtype, as Hugging Face's `Qwen3MoeTopKRouter`. Routing is
dropless: every (token, expert) pair is computed, there is no capacity. The
expert SwiGLUs run as one grouped matmul over the (token, slot) rows sorted by
expert: `jax.lax.ragged_dot` (XLA's / the TPU's grouped matmul), or on a CPU
the "blocked" form below.

Routing replay (R2 / R3, docs/method.md §7a): given forced expert ids, only the
indices are replaced; the gate weights are the live router softmax gathered at
them (renormalised when `norm_topk_prob`), so the router keeps its gradient.
Forced ids must lie in [0, E) (the model checks them where they are concrete).

Shape letters: n tokens (flattened B·T), E experts, k experts per token,
m = n·k routed rows, D hidden, F expert width, b blocks, s block rows.
"""

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from mipu_jax.models import quantized
from mipu_jax.models import sharding

BLOCK_ROWS = 128  # rows per block of the "blocked" grouped matmul (at most)
# From this size of one expert's weight matrix up, XLA:CPU runs the blocked matmul
# block by block (`_block_loop`); below it the per-block weight copies cost less
# than the loop (bench/README.md: at 256 x 256 float32 the loop is level for the
# learner's step and ahead when decoding).
LOOP_WEIGHT_BYTES = 256 * 1024
# XLA:CPU's dots by Eigen, not by the YNNPACK fusions jax 0.10.2 compiles lone dots
# into: those run a batched dot of small blocks on one thread, and single small dots
# faster than Eigen (bench/README.md, "YNNPACK's dots and Eigen's").
EIGEN_DOTS = {"xla_cpu_experimental_ynn_fusion_type": ""}
# The most layers for which the learner's differentiated MoE forward runs its layer
# scans unrolled on a CPU: beyond, compile time grows with every layer copied
# (bench/README.md, "The layer scan unrolled").
UNROLL_MAX_LAYERS = 4


class Routing(NamedTuple):
  """One MoE layer's routing of n tokens.

  Attributes:
    experts: int32 `[n, k]`, each token's expert ids (top-k order, or as forced).
    gates: `[n, k]` gate weights in the compute dtype.
    probs: float32 `[n, E]` router softmax (the load-balancing loss reads it).
  """

  experts: jax.Array
  gates: jax.Array
  probs: jax.Array


def route(x_nD: jax.Array, router_DE: jax.Array, k: int, norm_topk_prob: bool,
          forced_nk: Optional[jax.Array] = None) -> Routing:
  """Top-k routing of tokens `x_nD` (Hugging Face `Qwen3MoeTopKRouter`).

  `forced_nk` (int, -1 where none): replayed expert ids; a row with any id < 0
  keeps its own top-k (positions with no token, which no loss reads).
  """
  logits_nE = jnp.einsum("nD,DE->nE", x_nD, router_DE.astype(x_nD.dtype))
  probs_nE = jax.nn.softmax(logits_nE.astype(jnp.float32), axis=-1)
  top_nk, experts_nk = jax.lax.top_k(probs_nE, k)
  experts_nk = experts_nk.astype(jnp.int32)
  if forced_nk is not None:
    forced_nk = forced_nk.astype(jnp.int32)
    use = jnp.all(forced_nk >= 0, axis=-1, keepdims=True)
    experts_nk = jnp.where(use, forced_nk, experts_nk)
    top_nk = jnp.take_along_axis(probs_nE, experts_nk, axis=-1)
    # Slots in top-k order (probability down, then id): the order of the forced
    # slots does not matter, and a token's own routing replays bitwise.
    order = jnp.lexsort((experts_nk, -top_nk), axis=-1)
    experts_nk = jnp.take_along_axis(experts_nk, order, axis=-1)
    top_nk = jnp.take_along_axis(top_nk, order, axis=-1)
  if norm_topk_prob:
    top_nk = top_nk / jnp.sum(top_nk, axis=-1, keepdims=True)
  return Routing(experts_nk, top_nk.astype(x_nD.dtype), probs_nE)


def _dense_weight(w) -> jax.Array:
  """An expert weight `[E, I, O]` as a float array: a sampler's `QuantizedWeight`
  (`[E, O, I]` values and scales) dequantized; no maintained low-precision grouped
  matmul runs on XLA:CPU or GPU, so the experts' native dot is the dequantized one."""
  if isinstance(w, quantized.QuantizedWeight):
    return jnp.swapaxes(quantized.dequantize(w), -1, -2)
  return w


class _Layout(NamedTuple):
  """Where each routed (token, slot) row sits in the expert-sorted buffer.

  Rows are grouped by expert, each group padded to whole blocks of `rows`
  (1 for `ragged_dot`: no padding). `slot_m` is row m's place in the buffer (-1
  for an expert id E, another device's: it contributes zero), `src_p` the row
  at each place (-1 for padding); the two are inverse maps.
  """

  slot_m: jax.Array
  src_p: jax.Array
  sizes_E: jax.Array  # rows per expert group, padding included
  rows: int


def _block_rows(m: int, e: int) -> int:
  """Rows per block: `BLOCK_ROWS`, fewer when the m rows spread over e experts
  leave groups smaller than that (decoding), so padding stays below half."""
  r = BLOCK_ROWS
  while r > 8 and r * e > m:
    r //= 2
  return r


def _layout(experts_m: jax.Array, e: int, rows: int) -> _Layout:
  """Each row's rank within its expert by a cumulative count (no sort)."""
  m = experts_m.shape[0]
  onehot_mE = (experts_m[:, None] == jnp.arange(e, dtype=jnp.int32)[None]).astype(jnp.int32)
  counts_E = jnp.sum(onehot_mE, axis=0)
  rank_m = jnp.sum((jnp.cumsum(onehot_mE, axis=0) - 1) * onehot_mE, axis=1)
  sizes_E = (counts_E + rows - 1) // rows * rows
  start_E = jnp.cumsum(sizes_E) - sizes_E
  slot_m = jnp.where(experts_m < e, start_E[jnp.minimum(experts_m, e - 1)] + rank_m, -1)
  length = m if rows == 1 else (m // rows + e) * rows  # enough for any group sizes
  src_p = jnp.full((length,), -1, jnp.int32).at[jnp.where(slot_m < 0, length, slot_m)].set(
      jnp.arange(m, dtype=jnp.int32), mode="drop")  # (an index -1 would wrap around)
  return _Layout(slot_m, src_p, sizes_E.astype(jnp.int32), rows)


@jax.custom_vjp
def _take_rows(x_mD: jax.Array, src_p: jax.Array, slot_m: jax.Array) -> jax.Array:
  """`x[src_p]`, zero where `src_p` < 0. `slot_m` is the inverse map (row m's
  place, -1 if none), so the backward is a gather too: XLA:CPU's scatter-add,
  the default transpose of a gather, costs more than the experts' matmuls."""
  return jnp.where((src_p >= 0)[:, None], x_mD[jnp.maximum(src_p, 0)], 0).astype(x_mD.dtype)


def _take_rows_fwd(x_mD, src_p, slot_m):
  return _take_rows(x_mD, src_p, slot_m), (src_p, slot_m)


def _take_rows_bwd(res, g_pD):
  src_p, slot_m = res
  return _take_rows(g_pD, slot_m, src_p), None, None


_take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


def grouped_matmul(x_pI: jax.Array, w_EIO, layout: _Layout, impl: str) -> jax.Array:
  """`x · w[e]` for each group of rows in the expert-sorted buffer.

  "blocked": a dot per block of `layout.rows` rows that each belong to one
  expert, so the work is the routed rows' own (XLA:CPU lowers `ragged_dot` to
  a masked dot over all E): one batched dot over weights gathered per block,
  or on a CPU, for expert weights of `LOOP_WEIGHT_BYTES` and more, one block
  at a time (`_block_loop`). "ragged_dot": XLA's grouped matmul. Rows past
  the groups give zeros.
  """
  w_EIO = _dense_weight(w_EIO).astype(x_pI.dtype)
  if impl == "footprint":  # a memory plan's stand-in: the shapes, not the values
    return x_pI @ jnp.sum(w_EIO, axis=0)
  if impl == "ragged_dot":
    return jax.lax.ragged_dot(x_pI, w_EIO, layout.sizes_E)
  s, e = layout.rows, w_EIO.shape[0]
  nb = x_pI.shape[0] // s
  ends_E = jnp.cumsum(layout.sizes_E)
  block_expert = jnp.clip(jnp.searchsorted(ends_E, jnp.arange(nb, dtype=jnp.int32) * s,
                                           side="right"), 0, e - 1)
  x_bsI = x_pI.reshape(nb, s, -1)
  if jax.default_backend() == "cpu" and _loops(w_EIO.shape[1], w_EIO.shape[2], w_EIO.dtype):
    return _block_loop(x_bsI, w_EIO, block_expert).reshape(nb * s, -1)
  return _block_batched(x_bsI, w_EIO, block_expert).reshape(nb * s, -1)


def _loops(i: int, o: int, dtype) -> bool:
  """Whether XLA:CPU runs an `[I, O]` expert matrix block by block (`_block_loop`)."""
  return i * o * jnp.dtype(dtype).itemsize >= LOOP_WEIGHT_BYTES


def learner_compiler_options(cfg, platform: str, true_on_policy: bool = False) -> dict:
  """XLA options for the learner's programs on `platform` (`Learner` resolves them).

  `EIGEN_DOTS` on a CPU when `cfg`'s experts run as batched dots of blocks
  (`_block_batched`: the blocked form below `LOOP_WEIGHT_BYTES`), which then take
  less time; the updates move within float rounding. Else jax's defaults, which are
  level or faster for the block loop's single dots, dense models and decoding (so the
  sampler keeps them); in the true on-policy mode the learner compiles as the sampler
  does (docs/method.md §7, §7a). A model with dense layers too takes the MoE's choice
  for its whole program. Measured: bench/README.md, "YNNPACK's dots and Eigen's".
  """
  if (platform != "cpu" or jax.default_backend() != "cpu" or true_on_policy
      or not cfg.is_moe or cfg.moe_impl not in ("auto", "blocked")):
    return {}
  return {} if _loops(cfg.hidden_size, cfg.moe_intermediate_size, cfg.dtype) else dict(EIGEN_DOTS)


def learner_unroll_layers(cfg, platform: str, true_on_policy: bool = False) -> bool:
  """Whether the learner's step runs `cfg`'s layer scans unrolled on `platform`
  (`Qwen3.__call__`'s `unroll_layers`; `Learner` resolves it).

  On a CPU, for an MoE of at most `UNROLL_MAX_LAYERS` layers: XLA:CPU's layer scan
  zero-fills and copies `[L, ...]` stacks of the residuals the backward pass reads,
  which an unrolled forward does not have, and at so few layers the unrolled program
  compiles nearly as fast. Only the step's differentiated forward: the forward-only
  recompute is faster as a scan. Dense models keep the scan (their programs and bits
  unchanged), as do the true on-policy mode (the learner compiles as the sampler does;
  docs/method.md §7) and accelerators. Measured: bench/README.md, "The layer scan
  unrolled".
  """
  return (platform == "cpu" and not true_on_policy and cfg.is_moe
          and cfg.num_layers <= UNROLL_MAX_LAYERS)


def _block_batched(x_bsI: jax.Array, w_EIO: jax.Array, expert_b: jax.Array) -> jax.Array:
  """`x[b] · w[expert_b[b]]` as one batched dot over weights gathered per block:
  on an accelerator (many small dots in turn would leave it idle), and on a CPU
  where the gathered weights are small."""
  return jnp.einsum("bsI,bIO->bsO", x_bsI, w_EIO[expert_b])


@jax.custom_vjp
def _block_loop(x_bsI: jax.Array, w_EIO: jax.Array, expert_b: jax.Array) -> jax.Array:
  """`x[b] · w[expert_b[b]]` for each block b, one block at a time: indexing
  the expert's weight in a loop reads it in place, where a batched dot needs a
  `[b, I, O]` copy of the gathered weights, which the backward also keeps and
  scatter-adds into; on XLA:CPU those copies cost more than the loop for
  large weights (bench/README.md, "Mixture of experts")."""
  def block(_, xs):
    x_sI, e = xs
    return None, x_sI @ jax.lax.dynamic_index_in_dim(w_EIO, e, keepdims=False)
  return jax.lax.scan(block, None, (x_bsI, expert_b))[1]


def _block_loop_fwd(x_bsI, w_EIO, expert_b):
  return _block_loop(x_bsI, w_EIO, expert_b), (x_bsI, w_EIO, expert_b)


def _block_loop_bwd(res, g_bsO):
  """The rows' gradient block by block, and each expert's weight gradient summed
  in place over its blocks (in float32, cast back once)."""
  x_bsI, w_EIO, expert_b = res

  def block(g_EIO, xs):
    x_sI, g_sO, e = xs
    w_IO = jax.lax.dynamic_index_in_dim(w_EIO, e, keepdims=False)
    g_IO = jax.lax.dynamic_index_in_dim(g_EIO, e, keepdims=False)
    g_IO = g_IO + jnp.matmul(x_sI.T, g_sO, preferred_element_type=jnp.float32)
    return jax.lax.dynamic_update_index_in_dim(g_EIO, g_IO, e, 0), g_sO @ w_IO.T

  g_EIO, g_bsI = jax.lax.scan(block, jnp.zeros(w_EIO.shape, jnp.float32),
                              (x_bsI, g_bsO, expert_b))
  return g_bsI, g_EIO.astype(w_EIO.dtype), None


_block_loop.defvjp(_block_loop_fwd, _block_loop_bwd)


def experts_mlp(h_nD: jax.Array, hq_nD: jax.Array, routing: Routing, w: dict,
                act_quant: Optional[Callable], impl: str) -> jax.Array:
  """Dropless experts: each token's k SwiGLUs, weighted by its gates and summed.

  The (token, slot) rows move once into the expert-sorted buffer, run the
  three grouped matmuls there and move back (`_take_rows`). `hq_nD` is `h_nD`
  after the sampler's activation quantizer (or `h_nD`); the experts' down
  projection sees its input quantized the same way. An expert id equal to E
  (the weights' expert count: a slot another device computes,
  `experts_on_mesh`) contributes zero.
  """
  n, k = routing.experts.shape
  e = w["experts_gate"].shape[0]
  if impl == "auto":
    impl = "blocked" if jax.default_backend() == "cpu" else "ragged_dot"
  rows = _block_rows(n * k, e) if impl == "blocked" else 1
  layout = _layout(routing.experts.reshape(-1), e, rows)
  x_pD = _take_rows(jnp.repeat(hq_nD, k, axis=0), layout.src_p, layout.slot_m)
  gate_pF = grouped_matmul(x_pD, w["experts_gate"], layout, impl)
  up_pF = grouped_matmul(x_pD, w["experts_up"], layout, impl)
  act_pF = jax.nn.silu(gate_pF) * up_pF
  if act_quant is not None:
    act_pF = act_quant(act_pF[None])[0]
  y_pD = grouped_matmul(act_pF, w["experts_down"], layout, impl)
  y_nkD = _take_rows(y_pD, layout.slot_m, layout.src_p).reshape(n, k, -1)
  return jnp.sum(y_nkD * routing.gates[..., None].astype(y_nkD.dtype), axis=1).astype(
      h_nD.dtype)


def experts_on_mesh(h_BTD: jax.Array, hq_BTD: jax.Array, experts_BTk: jax.Array,
                    gates_BTk: jax.Array, w: dict, act_quant: Optional[Callable],
                    impl: str) -> jax.Array:
  """`experts_mlp` on `[B, T, D]`, split over the active mesh (expert parallelism).

  Under a mesh (`jax.set_mesh`, as the learner and the sampler trace) whose row
  axes (`sharding.ROWS`) divide B, each device runs `shard_map` on its own rows.
  Without an `expert` axis it holds every expert (the fsdp / tensor shards
  all-gathered per layer, ZeRO-3) and computes its tokens' slots. With one of
  size N it holds E / N experts, and the N devices along the axis pass their
  token blocks around a ring: at each of N steps a device computes, for the
  block it holds, only the slots routed to its own experts, adds them to the
  block's float32 sum and hands block and sum to the next device, so after N
  steps every block is home with all its k slots summed. Dropless (no
  capacity, no token dropped), the one-device sum up to its order, and each
  device holds one block's slots at a time (an all-gather of the N blocks
  would hold N times as many). Left to itself, XLA's partitioner cannot split
  the block's sort over sharded tokens: it would gather every token onto every
  device. Elsewhere (no mesh, inside a `shard_map` already, rows the mesh does
  not divide) the plain `experts_mlp`.
  """
  w = {name: w[name] for name in ("experts_gate", "experts_up", "experts_down")}

  def run(h_bTD, hq_bTD, experts_bTk, gates_bTk, w):
    flat = lambda x: x.reshape(-1, x.shape[-1])
    routing = Routing(flat(experts_bTk), flat(gates_bTk), None)
    out = experts_mlp(flat(h_bTD), flat(hq_bTD), routing, w, act_quant, impl)
    return out.reshape(h_bTD.shape)

  mesh = jax.sharding.get_abstract_mesh()
  rows = sharding.split_axes(mesh)
  if not rows or h_BTD.shape[0] % sharding.row_shards(mesh):
    return run(h_BTD, hq_BTD, experts_BTk, gates_BTk, w)
  ep = sharding.expert_shards(mesh)

  def local(h_bTD, hq_bTD, experts_bTk, gates_bTk, w):
    if ep == 1:
      return run(h_bTD, hq_bTD, experts_bTk, gates_bTk, w)
    e_local = w["experts_gate"].shape[0]
    first = jax.lax.axis_index("expert") * e_local
    ring = [(i, (i + 1) % ep) for i in range(ep)]

    def visit(block, _):  # this device's experts on the block it holds; pass it on
      hq_bTD, experts_bTk, gates_bTk, sum_bTD = block
      mine = (experts_bTk >= first) & (experts_bTk < first + e_local)
      out = run(hq_bTD, hq_bTD, jnp.where(mine, experts_bTk - first, e_local),  # E: not mine
                jnp.where(mine, gates_bTk, jnp.zeros_like(gates_bTk)), w)
      block = (hq_bTD, experts_bTk, gates_bTk, sum_bTD + out.astype(jnp.float32))
      return jax.tree.map(lambda x: jax.lax.ppermute(x, "expert", ring), block), None

    # Checkpointed: the backward keeps the N blocks, not N blocks' expert activations.
    block = (hq_bTD, experts_bTk, gates_bTk, jnp.zeros(hq_bTD.shape, jnp.float32))
    (_, _, _, sum_bTD), _ = jax.lax.scan(jax.checkpoint(visit), block, None, length=ep)
    return sum_bTD.astype(h_bTD.dtype)

  spec = jax.sharding.PartitionSpec
  w_spec = jax.tree.map(lambda _: spec("expert") if ep > 1 else spec(), w)
  return jax.shard_map(local, mesh=mesh, in_specs=(spec(rows),) * 4 + (w_spec,),
                       out_specs=spec(rows), check_vma=False)(
                           h_BTD, hq_BTD, experts_BTk, gates_BTk, w)


def experts_mlp_per_token(h_nD: jax.Array, routing: Routing, w: dict) -> jax.Array:
  """The experts as one `[D] x [D, F]` product per (token, slot) with the slot's
  expert weights gathered: no row shares a dot with another, so a token's bits
  do not depend on its batch (the true on-policy mode, docs/method.md §7)."""
  gather = lambda name: _dense_weight(w[name]).astype(h_nD.dtype)[routing.experts]
  gate_nkF = jnp.einsum("nD,nkDF->nkF", h_nD, gather("experts_gate"))
  up_nkF = jnp.einsum("nD,nkDF->nkF", h_nD, gather("experts_up"))
  y_nkD = jnp.einsum("nkF,nkFD->nkD", jax.nn.silu(gate_nkF) * up_nkF, gather("experts_down"))
  return jnp.sum(y_nkD * routing.gates[..., None].astype(y_nkD.dtype), axis=1).astype(
      h_nD.dtype)


def experts_mlp_reference(h_nD: jax.Array, routing: Routing, w: dict) -> jax.Array:
  """Every expert on every token, weighted by a dense `[n, E]` gate matrix (zero
  off the token's k): the test reference, E/k times the work."""
  e = w["experts_gate"].shape[0]
  dense_nE = jnp.zeros((h_nD.shape[0], e), routing.gates.dtype)
  dense_nE = dense_nE.at[jnp.arange(h_nD.shape[0])[:, None], routing.experts].add(routing.gates)
  wf = lambda name: _dense_weight(w[name]).astype(h_nD.dtype)
  gate_nEF = jnp.einsum("nD,EDF->nEF", h_nD, wf("experts_gate"))
  up_nEF = jnp.einsum("nD,EDF->nEF", h_nD, wf("experts_up"))
  y_nED = jnp.einsum("nEF,EFD->nED", jax.nn.silu(gate_nEF) * up_nEF, wf("experts_down"))
  return jnp.einsum("nED,nE->nD", y_nED, dense_nE.astype(y_nED.dtype))


class LayerStats(NamedTuple):
  """Per-layer routing statistics over the real tokens (float32).

  Attributes:
    load: `[E]` fraction of the routed (token, slot) pairs each expert got.
    mean_prob: `[E]` mean router probability per expert (differentiable).
  """

  load: jax.Array
  mean_prob: jax.Array


def layer_stats(routing: Routing, mask_n: jax.Array) -> LayerStats:
  e = routing.probs.shape[-1]
  m = mask_n.astype(jnp.float32)
  count_E = jnp.zeros((e,), jnp.float32).at[routing.experts].add(
      jnp.broadcast_to(m[:, None], routing.experts.shape))
  real = jnp.maximum(jnp.sum(m), 1.0)
  load = count_E / (real * routing.experts.shape[-1])
  mean_prob = jnp.sum(routing.probs * m[:, None], axis=0) / real
  return LayerStats(load, mean_prob)


def load_balancing_loss(stats: LayerStats) -> jax.Array:
  """Switch-Transformer load-balancing loss `E · Σ_e load_e · mean_prob_e`, mean
  over MoE layers (`stats` stacked `[L_moe, E]`); 1 at a uniform routing
  (docs/method.md §7a). Only `mean_prob` carries a gradient, as in the sources."""
  e = stats.load.shape[-1]
  per_layer = e * jnp.sum(jax.lax.stop_gradient(stats.load) * stats.mean_prob, axis=-1)
  return jnp.mean(per_layer)


def moe_block(cfg, h_BTD: jax.Array, hq_BTD: jax.Array, w: dict, act_quant,
              mask_BT: jax.Array, forced_BTk: Optional[jax.Array], per_token: bool = False):
  """The sparse MoE block of one layer on `[B, T, D]`.

  Returns `(out_BTD, experts_BTk, stats)`; `experts_BTk` is -1 where `mask_BT`
  is 0. `per_token`: `experts_mlp_per_token` (the true on-policy mode).
  """
  b, t, d = h_BTD.shape
  k = cfg.num_experts_per_tok
  forced = None if forced_BTk is None else forced_BTk.reshape(b * t, k)
  routing = route(h_BTD.reshape(b * t, d), w["router"], k, cfg.norm_topk_prob, forced)
  if per_token:
    out = experts_mlp_per_token(hq_BTD.reshape(b * t, d), routing, w)
  else:
    out = experts_on_mesh(h_BTD, hq_BTD, routing.experts.reshape(b, t, k),
                          routing.gates.reshape(b, t, k), w, act_quant, cfg.moe_impl)
  mask_n = mask_BT.reshape(b * t)
  experts = jnp.where(mask_n[:, None], routing.experts, -1).reshape(b, t, k)
  return out.reshape(b, t, d), experts, layer_stats(routing, mask_n)


def routing_mismatch(mu_BTLk, pi_BTLk, mask_BT) -> dict[str, float]:
  """Host metrics of how differently the sampler (μ) and the learner (π) routed
  the same tokens (docs/method.md §7a), over the tokens where `mask_BT` is set
  and both routings exist (ids ≥ 0); numpy in, floats out.

  `moe/routing_flip_rate`: share of (token, MoE layer) pairs whose top-k expert
  sets differ (the R3 paper's per-decision rate); `moe/token_flip_rate`: share
  of tokens that differ in at least one layer; `moe/routing_flip_rate_layer{j}`
  per MoE layer; `moe/expert_load_max_over_mean`: the learner's busiest expert
  over the mean, averaged over layers (1 is perfectly balanced).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  mu, pi = np.sort(np.asarray(mu_BTLk), -1), np.sort(np.asarray(pi_BTLk), -1)
  valid = (np.asarray(mask_BT) > 0) & (mu >= 0).all((-1, -2)) & (pi >= 0).all((-1, -2))
  out: dict[str, float] = {}
  if not valid.any():
    return out
  flip_NL = (mu[valid] != pi[valid]).any(-1)  # [N tokens, L_moe]
  out["moe/routing_flip_rate"] = float(flip_NL.mean())
  out["moe/token_flip_rate"] = float(flip_NL.any(-1).mean())
  for j in range(flip_NL.shape[1]):
    out[f"moe/routing_flip_rate_layer{j}"] = float(flip_NL[:, j].mean())
  experts = int(max(pi.max(), mu.max())) + 1
  loads = [np.bincount(pi[valid][:, j].ravel(), minlength=experts)
           for j in range(pi.shape[2])]
  out["moe/expert_load_max_over_mean"] = float(np.mean([l.max() / l.mean() for l in loads]))
  return out
