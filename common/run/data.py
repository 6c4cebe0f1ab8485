"""Seeding, the task pool and the task sampler whose cursor is part of every checkpoint."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (the one seeding idiom of every tier)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def hash_seed(*parts: int) -> int:
    """A stable 31-bit seed from integers (``hash()`` of a tuple is salted per process for str; this is not).

    >>> hash_seed(0, 1, 2) == hash_seed(0, 1, 2), hash_seed(0, 1, 2) == hash_seed(0, 2, 1)
    (True, False)
    """
    return int.from_bytes(str(parts).encode(), "little") % (2**31 - 1)


class TaskSampler:
    """Shuffles the pool once per epoch with a seed that depends only on (seed, epoch); ``cursor`` counts
    the tasks drawn so far, so a resumed run draws exactly the tasks the killed run would have drawn.

    >>> s = TaskSampler([{"id": i} for i in range(3)], seed=0)
    >>> sorted(s.next()["id"] for _ in range(3)), s.cursor
    ([0, 1, 2], 3)
    """

    def __init__(self, tasks: list[dict[str, Any]], seed: int, cursor: int = 0):
        if not tasks:
            raise ValueError("the task pool is empty")
        self.tasks, self.seed, self.cursor = tasks, seed, cursor

    def next(self) -> dict[str, Any]:
        epoch, i = divmod(self.cursor, len(self.tasks))
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}/{epoch}").shuffle(order)
        self.cursor += 1
        return self.tasks[order[i]]


def task_pool(env: str, tasks: str | None, n_tasks: int, seed: int, difficulty: str) -> list[dict[str, Any]]:
    """The training tasks: a task file (validated; errors name file:line) or a generated train split."""
    from common.envs import env_spec, load_tasks

    if tasks:
        return load_tasks(env, tasks)
    return env_spec(env).generate_tasks("train", n_tasks, seed, None if difficulty == "all" else difficulty)
