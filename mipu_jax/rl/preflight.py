"""Every input a run reads before its first step, checked before anything compiles.

`check(cfg, workdir)` is what `rl.train` runs first: the devices against the
mesh and the batch, the model directory's `config.json` and safetensors
headers (no tensor data; routing replay and an expert axis need MoE layers
there), the task (its tokenizer, chat template, training
prompts and evaluation sets, read in full), the answer grader's module, and
the workdir against the run it may already hold. A bad input is refused here
with one `ValueError` (or `FileNotFoundError`) naming the field or the file
and what was expected, instead of a traceback from a reader, or a compile,
later (docs/reliability.md, "Bad inputs").
"""

import importlib.util

import jax
from flax import nnx

from mipu_jax import models
from mipu_jax.config import TrainConfig
from mipu_jax.learner import learner as learner_lib
from mipu_jax.models import hf
from mipu_jax.models import sharding
from mipu_jax.rl import build
from mipu_jax.rl import resume
from mipu_jax.tasks import base


def check(cfg: TrainConfig, workdir: str, *,
          allow_config_change: bool = False) -> base.Task:
  """Checks what `rl.train(cfg, workdir)` reads before its first step.

  Returns:
    The task (its data read), for `build.build_run(cfg, task=...)`.

  Raises:
    ValueError, FileNotFoundError: a bad input, named with what was expected.
    resume.ConfigChangedError: the workdir holds another run.
  """
  check_devices(cfg)
  if cfg.model.init_from:
    policy = hf.check_pretrained(cfg.model.init_from)
    # A preset's are TrainConfig's checks.
    if cfg.moe.routing_replay != "none" and not policy.is_moe:
      raise ValueError(f"moe.routing_replay={cfg.moe.routing_replay!r} on a dense model: "
                       f"{cfg.model.init_from!r} has no MoE layers.")
    sharding.check_experts(policy.num_experts, cfg.learner.mesh.expert)
  if cfg.data.task == "math":
    check_grader(cfg.data.reward_grader)
  task = build.make_task(cfg)
  check_lengths(cfg, task.prompt_budget)
  resume.check_workdir(workdir, cfg, allow_change=allow_config_change,
                       param_shapes=param_shapes(cfg, task.tokenizer))
  return task


def check_devices(cfg: TrainConfig) -> None:
  """The mesh fits the devices and the batch splits over its rows."""
  mesh = learner_lib.mesh_from_config(cfg.learner.mesh)
  learner_lib.check_rows(cfg.data.batch_size, cfg.learner.num_minibatches
                         * cfg.learner.num_microbatches, sharding.row_shards(mesh))


def check_lengths(cfg: TrainConfig, prompt_budget: int) -> None:
  """A row (prompt budget + `sampling.max_new_tokens`) fits the checkpoint's
  context and, with packing, a packed row."""
  row = prompt_budget + cfg.sampling.max_new_tokens
  context = hf.context_length(cfg.model.init_from) if cfg.model.init_from else None
  if context is not None and row > context:
    raise ValueError(
        f"sampling.max_new_tokens={cfg.sampling.max_new_tokens} after a prompt budget of "
        f"{prompt_budget} tokens makes rows of {row}, beyond the checkpoint's context "
        f"(max_position_embeddings={context} in {cfg.model.init_from}/config.json).")
  if cfg.learner.pack_length and cfg.learner.pack_length < row:
    raise ValueError(
        f"learner.pack_length={cfg.learner.pack_length} is shorter than one row: a prompt "
        f"budget of {prompt_budget} + sampling.max_new_tokens={cfg.sampling.max_new_tokens} "
        f"= {row} tokens.")


def check_grader(spec: str) -> None:
  """`data.reward_grader`'s module exists (its workers import it at the first step)."""
  module, _, function = spec.partition(":")
  try:
    found = importlib.util.find_spec(module) if module else None
  except (ImportError, ValueError):
    found = None
  if found is None or not function.isidentifier():
    raise ValueError(f"data.reward_grader={spec!r}: expected 'module:function' with an "
                     "importable module; "
                     + ("no such module." if found is None else "no function name."))


def param_shapes(cfg: TrainConfig, tokenizer) -> dict[str, tuple[int, ...]]:
  """`{path: shape}` of the policy `build.make_policy` would make (traced, not built)."""
  m = cfg.model
  mcfg = (hf.read_config(m.init_from) if m.init_from else
          models.get_config(m.preset, vocab_size=tokenizer.vocab_size, dtype=m.dtype))
  abstract = nnx.eval_shape(lambda: models.Qwen3(mcfg, rngs=nnx.Rngs(0)))
  flat = jax.tree_util.tree_flatten_with_path(
      nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))[0]
  return {"/".join(str(getattr(k, "key", k)) for k in path): tuple(x.shape)
          for path, x in flat}
