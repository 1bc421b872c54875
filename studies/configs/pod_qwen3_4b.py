r"""Qwen3-4B on a TPU pod, one row of the MIPU table (default: MIPU, Step 1 + Step 2).

    python -m experiments.train --config studies/configs/pod_qwen3_4b.py:mipu,chips=16,ckpt=$CKPT,train=$DAPO,eval=$EVALS \
        --workdir /mnt/runs/qwen3_4b_mipu            # on every host (docs/pods.md)

Rows: baseline, tis, mis, lr_decay, mipu, step1, step2, random_rollback
(`studies/configs/rows.py`). Hyperparameters: `studies/configs/pod_base.py` (the sources':
lr 1e-6, RLOO, 16 responses x 64 prompts, clip 0.2 / 0.28, TIS/MIS bound 2,
wd 0.01, grad clip 1, min LR ratio 0.1, temperature 1, FP8 rollout). The
LR-decay row uses the length-surge paper's fixed period for Qwen3-4B-Base:
`T_decay = 204` (surge near step 110, docs/method.md §6).

Hardware: a v5p-32 slice (16 chips, 4 hosts; `chips=16`) or larger; see
`docs/pods.md` for the multi-host launch and the mesh per pod size. Memory per
device (params, optimizer, one micro-batch of one 9k-token row) is printed by
`pytest tests/test_pod.py -s -m extended`. Expected time: not measured (no pod was used
here); the sources' 500-step runs take days on 16 H100s.
"""

from studies.configs import pod_base


def get_config(arg=None):
  return pod_base.get_config("qwen3_4b", arg, decay_period=204)
