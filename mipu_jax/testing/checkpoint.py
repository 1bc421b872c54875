"""A tiny random Qwen3 checkpoint in the Hugging Face layout, written offline.

`write_tiny_qwen3(path)` writes what a real Qwen3 directory holds, at toy
size: `config.json` + `model.safetensors` (a random `tiny`-sized Qwen3),
`tokenizer.json` (a real byte-level BPE, trained here with `tokenizers` on a
small math corpus, plus Qwen's special tokens), `tokenizer_config.json`
(a ChatML chat template, `bos_token: null`, `eos_token: <|im_end|>`, pad
`<|endoftext|>`) and `generation_config.json` (two stop ids, as Qwen3 lists).
The math task's tests train it end to end; `transformers` loads it.
"""

from __future__ import annotations

import json
import os

from flax import nnx

from mipu_jax import models

QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")

# ChatML as Qwen's templates render it (system / user / assistant turns), with
# the assistant header as the generation prompt.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

_CORPUS = (
    "Solve the following math problem step by step. The last line of your response "
    "should be of the form Answer: $Answer where $Answer is the answer.",
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "What is the value of $\\frac{3}{4} - \\frac{1}{4}$? The answer is \\boxed{\\frac{1}{2}}.",
    "Compute 12 + 35 = 47, so the sum is 47. Find x such that 2x + 7 = 19; x = 6.",
    "The greatest common divisor of 84 and 36 is 12. The remainder is 2.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 + - * / = ( ) [ ] { } ^ _ \\sqrt \\cdot \\times",
    "system user assistant Let us think. Therefore, the final answer is",
)


def train_bpe(vocab_size: int = 384):
  """A byte-level BPE (`tokenizers`) with Qwen's special tokens first."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models as tok_models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top

  tok = tokenizers.Tokenizer(tok_models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(_CORPUS * 4, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=list(QWEN_SPECIALS),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  return tok


def write_tiny_qwen3(path: str, *, seed: int = 0, **config_overrides) -> str:
  """Writes the tiny checkpoint directory at `path` (see module docstring).

  Args:
    path: the directory (created).
    seed: the random init's seed.
    **config_overrides: `Qwen3Config` fields (e.g. `num_layers=1`,
      `vocab_size`).

  Returns:
    `path`.
  """
  os.makedirs(path, exist_ok=True)
  tok = train_bpe()
  tok.save(os.path.join(path, "tokenizer.json"))
  vocab = tok.get_vocab_size(with_added_tokens=True)
  ids = {t: tok.token_to_id(t) for t in QWEN_SPECIALS}
  # Qwen pads the embedding beyond the tokenizer; an override may make it
  # smaller (a checkpoint that does not fit its tokenizer, for tests).
  config_overrides.setdefault("vocab_size", -(-vocab // 8) * 8)
  cfg = models.get_config("tiny", **config_overrides)
  models.save_pretrained(models.Qwen3(cfg, rngs=nnx.Rngs(seed)), path)
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  hf.update(bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
  _write(path, "config.json", hf)
  _write(path, "tokenizer_config.json", {
      "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHATML_TEMPLATE,
      "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
      "model_max_length": 4096, "clean_up_tokenization_spaces": False})
  _write(path, "generation_config.json", {
      "bos_token_id": ids["<|endoftext|>"],
      "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
      "pad_token_id": ids["<|endoftext|>"], "do_sample": True, "temperature": 1.0})
  return path


def _write(path: str, name: str, data: dict) -> None:
  with open(os.path.join(path, name), "w") as f:
    json.dump(data, f, indent=2)
