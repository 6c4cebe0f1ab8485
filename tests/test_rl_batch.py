"""Trees -> stage datums: hand-built trees with hand-computed advantages, depth weights and the
zero-variance rule of every stage (issue #11's examples are computed by hand in the comments).

Run: pytest tests/test_rl_batch.py
"""

from __future__ import annotations

import pytest

from common.agent.tree import CallRecord, Node, Step, Tree
from common.rl.batch import build_stage_batch, group_has_signal, tree_metrics


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
    trees = [_tree(True, 1.0), _tree(True, 1.0)]  # b = 1: roots 1 - 1 = 0, children 1 - 1 = 0
    assert build_stage_batch("execution", [trees], zero_variance="drop").datums == []
    assert not group_has_signal(trees, "execution")
    kept = build_stage_batch("execution", [trees], zero_variance="keep")
    assert kept.zero_variance_groups == [0] and kept.datums and all(d.advantage == 0.0 for d in kept.datums)
    with pytest.raises(ValueError):
        build_stage_batch("execution", [trees], zero_variance="maybe")


def test_flat_roots_with_scored_children_keep_their_signal():
    # Issue #11 on trees: every root failed (b = 0), children scored 0.9 and 0.1, the third child's
    # rubric failed (no datum). Advantages: roots 0, children 0.9 and 0.1 -> NOT zero variance.
    trees = [_tree(False, 0.9), _tree(False, 0.1), _tree(False, 0.5, rubric_ok=False)]
    b = build_stage_batch("execution", [trees], zero_variance="drop")
    assert b.zero_variance_groups == []
    child = {d.trajectory_id: round(d.advantage, 6) for d in b.datums if d.depth == 1}
    assert child == {"0/0/0.1": 0.9, "0/1/0.1": 0.1}
    assert group_has_signal(trees, "execution")  # a trainer must not replace this task
    assert group_has_signal(trees, "execution", execution_reward="binary")  # RAO: 2 children succeeded
    for t in trees:
        t.nodes["0.1"].success = False
    assert not group_has_signal(trees, "execution", execution_reward="binary")  # RAO: all fail: flat


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


def _launch_call(text: str) -> CallRecord:
    c = _call("act", text)
    c.token_offsets = [(0, 8), (8, 30), (30, len(text))]
    return c


LAUNCH = "<python>r = await launch_subagent({'a': 1})</python>"


def _delegating_tree(success: bool, root_launches: int, child_launches: int) -> Tree:
    """root launches ``root_launches`` children (one per step); its first child launches
    ``child_launches`` grandchildren (one per step). Every child is a leaf unless it launched."""
    t = Tree(task_id="t", env="textcraft", success=success)
    root = Node("0", None, 0, None, "goal", 20, success=success)
    t.nodes["0"] = root
    for k in range(root_launches):
        cid = f"0.{k + 1}"
        root.steps.append(Step(k, _launch_call(LAUNCH), "obs", [cid]))
        t.nodes[cid] = Node(cid, "0", 1, k, "sub", 20, steps=[Step(0, _call("act", "x"), "obs")])
    if root_launches and child_launches:
        child = t.nodes["0.1"]
        child.steps = []
        for k in range(child_launches):
            gid = f"0.1.{k + 1}"
            child.steps.append(Step(k, _launch_call(LAUNCH), "obs", [gid]))
            t.nodes[gid] = Node(gid, "0.1", 2, k, "subsub", 20, steps=[Step(0, _call("act", "y"), "obs")])
    root.steps.append(Step(root_launches, _call("act", "<python>finish('done')</python>"), "obs"))
    return t


def test_delegation_baseline_counts_rollouts_without_launches_as_zero():
    # Issue #11: 1 of 8 rollouts delegates (one launch, R = 1, the launch covers the tree's only leaf:
    # r = 1); the 7 others never launch: m = 0. b = 0, A = 1.0 (the old rule: b = r, A = 0).
    trees = [_delegating_tree(True, 1, 0)] + [_delegating_tree(False, 0, 0) for _ in range(7)]
    b = build_stage_batch("delegation", [trees], zero_variance="keep")
    assert [d.advantage for d in b.datums] == [1.0]
    # one datum: all its advantages are equal -> zero variance: TextCraft ("drop") drops the task, as public
    assert b.zero_variance_groups == [0]
    assert build_stage_batch("delegation", [trees], zero_variance="drop").datums == []


def test_delegation_depth_weights_count_delegating_agents_not_launches():
    # Issue #11: the root launches twice, its first child once; a second rollout never launches.
    # Datums: 2 at depth 0 (one agent), 1 at depth 1 (one agent) -> T_0 = 1, T_1 = 1 -> w = 1, 1, 1.
    # Counting launches would give T_0 = 2: Z = 3 / (1/2 + 1/2 + 1) = 1.5 -> w_0 = 0.75, w_1 = 1.5.
    trees = [_delegating_tree(True, 2, 1), _delegating_tree(False, 0, 0)]
    b = build_stage_batch("delegation", [trees], zero_variance="keep")
    assert sorted(d.depth for d in b.datums) == [0, 0, 1]
    assert b.weights == pytest.approx([1.0, 1.0, 1.0])
    assert [d.traj_start for d in b.datums if d.depth == 0] == [True, False]
    # leaves: 0.1.1 and 0.2 (total 2); events (0,0) -> 1 leaf, (0,1) -> 1, (0.1,0) -> 1: r = 1/2 each;
    # m_0 = 1/2, m_1 = 0 -> b_0 = 0: every advantage 0.5
    assert [d.advantage for d in b.datums] == pytest.approx([0.5, 0.5, 0.5])


def test_delegation_depth_weights_two_delegating_roots():
    # rollout 0 (R = 1): root launches twice, child once (as above, r = 1/2 each, m_0 = 1/2);
    # rollout 1 (R = 0): root launches once (r = 0, m_1 = 0). b_0 = 0, b_1 = 1/2.
    # Datums: depth 0 -> 3 (two agents: T_0 = 2), depth 1 -> 1 (T_1 = 1).
    # Z = 4 / (1/2 * 3 + 1/1) = 1.6 -> w_0 = 0.8, w_1 = 1.6 (launch counting: T_0 = 3 -> 2/3 and 2).
    trees = [_delegating_tree(True, 2, 1), _delegating_tree(False, 1, 0)]
    b = build_stage_batch("delegation", [trees], zero_variance="drop")
    got = sorted(
        (d.depth, round(d.advantage, 6), round(w, 6)) for d, w in zip(b.datums, b.weights, strict=True)
    )
    assert got == [(0, -0.5, 0.8), (0, 0.5, 0.8), (0, 0.5, 0.8), (1, 0.5, 1.6)]


def test_delegation_drops_all_zero_tasks_for_textcraft():
    # both roots fail: every launch reward is 0 and every advantage 0 -> no signal
    trees = [_delegating_tree(False, 1, 0), _delegating_tree(False, 2, 0)]
    assert build_stage_batch("delegation", [trees], zero_variance="drop").datums == []
    assert not group_has_signal(trees, "delegation")
    kept = build_stage_batch("delegation", [trees], zero_variance="keep")  # TextWorld keeps them
    assert len(kept.datums) == 3 and kept.zero_variance_groups == [0]
    # a task with signal next to it is kept; the weights are over the kept datums only
    good = [_delegating_tree(True, 1, 0), _delegating_tree(False, 1, 0)]
    b = build_stage_batch("delegation", [trees, good], zero_variance="drop")
    assert [round(d.advantage, 6) for d in b.datums] == [1.0, -1.0] and b.zero_variance_groups == [0]
    assert group_has_signal(good, "delegation")


def _branches(t: Tree, parent: str, group: str, rows: list[tuple[float | None, bool | None]]) -> Node:
    """Add a counterfactual group under ``parent``: branch 0 is the committed head with a rubric call."""
    head = None
    for b, (score, label) in enumerate(rows):
        nid = f"{parent}.{group}" + ("" if b == 0 else f"~b{b}")
        n = Node(nid, parent, t.nodes[parent].depth + 1, 0, "sub", 20, branch_group=group, branch_index=b)
        n.branch_label, n.score, n.rubric = label, score, {"rubric_items": []}
        n.committed = b == 0
        if b == 0:
            n.rubric_call = _call("rubric", "{...}", 4)
            head = n
        t.nodes[nid] = n
    return head


def _rubric_tree(groups: list[list[tuple[float | None, bool | None]]]) -> Tree:
    t = Tree(task_id="t", env="textcraft", success=True)
    t.nodes["0"] = Node("0", None, 0, None, "goal", 20, success=True)
    for k, rows in enumerate(groups):
        _branches(t, "0", f"g{k + 1}", rows)
    return t


def test_rubric_loo_is_per_task_not_per_batch():
    # task 0, group A: pos 0.5, neg 0.6 -> hinge 0.2 - (0.5 - 0.6) = 0.3 -> R = -0.3
    #         group B: pos 0.9, neg 0.1 -> hinge max(0, 0.2 - 0.8) = 0   -> R = 0
    # task 1, group C: pos 0.5, neg 0.4 -> hinge 0.2 - 0.1 = 0.1         -> R = -0.1
    #         group D: pos 0.5, neg 0.5 -> hinge 0.2                     -> R = -0.2
    # per-task LOO: A -0.3 - 0 = -0.3, B 0 + 0.3 = 0.3; C -0.1 + 0.2 = 0.1, D -0.2 + 0.1 = -0.1
    # (LOO over the whole batch would give A: -0.3 - (0 - 0.1 - 0.2)/3 = -0.2, ...)
    t0 = _rubric_tree([[(0.5, True), (0.6, False)], [(0.9, True), (0.1, False)]])
    t1 = _rubric_tree([[(0.5, True), (0.4, False)], [(0.5, True), (0.5, False)]])
    b = build_stage_batch("rubric", [[t0, _rubric_tree([])], [t1, _rubric_tree([])]], zero_variance="drop")
    assert [round(d.advantage, 6) for d in b.datums] == [-0.3, 0.3, 0.1, -0.1]
    assert all(d.depth == 0 and d.stage == "rubric" for d in b.datums)


def test_rubric_homogeneous_and_unjudged_groups_give_no_datum():
    # group A mixed (R = -0.3 as above); group B all success (homogeneous: no reward, no datum);
    # group C: pos 0.9, an unjudged branch (verdict failed to parse) scored 0.95, neg 0.1 -> R = 0
    # (as a failure the unjudged branch would give hinge 0.2 + 0.05 = 0.25 on the pair (0.9, 0.95)).
    # LOO over A, C: A -0.3 - 0 = -0.3, C 0 + 0.3 = 0.3
    t = _rubric_tree(
        [
            [(0.5, True), (0.6, False)],
            [(0.5, True), (0.7, True)],
            [(0.9, True), (0.95, None), (0.1, False)],
        ]
    )
    b = build_stage_batch("rubric", [[t, _rubric_tree([])]], zero_variance="drop")
    assert [round(d.advantage, 6) for d in b.datums] == [-0.3, 0.3]
    assert b.counts["groups"] == 3 and b.counts["mixed_groups"] == 2 and b.counts["unjudged_branches"] == 1


def test_rubric_zero_variance_task_is_kept_in_both_environments():
    # issue #20.12: the public trainer builds the Rubric stage with filter_zero_variance_groups=False, so a
    # task whose rubric advantages are all equal stays in the batch (its tokens count in the token-mean)
    t = _rubric_tree([[(0.5, True), (0.6, False)]])  # one mixed group: LOO of one -> advantage 0
    flat = [t, _rubric_tree([])]
    for zero_variance in ("drop", "keep"):  # TextCraft's setting does not apply to this stage
        kept = build_stage_batch("rubric", [flat], zero_variance=zero_variance)
        assert [d.advantage for d in kept.datums] == [0.0] and kept.zero_variance_groups == [0]
    assert not group_has_signal(flat, "rubric")
    # next to a task with signal it dilutes the token-mean: 4 + 4 rubric tokens, two of them carry advantage
    signal = [_rubric_tree([[(0.5, True), (0.6, False)], [(0.9, True), (0.1, False)]]), _rubric_tree([])]
    b = build_stage_batch("rubric", [flat, signal], zero_variance="drop")
    assert [round(d.advantage, 6) for d in b.datums] == [0.0, -0.3, 0.3]
    assert sum(d.num_trained_tokens for d in b.datums) == 12


def _two_credit_tree() -> Tree:
    """R = 1; the root launches 0.1 (step 0) and 0.2 (step 1); 0.1 launches 0.1.1 and 0.1.2. Leaves 0.1.1,
    0.1.2, 0.2: credits (0,0) 2/3, (0,1) 1/3, (0.1,0) 1/3, (0.1,1) 1/3 -> mean 5/12, not all equal."""
    t = _delegating_tree(True, 2, 2)
    return t


def test_one_rollout_gives_no_delegation_or_rubric_datums():
    # issue #20.12: the public workflow returns no datums below 2 root rollouts. A lone rollout's LOO
    # baseline is its own mean, so launches (or groups) of different credit WOULD get non-zero advantages.
    from common.rl.rewards import delegation_advantages, rubric_advantages

    one = _two_credit_tree()
    assert delegation_advantages([[2 / 3, 1 / 3, 1 / 3, 1 / 3]]) != [[0.0] * 4]  # what would be trained
    for zero_variance in ("drop", "keep"):
        b = build_stage_batch("delegation", [[one]], zero_variance=zero_variance)
        assert b.datums == [] and b.counts["single_rollout_groups"] == 1
    assert not group_has_signal([one], "delegation")
    two_groups = _rubric_tree([[(0.5, True), (0.6, False)], [(0.9, True), (0.1, False)]])
    assert rubric_advantages([-0.3, 0.0]) == [-0.3, 0.3]
    b = build_stage_batch("rubric", [[two_groups]], zero_variance="keep")
    assert b.datums == [] and b.counts["single_rollout_groups"] == 1
    # the same trees next to a second rollout train as usual
    assert build_stage_batch("rubric", [[two_groups, _rubric_tree([])]]).datums
    assert build_stage_batch(
        "delegation", [[one, _delegating_tree(False, 1, 0)]], zero_variance="drop"
    ).datums


def test_refused_and_unreached_launches_are_trained_with_reward_zero():
    # issue #20.11: rollout 0 (R = 1): step 0 launches 0.1 (the only leaf: r = 1), step 1's launch is
    # refused (depth limit) and step 2's launch statement was never reached (r = 0 each): m_0 = 1/3.
    # rollout 1 (R = 0): one launch, r = 0, m_1 = 0. b_0 = 0, b_1 = 1/3 -> A = 1, 0, 0 and -1/3.
    # (Skipping the launches that started no child would give m_0 = 1, b_1 = 1, A = 1 and -1.)
    t = Tree(task_id="t", env="textcraft", success=True)
    root = Node("0", None, 0, None, "goal", 20, success=True)
    root.steps = [
        Step(0, _launch_call(LAUNCH), "obs", ["0.1"]),
        Step(1, _launch_call(LAUNCH), "Launch refused", [], refused_launches=1),
        Step(2, _launch_call(LAUNCH), "NameError before the launch line", []),
        Step(3, _call("act", "<python>finish('done')</python>"), "obs"),
    ]
    t.nodes = {"0": root, "0.1": Node("0.1", "0", 1, 0, "sub", 20, steps=[Step(0, _call("act", "x"), "obs")])}
    b = build_stage_batch("delegation", [[t, _delegating_tree(False, 1, 0)]], zero_variance="drop")
    got = [(d.trajectory_id, round(d.advantage, 6)) for d in b.datums]
    assert got == [("0/0/0", 1.0), ("0/0/0", 0.0), ("0/0/0", 0.0), ("0/1/0", round(-1 / 3, 6))]
    assert all(d.num_trained_tokens > 0 for d in b.datums)  # the refused/unreached statements are trained


def test_rubric_datums_of_deeper_agents_have_their_depth():
    # a depth-1 agent (0.1) delegated and wrote a rubric: the datum's depth is the writer's (1)
    t = _rubric_tree([[(0.5, True), (0.6, False)], [(0.9, True), (0.1, False)]])
    t.nodes["0.1"] = Node("0.1", "0", 1, 0, "sub", 20)
    _branches(t, "0.1", "g9", [(0.2, True), (0.9, False)])  # hinge 0.2 + 0.7 = 0.9 -> R = -0.9
    b = build_stage_batch("rubric", [[t, _rubric_tree([])]], zero_variance="drop")
    # R = -0.3, 0, -0.9: LOO -0.3 + 0.45 = 0.15, 0 + 0.6 = 0.6, -0.9 + 0.15 = -0.75
    got = sorted((d.depth, round(d.advantage, 6)) for d in b.datums)
    assert got == [(0, 0.15), (0, 0.6), (1, -0.75)]
    # T_0 = 2 datums (2 rubric trajectories), T_1 = 1: Z = 3 / (1/2 + 1/2 + 1) = 1.5 -> 0.75, 0.75, 1.5
    assert sorted(b.weights) == pytest.approx([0.75, 0.75, 1.5])


def test_rao_child_reward_from_judge_verdicts():
    # RAO with --judge: the runtime stores each child's verdict in branch_label and marks the tree.
    t_ok, t_bad = _tree(True, None, rubric_ok=False), _tree(False, None, rubric_ok=False)
    t_ok.nodes["0.1"].success, t_bad.nodes["0.1"].success = False, True  # the programmatic check disagrees
    t_ok.nodes["0.1"].branch_label, t_bad.nodes["0.1"].branch_label = True, None  # verdict failed to parse
    for t in (t_ok, t_bad):
        t.meta["judged_children"] = True
    b = build_stage_batch("execution", [[t_ok, t_bad]], execution_reward="binary")
    # b_0 = R_1 = 0, b_1 = R_0 = 1: root 0 -> 1, child 0 (judge: success) -> 1 - 0 = 1; root 1 -> -1;
    # child 1 (no verdict) is dropped, never counted as a failure
    got = {d.trajectory_id: d.advantage for d in b.datums}
    assert got == {"0/0/0": 1.0, "0/0/0.1": 1.0, "0/1/0": -1.0} and b.counts["dropped_children"] == 1
    for t in (t_ok, t_bad):  # without the mark the programmatic check is the reward
        t.meta.clear()
    got = {
        d.trajectory_id: d.advantage for d in build_stage_batch("execution", [[t_ok, t_bad]], "binary").datums
    }
    assert got["0/0/0.1"] == 0.0 and got["0/1/0.1"] == 0.0  # 0 - 0 and 1 - 1


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


def test_execution_trains_committed_nodes_only():
    # a counterfactual branch ran on an uncommitted fork: it is not part of the tree and gives no datum,
    # even though it has steps and a score (it only serves the Rubric stage)
    trees = [_tree(True, 0.8), _tree(False, 0.3)]
    branch = Node("0.1~b1", "0", 1, 0, "sub", 20, branch_group="g1", branch_index=1, committed=False)
    branch.steps = [Step(0, _call("act", "<python>craft({}, ('a', 1))</python>"), "obs")]
    branch.rubric, branch.score = {"rubric_items": []}, 0.1
    trees[0].nodes[branch.node_id] = branch
    b = build_stage_batch("execution", [trees], execution_reward="rubric")
    assert {d.trajectory_id for d in b.datums} == {"0/0/0", "0/0/0.1", "0/1/0", "0/1/0.1"}


# ---- TextCraft's error-step filter (public get_train_data_for_trajectory, filter_errors=is_craft) ----------
TRACEBACK = "---\nNameError                                 Traceback (most recent call last)\nNameError: x\n"


def _cell(tag: int, output: str = "ok\n", error: str = "") -> Step:
    """A step whose act call is identified by ``tag`` (its first prompt id)."""
    call = CallRecord(role="act", messages=[], text="<python>x</python>", prompt_ids=[tag], output_ids=[7, 8],
                      logprobs=[-0.5, -0.5])  # fmt: skip
    return Step(tag % 10, call, "obs", cell_output=output, cell_error=error)


def _error_tree(env: str, root_ok: bool, child_success: bool, tag: int) -> Tree:
    """root: ok cell, traceback cell, ok cell; child (scorer success ``child_success``): cell with an error
    slot, ok cell. Tags: root 10*tag + 0..2, child 10*tag + 5..6."""
    t = Tree(task_id="t", env=env, success=root_ok)
    root = Node("0", None, 0, None, "goal", 20, success=root_ok)
    root.steps = [_cell(10 * tag), _cell(10 * tag + 1, output=TRACEBACK), _cell(10 * tag + 2)]
    root.steps[0].launched = ["0.1"]
    child = Node("0.1", "0", 1, 0, "sub", 20, success=child_success, rubric={"rubric_items": []})
    child.score, child.score_success = (0.9, True) if child_success else (0.0, False)
    child.steps = [_cell(10 * tag + 5, output="", error="SyntaxError: invalid syntax"), _cell(10 * tag + 6)]
    t.nodes = {"0": root, "0.1": child}
    return t


def _tags(batch) -> list[int]:
    return sorted(d.prompt_ids[0] for d in batch.datums)


def test_textcraft_drops_failed_cells_of_successful_agents_only():
    # rollout 0: the root succeeded (R = 1) and its child's scorer said success -> both lose their failed
    # cells (tags 1 and 5); rollout 1: the root failed and the scorer called its child a failure -> their
    # failed cells (21, 25) are KEPT (they carry the negative advantage)
    groups = [[_error_tree("textcraft", True, True, 0), _error_tree("textcraft", False, False, 2)]]
    b = build_stage_batch("execution", groups, execution_reward="rubric")
    assert _tags(b) == [0, 2, 6, 20, 21, 22, 25, 26]
    assert b.counts["error_steps_dropped"] == 2
    # the advantages of what is kept are unchanged: root 0 -> 1 - 0, child 0 -> 0.9 - 0
    assert {d.prompt_ids[0]: d.advantage for d in b.datums}[6] == pytest.approx(0.9)
    # T_d: every agent still has a datum, so the depth weights count 2 trajectories per depth
    assert sum(d.traj_start for d in b.datums) == 4
    # off (or TextWorld, whose EnvSpec does not filter): every cell is a datum
    everything = [0, 1, 2, 5, 6, 20, 21, 22, 25, 26]
    assert _tags(build_stage_batch("execution", groups, filter_errors=False)) == everything
    tw = [[_error_tree("textworld", True, True, 0), _error_tree("textworld", False, False, 2)]]
    tw_batch = build_stage_batch("execution", tw, zero_variance="keep")
    assert _tags(tw_batch) == everything and tw_batch.counts["error_steps_dropped"] == 0


def test_error_filter_uses_the_scorers_verdict_for_sera_children_and_the_reward_for_rao():
    # a successful root whose child the scorer called a FAILURE although the environment's check passed:
    # SERA keeps the child's failed cell (public filter_success = float(rubric_success) = 0)
    t, other = _error_tree("textcraft", True, False, 0), _error_tree("textcraft", False, False, 2)
    t.nodes["0.1"].success = True
    assert 5 in _tags(build_stage_batch("execution", [[t, other]], execution_reward="rubric"))
    # RAO: the child's binary reward is its filter_success (1 here), so the failed cell goes
    assert 5 not in _tags(build_stage_batch("execution", [[t, other]], execution_reward="binary"))


def test_error_filter_runs_before_the_zero_variance_test():
    # both roots succeed (advantage 0); the child of rollout 0 scored 0.5 (advantage 0.5 - 1) but every one
    # of its cells failed, the child of rollout 1 scored 1.0 (advantage 0). Public order: the filter drops
    # the failing child's steps first, the rest is flat, so TextCraft drops (and replaces) the group
    t0, t1 = _error_tree("textcraft", True, True, 0), _error_tree("textcraft", True, True, 2)
    t0.nodes["0.1"].score = 0.5
    t0.nodes["0.1"].steps[1].cell_output = TRACEBACK
    t1.nodes["0.1"].score = 1.0
    b = build_stage_batch("execution", [[t0, t1]])
    assert b.datums == [] and b.zero_variance_groups == [0] and b.counts["error_steps_dropped"] == 5
    assert not group_has_signal([t0, t1], "execution")
    unfiltered = build_stage_batch("execution", [[t0, t1]], filter_errors=False)
    assert unfiltered.zero_variance_groups == [] and -0.5 in {d.advantage for d in unfiltered.datums}


def test_step_cell_fields_round_trip_and_old_trees_still_load():
    t = _error_tree("textcraft", True, True, 0)
    back = Tree.from_dict(t.to_dict())
    assert back.nodes["0"].steps[1].cell_output == TRACEBACK
    assert back.nodes["0.1"].steps[0].cell_error == "SyntaxError: invalid syntax"
    old = t.to_dict()
    for node in old["nodes"].values():
        for s in node["steps"]:
            del s["cell_output"], s["cell_error"]
    loaded = Tree.from_dict(old)
    assert loaded.nodes["0"].steps[1].cell_output == "" and loaded.nodes["0.1"].steps[0].cell_error == ""
    # an old tree has no cell record: nothing is filtered
    other = _error_tree("textcraft", False, False, 2)
    assert len(build_stage_batch("execution", [[loaded, other]]).datums) == 10


def test_the_skip_rule_counts_datums_with_a_trained_token():
    # public decide_sync_action: fewer trainable datums than the 8 data-parallel ranks -> no optimizer step.
    # A Rubric round with 3 mixed groups gives 3 datums (skipped at 8); one with 8 gives 8 (it steps)
    mixed = [(0.5, True), (0.6, False)]
    three = build_stage_batch("rubric", [[_rubric_tree([mixed] * 3), _rubric_tree([])]])
    eight = build_stage_batch("rubric", [[_rubric_tree([mixed] * 5), _rubric_tree([mixed] * 3)]])
    assert (three.num_trainable_datums, eight.num_trainable_datums) == (3, 8)
    assert not three.takes_step(8) and eight.takes_step(8)
    assert three.takes_step(1) and three.takes_step(3) and not eight.takes_step(9)
    # a datum with advantage 0 still counts (the public trainable_datums mask keeps it); one without a
    # trained token does not
    assert [d.advantage for d in three.datums] == pytest.approx([0.0] * 3)
    three.datums[0].loss_mask = [0] * len(three.datums[0].loss_mask)
    assert three.num_trainable_datums == 2 and not three.takes_step(3)
    with pytest.raises(ValueError, match="min_trainable_datums must be >= 1"):
        three.takes_step(0)
