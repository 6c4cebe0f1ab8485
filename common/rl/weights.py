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
