"""Rewards and LOO advantages (common/rl/rewards.py) vs naive loop references and hand-computed cases.

Run: pytest tests/test_rl_rewards.py
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.rl.rewards import (
    TreeNode,
    delegation_advantages,
    execution_advantages,
    execution_group,
    is_mixed_group,
    is_zero_variance,
    launch_rewards,
    leaf_credit,
    leaves_under_events,
    loo_advantages,
    loo_baseline,
    node_reward,
    ranking_loss,
    ranking_reward,
    rubric_advantages,
)

floats = st.floats(-10, 10, allow_nan=False)


# ---- naive references ------------------------------------------------------------------------------
def naive_loo(values):
    out = []
    for i in range(len(values)):
        others = [values[j] for j in range(len(values)) if j != i]
        out.append(sum(others) / len(others) if others else values[i])
    return out


def naive_ranking_loss(scores, labels, margin=0.2):
    keep = [k for k in range(len(scores)) if labels[k] is not None]  # unjudged branches are dropped
    scores, labels = [scores[k] for k in keep], [labels[k] for k in keep]
    pairs = []
    for i in range(len(scores)):
        for j in range(len(scores)):
            si, sj = scores[i], scores[j]
            if si is None or sj is None or math.isnan(si) or math.isnan(sj):
                continue
            if labels[i] and not labels[j]:
                pairs.append(max(0.0, margin - (si - sj)))
    n_valid = sum(1 for s in scores if s is not None and not math.isnan(s))
    if n_valid < 2 or not pairs:
        return None
    return sum(pairs) / len(pairs)


def naive_leaves(nodes, node_id):
    kids = [n for n in nodes if n.parent_id == node_id]
    if not kids:
        return [node_id]
    return [leaf for k in kids for leaf in naive_leaves(nodes, k.node_id)]


# ---- LOO -------------------------------------------------------------------------------------------
def test_loo_three_rollouts_by_hand():
    # R = [1, 0, 1]: b_0 = (0+1)/2 = 0.5, b_1 = (1+1)/2 = 1, b_2 = (1+0)/2 = 0.5
    assert loo_baseline([1.0, 0.0, 1.0]) == [0.5, 1.0, 0.5]
    assert loo_advantages([1.0, 0.0, 1.0]) == [0.5, -1.0, 0.5]


def test_loo_single_and_empty():
    assert loo_baseline([0.3]) == [0.3] and loo_advantages([0.3]) == [0.0]
    assert loo_baseline([]) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(floats, min_size=1, max_size=12))
def test_loo_matches_naive(values):
    assert loo_baseline(values) == pytest.approx(naive_loo(values), abs=1e-9)
    if len(values) > 1:  # LOO advantage = n/(n-1) * (v - mean)
        mean = sum(values) / len(values)
        n = len(values)
        assert loo_advantages(values) == pytest.approx([n / (n - 1) * (v - mean) for v in values], abs=1e-9)


# ---- execution ---------------------------------------------------------------------------------------
def test_node_reward():
    assert node_reward(True, 1.0, 0.3) == 1.0  # the root ignores any score
    assert node_reward(False, 1.0, 0.3) == 0.3
    assert node_reward(False, 0.0, None) is None


def test_execution_hand_example():
    # 3 rollouts, R = [1, 0, 0]; rollout 0 has a child scored 0.8, rollout 1 a child whose score failed
    adv, zero = execution_advantages([1.0, 0.0, 0.0], [[1.0, 0.8], [0.0, None], [0.0]])
    # b = [0, 0.5, 0.5]
    assert not zero
    assert adv == [[1.0, 0.8], [-0.5, None], [-0.5]]


def test_execution_zero_variance():
    g = execution_group([1.0, 1.0, 1.0])
    assert g.roots_equal and g.root_advantages == [0.0, 0.0, 0.0]
    adv, zero = execution_advantages([1.0, 1.0], [[1.0, 1.0], [1.0]])  # every datum's advantage is 0
    assert zero and adv == [[0.0, 0.0], [0.0]]  # TextWorld keeps the task at zero advantage
    adv, zero = execution_advantages([0.0, 0.0], [[0.0, None], [0.0]])  # a dropped child is no datum
    assert zero and adv == [[0.0, None], [0.0]]
    assert execution_group([1.0]).roots_equal  # one rollout: no root signal
    assert execution_advantages([1.0], [[1.0]]) == ([[0.0]], True)
    with pytest.raises(ValueError):
        execution_advantages([1.0], [[1.0], [0.0]])


def test_execution_zero_variance_looks_at_every_datum_not_only_roots():
    # Issue #11: every root failed (R = 0, 0, 0 -> b = 0, 0, 0) but the children were scored 0.9 and 0.1
    # by their rubrics: advantages 0 - 0 = 0 for the roots, 0.9 - 0 and 0.1 - 0 for the children.
    # The advantages are not all equal, so the group is NOT zero-variance and the children keep 0.9 / 0.1.
    adv, zero = execution_advantages([0.0, 0.0, 0.0], [[0.0, 0.9], [0.0, 0.1], [0.0]])
    assert not zero
    assert adv == [[0.0, pytest.approx(0.9)], [0.0, pytest.approx(0.1)], [0.0]]
    # every root succeeded, children scored 0.9 and 1.0: b = 1, advantages 0, -0.1, 0, 0 -> signal
    adv, zero = execution_advantages([1.0, 1.0], [[1.0, 0.9], [1.0, 1.0]])
    assert not zero and adv[0][1] == pytest.approx(-0.1)


def test_is_zero_variance_by_hand():
    assert is_zero_variance([0.0, 0.0]) and is_zero_variance([0.5]) and is_zero_variance([])
    assert is_zero_variance([None, None]) and is_zero_variance([1.0, None, 1.0])
    assert not is_zero_variance([0.0, 0.9]) and not is_zero_variance([-0.1, None, 0.0])


def naive_execution(roots, node_rewards):
    """Naive reference: per-datum r - LOO(roots); flagged when max == min over all non-None datums."""
    out = []
    for i, nodes in enumerate(node_rewards):
        others = [roots[j] for j in range(len(roots)) if j != i]
        b = sum(others) / len(others) if others else roots[i]
        out.append([None if r is None else r - b for r in nodes])
    flat_values = [a for nodes in out for a in nodes if a is not None]
    zero = not flat_values or max(flat_values) - min(flat_values) <= 1e-12
    if zero:
        out = [[None if a is None else 0.0 for a in nodes] for nodes in out]
    return out, zero


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=8), st.randoms(use_true_random=False))
def test_execution_matches_naive(roots, rng):
    node_rewards = [
        [r] + [rng.choice([None, rng.random(), 0.0, 1.0]) for _ in range(rng.randrange(3))] for r in roots
    ]
    adv, zero = execution_advantages(roots, node_rewards)
    ref, ref_zero = naive_execution(roots, node_rewards)
    assert zero == ref_zero
    for i, nodes in enumerate(node_rewards):
        for k, r in enumerate(nodes):
            if r is None:
                assert adv[i][k] is None
            else:
                assert adv[i][k] == pytest.approx(ref[i][k])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=8), st.randoms(use_true_random=False))
def test_execution_matches_naive_formula(roots, rng):
    node_rewards = [[r] + [rng.choice([None, rng.random()]) for _ in range(rng.randrange(3))] for r in roots]
    adv, zero = execution_advantages(roots, node_rewards)
    b = naive_loo(roots)
    for i, nodes in enumerate(node_rewards):
        for k, r in enumerate(nodes):
            if r is None:
                assert adv[i][k] is None
            else:
                assert adv[i][k] == pytest.approx(0.0 if zero else r - b[i])


# ---- leaf credit -------------------------------------------------------------------------------------
def test_tree_with_three_leaves_gives_two_thirds():
    #          root
    #   step 1 /  \ step 1   step 5 \       event (root, 1): children a, b -> leaves c, d, b = 3
    #         a    b                 e      event (a, 0): children c, d    -> leaves c, d    = 2
    # step 0 / \                            event (root, 5): child e       -> leaf e         = 1
    #       c   d                           all leaves: c, d, b, e = 4
    nodes = [
        TreeNode("root", None),
        TreeNode("a", "root", 1),
        TreeNode("b", "root", 1),
        TreeNode("c", "a", 0),
        TreeNode("d", "a", 0),
        TreeNode("e", "root", 5),
    ]
    events, total = leaves_under_events(nodes)
    assert total == 4
    assert events == {("root", 1): 3, ("a", 0): 2, ("root", 5): 1}

    # the 3-leaf tree: root -> (step 2) a, b ; root -> (step 4) c. Event (root, 2) covers 2 of 3 leaves.
    nodes = [TreeNode("r", None), TreeNode("a", "r", 2), TreeNode("b", "r", 2), TreeNode("c", "r", 4)]
    events, total = leaves_under_events(nodes)
    assert total == 3 and events == {("r", 2): 2, ("r", 4): 1}
    assert leaf_credit(1.0, events[("r", 2)], total) == pytest.approx(2 / 3)
    assert launch_rewards(1.0, [("r", 2), ("r", 4)], nodes) == pytest.approx([2 / 3, 1 / 3])
    assert launch_rewards(0.0, [("r", 2), ("r", 4)], nodes) == [0.0, 0.0]  # failed root: all 0


def test_lonely_root_is_its_own_leaf_and_refused_launch_gets_zero():
    events, total = leaves_under_events([TreeNode("r", None)])
    assert events == {} and total == 1
    assert launch_rewards(1.0, [("r", 3)], [TreeNode("r", None)]) == [0.0]  # refused: no child


def test_leaf_credit_validation():
    with pytest.raises(ValueError):
        leaf_credit(1.0, 3, 2)
    with pytest.raises(ValueError):
        leaf_credit(1.0, 0, 0)
    with pytest.raises(ValueError):
        leaves_under_events([TreeNode("a", "missing", 0)])


def random_tree(rng: random.Random, n: int) -> list[TreeNode]:
    nodes = [TreeNode(0, None)]
    for i in range(1, n):
        parent = rng.randrange(i)
        nodes.append(TreeNode(i, parent, rng.randrange(3)))
    rng.shuffle(nodes)
    return nodes


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 25), st.randoms(use_true_random=False))
def test_leaves_under_events_matches_naive(n, rng):
    nodes = random_tree(rng, n)
    events, total = leaves_under_events(nodes)
    assert total == len(naive_leaves(nodes, 0))
    naive_events = {}
    for node in nodes:
        if node.parent_id is not None:
            key = (node.parent_id, node.fork_step)
            naive_events.setdefault(key, []).extend(naive_leaves(nodes, node.node_id))
    assert events == {k: len(v) for k, v in naive_events.items()}
    assert sum(events[k] for k in events if k[0] == 0) == total or n == 1  # the root's events cover all


def test_delegation_advantages_hand_example():
    # rollout 0: launches 2/3, 1/3 (mean 1/2); rollout 1: no launches (m = 0); rollout 2: a refused
    # launch (m = 0). b_0 = (0 + 0) / 2 = 0; b_2 = (1/2 + 0) / 2 = 1/4.
    adv = delegation_advantages([[2 / 3, 1 / 3], [], [0.0]])
    assert adv[0] == pytest.approx([2 / 3, 1 / 3]) and adv[1] == [] and adv[2] == pytest.approx([-0.25])
    assert delegation_advantages([[], []]) == [[], []]


def test_delegation_one_delegating_rollout_of_eight():
    # Issue #11: one rollout of 8 delegates (one launch, leaf credit r = 1); the 7 others have no launch
    # and count as m = 0, so b = (0 * 7) / 7 = 0 and A = 1 - 0 = 1.0 (the old rule gave b = r, A = 0).
    adv = delegation_advantages([[1.0]] + [[] for _ in range(7)])
    assert adv[0] == [1.0] and all(a == [] for a in adv[1:])
    # two of 8 delegate: m = 1, 0.5, 0 x 6 -> b_0 = 0.5 / 7, b_1 = 1 / 7
    adv = delegation_advantages([[1.0], [0.5]] + [[] for _ in range(6)])
    assert adv[0] == pytest.approx([1 - 0.5 / 7]) and adv[1] == pytest.approx([0.5 - 1 / 7])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.floats(0, 1), max_size=4), min_size=1, max_size=8))
def test_delegation_advantages_matches_naive(rewards):
    adv = delegation_advantages(rewards)
    means = [sum(r) / len(r) if r else 0.0 for r in rewards]  # a rollout without launches: m = 0
    for i, r in enumerate(rewards):
        others = [means[j] for j in range(len(rewards)) if j != i]
        b = sum(others) / len(others) if others else means[i]
        assert adv[i] == pytest.approx([x - b for x in r], abs=1e-9)


# ---- ranking -----------------------------------------------------------------------------------------
def test_ranking_loss_2x2_by_hand():
    scores, labels = [0.9, 0.5, 0.3, 0.6], [True, True, False, False]
    # pairs (succ, fail): (0.9,0.3) -> max(0, 0.2-0.6) = 0     (0.9,0.6) -> max(0, 0.2-0.3) = 0
    #                     (0.5,0.3) -> max(0, 0.2-0.2) = 0     (0.5,0.6) -> max(0, 0.2+0.1) = 0.3
    assert ranking_loss(scores, labels) == pytest.approx(0.3 / 4)
    assert ranking_reward(scores, labels) == pytest.approx(-0.075)
    # margin 0.5: (0.9,0.3) 0, (0.9,0.6) 0.2, (0.5,0.3) 0.3, (0.5,0.6) 0.6 -> 1.1 / 4
    assert ranking_loss(scores, labels, margin=0.5) == pytest.approx(1.1 / 4)


def test_ranking_invalid_and_degenerate_groups():
    assert ranking_loss([0.9, float("nan"), 0.1], [True, True, False]) == pytest.approx(0.0)
    assert ranking_loss([0.2, None, 0.9], [True, False, False]) == pytest.approx(0.9)  # 0.2 - 0.9 -> 0.2+0.7
    assert ranking_loss([0.9, None], [True, False]) is None  # one valid score
    assert ranking_loss([0.9, 0.8], [True, True]) is None  # all success
    assert ranking_loss([0.1, 0.2], [False, False]) is None  # all failure
    assert ranking_loss([0.5, float("nan"), float("inf")], [True, False, False]) is None
    assert ranking_reward([0.9], [True]) is None
    assert is_mixed_group([True, False]) and not is_mixed_group([False, False])


def test_ranking_drops_branches_without_a_verdict():
    # an unparseable judge verdict (label None) drops the branch; it is NOT a failure.
    # As a failure, branch 1 (score 0.8) would give the pair (0.9, 0.8): hinge 0.2 - 0.1 = 0.1.
    assert ranking_loss([0.9, 0.8, 0.1], [True, None, False]) == pytest.approx(0.0)
    assert ranking_loss([0.9, 0.8, 0.1], [True, False, False]) == pytest.approx(0.05)
    assert ranking_loss([0.9, 0.8], [True, None]) is None  # one judged branch left


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.just(float("nan")), st.floats(0, 1)), st.one_of(st.none(), st.booleans())
        ),
        max_size=8,
    ),
    st.floats(0, 1),
)
def test_ranking_loss_matches_naive(pairs, margin):
    scores = [s for s, _ in pairs]
    labels = [y for _, y in pairs]
    got, ref = ranking_loss(scores, labels, margin), naive_ranking_loss(scores, labels, margin)
    assert (got is None) == (ref is None)
    if ref is not None:
        assert got == pytest.approx(ref, abs=1e-12)


def test_rubric_advantages():
    # three mixed groups of one task (rewards -0.5, -0.25, 0) and one skipped group
    adv = rubric_advantages([-0.5, None, -0.25, 0.0])
    assert adv[1] is None
    assert adv[0] == pytest.approx(-0.5 - (-0.25 + 0.0) / 2)
    assert adv[2] == pytest.approx(-0.25 - (-0.5 + 0.0) / 2)
    assert adv[3] == pytest.approx(0.0 - (-0.5 - 0.25) / 2)
    assert rubric_advantages([None, -0.3]) == [None, 0.0]  # one valid group: no signal
    assert rubric_advantages([]) == []
