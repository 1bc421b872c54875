r"""Which jitted int4 dots XLA computes exactly, per shape, precision and workaround.

    python -m bench.probes.int4_dot_probe     # prints one line per (variant, shape)

A probe, not a bench: `x @ table.T` with integer inputs (every product and sum
exact in float32) and the int4 `table` converted inside the jitted program in
several ways, counted against numpy. On an H200 (jax 0.11.2) a float32
'highest' dot of an int4 -> float convert was wrong for tables of 61, 62, 63
rows and right for 64 or 88 (and for 1,001 x 1,024); converting to int8 behind
an optimization barrier was right everywhere: `quantized._int4_safe`. Output:
bench/results/h200/int4_dot_probe.txt (two runs: default precision, then
'highest').
"""
import jax, jax.numpy as jnp, numpy as np
rng = np.random.default_rng(1)
def check(name, f, table, x):
  got = np.asarray(jax.jit(f)(jnp.asarray(x), jnp.asarray(table, jnp.int4)))
  want = x @ table.astype(np.float32).T
  bad = int((got != want).sum())
  print(f"{name:28s} {str(table.shape):10s} bad {bad}/{want.size}", flush=True)
variants = {
  "f32": lambda a, t: a @ t.astype(jnp.float32).T,
  "s8->f32": lambda a, t: a @ t.astype(jnp.int8).astype(jnp.float32).T,
  "barrier s8": lambda a, t: a @ jax.lax.optimization_barrier(t.astype(jnp.int8)).astype(jnp.float32).T,
  "bf16": lambda a, t: (a.astype(jnp.bfloat16) @ t.astype(jnp.bfloat16).T).astype(jnp.float32),
  "dot_general TN": lambda a, t: jax.lax.dot_general(a, t.astype(jnp.float32), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32),
}
with jax.default_matmul_precision("highest"):
  for shape in [(61, 40), (62, 40), (64, 40), (61, 64), (63, 88), (64, 88), (88, 40), (1001, 1024)]:
    table = rng.integers(-8, 8, shape).astype(np.int8)
    x = rng.integers(-4, 5, (7, shape[1])).astype(np.float32)
    for name, f in variants.items():
      if name != "bf16":
        check(name, f, table, x)
