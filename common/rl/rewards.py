"""Rewards and leave-one-out advantages of the three SERA stages (SPEC.md §4), as pure functions.

* Execution: node reward ``r = R`` (root outcome) for the root, ``s`` (rubric score, or the binary child
  success for RAO) for other nodes; baseline ``b_i`` = LOO mean of the ROOT rewards of the task's group;
  advantage ``r(node) - b_i`` for every datum of rollout ``i``.
* Delegation: leaf credit ``r_leaf(e) = R * |leaves under e| / |all leaves|`` per delegation event
  (refused launches get 0); baseline = LOO over ALL rollouts' *mean* launch rewards, a rollout without
  launches counting as mean 0.
* Rubric: ranking reward ``R = -mean_{i succ, j fail} max(0, margin - (s_i - s_j))`` per mixed
  counterfactual group; baseline = LOO over the mixed groups of the same task.

Zero variance (every stage): a task group gives no signal when the advantages of ALL its datums are
equal (:func:`is_zero_variance`), not only its root rewards: children scored differently by their rubrics
still teach the execution stage when every root failed.

All functions take and return plain Python numbers and lists (no torch). Every LOO here uses the same
convention: a group of one gets baseline = its own value, hence advantage 0 (no signal, no update).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

EventKey = tuple[Hashable, int]
"""A delegation event: ``(parent node id, fork_step)``."""


# ---- leave-one-out --------------------------------------------------------------------------------
def loo_baseline(values: Sequence[float]) -> list[float]:
    """Leave-one-out baselines ``b_i = mean_{j != i} v_j``.

    A group of one has no "others"; by convention ``b_0 = v_0`` so its advantage ``v_0 - b_0`` is 0.

    Shapes: [n] -> [n].

    >>> loo_baseline([1.0, 0.0, 1.0])      # b_0 = (0 + 1) / 2, b_1 = (1 + 1) / 2, b_2 = (1 + 0) / 2
    [0.5, 1.0, 0.5]
    >>> loo_baseline([0.7])
    [0.7]
    """
    n = len(values)
    if n == 1:
        return [float(values[0])]
    total = math.fsum(values)
    return [(total - v) / (n - 1) for v in values]


def loo_advantages(values: Sequence[float]) -> list[float]:
    """``v_i - b_i`` with :func:`loo_baseline` (equals ``n/(n-1) * (v_i - mean(v))`` for ``n > 1``).

    >>> loo_advantages([1.0, 0.0, 1.0])
    [0.5, -1.0, 0.5]
    """
    return [v - b for v, b in zip(values, loo_baseline(values), strict=True)]


def _all_equal(values: Sequence[float], tol: float = 1e-12) -> bool:
    return all(abs(v - values[0]) <= tol for v in values)


def is_zero_variance(advantages: Iterable[float | None]) -> bool:
    """The public no-signal rule: True when the advantages of all datums of one task group are equal
    (``max == min``; ``None`` entries, i.e. dropped datums, are ignored; no datum at all is no signal).

    >>> is_zero_variance([0.0, 0.0, 0.0]), is_zero_variance([0.0, 0.9, 0.0, 0.1]), is_zero_variance([None, 0.3])
    (True, False, True)
    >>> is_zero_variance([])
    True
    """
    kept = [float(a) for a in advantages if a is not None]
    return not kept or _all_equal(kept)


# ---- execution stage ------------------------------------------------------------------------------
def node_reward(is_root: bool, root_outcome: float, child_reward: float | None) -> float | None:
    """Execution reward of one node: the root gets the outcome ``R``; other nodes their own reward.

    ``child_reward`` is the rubric score ``s`` in [0, 1] (SERA) or the binary child success (RAO);
    ``None`` (rubric or score failed to parse) -> ``None``: the node contributes no datums.

    >>> node_reward(True, 1.0, None), node_reward(False, 1.0, 0.25), node_reward(False, 1.0, None)
    (1.0, 0.25, None)
    """
    if is_root:
        return float(root_outcome)
    return None if child_reward is None else float(child_reward)


@dataclass(frozen=True)
class ExecutionGroup:
    """LOO statistics of one task's group of root rollouts."""

    baselines: list[float]
    """``b_i = mean_{j != i} R_j`` per rollout."""
    root_advantages: list[float]
    """``R_i - b_i`` per rollout."""
    roots_equal: bool
    """All root advantages equal (all ``R_i`` equal, or one rollout). This alone is NOT the no-signal
    test: children's rewards may still differ (see :func:`execution_advantages`)."""


def execution_group(root_rewards: Sequence[float]) -> ExecutionGroup:
    """Baselines, root advantages and whether the roots alone are flat, for one task's rollout group.

    >>> g = execution_group([1.0, 0.0, 1.0])
    >>> g.baselines, g.root_advantages, g.roots_equal
    ([0.5, 1.0, 0.5], [0.5, -1.0, 0.5], False)
    >>> execution_group([1.0, 1.0]).roots_equal
    True
    """
    if not root_rewards:
        raise ValueError("execution_group needs at least one root reward (a task with no rollouts?)")
    baselines = loo_baseline(root_rewards)
    advantages = [r - b for r, b in zip(root_rewards, baselines, strict=True)]
    return ExecutionGroup(baselines, advantages, _all_equal(advantages))


def execution_advantages(
    root_rewards: Sequence[float], node_rewards: Sequence[Sequence[float | None]]
) -> tuple[list[list[float | None]], bool]:
    """Per-node execution advantages ``r(node) - b_i`` for every rollout ``i`` of one task.

    ``node_rewards[i]`` lists the rewards (:func:`node_reward`) of rollout i's nodes; ``None`` stays
    ``None`` (no datums). Returns ``(advantages with the same nesting, zero_variance)`` where
    ``zero_variance`` is :func:`is_zero_variance` over ALL the node advantages (public rule); when it is
    True every advantage is 0.0 (TextWorld keeps them, TextCraft drops the task).

    Shapes: [n], [n][nodes_i] -> [n][nodes_i], bool.

    >>> execution_advantages([1.0, 0.0], [[1.0, 0.5], [0.0, None, 0.75]])   # b = [0.0, 1.0]
    ([[1.0, 0.5], [-1.0, None, -0.25]], False)
    >>> execution_advantages([0.0, 0.0, 0.0], [[0.0, 0.9], [0.0, 0.1], [0.0]])   # roots flat, children not
    ([[0.0, 0.9], [0.0, 0.1], [0.0]], False)
    """
    if len(root_rewards) != len(node_rewards):
        raise ValueError(f"{len(root_rewards)} root rewards but {len(node_rewards)} rollouts of node rewards")
    group = execution_group(root_rewards)
    out = [
        [None if r is None else r - b for r in nodes]
        for nodes, b in zip(node_rewards, group.baselines, strict=True)
    ]
    flat = is_zero_variance(a for nodes in out for a in nodes)
    if flat:
        out = [[None if a is None else 0.0 for a in nodes] for nodes in out]
    return out, flat


# ---- delegation stage: leaf credit ----------------------------------------------------------------
def leaf_credit(root_R: float, leaves_under_event: int, total_leaves: int) -> float:
    """``r_leaf(e) = R * |leaves under e| / |all leaves|`` (no child-success filter).

    >>> leaf_credit(1.0, 2, 3)      # a successful root; the event covers 2 of the tree's 3 leaves
    0.6666666666666666
    >>> leaf_credit(0.0, 2, 3)      # a failed root gives every launch 0
    0.0
    """
    if total_leaves < 1 or not 0 <= leaves_under_event <= total_leaves:
        raise ValueError(
            f"need 0 <= leaves_under_event ({leaves_under_event}) <= total_leaves ({total_leaves}), total >= 1"
        )
    return float(root_R) * leaves_under_event / total_leaves


@dataclass(frozen=True)
class TreeNode:
    """The three fields the leaf-credit helpers read (any object with these attributes works)."""

    node_id: Hashable
    parent_id: Hashable | None
    fork_step: int | None = None
    """The parent's step index at which this child was launched (None for the root)."""


def leaves_under_events(nodes: Iterable[Any]) -> tuple[dict[EventKey, int], int]:
    """Count the leaves under every delegation event of one tree.

    ``nodes``: objects with ``node_id``, ``parent_id`` (None for the root) and ``fork_step`` (pass the
    committed nodes only: counterfactual branches are not part of the tree). A node without children
    is its own leaf. An event ``(parent_id, fork_step)`` groups the children launched in one step; its
    leaves are the leaves of all those children's subtrees.

    Returns ``({event: leaves under it}, total leaves)``.

    >>> #        root
    >>> #       /    \\           event (root, 2) has children a and b
    >>> #      a      b          event (a, 0) has child c
    >>> #      |
    >>> #      c                 leaves: c, b  -> total 2
    >>> nodes = [TreeNode("root", None), TreeNode("a", "root", 2), TreeNode("b", "root", 2), TreeNode("c", "a", 0)]
    >>> leaves_under_events(nodes)
    ({('root', 2): 2, ('a', 0): 1}, 2)
    """
    nodes = list(nodes)
    ids = {n.node_id for n in nodes}
    children: dict[Hashable, list[Any]] = {n.node_id: [] for n in nodes}
    for n in nodes:
        if n.parent_id is not None:
            if n.parent_id not in ids:
                raise ValueError(f"node {n.node_id!r} has parent {n.parent_id!r} which is not in the tree")
            children[n.parent_id].append(n)

    leaves: dict[Hashable, int] = {}

    def count(node_id: Hashable) -> int:  # leaves in the subtree of node_id (iterative: deep trees)
        stack, order = [node_id], []
        while stack:
            nid = stack.pop()
            order.append(nid)
            stack.extend(c.node_id for c in children[nid] if c.node_id not in leaves)
        for nid in reversed(order):
            if nid not in leaves:
                kids = children[nid]
                leaves[nid] = 1 if not kids else sum(leaves[c.node_id] for c in kids)
        return leaves[node_id]

    events: dict[EventKey, int] = {}
    for n in nodes:
        if n.parent_id is not None:
            key = (n.parent_id, int(n.fork_step or 0))
            events[key] = events.get(key, 0) + count(n.node_id)
    total = sum(1 for n in nodes if not children[n.node_id])
    return events, total


def launch_rewards(root_R: float, launch_points: Sequence[EventKey], nodes: Iterable[Any]) -> list[float]:
    """Leaf credit of every launch point ``(node id, step)`` of one rollout (a step whose reply had a
    launch statement). A launch point that started no child (refused, or the code never reached the
    launch) is not an event and gets 0.

    >>> nodes = [TreeNode("r", None), TreeNode("a", "r", 1), TreeNode("b", "r", 1), TreeNode("c", "r", 4)]
    >>> launch_rewards(1.0, [("r", 1), ("r", 4), ("a", 0)], nodes)   # ("a", 0) was refused
    [0.6666666666666666, 0.3333333333333333, 0.0]
    """
    events, total = leaves_under_events(nodes)
    return [leaf_credit(root_R, events[p], total) if p in events else 0.0 for p in launch_points]


def delegation_advantages(rollout_launch_rewards: Sequence[Sequence[float]]) -> list[list[float]]:
    """Root-balanced LOO for launch rewards of one task's rollouts (public ``reward_first_root_balanced``).

    ``m_i`` = mean launch reward of rollout i, **0 for a rollout without launches**; ``b_i = mean_{j != i}
    m_j`` over ALL ``n`` rollouts; advantage of each launch of rollout i = ``r - b_i``. Averaging within
    a rollout first keeps a rollout with many launches from dominating the baseline; counting the
    rollouts that did not delegate as 0 rewards a successful delegation against them.

    Shapes: [n][launches_i] -> [n][launches_i].

    >>> delegation_advantages([[0.75, 0.25], [], [0.0]])   # m = 0.5, 0, 0 -> b = 0.0, -, 0.25
    [[0.75, 0.25], [], [-0.25]]
    >>> delegation_advantages([[1.0]] + [[]] * 7)          # one delegating rollout of 8: b = 0
    [[1.0], [], [], [], [], [], [], []]
    """
    means = [math.fsum(r) / len(r) if r else 0.0 for r in rollout_launch_rewards]
    baselines = loo_baseline(means) if means else []
    return [[r - b for r in rewards] for rewards, b in zip(rollout_launch_rewards, baselines, strict=True)]


# ---- rubric stage: ranking reward -----------------------------------------------------------------
def _valid(score: float | None) -> bool:
    return score is not None and math.isfinite(score)


def ranking_loss(
    scores: Sequence[float | None], labels: Sequence[bool | None], margin: float = 0.2
) -> float | None:
    """``L_rank = mean_{i success, j failure} max(0, margin - (s_i - s_j))`` over one counterfactual group.

    Invalid scores (``None``/NaN/inf: the score call failed to parse) and unknown labels (``None``: the
    judge's verdict failed to parse) are removed first. Needs >= 2 valid branches with both labels
    present; otherwise ``None`` (no reward for this group).

    Shapes: [K], [K] -> scalar.

    >>> # 2 successes (0.9, 0.5) x 2 failures (0.3, 0.6): pair hinges
    >>> # (0.9,0.3): max(0, 0.2-0.6)=0   (0.9,0.6): max(0, 0.2-0.3)=0
    >>> # (0.5,0.3): max(0, 0.2-0.2)=0   (0.5,0.6): max(0, 0.2+0.1)=0.3   -> mean 0.075
    >>> round(ranking_loss([0.9, 0.5, 0.3, 0.6], [True, True, False, False]), 6)
    0.075
    >>> ranking_loss([0.9, None, 0.1], [True, False, True]) is None     # one label left
    True
    >>> ranking_loss([0.9, 0.1, 0.5], [True, None, False])               # branch 1 unjudged: dropped
    0.0
    """
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores but {len(labels)} labels")
    kept = [(float(s), bool(y)) for s, y in zip(scores, labels, strict=True) if _valid(s) and y is not None]
    pos = [s for s, y in kept if y]
    neg = [s for s, y in kept if not y]
    if len(kept) < 2 or not pos or not neg:
        return None
    return math.fsum(max(0.0, margin - (si - sj)) for si in pos for sj in neg) / (len(pos) * len(neg))


def ranking_reward(
    scores: Sequence[float | None], labels: Sequence[bool | None], margin: float = 0.2
) -> float | None:
    """``R = -L_rank`` (``None`` when the group gives no signal, see :func:`ranking_loss`).

    >>> ranking_reward([0.8, 0.1], [True, False])
    -0.0
    """
    loss = ranking_loss(scores, labels, margin)
    return None if loss is None else -loss


def is_mixed_group(labels: Sequence[bool]) -> bool:
    """True when the branch labels contain both a success and a failure (else the group is skipped).

    >>> is_mixed_group([True, False, True]), is_mixed_group([True, True]), is_mixed_group([])
    (True, False, False)
    """
    return any(labels) and not all(labels)


def rubric_advantages(group_rewards: Sequence[float | None]) -> list[float | None]:
    """LOO over the valid (mixed, scored) groups of one task: ``R_g - mean_{h != g} R_h``.

    ``None`` entries (skipped groups) stay ``None`` and take no part in the baseline.

    >>> rubric_advantages([-0.5, None, -0.25, 0.0])   # b = (-0.25+0)/2, (-0.5+0)/2, (-0.5-0.25)/2
    [-0.375, None, 0.0, 0.375]
    """
    valid = [r for r in group_rewards if r is not None]
    advantages = iter(loo_advantages(valid)) if valid else iter(())
    return [None if r is None else next(advantages) for r in group_rewards]
