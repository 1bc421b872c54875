"""bench/gpu/xprof_table.py reads a CPU trace of a jitted program into kernel classes."""

import jax
import jax.numpy as jnp
import numpy as np

from bench.gpu import xprof_table


def _mlp(x_BTD, w_DF, w_FD, cache_SH, new_H):
  h_BTF = jax.nn.silu(jnp.einsum("BTD,DF->BTF", x_BTD, w_DF))
  out_BTD = jnp.einsum("BTF,FD->BTD", h_BTF, w_FD)
  return out_BTD, cache_SH.at[3].set(new_H).T


def test_a_cpu_trace_reduces_to_the_classes_of_its_instructions(tmp_path):
  rng = np.random.default_rng(0)
  args = [jnp.asarray(rng.normal(size=s), jnp.float32)
          for s in ((4, 3, 32), (32, 96), (96, 32), (64, 48), (48,))]
  fn = jax.jit(_mlp)
  compiled = fn.lower(*args).compile()
  hlo = xprof_table.Hlo(compiled.as_text())
  dots = [op for op in hlo.ops.values() if op.opcode == "dot"]
  groups = {xprof_table._matmul_group(hlo, op) for op in dots}  # pylint: disable=protected-access
  assert dots and groups <= {"MLP gate/up", "MLP down"}
  assert any(site[0] == "test_bench_profile.py" for op in dots for site in hlo.sites(op))
  jax.block_until_ready(compiled(*args))
  with jax.profiler.trace(str(tmp_path)):
    for _ in range(2):
      jax.block_until_ready(compiled(*args))
  table = xprof_table.reduce(xprof_table.xplane_file(str(tmp_path)), compiled.as_text(),
                             module="_mlp", steps=2)
  assert table["events"] > 0 and table["events_not_in_hlo"] == 0
  assert set(table["classes"]) == set(xprof_table.CLASSES)
  assert abs(sum(table["classes"].values()) - table["kernels_s"]) < 1e-9
  assert table["classes"]["MLP gate/up"] + table["classes"]["MLP down"] > 0
  text = xprof_table.markdown(table, step_s=table["kernels_s"], bound_s=1e-3,
                              class_bytes={"MLP down": 12288}, rate=1e9)
  assert "| MLP down |" in text and "kernels, sum" in text
