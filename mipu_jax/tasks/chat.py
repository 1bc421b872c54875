"""Prompt rendering: a checkpoint's Jinja chat template, as `transformers` renders it.

`render_chat(template, messages, special_tokens)` follows
`transformers`' `apply_chat_template(..., tokenize=False,
add_generation_prompt=True)`: an immutable sandboxed Jinja environment with
`trim_blocks` and `lstrip_blocks`, the loop-control extension, the same
globals (`raise_exception`, `strftime_now`, `namespace`, `dict`) and a
`tojson` filter that does not escape HTML; the template sees `messages`,
`add_generation_prompt`, `tools=None`, `documents=None` and the special tokens
(`bos_token`, `eos_token`, `pad_token`). Messages whose fields are None drop
those fields, as `transformers` does. A test compares the two on several
templates.

Base models without a template take a raw string template instead
(`render_raw`), with `{question}` as the only field.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

Message = Mapping[str, Any]


@functools.lru_cache(maxsize=8)
def _compile(template: str):
  import jinja2  # pylint: disable=g-import-not-at-top
  import jinja2.ext  # pylint: disable=g-import-not-at-top
  from jinja2 import sandbox  # pylint: disable=g-import-not-at-top

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)

  def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)

  class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore names (no CPython internals)."""

    def __init__(*args, **kwargs):  # pylint: disable=no-method-argument
      self, args = args[0], args[1:]
      attrs = dict(*args, **kwargs)
      for name in attrs:
        _Namespace.check(name)
      jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
      _Namespace.check(name)
      jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def check(name):
      if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(
            f"chat templates cannot set underscore attributes, got {name!r}")

  class _Sandbox(sandbox.ImmutableSandboxedEnvironment):
    """Jinja's sandbox, except that reaching for an unsafe attribute raises.

    Jinja renders it as an empty string, so a template that tries to leave
    its sandbox would train on prompts with holes instead of being refused.
    """

    def unsafe_undefined(self, obj, attribute):
      raise jinja2.exceptions.SecurityError(
          f"the chat template reaches for {attribute!r} of a "
          f"{type(obj).__name__}, outside its sandbox")

  env = _Sandbox(trim_blocks=True, lstrip_blocks=True,
                 extensions=[jinja2.ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = strftime_now
  env.globals["dict"] = dict
  env.globals["namespace"] = _Namespace
  return env.from_string(template)


def _plain(value: Any) -> Any:
  """JSON-like data only (what a sandboxed template may see)."""
  if value is None or type(value) in (str, int, float, bool):
    return value
  if isinstance(value, Mapping):
    return {str(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  return str(value)


def render_chat(template: str, messages: Sequence[Message],
                special_tokens: Mapping[str, str | None] | None = None,
                **kwargs: Any) -> str:
  """The prompt text of `messages` under `template`, generation prompt appended.

  Args:
    template: the checkpoint's `chat_template`.
    messages: `[{"role": ..., "content": ...}, ...]`.
    special_tokens: `{"bos_token": ..., "eos_token": ..., ...}` (None entries
      are left out).
    **kwargs: further template variables (e.g. `enable_thinking=False`).

  Raises:
    ValueError: a message without `role` / `content`, or the template raising.
  """
  import jinja2  # pylint: disable=g-import-not-at-top
  chat = []
  for i, m in enumerate(messages):
    if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
      raise ValueError(f"message {i} is not a {{role, content}} mapping: {m!r}")
    chat.append({k: v for k, v in m.items() if v is not None})
  variables = {k: v for k, v in (special_tokens or {}).items() if v is not None}
  variables.update(kwargs)
  try:
    return _compile(template).render(
        messages=_plain(chat), tools=None, documents=None,
        add_generation_prompt=True, **_plain(variables))
  except jinja2.exceptions.TemplateError as e:
    raise ValueError(f"the chat template failed on {chat!r}: {e}") from e


def render_raw(template: str, question: str) -> str:
  """A base model's prompt: `template` with `{question}` filled in.

  Raises:
    ValueError: the template has no `{question}` field or other fields.
  """
  if "{question}" not in template:
    raise ValueError(f"a raw prompt template needs a {{question}} field, got "
                     f"{template!r}.")
  try:
    return template.format(question=question)
  except (KeyError, IndexError) as e:
    raise ValueError(f"the raw prompt template {template!r} has a field other "
                     f"than {{question}}: {e}") from e
