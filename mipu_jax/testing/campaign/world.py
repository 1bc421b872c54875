"""The valid inputs every case starts from, written once per campaign.

A tiny Hugging Face Qwen3 directory (one file, and the same split into two
shards with an index), a tiny Qwen3-MoE one, training prompts in both schemas and three formats,
the five benchmark files, and the base run configs (the small arithmetic run
and a math run of the tiny checkpoint) as plain nested mappings.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from mipu_jax import config as config_lib
from mipu_jax import models
from mipu_jax.testing import checkpoint as ckpt_lib

FORMATS = ("jsonl", "json", "parquet")
BENCHMARKS = ("math500", "aime24", "amc23", "minerva_math", "olympiadbench")
# The math base's prompt budget: the training prompts fit it, a prompt made long does not.
PROMPT_TOKENS = 96


def math_rows(n: int = 24) -> list[dict[str, Any]]:
  return [{"problem": f"What is {i} + {2 * i + 1}?", "answer": str(3 * i + 1),
           "unique_id": f"p{i}", "solution": f"It is \\boxed{{{3 * i + 1}}}."}
          for i in range(n)]


def dapo_rows(n: int = 24) -> list[dict[str, Any]]:
  return [{"data_source": "campaign",
           "prompt": [{"role": "user", "content": f"Compute {i} * 3. Answer: $Answer"}],
           "reward_model": {"ground_truth": str(3 * i), "style": "rule"},
           "extra_info": {"index": i}} for i in range(n)]


def benchmark_rows(name: str, n: int = 6) -> list[dict[str, Any]]:
  """Rows in each benchmark's Hugging Face schema (`mipu_jax.math_eval.loaders`)."""
  q = [f"Find {i} + {i}." for i in range(n)]
  if name == "math500":
    return [{"problem": q[i], "answer": str(2 * i), "unique_id": f"m{i}",
             "subject": "Algebra", "level": 1} for i in range(n)]
  if name == "aime24":
    return [{"ID": f"2024-I-{i}", "Problem": q[i], "Answer": 2 * i} for i in range(n)]
  if name == "amc23":
    return [{"id": i, "question": q[i], "answer": float(2 * i)} for i in range(n)]
  if name == "minerva_math":
    return [{"question": q[i], "answer": str(2 * i)} for i in range(n)]
  return [{"id": i, "question": q[i], "final_answer": [f"${2 * i}$"]} for i in range(n)]


def write_rows(path: str, rows: list[dict[str, Any]], fmt: str) -> str:
  """`rows` as a `.jsonl`, `.json` or `.parquet` file at `path` (its extension)."""
  if fmt == "jsonl":
    with open(path, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
  elif fmt == "json":
    with open(path, "w", encoding="utf-8") as f:
      json.dump(rows, f)
  else:
    pq.write_table(pa.Table.from_pylist(rows), path)
  return path


@dataclasses.dataclass
class World:
  """Paths of the valid inputs under `root`."""
  root: str
  ckpt: str
  sharded: str
  moe: str                     # a tiny Qwen3-MoE directory (two experts)
  train: dict[str, str]        # "<schema>.<fmt>" -> file
  benchmarks: str              # a directory holding the five files

  def tmp(self, name: str) -> str:
    """A fresh directory for one case."""
    path = os.path.join(self.root, "cases", name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path

  def arithmetic_config(self) -> dict[str, Any]:
    """The tiny arithmetic run (`mipu_jax.testing.tiny_run_config`) as a mapping."""
    return _plain(config_lib.default_config().to_dict(), dict(
        num_steps=2,
        data=dict(prompts_per_step=4, group_size=4, train_tiers=["tier1"],
                  max_sampling_rounds=1),
        sampling=dict(max_new_tokens=16), optim=dict(learning_rate=1e-3),
        learner=dict(log_entropy=False, mesh=dict(data=1, fsdp=1, tensor=1)),
        eval=dict(tiers=["tier1"], n_per_tier=4, num_samples=1),
        logging=dict(backends="jsonl", plots=False, progress_bar=False),
        checkpoint=dict(every=1, keep=2), export=dict(final=False)))

  def math_config(self, train_file: str | None = None, init_from: str | None = None,
                  benchmark_dir: str | None = None) -> dict[str, Any]:
    """A math run of the tiny checkpoint on the campaign's prompts and benchmarks."""
    cd = self.arithmetic_config()
    cd["model"]["init_from"] = init_from or self.ckpt
    cd["data"].update(task="math", train_file=train_file or self.train["math.jsonl"],
                      max_prompt_tokens=PROMPT_TOKENS, probe_holdout=2, reward_workers=1)
    cd["eval"].update(benchmark_dir=self.benchmarks if benchmark_dir is None
                      else benchmark_dir, max_problems=4)
    return cd


def _plain(base: dict, updates: dict) -> dict:
  out = json.loads(json.dumps(base))
  for k, v in updates.items():
    out[k] = _plain(out[k], v) if isinstance(v, dict) else v
  return out


def make_world(root: str) -> World:
  """Writes the valid inputs under `root` (a few seconds: one tokenizer trained)."""
  os.makedirs(root, exist_ok=True)
  ckpt = ckpt_lib.write_tiny_qwen3(os.path.join(root, "qwen3"), num_layers=1)
  sharded = os.path.join(root, "qwen3_sharded")
  shutil.copytree(ckpt, sharded)
  os.remove(os.path.join(sharded, "model.safetensors"))
  models.save_pretrained(models.from_pretrained(ckpt), sharded, max_shard_bytes=40_000)
  shutil.copy(os.path.join(ckpt, "config.json"), sharded)  # its special token ids
  moe = ckpt_lib.write_tiny_qwen3(os.path.join(root, "qwen3_moe"), num_layers=1,
                                  num_experts=2, num_experts_per_tok=1,
                                  moe_intermediate_size=32)
  train = {}
  for fmt in FORMATS:
    for schema, rows in (("math", math_rows()), ("dapo", dapo_rows())):
      train[f"{schema}.{fmt}"] = write_rows(
          os.path.join(root, f"train_{schema}.{fmt}"), rows, fmt)
  bench = os.path.join(root, "benchmarks")
  os.makedirs(bench)
  for i, name in enumerate(BENCHMARKS):
    fmt = FORMATS[i % len(FORMATS)]
    write_rows(os.path.join(bench, f"{name}.{fmt}"), benchmark_rows(name), fmt)
  return World(root=root, ckpt=ckpt, sharded=sharded, moe=moe, train=train,
               benchmarks=bench)
