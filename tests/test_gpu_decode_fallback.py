"""The GPU decode kernel on a jax without Pallas' Triton backend (docs/method.md §7).

jax deprecated Pallas Triton in 0.11.0 and will remove it. The backend is hidden
here as its removal would hide it (the module cannot be imported): "auto" then
runs the XLA paged path with one warning, and "pallas" asked for by name is an
error that says why, from the sampler config and from the engine.
"""

import logging
import sys

import jax.experimental.pallas
import pytest

from flax import nnx

from mipu_jax.models import get_config
from mipu_jax.models import paged_pallas
from mipu_jax.models import Qwen3
from mipu_jax.sampler import Engine
from mipu_jax.sampler import config as sampler_config
from mipu_jax.sampler.config import SamplerConfig

_TRITON = "jax.experimental.pallas.triton"


@pytest.fixture
def no_triton(monkeypatch):
  """Imports of Pallas Triton fail, as on a jax that no longer ships it."""
  for name in list(sys.modules):
    if name == _TRITON or name.startswith("jax._src.pallas.triton"):
      monkeypatch.setitem(sys.modules, name, None)
  monkeypatch.setitem(sys.modules, _TRITON, None)
  monkeypatch.delattr(jax.experimental.pallas, "triton", raising=False)
  sampler_config._warn_auto_without_kernel.cache_clear()  # pylint: disable=protected-access
  yield
  sampler_config._warn_auto_without_kernel.cache_clear()  # pylint: disable=protected-access


@pytest.mark.xfail(paged_pallas.missing_backend() is not None, strict=True, raises=AssertionError,
                   reason="the day jax drops Pallas Triton: the kernel's tests are expected "
                   "failures, auto decodes through 'paged' (the tests below)")
def test_this_jax_ships_the_backend():
  assert paged_pallas.missing_backend() is None
  assert SamplerConfig().decode_attention_for("gpu") == "pallas"


def test_hidden_backend_is_missing_to_the_kernel_too(no_triton):
  """What the hiding models: the kernel's own import of the backend fails."""
  assert "no Pallas Triton backend" in paged_pallas.missing_backend()
  with pytest.raises(ImportError):
    from jax.experimental.pallas import triton  # pylint: disable=g-import-not-at-top,unused-import


def test_auto_falls_back_to_paged_with_one_warning(no_triton, caplog):
  cfg = SamplerConfig()
  with caplog.at_level(logging.WARNING):
    for _ in range(3):  # resolved by every engine: warned once
      assert cfg.decode_attention_for("gpu") == "paged"
    assert cfg.decode_attention_for("cpu") == "paged"
    assert cfg.replace(decode_attention="paged").decode_attention_for("gpu") == "paged"
  warned = [r.getMessage() for r in caplog.records if "Pallas Triton" in r.getMessage()]
  assert len(warned) == 1, warned
  assert 'decode_attention="auto" runs "paged"' in warned[0]


def test_pallas_by_name_is_an_error_that_says_why(no_triton):
  cfg = SamplerConfig(decode_attention="pallas")
  for platform in ("gpu", "cpu"):
    with pytest.raises(RuntimeError, match="no Pallas Triton backend"):
      cfg.decode_attention_for(platform)
  with pytest.raises(RuntimeError, match='decode_attention="pallas" cannot run'):
    Engine(Qwen3(get_config("tiny"), rngs=nnx.Rngs(0)), SamplerConfig(decode_attention="pallas"))
  # The other choices do not need the backend.
  for impl in ("paged", "dense", "pallas_tpu"):
    assert SamplerConfig(decode_attention=impl).decode_attention_for("gpu") == impl
