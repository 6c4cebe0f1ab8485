"""The run pieces every tier's training loop shares (the boring parts, written once).

| module          | what                                                                              |
|-----------------|-----------------------------------------------------------------------------------|
| `data.py`       | seeding, the task pool, the checkpointed task sampler, per-rollout seeds          |
| `rollout.py`    | the runtime settings of one rollout; the group-acceptance rule (replace or keep)  |
| `optim.py`      | AdamW with fp32 master weights under bf16 compute; on a CPU their state on disk    |
| `metrics.py`    | the metrics line (the same names in every tier), metrics.jsonl, TensorBoard, plots |
| `progress.py`   | a live display inside a step (agents, model calls, tokens/s) and the step bar     |
| `memory.py`     | what a run gives back between rollouts and training (malloc_trim), its peak RSS       |
| `trainer_memory.py` | a training step's GPU memory estimated, the row length and checkpointing that fit a budget; mem/gpu_* |
| `checkpoint.py` | the checkpoint interface (torch.save here; level 2 plugs in torch.distributed.checkpoint) |
| `entry.py`      | a tier's own entry point (`python -m level1_batched.train`) runs the `sera` command as a program |

A tier's ``train.py`` keeps the algorithm visible in its loop (stage, rollouts, rewards -> advantages ->
datums, the CISPO loss, the optimizer step) and imports these pieces; no tier imports another tier's
``train.py``.
"""
