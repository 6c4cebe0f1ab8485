"""Level 1's rollouts: every tree of a wave in flight at once; each rank runs its share of the task groups
(``rollout_in_flight`` itself lives in ``common/run/rollout.py``; level 0 rolls one group and its spares at once).

Used by level 1's loop (``level1_batched/train.py``) and, at world size 1, by level 2's driver (whose
agents' calls go to the inference servers through its router instead of the trained model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from common.run.data import TaskSampler
from common.run.rollout import collect_groups, rollout_in_flight, run_round
from common.train_config import TrainConfig


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
    dropped: list[list[Any]] | None = None,
    version: Callable[[], int] | None = None,
) -> tuple[list[list[Any]], int]:
    """Level 0's ``collect_groups`` in waves: every group still missing (plus its spares) rolled out at once,
    each rank its share, then judged in draw order (:func:`common.run.rollout.collect_groups`). Same tasks,
    seeds and acceptance rule as level 0 (the sampler and its cursor are identical on every rank); only the
    schedule differs. ``version`` (``--max-staleness 1``): read as each wave starts, the policy version of
    the engine's weights then, recorded in every tree of the wave as ``meta["policy_version"]`` (weights
    that change during the wave are newer, so it is the oldest version any of its calls saw)."""

    def roll(jobs):
        v = None if version is None else int(version())
        mine = run_round(  # bounded: a tree that ignores cancellation cannot hold the round (issue #53)
            rollout_in_flight(jobs[rank::world], env, policy, judge), cfg.rollout.cancel_grace_s, f"round {rnd}"
        )
        groups = gather_groups(mine, len(jobs), world)
        if v is not None:
            for trees in groups:
                for t in trees:
                    t.meta["policy_version"] = v
        return groups

    return collect_groups(cfg, stage, rnd, sampler, preset, roll, per_wave=None, dropped=dropped)
