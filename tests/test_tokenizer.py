"""Tests for mipu_jax.tokenizer: the protocol, the character and HF tokenizers."""

import json
import pathlib

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from mipu_jax import tokenizer as tokenizer_lib

_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = ["the cat sat on the mat", "a dog ate the bone", "cats and dogs"]


def _word_level() -> tokenizers.Tokenizer:
  tok = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.train_from_iterator(
      _CORPUS, trainers.WordLevelTrainer(special_tokens=["[UNK]"] + _SPECIALS))
  return tok


def _byte_bpe() -> tokenizers.Tokenizer:
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(
      _CORPUS, trainers.BpeTrainer(
          vocab_size=300, special_tokens=_SPECIALS,
          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  return tok


def _write_dir(tmp_path: pathlib.Path, tok: tokenizers.Tokenizer,
               tok_config: dict | None = None,
               config: dict | None = None) -> pathlib.Path:
  tok.save(str(tmp_path / "tokenizer.json"))
  if tok_config is not None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tok_config))
  if config is not None:
    (tmp_path / "config.json").write_text(json.dumps(config))
  return tmp_path


class TestCharTokenizer:

  def test_id_layout(self):
    tok = tokenizer_lib.CharTokenizer("ab+")
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
    assert tok.vocab_size == 6
    assert tok.encode("ab+a") == [3, 4, 5, 3]
    assert tok.encode("") == []

  def test_round_trip_skips_pad_and_shows_eos(self):
    tok = tokenizer_lib.CharTokenizer("0123456789")
    ids = tok.encode("2024")
    assert tok.decode(ids) == "2024"
    assert tok.decode([0, 0] + ids + [tok.eos_id, 0, 0]) == "2024<eos>"
    assert tok.decode([tok.bos_id] + ids) == "<bos>2024"

  def test_unknown_character_is_named(self):
    tok = tokenizer_lib.CharTokenizer("abc")
    with pytest.raises(ValueError, match="'z'"):
      tok.encode("abz")

  def test_bad_alphabet_or_id(self):
    with pytest.raises(ValueError, match="repeats"):
      tokenizer_lib.CharTokenizer("abca")
    with pytest.raises(ValueError, match="empty"):
      tokenizer_lib.CharTokenizer("")
    with pytest.raises(ValueError, match="outside"):
      tokenizer_lib.CharTokenizer("ab").decode([7])

  def test_satisfies_protocol(self):
    assert isinstance(tokenizer_lib.CharTokenizer("ab"),
                      tokenizer_lib.Tokenizer)


@pytest.mark.parametrize("build", [_word_level, _byte_bpe])
class TestHFTokenizer:

  def test_qwen_style_specials_from_tokenizer_config(self, tmp_path, build):
    raw = build()
    path = _write_dir(tmp_path, raw, tok_config={
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "bos_token": None})
    tok = tokenizer_lib.HFTokenizer.from_dir(path)
    assert isinstance(tok, tokenizer_lib.Tokenizer)
    assert tok.eos_id == raw.token_to_id("<|im_end|>")
    assert tok.pad_id == raw.token_to_id("<|endoftext|>")
    assert tok.bos_id is None
    assert tok.vocab_size == raw.get_vocab_size(with_added_tokens=True)

  def test_encode_decode(self, tmp_path, build):
    raw = build()
    tok = tokenizer_lib.HFTokenizer.from_dir(_write_dir(
        tmp_path, raw, tok_config={"eos_token": "<|im_end|>",
                                   "pad_token": "<|endoftext|>"}))
    ids = tok.encode("the cat sat")
    assert ids == raw.encode("the cat sat", add_special_tokens=False).ids
    assert ids and tok.eos_id not in ids
    assert tok.decode(ids) == "the cat sat"
    padded = ids + [tok.eos_id] + [tok.pad_id] * 3
    assert tok.decode(padded) == raw.decode(ids + [tok.eos_id],
                                            skip_special_tokens=False)
    assert "<|im_end|>" in tok.decode(padded)
    assert "<|endoftext|>" not in tok.decode(padded)

  def test_ids_from_config_json_when_no_tokenizer_config(self, tmp_path, build):
    raw = build()
    eos = raw.token_to_id("<|endoftext|>")
    tok = tokenizer_lib.HFTokenizer.from_dir(_write_dir(
        tmp_path, raw, config={"eos_token_id": [eos, eos + 1],
                               "bos_token_id": eos + 1}))
    assert tok.eos_id == eos
    assert tok.pad_id == eos  # Pad falls back to EOS.
    assert tok.bos_id == eos + 1

  def test_missing_eos_is_an_error(self, tmp_path, build):
    path = _write_dir(tmp_path, build(), tok_config={"pad_token": "<|im_end|>"})
    with pytest.raises(ValueError, match="No EOS"):
      tokenizer_lib.HFTokenizer.from_dir(path)

  def test_eos_name_not_in_vocab(self, tmp_path, build):
    path = _write_dir(tmp_path, build(), tok_config={"eos_token": "</s>"})
    with pytest.raises(ValueError, match="</s>"):
      tokenizer_lib.HFTokenizer.from_dir(path)


def test_missing_tokenizer_json_names_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="tokenizer.json") as err:
    tokenizer_lib.HFTokenizer.from_dir(tmp_path / "ckpt")
  assert str(tmp_path / "ckpt") in str(err.value)
