"""Supervised pretraining of the small CPU task's base policy.

  cfg = PretrainConfig()                 # model, data, curriculum, optimiser
  model, nll = train(cfg)                # `sft`: the SFT loop
  results = evaluate(model)              # `base_policy`: accuracy by answer style
  run(cfg, "mipu_jax/tasks/assets/base_policy")   # train + evaluate + write

`experiments/pretrain_base.py` is the command-line front end.
"""

from mipu_jax.pretrain.base_policy import evaluate
from mipu_jax.pretrain.base_policy import response_style
from mipu_jax.pretrain.base_policy import run
from mipu_jax.pretrain.base_policy import save
from mipu_jax.pretrain.base_policy import STYLES
from mipu_jax.pretrain.sft import Batch
from mipu_jax.pretrain.sft import encode_examples
from mipu_jax.pretrain.sft import make_optimizer
from mipu_jax.pretrain.sft import make_train_step
from mipu_jax.pretrain.sft import PretrainConfig
from mipu_jax.pretrain.sft import sft_batches
from mipu_jax.pretrain.sft import sft_loss
from mipu_jax.pretrain.sft import train

__all__ = [
    "Batch",
    "PretrainConfig",
    "STYLES",
    "encode_examples",
    "evaluate",
    "make_optimizer",
    "make_train_step",
    "response_style",
    "run",
    "save",
    "sft_batches",
    "sft_loss",
    "train",
]
