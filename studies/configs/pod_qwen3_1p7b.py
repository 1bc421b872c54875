r"""Qwen3-1.7B on a TPU pod, one row of the MIPU table (default: MIPU, Step 1 + Step 2).

    python -m experiments.train --config studies/configs/pod_qwen3_1p7b.py:mis,chips=8,ckpt=$CKPT,train=$DAPO,eval=$EVALS \
        --workdir /mnt/runs/qwen3_1p7b_mis           # on every host (docs/pods.md)

Rows: baseline, tis, mis, lr_decay, mipu, step1, step2, random_rollback
(`studies/configs/rows.py`). Hyperparameters: `studies/configs/pod_base.py` (the sources':
lr 1e-6, RLOO, 16 responses x 64 prompts, clip 0.2 / 0.28, TIS/MIS bound 2,
wd 0.01, grad clip 1, min LR ratio 0.1, temperature 1, FP8 rollout). The
sources give no decay period for 1.7B, so the LR-decay row detects the
length surge online (`auto` mode, `T_decay = round(1.8 t_surge)`, docs/method.md §6).

Hardware: a v5e-16 or v5p-16 slice or larger; see `docs/pods.md`. Memory per
device is printed by `pytest tests/test_pod.py -s -m extended`. Expected time: not
measured (no pod was used here).
"""

from studies.configs import pod_base


def get_config(arg=None):
  return pod_base.get_config("qwen3_1p7b", arg)
