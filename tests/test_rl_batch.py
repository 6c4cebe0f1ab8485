"""Trees -> stage datums: hand-built trees with hand-computed advantages."""

from __future__ import annotations

import pytest

from common.agent.tree import CallRecord, Node, Step, Tree
from common.rl.batch import build_stage_batch, tree_metrics


def _call(role: str, text: str, n: int = 3) -> CallRecord:
    return CallRecord(
        role=role,
        messages=[],
        text=text,
        prompt_ids=[1, 2],
        output_ids=list(range(10, 10 + n)),
        logprobs=[-0.5] * n,
    )


def _tree(success: bool, child_score: float | None, rubric_ok: bool = True) -> Tree:
    """root (2 steps, launches one child at step 0) -> child (1 step)."""
    t = Tree(task_id="t", env="textcraft", success=success)
    root = Node("0", None, 0, None, "goal", 20, success=success)
    root.steps = [
        Step(0, _call("act", "<python>r = await launch_subagent({'a': 1})</python>"), "obs", ["0.1"]),
        Step(1, _call("act", "<python>finish('done')</python>"), "obs"),
    ]
    child = Node("0.1", "0", 1, 0, "sub", 20, success=child_score is not None and child_score > 0)
    child.steps = [Step(0, _call("act", "<python>craft({}, ('a', 1))</python>"), "obs")]
    child.rubric = {"rubric_items": []} if rubric_ok else None
    child.rubric_error = None if rubric_ok else "no JSON object"
    child.rubric_call = _call("rubric", "{...}", 5)
    child.score = child_score if rubric_ok else None
    t.nodes = {"0": root, "0.1": child}
    return t


def test_execution_advantages_use_root_loo_and_child_scores():
    trees = [_tree(True, 0.8), _tree(False, 0.3)]
    b = build_stage_batch("execution", [trees], execution_reward="rubric")
    # rollout 0: b = R_1 = 0; root adv 1, child adv 0.8; rollout 1: b = 1; root -1, child 0.3-1
    advs = sorted((d.trajectory_id, round(d.advantage, 6)) for d in b.datums)
    assert advs == [
        ("0/0/0", 1.0),
        ("0/0/0", 1.0),
        ("0/0/0.1", 0.8),
        ("0/1/0", -1.0),
        ("0/1/0", -1.0),
        ("0/1/0.1", -0.7),
    ]
    assert all(d.loss_mask == [1, 1, 1] for d in b.datums)
    assert sum(b.weights) == pytest.approx(len(b.weights))


def test_binary_execution_reward_for_rao():
    b = build_stage_batch("execution", [[_tree(True, 0.8), _tree(False, 0.0)]], execution_reward="binary")
    child = [d for d in b.datums if d.trajectory_id == "0/0/0.1"]
    assert child and child[0].advantage == pytest.approx(1.0 - 0.0)  # success 1 - b (R of the other = 0)


def test_failed_rubric_drops_exactly_that_childs_datums():
    b = build_stage_batch("execution", [[_tree(True, 0.8), _tree(False, 0.5, rubric_ok=False)]])
    ids = {d.trajectory_id for d in b.datums}
    assert ids == {"0/0/0", "0/0/0.1", "0/1/0"} and b.counts["dropped_children"] == 1


def test_zero_variance_groups_drop_or_keep():
    trees = [_tree(True, 0.8), _tree(True, 0.1)]
    assert build_stage_batch("execution", [trees], zero_variance="drop").datums == []
    kept = build_stage_batch("execution", [trees], zero_variance="keep")
    assert kept.zero_variance_groups == [0] and kept.datums and all(d.advantage == 0.0 for d in kept.datums)


class _OffsetsTok:
    """A stand-in tokenizer is not needed: calls carry token offsets."""


def test_delegation_leaf_credit_and_loo():
    trees = [_tree(True, 0.8), _tree(False, 0.3)]
    for t in trees:  # one token per 17 chars of the launch reply so the span maps onto tokens
        c = t.nodes["0"].steps[0].call
        c.token_offsets = [(0, 8), (8, 30), (30, len(c.text))]
    b = build_stage_batch("delegation", [trees])
    # rollout 0: 1 event covering the only leaf -> r = 1; rollout 1: R = 0 -> r = 0. LOO: +1, -1
    assert [round(d.advantage, 6) for d in b.datums] == [1.0, -1.0]
    assert b.datums[0].loss_mask[-1] == 1 and b.datums[0].loss_mask[0] == 0


def test_rubric_ranking_reward_over_counterfactual_groups():
    t = _tree(True, 0.8)
    head = t.nodes["0.1"]
    head.branch_group, head.branch_index, head.branch_label = "g1", 0, True
    for b, (score, label) in enumerate([(0.7, False), (0.2, False), (0.9, True)], start=1):
        n = Node(
            f"0.{b + 1}~b{b}",
            "0",
            1,
            0,
            "sub",
            20,
            branch_group="g1",
            branch_index=b,
            branch_label=label,
            score=score,
            rubric=head.rubric,
            committed=False,
        )
        t.nodes[n.node_id] = n
    t2 = _tree(True, 0.5)
    h2 = t2.nodes["0.1"]
    h2.branch_group, h2.branch_index, h2.branch_label = "g1", 0, False
    n = Node(
        "0.2~b1",
        "0",
        1,
        0,
        "sub",
        20,
        branch_group="g1",
        branch_index=1,
        branch_label=True,
        score=0.9,
        rubric=h2.rubric,
        committed=False,
    )
    t2.nodes[n.node_id] = n
    batch = build_stage_batch("rubric", [[t, t2]])
    # group 1: pos {0.8, 0.9} x neg {0.7, 0.2}: hinges (0.8,0.7)=0.1, others 0 -> L = 0.025
    # group 2: pos {0.9} x neg {0.5}: 0 -> L = 0. LOO: -0.025 - 0 = -0.025, 0 + 0.025 = 0.025
    assert [round(d.advantage, 6) for d in batch.datums] == [-0.025, 0.025]
    assert all(d.stage == "rubric" and d.depth == 0 for d in batch.datums)
    m = tree_metrics([t, t2])
    assert m["rubric/pair_accuracy"] == 1.0  # every success outscored every failure
    h2.score = 0.95  # now the failed branch 0 of group 2 outscores its success (0.9)
    assert tree_metrics([t, t2])["rubric/pair_accuracy"] == pytest.approx(4 / 5)


def test_tree_metrics_names_and_values():
    m = tree_metrics([_tree(True, 0.8), _tree(False, 0.3, rubric_ok=False)])
    assert m["reward/root_success"] == 0.5
    assert m["rubric/parse_fail_rate"] == 0.5
    assert m["tree/nodes_mean"] == 2 and m["tree/depth_mean"] == 1
    assert m["reward/exec_mean"] == pytest.approx((1.0 + 0.8 + 0.0) / 3)
