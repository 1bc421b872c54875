"""bench/perf/learner_profile.py: the FLOPs it reads off the compiled HLO, which its
estimate of Eigen's asynchronous dots divides by a rate (bench/README.md, "Where the
learner's time goes on a CPU")."""

import jax
import jax.numpy as jnp
import pytest

from bench.perf import learner_profile
from mipu_jax.models import moe


def test_each_plain_dot_counts_its_own_flops_not_those_before_it_in_its_computation():
  x, w1, w2 = jnp.ones((64, 32)), jnp.ones((32, 48)), jnp.ones((48, 16))
  fn = jax.jit(lambda x, w1, w2: jnp.tanh(x @ w1) @ w2)
  text = fn.lower(x, w1, w2).compile(compiler_options=moe.EIGEN_DOTS).as_text()
  instructions, _ = learner_profile._hlo_index(text)  # pylint: disable=protected-access
  dots = sorted(ins["flops"] for ins in instructions.values() if ins["op"] == "dot")
  assert dots == [2 * 64 * 48 * 16, 2 * 64 * 32 * 48]  # two plain dots in one computation


def test_a_dot_is_counted_once_whichever_library_runs_it():
  x, w = jnp.ones((64, 32)), jnp.ones((32, 48))
  for options in ({}, moe.EIGEN_DOTS):  # a library fusion calling the dot (x86), a plain dot
    text = jax.jit(lambda x, w: x @ w).lower(x, w).compile(compiler_options=options).as_text()
    instructions, _ = learner_profile._hlo_index(text)  # pylint: disable=protected-access
    counted = [ins["flops"] for ins in instructions.values()  # the ops the program runs
               if ins["computation"].startswith("main") and ins["flops"]]
    assert counted == [2 * 64 * 32 * 48], options


def test_categories_take_the_median_over_steps_a_missing_one_counting_zero():
  steps = [{"attention": 3.0, "scan": 1.0}, {"attention": 1.0}, {"attention": 2.0, "scan": 5.0}]
  assert learner_profile._median_counters(steps) == {"attention": 2.0, "scan": 1.0}  # pylint: disable=protected-access


def test_a_loop_counts_its_body_ops_not_its_own_span_over_them():
  x = jnp.ones((16, 16))
  fn = jax.jit(lambda x: jax.lax.fori_loop(0, 3, lambda i, y: jnp.sin(y) @ y, x))
  instructions, _ = learner_profile._hlo_index(fn.lower(x).compile().as_text())  # pylint: disable=protected-access
  loop = next(n for n, ins in instructions.items() if ins["op"] == "while")
  body = next(n for n, ins in instructions.items() if ins["op"] in ("dot", "fusion"))
  events = [{"ph": "X", "name": loop, "dur": 900.0}]  # microseconds, spanning the body's
  events += [{"ph": "X", "name": body, "dur": 250.0}] * 3
  seconds, calls = learner_profile.op_times(events, instructions)
  assert calls == {body: 3} and list(seconds) == [body]
  assert seconds[body] == pytest.approx(750e-6)


def test_a_top_op_line_takes_a_median_call_count():
  line = learner_profile.top_line("dot.1", 0.0021, 3.0, "f32[4,4]", "attention", "a.py:f:1")
  assert line.split()[:3] == ["2.1", "ms", "x3"]


def test_the_fused_kernel_and_ropes_gradient_fall_in_their_categories():
  """The FFI kernel's call and RoPE's custom gradient are attributed by their frames."""
  from mipu_jax.models import attention, cpu_attention, qwen3  # pylint: disable=g-import-not-at-top
  if cpu_attention._compiler() is None:  # pylint: disable=protected-access
    pytest.skip("no C++ compiler to build the kernel with")
  q = jnp.ones((1, 4, 2, 16))
  mask = attention.row_mask(jnp.ones((1, 4), bool))
  pos = jnp.broadcast_to(jnp.arange(4), (1, 4))

  def loss(q):
    q = qwen3.rope(q, pos, 1e4)
    return jnp.sum(attention.attend(q, q[:, :, :1], q[:, :, :1], mask, implementation="cpu_fused"))

  text = jax.jit(jax.grad(loss)).lower(q).compile().as_text()
  instructions, comp_ops = learner_profile._hlo_index(text)  # pylint: disable=protected-access
  cats = {}
  for ins in instructions.values():
    if ins["computation"].startswith("main"):
      cats.setdefault(ins["op"], set()).add(learner_profile._xla_category(ins, comp_ops))  # pylint: disable=protected-access
  assert cats["custom-call"] == {"attention"}
  fused = {learner_profile._xla_category(ins, comp_ops) for ins in instructions.values()  # pylint: disable=protected-access
           if ins["op"] == "fusion" and "concatenate" in comp_ops.get(ins["calls"], ())}
  assert "rope" in fused
