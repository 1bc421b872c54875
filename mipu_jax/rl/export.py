"""The trained policy as a Hugging Face checkpoint directory, which `transformers` loads.

`export_policy` writes the learner's parameters with `models.save_pretrained`
(config.json + safetensors) and copies the tokenizer files of the base
checkpoint (`tokenizer.json`, `tokenizer_config.json`,
`generation_config.json`, ...) beside them, so the directory is a complete
checkpoint: `AutoModelForCausalLM.from_pretrained(path)` and
`AutoTokenizer.from_pretrained(path)` both load it, and so does
`model.init_from` of a later run.
"""

import os
import shutil
from typing import Any

from flax import nnx

from mipu_jax import distributed
from mipu_jax import models

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                   "special_tokens_map.json", "vocab.json", "merges.txt",
                   "added_tokens.json", "chat_template.jinja", "tokenizer_meta.json")


def export_policy(run: Any, params: Any, path: str) -> str:
  """Writes `params` (a learner parameter tree) as a checkpoint at `path`.

  Args:
    run: the `build.Run` (its model gives the architecture, its config the
      base checkpoint whose tokenizer files are copied).
    params: the learner's parameter pure dict (sharded arrays are gathered).
    path: the output directory (replaced if it exists).

  Returns:
    `path`.
  """
  host = distributed.to_host(params)  # every process gathers; the main one writes
  if not distributed.is_main():
    return path
  model = nnx.clone(run.model)
  state = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(state, host)
  nnx.update(model, state)
  tmp = path + ".tmp"
  shutil.rmtree(tmp, ignore_errors=True)
  models.save_pretrained(model, tmp)
  source = run.cfg.model.init_from
  if source:
    for name in TOKENIZER_FILES:
      if os.path.isfile(os.path.join(source, name)):
        shutil.copy2(os.path.join(source, name), os.path.join(tmp, name))
  shutil.rmtree(path, ignore_errors=True)
  os.replace(tmp, path)
  return path
