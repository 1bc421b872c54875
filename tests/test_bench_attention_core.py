"""bench/probes/attention_core.py: the head-major layout it times is the learner's
attention core with another operand layout (models/attention.py's `_dense`)."""

import jax.numpy as jnp
import numpy as np

from bench.probes import attention_core
from mipu_jax.models import attention


def test_the_head_major_layout_computes_the_dense_core():
  rng = np.random.default_rng(0)
  b, t, kh, qh, h = 2, 12, 2, 3, 8
  q = jnp.asarray(rng.standard_normal((b, t, kh, qh, h), dtype=np.float32))
  k, v = (jnp.asarray(rng.standard_normal((b, t, kh, h), dtype=np.float32)) for _ in range(2))
  valid = jnp.asarray(np.arange(t)[None] < np.array([[t], [t - 3]]))  # row 1 ends in padding
  mask = attention.row_mask(valid).dense_BTS()
  np.testing.assert_allclose(attention_core.head_major(q, k, v, mask),
                             attention._dense(q, k, v, mask),  # pylint: disable=protected-access
                             rtol=1e-5, atol=1e-6)
