"""Level 1's rollouts: every tree of a wave in flight at once; each rank runs its share of the task groups.

Used by level 1's loop (``level1_batched/train.py``) and, at world size 1, by level 2's driver (whose
agents' calls go to the inference servers through its router instead of the trained model).
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch.distributed as dist

from common.run.data import TaskSampler, hash_seed
from common.run.rollout import accept_group, rollout_group, stage_runtime_config
from common.train_config import TrainConfig


async def rollout_in_flight(jobs: list[tuple[dict, list[Any]]], env, policy, judge) -> list[list[Any]]:
    """``jobs`` = ``(task, one RuntimeConfig per rollout)``; all their trees run concurrently, one group per
    job (level 0 runs one job at a time)."""
    return list(
        await asyncio.gather(*(rollout_group(task, rcfgs, env, policy, judge) for task, rcfgs in jobs))
    )


def gather_groups(mine: list[list[Any]], n_jobs: int, world: int) -> list[list[Any]]:
    """All ranks' groups in job order (rank r ran jobs r, r + world, ...)."""
    if world == 1:
        return mine
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, mine)
    return [parts[j % world][j // world] for j in range(n_jobs)]


def collect_groups_in_flight(
    cfg: TrainConfig,
    stage: str,
    rnd: int,
    sampler: TaskSampler,
    env,
    policy,
    judge,
    preset,
    rank: int = 0,
    world: int = 1,
) -> tuple[list[list[Any]], int]:
    """Level 0's ``collect_groups`` in waves: draw the missing tasks, roll all of them out at once, then
    accept/replace in draw order. Same tasks, seeds and acceptance rule as level 0 (the sampler and its
    cursor are identical on every rank); only the schedule differs."""
    groups, extra = [], 0
    while len(groups) < cfg.tasks_per_step:
        jobs = []
        for _ in range(cfg.tasks_per_step - len(groups)):
            task = sampler.next()
            seeds = [hash_seed(cfg.seed, rnd, sampler.cursor, r) for r in range(cfg.rollouts_per_task)]
            rcfgs = [
                stage_runtime_config(cfg.env, cfg.rollout, stage, preset.generate_rubrics, s) for s in seeds
            ]
            jobs.append((task, rcfgs))
        mine = asyncio.run(rollout_in_flight(jobs[rank::world], env, policy, judge))
        for trees in gather_groups(mine, len(jobs), world):
            if not accept_group(
                trees, cfg.env, stage, preset.execution_reward, cfg.max_task_replacements - extra
            ):
                extra += 1  # no signal: another task in the next wave (SPEC.md §4)
                continue
            groups.append(trees)
    return groups, extra
