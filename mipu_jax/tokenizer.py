"""Tokenizers: a small protocol, a Hugging Face `tokenizers` backend and a character one.

`encode` never adds special tokens: callers that want a BOS or EOS add the ids
themselves, so the two implementations behave alike. `decode` does not stop at
EOS (truncating a completion is the caller's job); it only drops padding.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
  """What the sampler, the learner and the tasks need from a tokenizer."""

  @property
  def vocab_size(self) -> int:
    """Number of ids the tokenizer can produce (specials included)."""

  @property
  def eos_id(self) -> int:
    """Id that ends a completion."""

  @property
  def pad_id(self) -> int:
    """Id used to pad; `decode` skips it."""

  @property
  def bos_id(self) -> int | None:
    """Id that starts a sequence, or None if the model uses none (Qwen)."""

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """Every id that ends a completion (`eos_id` first)."""

  def encode(self, text: str) -> list[int]:
    """Text to ids, without adding any special token."""

  def decode(self, ids: Iterable[int]) -> str:
    """Ids to text, skipping `pad_id`; does not stop at `eos_id`."""


class CharTokenizer:
  """One id per character: pad=0, eos=1, bos=2, then the alphabet in order.

  Special ids decode to `<pad>`-style markers (pad is skipped), so a decoded
  completion shows where the model emitted EOS.
  """

  PAD_ID = 0
  EOS_ID = 1
  BOS_ID = 2
  _SPECIALS = ("<pad>", "<eos>", "<bos>")

  def __init__(self, alphabet: str):
    if not alphabet:
      raise ValueError("CharTokenizer alphabet is empty.")
    if len(set(alphabet)) != len(alphabet):
      dupes = sorted({c for c in alphabet if alphabet.count(c) > 1})
      raise ValueError(f"CharTokenizer alphabet repeats characters: {dupes!r}.")
    self._alphabet = alphabet
    offset = len(self._SPECIALS)
    self._char_to_id = {c: i + offset for i, c in enumerate(alphabet)}
    self._id_to_text = list(self._SPECIALS) + list(alphabet)

  @property
  def alphabet(self) -> str:
    return self._alphabet

  @property
  def vocab_size(self) -> int:
    return len(self._id_to_text)

  @property
  def eos_id(self) -> int:
    return self.EOS_ID

  @property
  def pad_id(self) -> int:
    return self.PAD_ID

  @property
  def bos_id(self) -> int:
    return self.BOS_ID

  @property
  def stop_ids(self) -> tuple[int, ...]:
    return (self.EOS_ID,)

  def encode(self, text: str) -> list[int]:
    ids = []
    for c in text:
      i = self._char_to_id.get(c)
      if i is None:
        raise ValueError(
            f"Character {c!r} is not in the CharTokenizer alphabet "
            f"{self._alphabet!r}.")
      ids.append(i)
    return ids

  def decode(self, ids: Iterable[int]) -> str:
    out = []
    for i in ids:
      i = int(i)
      if i == self.PAD_ID:
        continue
      if not 0 <= i < len(self._id_to_text):
        raise ValueError(
            f"Id {i} is outside the CharTokenizer vocabulary "
            f"(size {self.vocab_size}).")
      out.append(self._id_to_text[i])
    return "".join(out)

  def __repr__(self) -> str:
    return f"CharTokenizer(alphabet={self._alphabet!r})"


class HFTokenizer:
  """A checkpoint's `tokenizers.Tokenizer` (`tokenizer.json`) with its special ids.

  Attributes:
    chat_template: the checkpoint's chat template (`tokenizer_config.json`),
      or None.
    special_tokens: `{"bos_token": text or None, "eos_token": ..., "pad_token":
      ...}`, the names a chat template sees.
  """

  def __init__(self, tokenizer: Any, *, eos_id: int, pad_id: int | None = None,
               bos_id: int | None = None, stop_ids: Sequence[int] = (),
               chat_template: str | None = None):
    """Wraps a loaded `tokenizers.Tokenizer`.

    Args:
      tokenizer: a `tokenizers.Tokenizer`.
      eos_id: id that ends a completion.
      pad_id: padding id; defaults to `eos_id` (as Qwen base checkpoints do).
      bos_id: id that starts a sequence, or None.
      stop_ids: further ids that end a completion (`generation_config.json`).
      chat_template: the Jinja chat template, if the checkpoint has one.
    """
    self._tok = tokenizer
    self._eos_id = int(eos_id)
    self._pad_id = self._eos_id if pad_id is None else int(pad_id)
    self._bos_id = None if bos_id is None else int(bos_id)
    self._stop_ids = tuple(dict.fromkeys([self._eos_id, *map(int, stop_ids)]))
    self.chat_template = chat_template
    self.special_tokens = {
        f"{name}_token": (None if i is None else tokenizer.id_to_token(i))
        for name, i in (("bos", self._bos_id), ("eos", self._eos_id),
                        ("pad", self._pad_id))}

  @classmethod
  def from_dir(cls, path: str | os.PathLike[str]) -> HFTokenizer:
    """Reads `tokenizer.json` and the special tokens of a checkpoint directory.

    Special tokens come from `tokenizer_config.json` (`eos_token`, `pad_token`,
    `bos_token`, by name) and, for whatever it leaves unset, from `config.json`
    (`eos_token_id`, `pad_token_id`, `bos_token_id`). A missing pad falls back
    to EOS; a BOS is used only when the checkpoint names one (Qwen names none).
    Stop ids are the EOS plus every `eos_token_id` of `generation_config.json`
    (Qwen3 lists `<|im_end|>` and `<|endoftext|>`).

    Args:
      path: directory holding `tokenizer.json`.

    Returns:
      The tokenizer.

    Raises:
      FileNotFoundError: `tokenizer.json` is not in `path`.
      ValueError: no EOS token can be found, or a named token or id is not in
        the vocab.
    """
    import tokenizers  # pylint: disable=g-import-not-at-top

    path = os.fspath(path)
    tok_file = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tok_file):
      raise FileNotFoundError(
          f"No tokenizer.json in {path!r} (looked for {tok_file!r}).")
    try:
      tok = tokenizers.Tokenizer.from_file(tok_file)
    except Exception as e:  # pylint: disable=broad-except
      # tokenizers raises a bare Exception for any file it cannot parse.
      raise ValueError(f"{tok_file} is not a tokenizer the `tokenizers` library "
                       f"can read: {e}.") from e
    tok_config = _read_json(os.path.join(path, "tokenizer_config.json"))
    model_config = _read_json(os.path.join(path, "config.json"))
    gen_config = _read_json(os.path.join(path, "generation_config.json"))
    vocab = tok.get_vocab_size(with_added_tokens=True)

    def special(name: str) -> int | None:
      key = f"{name}_token"
      if key in tok_config and tok_config[key] is None:
        return None  # named as absent (Qwen's bos_token: null), whatever config.json says
      token = tok_config.get(key)
      if isinstance(token, dict):  # AddedToken serialised as a dict.
        token = token.get("content")
      if token:
        token_id = tok.token_to_id(token)
        if token_id is None:
          raise ValueError(
              f"{name}_token {token!r} from tokenizer_config.json in {path!r} "
              "is not in tokenizer.json's vocabulary.")
        return token_id
      token_id = _first(model_config.get(f"{name}_token_id"))
      return None if token_id is None else int(token_id)

    eos_id = special("eos")
    if eos_id is None:
      raise ValueError(
          f"No EOS token for the tokenizer in {path!r}: set eos_token in "
          "tokenizer_config.json or eos_token_id in config.json.")
    stop_ids = _as_list(gen_config.get("eos_token_id"))
    bad = [i for i in stop_ids if type(i) is not int or not 0 <= i < vocab]
    if bad:
      raise ValueError(f"generation_config.json in {path!r} names stop ids {bad} "
                       f"outside the tokenizer's vocabulary of {vocab}.")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # several named templates: the default one
      template = {t.get("name"): t.get("template") for t in template}.get("default")
    if template is None and os.path.isfile(os.path.join(path, "chat_template.jinja")):
      with open(os.path.join(path, "chat_template.jinja"), encoding="utf-8") as f:
        template = f.read()
    if template is not None and not isinstance(template, str):
      raise ValueError(f"chat_template in {path!r}/tokenizer_config.json should be a "
                       f"string, got {type(template).__name__}.")
    return cls(tok, eos_id=eos_id, pad_id=special("pad"),
               bos_id=special("bos"), stop_ids=stop_ids, chat_template=template)

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  @property
  def eos_id(self) -> int:
    return self._eos_id

  @property
  def pad_id(self) -> int:
    return self._pad_id

  @property
  def bos_id(self) -> int | None:
    return self._bos_id

  @property
  def stop_ids(self) -> tuple[int, ...]:
    return self._stop_ids

  def encode(self, text: str) -> list[int]:
    return list(self._tok.encode(text, add_special_tokens=False).ids)

  def decode(self, ids: Iterable[int]) -> str:
    """Ids to text, special tokens shown; pad skipped (so is EOS if pad == EOS)."""
    kept = [int(i) for i in ids if int(i) != self._pad_id]
    return self._tok.decode(kept, skip_special_tokens=False)


def completion_text(tokenizer: Tokenizer, ids: Iterable[int]) -> str:
  """A completion's text: its ids up to the first stop id (which `decode` would
  show), decoded."""
  ids = [int(i) for i in ids]
  stops = set(tokenizer.stop_ids)
  end = next((k for k, i in enumerate(ids) if i in stops), len(ids))
  return tokenizer.decode(ids[:end])


def _as_list(value: Any) -> list[Any]:
  if value is None:
    return []
  if isinstance(value, Sequence) and not isinstance(value, str):
    return list(value)
  return [value]


def _first(value: Any) -> Any:
  """The first of a list (HF allows a list of EOS ids), or the value itself."""
  values = _as_list(value)
  return values[0] if values else None


def _read_json(path: str) -> dict[str, Any]:
  """The JSON object in `path`, or {} if the file does not exist."""
  if not os.path.isfile(path):
    return {}
  return read_json_object(path)


def read_json_object(path: str, error: type[Exception] = ValueError) -> dict[str, Any]:
  """The JSON object in `path`; damaged or non-object JSON raises `error`
  naming the file (the one reader of HF's JSON files, here and in models/hf.py)."""
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise error(f"{path} is not valid JSON: {e}.") from e
  if not isinstance(data, dict):
    raise error(f"{path} should hold a JSON object, got {type(data).__name__}.")
  return data
