"""Hugging Face interop: Qwen3 / Qwen3-MoE `config.json` + safetensors directories (docs/method.md §7, §7a).

The only module that knows Hugging Face tensor names. Layouts (ours <- HF):
  embed [V, D]           <- model.embed_tokens.weight [V, D]
  layers.q [L, D, N, H]  <- model.layers.{i}.self_attn.q_proj.weight [N*H, D] (transposed)
  layers.k/v [L, D, K, H]<- k_proj / v_proj [K*H, D]
  layers.o [L, N, H, D]  <- o_proj [D, N*H]
  layers.gate/up [L, D, F] <- mlp.gate_proj / up_proj [F, D]
  layers.down [L, F, D]  <- mlp.down_proj [D, F]
  norms                  <- input_layernorm, post_attention_layernorm, q_norm, k_norm, model.norm
  lm_head [D, V]         <- lm_head.weight [V, D] (untied models only)
Qwen3-MoE's sparse layers (`Qwen3MoeForCausalLM`, the released per-expert names):
  layers.router [L_moe, D, E]            <- mlp.gate.weight [E, D] (transposed)
  layers.experts_gate/up [L_moe, E, D, F] <- mlp.experts.{e}.gate_proj / up_proj [F, D]
  layers.experts_down [L_moe, E, F, D]   <- mlp.experts.{e}.down_proj [D, F]
  the dense layers' gate / up / down stack over the dense layers only.
"""

import json
import os
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.flax import save_file

from mipu_jax.models.config import Qwen3Config, as_dtype
from mipu_jax.models.qwen3 import Qwen3
from mipu_jax.tokenizer import read_json_object

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


class CheckpointError(ValueError):
  """A Hugging Face checkpoint directory that cannot be loaded as Qwen3."""


def config_from_hf(hf: dict, **overrides) -> Qwen3Config:
  """Qwen3Config from a parsed `config.json`; unsupported features are errors."""
  model_type = hf.get("model_type")
  archs = hf.get("architectures") or []
  arch = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}.get(model_type)
  if arch is None or (archs and arch not in archs):
    raise CheckpointError(
        f"Unsupported architecture: model_type={model_type!r}, architectures={archs}; "
        "mipu_jax loads Qwen3ForCausalLM (model_type 'qwen3') and Qwen3MoeForCausalLM "
        "(model_type 'qwen3_moe') only.")
  if hf.get("hidden_act", "silu") != "silu":
    raise CheckpointError(f"Unsupported hidden_act {hf['hidden_act']!r}; Qwen3 uses 'silu'.")
  if hf.get("attention_bias", False):
    raise CheckpointError("Unsupported: attention_bias=true (Qwen3 has no attention bias).")
  if hf.get("use_sliding_window", False):
    raise CheckpointError("Unsupported: use_sliding_window=true.")
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope_type != "default":
    raise CheckpointError(f"Unsupported RoPE scaling {rope_type!r}; only 'default' RoPE.")
  theta = hf.get("rope_theta", rope.get("rope_theta", 1_000_000.0))
  n_heads = hf["num_attention_heads"]
  kwargs = dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
      num_layers=hf["num_hidden_layers"], num_heads=n_heads,
      num_kv_heads=hf.get("num_key_value_heads", n_heads),
      head_dim=hf.get("head_dim", hf["hidden_size"] // n_heads),
      intermediate_size=hf["intermediate_size"],
      tie_embeddings=hf.get("tie_word_embeddings", False),
      rope_theta=float(theta), rms_eps=hf.get("rms_norm_eps", 1e-6))
  if model_type == "qwen3_moe":
    # transformers 5 writes `num_local_experts`; the released files `num_experts`.
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    if experts is None:
      raise CheckpointError("config.json of a qwen3_moe model has no 'num_experts'.")
    kwargs.update(
        num_experts=experts, num_experts_per_tok=hf.get("num_experts_per_tok", 8),
        moe_intermediate_size=hf.get("moe_intermediate_size", 768),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        decoder_sparse_step=hf.get("decoder_sparse_step", 1),
        mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
        router_aux_loss_coef=float(hf.get("router_aux_loss_coef", 0.001)))
  kwargs.update(overrides)
  try:
    return Qwen3Config(**kwargs)
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"config.json describes no valid model: {e}") from e


def config_to_hf(cfg: Qwen3Config) -> dict:
  """`config.json` contents that `transformers` reads as Qwen3ForCausalLM."""
  return {
      "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim, "hidden_act": "silu", "attention_bias": False,
      "attention_dropout": 0.0, "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
      "tie_word_embeddings": cfg.tie_embeddings, "use_sliding_window": False,
      "sliding_window": None, "max_position_embeddings": 40960,
      "dtype": jnp.dtype(cfg.param_dtype).name, "initializer_range": 0.02,
      **({} if not cfg.num_experts else {
          "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
          "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
          "moe_intermediate_size": cfg.moe_intermediate_size,
          "norm_topk_prob": cfg.norm_topk_prob, "decoder_sparse_step": cfg.decoder_sparse_step,
          "mlp_only_layers": list(cfg.mlp_only_layers),
          "router_aux_loss_coef": cfg.router_aux_loss_coef, "output_router_logits": False}),
  }


def _expected_shapes(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
  d, f, n, k, h, v = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                      cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size)
  shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
  for i in range(cfg.num_layers):
    p = f"model.layers.{i}."
    shapes.update({
        p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
        p + "self_attn.q_proj.weight": (n * h, d), p + "self_attn.k_proj.weight": (k * h, d),
        p + "self_attn.v_proj.weight": (k * h, d), p + "self_attn.o_proj.weight": (d, n * h),
        p + "self_attn.q_norm.weight": (h,), p + "self_attn.k_norm.weight": (h,),
    })
    if cfg.is_moe_layer(i):
      fm = cfg.moe_intermediate_size
      shapes[p + "mlp.gate.weight"] = (cfg.num_experts, d)
      for e in range(cfg.num_experts):
        q = f"{p}mlp.experts.{e}."
        shapes.update({q + "gate_proj.weight": (fm, d), q + "up_proj.weight": (fm, d),
                       q + "down_proj.weight": (d, fm)})
    else:
      shapes.update({p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                     p + "mlp.down_proj.weight": (d, f)})
  if not cfg.tie_embeddings:
    shapes["lm_head.weight"] = (v, d)
  return shapes


def _tensor_files(path: str) -> dict[str, str]:
  """Maps each tensor name to the safetensors file holding it.

  Every file's header is checked first (`_check_header`), so a file that lies
  about its tensors is refused by name before any tensor is read.
  """
  index = os.path.join(path, _INDEX)
  if os.path.exists(index):
    weight_map = _read_json(index).get("weight_map")
    if not weight_map or not isinstance(weight_map, dict):
      raise CheckpointError(f"{index} has no 'weight_map'.")
    missing = sorted({fn for fn in weight_map.values()
                      if not isinstance(fn, str) or not os.path.isfile(os.path.join(path, fn))},
                     key=str)
    if missing:
      raise CheckpointError(f"{index} names shard files that do not exist: {missing}.")
    headers = {fn: _check_header(os.path.join(path, fn)) for fn in set(weight_map.values())}
    absent = sorted(n for n, fn in weight_map.items() if n not in headers[fn])
    if absent:
      raise CheckpointError(f"{index} maps tensors to shards that do not hold them: "
                            f"{absent[:8]}.")
    return {name: os.path.join(path, fn) for name, fn in weight_map.items()}
  single = os.path.join(path, _SINGLE)
  if not os.path.exists(single):
    raise CheckpointError(f"No {_SINGLE} or {_INDEX} in {path}.")
  return {name: single for name in _check_header(single)}


# Bytes per element of the safetensors dtypes a checkpoint may hold.
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2,
                "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8,
                "U64": 8, "F64": 8}


_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64", "F8_E4M3", "F8_E5M2")


def _check_header(fn: str) -> dict[str, tuple[int, ...]]:
  """`{tensor: shape}` from a safetensors file's header, checked against the file.

  The format: an 8-byte little-endian header length, a JSON header of
  `{name: {dtype, shape, data_offsets: [begin, end]}}`, then the data. A
  header that lies (a dtype or shape whose size is not its byte range, ranges
  past the end of the file or overlapping, a truncated file) would otherwise
  surface as a reader error without the file's name, or as wrong numbers.
  """
  size = os.path.getsize(fn)

  def bad(why):
    return CheckpointError(f"{fn} is not a valid safetensors file: {why}.")

  with open(fn, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise bad(f"{size} bytes, shorter than the 8-byte header length")
    n = int.from_bytes(head, "little")
    if n > size - 8:
      raise bad(f"its header claims {n} bytes, the file has {size - 8} after the length")
    try:
      header = json.loads(f.read(n).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise bad(f"its header is not JSON ({e})") from e
  if not isinstance(header, dict):
    raise bad("its header is not a JSON object")
  shapes, ranges = {}, []
  for name, info in header.items():
    if name == "__metadata__":
      continue
    if not isinstance(info, dict):
      raise bad(f"tensor {name!r} has no dtype, shape and offsets")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in _DTYPE_BYTES:
      raise bad(f"tensor {name!r} has unknown dtype {dtype!r}")
    if dtype not in _FLOAT_DTYPES:
      raise bad(f"tensor {name!r} is {dtype}; a Qwen3 checkpoint's weights are one of "
                f"{_FLOAT_DTYPES}")
    if (not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2
        or not all(type(x) is int and x >= 0 for x in shape + offsets)):
      raise bad(f"tensor {name!r} has shape {shape!r} and offsets {offsets!r}; expected "
                "lists of non-negative integers")
    begin, end = offsets
    want = int(np.prod(shape, dtype=object)) * _DTYPE_BYTES[dtype]
    if end - begin != want:
      raise bad(f"tensor {name!r} ({dtype} {shape}) needs {want} bytes, its offsets "
                f"[{begin}, {end}] hold {end - begin}")
    if end > size - 8 - n:
      raise bad(f"tensor {name!r} ends at byte {end} of the data, which has "
                f"{size - 8 - n} (a truncated file?)")
    shapes[name] = tuple(shape)
    ranges.append((begin, end, name))
  ranges.sort()
  for (_, end, a), (begin, _, b) in zip(ranges, ranges[1:]):
    if begin < end:
      raise bad(f"tensors {a!r} and {b!r} overlap")
  covered = ranges[-1][1] if ranges else 0
  if covered != size - 8 - n:   # the format's rule: the tensors fill the data exactly
    raise bad(f"its tensors cover {covered} bytes of data, the file holds {size - 8 - n} "
              "after the header")
  return shapes


def _read_tensors(path: str, cfg: Qwen3Config) -> dict[str, np.ndarray]:
  files = _tensor_files(path)
  expected = _expected_shapes(cfg)
  names = set(files)
  if cfg.tie_embeddings:
    names.discard("lm_head.weight")  # Some tied checkpoints store a copy; the embedding wins.
  missing = sorted(set(expected) - names)
  unexpected = sorted(names - set(expected))
  if missing:
    raise CheckpointError(f"Checkpoint {path} is missing tensors: {missing[:8]}"
                          + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
  if unexpected:
    raise CheckpointError(f"Checkpoint {path} has unexpected tensors: {unexpected[:8]}"
                          + (f" and {len(unexpected) - 8} more" if len(unexpected) > 8 else ""))
  tensors = {}
  by_file: dict[str, list[str]] = {}
  for name in expected:
    by_file.setdefault(files[name], []).append(name)
  for fn, fnames in by_file.items():
    # Shapes first (from the header), so a config.json that disagrees with the
    # tensors is refused before any data is read.
    with safe_open(fn, framework="numpy") as f:
      for name in fnames:
        shape = tuple(f.get_slice(name).get_shape())
        if shape != expected[name]:
          raise CheckpointError(f"Tensor {name} in {fn} has shape {shape}, expected "
                                f"{expected[name]} for the config.json in {path}.")
      # numpy (bfloat16 through ml_dtypes): reading compiles nothing.
      for name in fnames:
        t = np.asarray(f.get_tensor(name), np.float32)
        if not np.isfinite(t).all():
          raise CheckpointError(f"Tensor {name} in {fn} holds non-finite values "
                                f"({int((~np.isfinite(t)).sum())} of {t.size}).")
        tensors[name] = t
  return tensors


def _to_ours(t: dict[str, np.ndarray], cfg: Qwen3Config, dtype) -> dict[str, Any]:
  d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

  def stack(suffix, fn, layers=range(cfg.num_layers)):
    return np.stack([fn(t[f"model.layers.{i}.{suffix}"]) for i in layers])

  def experts(name, fn):
    return np.stack([np.stack([fn(t[f"model.layers.{i}.mlp.experts.{e}.{name}.weight"])
                               for e in range(cfg.num_experts)]) for i in cfg.moe_layers])

  layers = {
      "attn_norm": stack("input_layernorm.weight", lambda w: w),
      "q": stack("self_attn.q_proj.weight", lambda w: w.T.reshape(d, n, h)),
      "k": stack("self_attn.k_proj.weight", lambda w: w.T.reshape(d, k, h)),
      "v": stack("self_attn.v_proj.weight", lambda w: w.T.reshape(d, k, h)),
      "o": stack("self_attn.o_proj.weight", lambda w: w.T.reshape(n, h, d)),
      "q_norm": stack("self_attn.q_norm.weight", lambda w: w),
      "k_norm": stack("self_attn.k_norm.weight", lambda w: w),
      "mlp_norm": stack("post_attention_layernorm.weight", lambda w: w),
  }
  if cfg.dense_layers:
    layers.update({
        "gate": stack("mlp.gate_proj.weight", lambda w: w.T, cfg.dense_layers),
        "up": stack("mlp.up_proj.weight", lambda w: w.T, cfg.dense_layers),
        "down": stack("mlp.down_proj.weight", lambda w: w.T, cfg.dense_layers),
    })
  if cfg.moe_layers:
    layers.update({
        "router": stack("mlp.gate.weight", lambda w: w.T, cfg.moe_layers),
        "experts_gate": experts("gate_proj", lambda w: w.T),
        "experts_up": experts("up_proj", lambda w: w.T),
        "experts_down": experts("down_proj", lambda w: w.T),
    })
  out = {"embed": t["model.embed_tokens.weight"], "layers": layers,
         "final_norm": t["model.norm.weight"]}
  if not cfg.tie_embeddings:
    out["lm_head"] = t["lm_head.weight"].T
  return jax.tree.map(lambda a: np.asarray(a, dtype), out)


def _from_ours(params: dict, cfg: Qwen3Config) -> dict[str, np.ndarray]:
  d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  lay = params["layers"]
  t = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["final_norm"]}
  for i in range(cfg.num_layers):
    p = f"model.layers.{i}."
    t[p + "input_layernorm.weight"] = lay["attn_norm"][i]
    t[p + "post_attention_layernorm.weight"] = lay["mlp_norm"][i]
    t[p + "self_attn.q_proj.weight"] = lay["q"][i].reshape(d, n * h).T
    t[p + "self_attn.k_proj.weight"] = lay["k"][i].reshape(d, k * h).T
    t[p + "self_attn.v_proj.weight"] = lay["v"][i].reshape(d, k * h).T
    t[p + "self_attn.o_proj.weight"] = lay["o"][i].reshape(n * h, d).T
    t[p + "self_attn.q_norm.weight"] = lay["q_norm"][i]
    t[p + "self_attn.k_norm.weight"] = lay["k_norm"][i]
    if cfg.is_moe_layer(i):
      j = cfg.moe_layers.index(i)
      t[p + "mlp.gate.weight"] = lay["router"][j].T
      for e in range(cfg.num_experts):
        q = f"{p}mlp.experts.{e}."
        t[q + "gate_proj.weight"] = lay["experts_gate"][j, e].T
        t[q + "up_proj.weight"] = lay["experts_up"][j, e].T
        t[q + "down_proj.weight"] = lay["experts_down"][j, e].T
    else:
      j = cfg.dense_layers.index(i)
      t[p + "mlp.gate_proj.weight"] = lay["gate"][j].T
      t[p + "mlp.up_proj.weight"] = lay["up"][j].T
      t[p + "mlp.down_proj.weight"] = lay["down"][j].T
  if not cfg.tie_embeddings:
    t["lm_head.weight"] = params["lm_head"].T
  return t


def read_config(path: str, **overrides) -> Qwen3Config:
  """Qwen3Config from `path/config.json`.

  Raises:
    CheckpointError: no such directory or file, a file that is not a JSON
      object, or dimensions that are missing or not positive integers (named
      with the file).
  """
  fn = os.path.join(path, "config.json")
  if not os.path.isdir(path):
    raise CheckpointError(f"Checkpoint directory {path} does not exist.")
  if not os.path.exists(fn):
    raise CheckpointError(f"No config.json in {path}.")
  hf = _read_json(fn)
  _check_dims(hf, fn)
  try:
    return config_from_hf(hf, **overrides)
  except (KeyError, TypeError, ValueError) as e:   # CheckpointError included
    if isinstance(e, CheckpointError) and fn in str(e):
      raise
    raise CheckpointError(f"{fn} does not describe a Qwen3 model: {e!r}.") from e


# config.json fields that are tensor dimensions or counts (when present).
_DIMS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "intermediate_size", "num_experts",
         "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
         "decoder_sparse_step")


def _check_dims(hf: dict, fn: str) -> None:
  bad = {k: hf[k] for k in _DIMS if k in hf and (type(hf[k]) is not int or hf[k] < 1)}
  if bad:
    raise CheckpointError(f"{fn}: dimensions must be positive integers, got {bad}.")


def _read_json(fn: str) -> dict:
  """A JSON object from `fn`; anything else is a `CheckpointError` naming it."""
  return read_json_object(fn, CheckpointError)


def context_length(path: str) -> Optional[int]:
  """`max_position_embeddings` of `path/config.json`: the longest row the
  checkpoint was trained for (None when it does not say)."""
  n = _read_json(os.path.join(path, "config.json")).get("max_position_embeddings")
  return n if type(n) is int and n > 0 else None


def check_pretrained(path: str) -> Qwen3Config:
  """The checks of `from_pretrained` that read no tensor data: `config.json`,
  every safetensors header, and each tensor's shape against the config.

  A run calls it before building anything (`mipu_jax.rl.preflight`), so a
  damaged directory is refused before any compile (docs/reliability.md).
  """
  cfg = read_config(path)
  files = _tensor_files(path)
  expected = _expected_shapes(cfg)
  missing = sorted(set(expected) - set(files))
  if missing:
    raise CheckpointError(f"Checkpoint {path} is missing tensors: {missing[:8]}"
                          + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
  for fn in sorted(set(files.values())):
    for name, shape in _check_header(fn).items():
      if name in expected and shape != expected[name]:
        raise CheckpointError(f"Tensor {name} in {fn} has shape {shape}, expected "
                              f"{expected[name]} for the config.json in {path}.")
  return cfg


def from_pretrained(path: str, dtype: Any = jnp.float32, *, compute_dtype: Any = None,
                    mesh: Optional[jax.sharding.Mesh] = None, layout: str = "train") -> Qwen3:
  """Loads a local Hugging Face Qwen3 directory as a `Qwen3` model.

  Args:
    path: directory with `config.json` and `model.safetensors` or sharded
      `*.safetensors` + `model.safetensors.index.json`.
    dtype: parameter dtype (float32 master weights by default).
    compute_dtype: matmul dtype; defaults to `dtype`.
    mesh: if given, parameters are placed with the `layout` sharding table.
    layout: 'train' or 'sampling' (see `mipu_jax.models.sharding`).
  """
  dtype = as_dtype(dtype)
  cfg = read_config(path, param_dtype=dtype, dtype=as_dtype(compute_dtype or dtype))
  params = _to_ours(_read_tensors(path, cfg), cfg, dtype)
  abstract = nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  if mesh is not None:
    from mipu_jax.models import sharding  # pylint: disable=g-import-not-at-top
    shardings = sharding.param_shardings(state, mesh, layout)
    params = jax.tree.map(jax.device_put, params, shardings)
  else:
    params = jax.tree.map(jnp.asarray, params)
  nnx.replace_by_pure_dict(state, params)
  return nnx.merge(graphdef, state)


def save_pretrained(model: Qwen3, path: str, *, max_shard_bytes: int = 2 * 1024**3,
                    dtype: Any = None) -> None:
  """Writes `model` as a Hugging Face directory that `transformers` loads.

  Tensors are written in `dtype` (default: the parameter dtype), split into
  several files with an index when they exceed `max_shard_bytes`.
  """
  cfg = model.config
  dtype = as_dtype(dtype) if dtype is not None else cfg.param_dtype
  os.makedirs(path, exist_ok=True)
  hf_cfg = config_to_hf(cfg)
  hf_cfg["dtype"] = jnp.dtype(dtype).name
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf_cfg, f, indent=2)
  params = jax.tree.map(lambda a: np.asarray(jax.device_get(a), np.float32),
                        nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  tensors = {n: jnp.asarray(np.ascontiguousarray(a), dtype)
             for n, a in _from_ours(params, cfg).items()}
  shards, current, size = [], {}, 0
  for name in sorted(tensors):
    nbytes = tensors[name].nbytes
    if current and size + nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = tensors[name]
    size += nbytes
  shards.append(current)
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, _SINGLE), metadata={"format": "pt"})
    return
  weight_map = {}
  for i, shard in enumerate(shards):
    fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file(shard, os.path.join(path, fn), metadata={"format": "pt"})
    weight_map.update({name: fn for name in shard})
  total = sum(t.nbytes for t in tensors.values())
  with open(os.path.join(path, _INDEX), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
