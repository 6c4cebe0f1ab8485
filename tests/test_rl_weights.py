"""Depth weights (common/rl/weights.py) vs a naive reference.

Run: pytest tests/test_rl_weights.py
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.rl.weights import depth_weights


def test_hand_example():
    # depth 0: 2 trajectories (3 datums); depth 1: 1 trajectory (1 datum)
    # T_0 = 2, T_1 = 1; Z = 4 / (1/2 * 3 + 1) = 1.6; w_0 = 0.8, w_1 = 1.6; mean = (3*0.8 + 1.6)/4 = 1
    assert depth_weights([0, 0, 0, 1], ["r1", "r1", "r2", "c1"]) == pytest.approx([0.8, 0.8, 0.8, 1.6])


def test_uniform_when_one_trajectory_per_depth():
    assert depth_weights([0, 1, 2], ["a", "b", "c"]) == pytest.approx([1.0, 1.0, 1.0])
    assert depth_weights([], []) == []
    with pytest.raises(ValueError):
        depth_weights([0], [])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), min_size=1, max_size=40))
def test_matches_naive(rows):
    depths = [d for d, _ in rows]
    tids = [f"{d}:{t}" for d, t in rows]  # a trajectory lives at one depth
    got = depth_weights(depths, tids)
    # naive: count distinct trajectories per depth with loops, then solve mean(Z / T_d) = 1 for Z
    T = {}
    for d, tid in zip(depths, tids, strict=True):
        T.setdefault(d, [])
        if tid not in T[d]:
            T[d].append(tid)
    raw = [1.0 / len(T[d]) for d in depths]
    Z = len(raw) / sum(raw)
    assert got == pytest.approx([Z * r for r in raw])
    assert sum(got) / len(got) == pytest.approx(1.0)
    # weights are inversely proportional to T_d
    for i in range(len(depths)):
        for j in range(len(depths)):
            assert got[i] * len(T[depths[i]]) == pytest.approx(got[j] * len(T[depths[j]]))
