"""JetStream registration: with a `jetstream` package importable, our adapter classes
are virtual subclasses of its ABCs (`mipu_jax.sampler.jetstream`).

JetStream itself is not a dependency (its PyPI release pulls TensorFlow and has
old signatures), so the test puts a stand-in `jetstream.engine.engine_api`
module with the two ABCs on `PYTHONPATH` of a fresh interpreter.
"""

import os
import subprocess
import sys
import textwrap

_STANDIN = '''
import abc


class Engine(abc.ABC):
  @abc.abstractmethod
  def prefill(self, *, params, existing_prefix=None, padded_tokens, true_length,
              sampler=None, request_id=None): ...


class ResultTokens(abc.ABC):
  pass
'''

_CHECK = textwrap.dedent('''
    from jetstream.engine import engine_api
    from mipu_jax.sampler import jetstream
    assert jetstream.JETSTREAM_REGISTERED
    assert issubclass(jetstream.JetStreamEngine, engine_api.Engine)
    assert issubclass(jetstream.ResultTokens, engine_api.ResultTokens)
    print("REGISTERED")
''')


def test_engine_registers_with_an_importable_jetstream(tmp_path):
  api = tmp_path / "jetstream" / "engine"
  api.mkdir(parents=True)
  (tmp_path / "jetstream" / "__init__.py").write_text("")
  (api / "__init__.py").write_text("")
  (api / "engine_api.py").write_text(_STANDIN)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(tmp_path))
  proc = subprocess.run([sys.executable, "-c", _CHECK], env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "REGISTERED" in proc.stdout


def test_without_jetstream_nothing_is_registered():
  proc = subprocess.run(
      [sys.executable, "-c", "from mipu_jax.sampler import jetstream; "
       "print(jetstream.JETSTREAM_REGISTERED)"],
      env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip() == "False"
