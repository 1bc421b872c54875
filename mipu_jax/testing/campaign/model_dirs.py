"""Model-directory cases: a Hugging Face Qwen3 directory damaged one way.

The tiny checkpoint (one file, two shards and an index, or a Qwen3-MoE one) is copied and
damaged: a safetensors header that lies (a shape, a dtype, offsets, its own
length), a tensor file cut short, non-finite weights, an index naming a shard
that is not there, a `config.json` whose dimensions disagree with the tensors
(or that is not JSON, or mistyped), a `tokenizer.json` that does not parse, a
chat template that does not parse or reaches outside its sandbox. A math run
of it goes through `rl.preflight.check` and then the loader itself
(`models.from_pretrained`, the real safetensors, tokenizers and Jinja code).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
from hypothesis import strategies as st
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from mipu_jax import config as config_lib
from mipu_jax import models
from mipu_jax.rl import preflight
from mipu_jax.testing.campaign import core
from mipu_jax.testing.campaign.world import World

KIND = "model directory"

DIMS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "intermediate_size")
MOE_DIMS = ("num_experts", "moe_intermediate_size")

TEMPLATE_SYNTAX = (
    "{% for m in messages %}{{ m['content'] }}",                 # unclosed for
    "{{ messages[0]['content'] | no_such_filter }}",
    "{% endfor %}",
    "{{ messages[0]['content'] ",
    "{% if %}x{% endif %}",
)
# Templates that try to reach Python internals, the file system or the process.
TEMPLATE_ESCAPES = (
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{{ raise_exception.__globals__['os'].system('true') }}",
    "{{ namespace.__init__.__globals__ }}",
    "{% set ns = namespace(_x=1) %}{{ ns._x }}",
    "{{ strftime_now.__globals__['datetime'].os }}",
    "{{ dict.__base__.__subclasses__() }}",
    "{{ messages[0].update({'role': 'system'}) }}{{ messages[0]['role'] }}",
    "{{ self._TemplateReference__context }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ (messages|attr('__class__')).__mro__ }}",
    "{% for m in messages %}{{ m.__class__ }}{% endfor %}",
)


def _header(fn: str) -> tuple[dict, bytes]:
  data = open(fn, "rb").read()
  n = int.from_bytes(data[:8], "little")
  return json.loads(data[8:8 + n]), data[8 + n:]


def _write_header(fn: str, header: dict, rest: bytes, length: int | None = None) -> None:
  text = json.dumps(header).encode()
  text += b" " * (-len(text) % 8)
  with open(fn, "wb") as f:
    f.write((len(text) if length is None else length).to_bytes(8, "little") + text + rest)


def _tensor_file(d: str, draw) -> str:
  files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
  return os.path.join(d, draw(st.sampled_from(files)))


@st.composite
def cases(draw, world: World) -> core.Case:
  """One model-directory case (see the module docstring)."""
  n = draw(st.integers(0, 2**31))
  tmp = world.tmp(f"model{n}")
  layout = draw(st.sampled_from(["one file", "sharded", "MoE"]))
  sharded = layout == "sharded"
  d = os.path.join(tmp, "ckpt")
  shutil.copytree({"one file": world.ckpt, "sharded": world.sharded, "MoE": world.moe}[layout], d)
  damage = draw(st.sampled_from([
      "header shape", "header dtype", "header offsets", "header length", "header not JSON",
      "truncated tensors", "non-finite weights", "missing shard", "index not JSON",
      "index maps a tensor to the wrong shard", "config dims", "config mistyped",
      "config not JSON", "config missing a field", "tokenizer.json", "chat template syntax",
      "chat template escape", "tokenizer_config not JSON", "stop ids outside the vocabulary",
      "no config.json", "no tensors"]))
  refuse, names, detail = True, [d], damage
  if damage.startswith("header"):
    fn = _tensor_file(d, draw)
    header, rest = _header(fn)
    name = draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
    info = header[name]
    names += [fn, os.path.basename(fn)]
    if damage == "header shape":
      shape = list(info["shape"])
      i = draw(st.integers(0, len(shape) - 1))
      shape[i] = draw(st.sampled_from([shape[i] + 1, max(shape[i] - 1, 0), shape[i] * 2, 0]))
      # Same byte count (a permuted shape) is a shape that lies too.
      if draw(st.booleans()) and len(shape) == 2:
        shape = info["shape"][::-1]
      refuse = shape != info["shape"]
      info["shape"] = shape
      detail = f"{name} shape {shape}"
    elif damage == "header dtype":
      info["dtype"] = draw(st.sampled_from(["F16", "BF16", "I32", "F64", "U8", "F99", "int"]))
      detail = f"{name} dtype {info['dtype']}"
    elif damage == "header offsets":
      begin, end = info["data_offsets"]
      shift = draw(st.sampled_from([1, -1, 8, len(rest), -begin - 1, 3]))
      which = draw(st.sampled_from(["begin", "end", "both"]))
      info["data_offsets"] = [begin + shift * (which != "end"), end + shift * (which != "begin")]
      detail = f"{name} offsets {info['data_offsets']}"
      # Both moved by a whole number of tensors inside the data may point at another tensor.
      refuse = not (which == "both" and 0 <= begin + shift and end + shift <= len(rest))
    if damage == "header length":
      raw = open(fn, "rb").read()
      n_len = int.from_bytes(raw[:8], "little")
      length = draw(st.sampled_from([n_len + 1, n_len - 1, len(raw) * 2, 0, 2**63]))
      with open(fn, "wb") as f:
        f.write(length.to_bytes(8, "little") + raw[8:])
      detail = f"header length {length}"
    elif damage == "header not JSON":
      raw = open(fn, "rb").read()
      n_len = int.from_bytes(raw[:8], "little")
      with open(fn, "wb") as f:
        f.write(raw[:8] + b"\xff" + raw[9:])
    else:
      _write_header(fn, header, rest)
  elif damage == "truncated tensors":
    fn = _tensor_file(d, draw)
    raw = open(fn, "rb").read()
    at = draw(st.integers(0, len(raw) - 1))
    with open(fn, "wb") as f:
      f.write(raw[:at])
    names += [fn, os.path.basename(fn)]
    detail = f"{os.path.basename(fn)} cut at {at} of {len(raw)}"
  elif damage == "non-finite weights":
    fn = _tensor_file(d, draw)
    tensors = load_file(fn)
    name = draw(st.sampled_from(sorted(tensors)))
    t = tensors[name].copy()
    t.reshape(-1)[draw(st.integers(0, t.size - 1))] = draw(
        st.sampled_from([np.nan, np.inf, -np.inf]))
    tensors[name] = t
    save_file(tensors, fn, metadata={"format": "pt"})
    names += [name, fn]
    detail = f"a non-finite value in {name}"
  elif damage in ("missing shard", "index not JSON", "index maps a tensor to the wrong shard"):
    index = os.path.join(d, "model.safetensors.index.json")
    if not sharded:   # one file: the same damage is its absence
      os.remove(os.path.join(d, "model.safetensors"))
      detail = "no model.safetensors"
      names.append("model.safetensors")
    elif damage == "missing shard":
      fn = _tensor_file(d, draw)
      os.remove(fn)
      names += [os.path.basename(fn), index]
    elif damage == "index not JSON":
      with open(index, "w") as f:
        f.write(draw(st.sampled_from(["", "{", "[]", "{\"weight_map\": 3}", "null"])))
      names.append(index)
    else:
      idx = json.load(open(index))
      shards = sorted(set(idx["weight_map"].values()))
      name = draw(st.sampled_from(sorted(idx["weight_map"])))
      other = [s for s in shards if s != idx["weight_map"][name]]
      idx["weight_map"][name] = other[0]
      json.dump(idx, open(index, "w"))
      names += [index, name]
  elif damage.startswith("config") or damage == "no config.json":
    fn = os.path.join(d, "config.json")
    names.append(fn)
    hf = json.load(open(fn))
    if damage == "config dims":
      # The MoE directory's one layer is sparse: its dense width sizes no tensor.
      dim = draw(st.sampled_from(
          DIMS if layout != "MoE" else tuple(x for x in DIMS if x != "intermediate_size")
          + MOE_DIMS))
      old = hf.get(dim, 0)
      hf[dim] = draw(st.sampled_from([old + 1, old * 2, max(old - 1, 1), old + 64]))
      refuse = hf[dim] != old
      names.append(dim)
      detail = f"{dim} {old} -> {hf[dim]}"
    elif damage == "config mistyped":
      dim = draw(st.sampled_from(DIMS + (MOE_DIMS if layout == "MoE" else ())))
      hf[dim] = draw(st.sampled_from(["64", 64.5, None, -4, 0, [64], True]))
      names.append(dim)
      detail = f"{dim} = {hf[dim]!r}"
    elif damage == "config missing a field":
      dim = draw(st.sampled_from(["vocab_size", "hidden_size", "num_hidden_layers",
                                  "num_attention_heads", "intermediate_size", "model_type"]))
      del hf[dim]
      names.append(dim)
      detail = f"no {dim}"
    if damage == "config not JSON":
      with open(fn, "wb") as f:
        f.write(draw(st.sampled_from([b"", b"{", b"\xff\xfe", b"[1, 2]", b"null"])))
    elif damage == "no config.json":
      os.remove(fn)
    else:
      json.dump(hf, open(fn, "w"))
  elif damage == "tokenizer.json":
    fn = os.path.join(d, "tokenizer.json")
    raw = open(fn, "rb").read()
    how = draw(st.sampled_from(["truncated", "empty", "not JSON", "another structure",
                                "non-UTF-8", "removed"]))
    data = {"truncated": raw[:draw(st.integers(1, len(raw) - 1))], "empty": b"",
            "not JSON": b"tokenizer", "another structure": b'{"model": {"type": "Nope"}}',
            "non-UTF-8": raw[:100] + b"\xff\xfe" + raw[100:], "removed": None}[how]
    if data is None:
      os.remove(fn)
    else:
      with open(fn, "wb") as f:
        f.write(data)
    names += [fn, "tokenizer.json"]
    detail = f"tokenizer.json {how}"
  elif damage in ("chat template syntax", "chat template escape",
                  "tokenizer_config not JSON"):
    fn = os.path.join(d, "tokenizer_config.json")
    tc = json.load(open(fn))
    if damage == "tokenizer_config not JSON":
      with open(fn, "wb") as f:
        f.write(draw(st.sampled_from([b"", b"{", b"\xff", b"3"])))
      names.append(fn)
    else:
      pool = TEMPLATE_SYNTAX if damage.endswith("syntax") else TEMPLATE_ESCAPES
      tc["chat_template"] = draw(st.sampled_from(pool))
      json.dump(tc, open(fn, "w"))
      names += ["chat template", "chat_template", fn]
      detail = f"{damage}: {tc['chat_template']}"
  elif damage == "stop ids outside the vocabulary":
    fn = os.path.join(d, "generation_config.json")
    gc = json.load(open(fn))
    gc["eos_token_id"] = [gc["eos_token_id"][0], draw(st.sampled_from([10**6, -1]))]
    json.dump(gc, open(fn, "w"))
    names.append(fn)
  elif damage == "no tensors":
    for fn in os.listdir(d):
      if "safetensors" in fn:
        os.remove(os.path.join(d, fn))
    names.append("model.safetensors")
  cd = world.math_config(init_from=d)
  workdir = os.path.join(tmp, "workdir")

  def run():
    preflight.check(config_lib.from_config_dict(cd), workdir)
    models.from_pretrained(d)
  return core.Case(KIND, f"{layout}: {detail}", run, names, must_refuse=refuse)
