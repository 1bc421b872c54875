r"""Qwen3-30B-A3B (mixture of experts) on a TPU pod or a GPU host, one row of the MIPU table.

    python -m experiments.train --config studies/configs/pod_qwen3_30b_a3b.py:mipu,chips=16,ckpt=$CKPT,train=$DAPO,eval=$EVALS \
        --workdir /mnt/runs/qwen3_30b_a3b_mipu       # on every host (docs/pods.md)

Rows: baseline, tis, mis, lr_decay, mipu, step1, step2, random_rollback
(`studies/configs/rows.py`). Hyperparameters: `studies/configs/pod_base.py` (the sources':
lr 1e-6, RLOO, 16 responses x 64 prompts, clip 0.2 / 0.28, TIS/MIS bound 2,
wd 0.01, grad clip 1, min LR ratio 0.1, temperature 1, FP8 rollout). The
sources give no decay period for this model, so the LR-decay row detects the
length surge online (`auto` mode, docs/method.md §6).

Mesh: expert parallelism over 8 chips by default (`expert=8`: 16 of the 128
experts per chip, docs/method.md §7a), the rest of the chips over fsdp.

Hardware: 8 x 80 GiB GPUs (`chips=8`, with `--config.optim.mu_dtype=bfloat16`:
Adam's first moment in bf16, without which the plan is 0.7 GiB over) or a v5p-32
slice (16 chips, `chips=16`) or larger; per-device memory from XLA's plan, and
the command that prints it: `docs/pods.md`. Expected time: not measured (no pod
or GPU host was used here).
"""

from studies.configs import pod_base


def get_config(arg=None):
  return pod_base.get_config("qwen3_30b_a3b", arg, expert=8)
