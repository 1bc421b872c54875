"""bench/probes/dot_libraries.py: the learner's dots it times, and the oneDNN option it
measures (docs/method.md keeps no formula here; these are the probe's own claims)."""

import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench.probes import dot_libraries


def test_the_learner_dots_at_tiny_have_the_shapes_of_its_projections_and_head():
  cases = {label: (eq, sa, sb) for label, eq, sa, sb in dot_libraries.dot_cases("tiny,moe")}
  t, d, f, v, c = 64 * 96, 256, 768, 8192, 64 * 95  # bench/perf/sampler.py's tiny, 64 x 96 tokens
  assert cases["tiny: up"][1:] == ((t, d), (d, f))
  assert cases["tiny: dw"] == ("td,tf->df", (t, d), (t, f))
  assert cases["tiny: head"] == ("cd,vd->cv", (c, d), (v, d))
  assert cases["moe: up"][1:] == ((2048, 128), (128, 256))  # bench/perf/moe.py's twin, 16 x 128
  assert cases["moe: dw"] == ("td,tf->df", (2048, 128), (2048, 256))
  assert cases["moe: head"][1:] == ((16 * 127, 128), (256, 128))  # 127 positions predict
  assert dot_libraries.flops("td,tf->df", (t, d), (t, f)) == 2 * t * d * f
  assert dot_libraries.flops("cd,vd->cv", (c, d), (v, d)) == 2 * c * d * v


@pytest.mark.skipif(platform.machine() != "x86_64", reason="oneDNN's XLA:CPU path is x86's")
def test_onednn_lone_dots_fire_and_agree_with_the_default_dots():
  rng = np.random.default_rng(0)
  a, b, c, d = (jnp.asarray(rng.standard_normal(s, dtype=np.float32))
                for s in ((96, 64), (48, 64), (96, 64), (48, 64)))
  fn = jax.jit(lambda a, b, c, d: a @ b.T + c @ d.T)  # the sum oneDNN's fused type aborts on
  onednn = fn.lower(a, b, c, d).compile(compiler_options=dot_libraries.ONEDNN_DOTS)
  assert onednn.as_text().count("__onednn_fusion") == 2  # each dot alone, the add left out
  np.testing.assert_allclose(np.asarray(onednn(a, b, c, d)), np.asarray(fn(a, b, c, d)),
                             rtol=1e-5, atol=1e-4)
