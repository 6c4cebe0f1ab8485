"""Depth weighting over a training batch (SPEC.md §4).

A tree has one root but may have many depth-2 nodes; without weighting the deep levels dominate the
batch. With ``T_d`` distinct trajectories (nodes) at depth ``d`` in the batch, every datum at depth d
gets ``w_d = Z / T_d``, and ``Z`` is chosen so that the mean weight over all datums is 1:

    Z = N / sum_k (1 / T_{d_k})          (N datums, datum k at depth d_k)

Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def depth_weights(depths: Sequence[int], trajectory_ids: Sequence[Hashable]) -> list[float]:
    """Per-datum depth weights ``w_{d_k} = Z / T_{d_k}`` with ``mean_k w = 1``.

    ``trajectory_ids[k]`` identifies the node (agent trajectory) datum k came from; ``T_d`` counts the
    distinct ids at depth d. Shapes: [N], [N] -> [N].

    >>> # depth 0: trajectories r1, r2 (3 datums); depth 1: trajectory c1 (1 datum)
    >>> # T_0 = 2, T_1 = 1; Z = 4 / (1/2 + 1/2 + 1/2 + 1/1) = 1.6 -> w_0 = 0.8, w_1 = 1.6
    >>> depth_weights([0, 0, 0, 1], ["r1", "r1", "r2", "c1"])
    [0.8, 0.8, 0.8, 1.6]
    """
    if len(depths) != len(trajectory_ids):
        raise ValueError(f"{len(depths)} depths but {len(trajectory_ids)} trajectory ids")
    if not depths:
        return []
    trajectories: dict[int, set[Hashable]] = {}
    for d, tid in zip(depths, trajectory_ids, strict=True):
        trajectories.setdefault(d, set()).add(tid)
    inv = [1.0 / len(trajectories[d]) for d in depths]  # 1 / T_{d_k}
    z = len(depths) / sum(inv)
    return [z * x for x in inv]


def cap_weights(weights: Sequence[float], cap: float) -> list[float]:
    """``--depth-weight-cap C`` (a stability knob, not the paper's): no weight above ``cap``, mean still 1.
    Weights above the cap are set to it and the others rescaled so the mean stays 1, repeated until none
    exceeds it (a few passes). ``cap`` 0 returns the weights unchanged; it must be >= 1 otherwise (a mean of
    1 cannot fit under a smaller cap).

    >>> cap_weights([0.5, 0.5, 2.0], 1.5)   # the 2.0 is capped, the rest share the 0.5 it gave up
    [0.75, 0.75, 1.5]
    >>> cap_weights([0.8, 0.8, 0.8, 1.6], 0)
    [0.8, 0.8, 0.8, 1.6]
    """
    w = list(weights)
    if not cap or not w:
        return w
    if cap < 1:
        raise ValueError(f"a depth-weight cap must be >= 1 (got {cap})")
    n = len(w)
    for _ in range(n):
        capped = [x >= cap for x in w]
        free = sum(x for x, c in zip(w, capped, strict=True) if not c)
        if not any(x > cap * (1 + 1e-12) for x in w) and abs(sum(w) - n) < 1e-9 * n:
            break
        budget = n - cap * sum(capped)  # what the uncapped weights must add up to
        if free <= 0 or budget <= 0:
            w = [1.0] * n  # everything at or above the cap: equal weights
            break
        w = [cap if c else x * budget / free for x, c in zip(w, capped, strict=True)]
    return w
