"""Issue #21, items 4-5: a Rubric-stage round with a discriminating scorer trains (datums with non-zero
advantages, pair accuracy computed by hand), an idle round names its stage's real reason, and the timing
metrics are wall times (overlapping scoring calls count once; the round's wall time is logged).

Run: pytest tests/test_round_signal_metrics.py
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from common.agent.runtime import run_root
from common.agent.tree import CallRecord, Node, Step, Tree
from common.envs import make_env
from common.envs.textcraft.oracle import flawed_reply, oracle_reply
from common.policy.base import Completion, GenerationRequest, Policy
from common.policy.scripted import rubric_json, score_json
from common.rl.batch import build_stage_batch, counterfactual_groups, tree_metrics
from common.run.data import task_pool
from common.run.metrics import busy_seconds, scoring_seconds, step_metrics, timing_metrics
from common.run.rollout import stage_runtime_config
from common.run.setup import idle_hint
from common.train_config import TrainConfig, laptop_rollout


# ---------------------------------------------------------------- a discriminating scorer, end to end
class Discriminating(Policy):
    """The oracle for every agent, except branches 1 and 3 of each counterfactual group, which claim
    success without crafting (so they fail). Rubrics: the template, with token ids (so a datum exists).
    Scores: 0.9 for a child that succeeded, 0 for one that failed; with ``errs`` the scorer is fooled once
    (branch 3 of group 1 scored 0.95 with success true)."""

    name = "discriminating"
    trainable = False

    def __init__(self, errs: bool):
        self.errs = errs

    async def generate(self, request: GenerationRequest) -> Completion:
        nid = str(request.meta.get("node_id"))
        if request.role == "act":
            if nid.endswith(("~b1", "~b3")):
                return Completion(text=flawed_reply(request.session, "false_finish", look_up=False))
            return Completion(text=oracle_reply(request.session, delegate=True))
        if request.role == "rubric":
            text = rubric_json(str(request.meta.get("goal", "")))
            return Completion(text=text, prompt_ids=[1, 2], output_ids=[5, 6, 7], logprobs=[-0.1] * 3)
        if self.errs and nid == "0.4~b3":
            return Completion(text=score_json(True, value=0.95))
        return Completion(text=score_json(bool(request.meta["child_success"]), value=0.9))


@pytest.fixture(scope="module")
def rubric_round():
    """One task, 2 rollouts in the Rubric-stage shape (K=4); the second rollout's scorer errs once."""
    task = task_pool("textcraft", None, 1, 0, "easy")[0]
    cfg = stage_runtime_config("textcraft", laptop_rollout(), "rubric", True, 1)
    env = make_env("textcraft")
    return [asyncio.run(run_root(task, env, Discriminating(errs), cfg)) for errs in (False, True)]


def test_a_discriminating_scorer_gives_rubric_datums_and_pair_accuracy_by_hand(rubric_round):
    trees = rubric_round
    for t in trees:  # the constructed shape: 3 mixed groups per rollout, branches 0/2 succeed, 1/3 fail
        groups = counterfactual_groups(t)
        assert list(groups) == ["g1", "g2", "g3"]
        for branches in groups.values():
            assert [b.branch_label for b in branches] == [True, False, True, False]
    assert trees[1].nodes["0.4~b3"].score == 0.95 and not trees[1].nodes["0.4~b3"].success
    # Ranking reward R = -mean over (success i, failure j) of max(0, 0.2 - (s_i - s_j)):
    #   a faithful group: s = 0.9, 0, 0.9, 0 -> every hinge max(0, 0.2 - 0.9) = 0 -> R = 0;
    #   rollout 1, g1: failures scored 0 and 0.95 -> hinges 0, 0.25 (x2 successes) -> L = 0.5/4 -> R = -0.125.
    # LOO over the task's 6 mixed groups: the fooled group -0.125 - 0 = -0.125; the others
    # 0 - (-0.125)/5 = +0.025.
    batch = build_stage_batch("rubric", [trees], "rubric", zero_variance="drop")
    assert batch.counts["groups"] == 6 and batch.counts["mixed_groups"] == 6
    got = [round(d.advantage, 9) for d in batch.datums]
    assert got == [0.025, 0.025, 0.025, -0.125, 0.025, 0.025]
    assert all(d.stage == "rubric" and d.depth == 0 and d.num_trained_tokens == 3 for d in batch.datums)
    assert build_stage_batch("rubric", [trees], "rubric", zero_variance="keep").datums  # the same group kept
    # Pair accuracy: 6 groups x (2 successes x 2 failures) = 24 pairs; only 0.9 vs 0.95 is ranked wrong
    # (twice, one per success of that group) -> 22/24.
    assert tree_metrics(trees)["rubric/pair_accuracy"] == pytest.approx(22 / 24)
    assert tree_metrics(trees[:1])["rubric/pair_accuracy"] == 1.0


# ---------------------------------------------------------------- idle messages: each stage's own reason
def _group(t: Tree, k: int, rows: list[tuple[float | None, bool]], rubric: bool = True) -> None:
    for b, (score, label) in enumerate(rows):
        nid = f"0.{k}" + ("" if b == 0 else f"~b{b}")
        n = Node(nid, "0", 1, 0, "sub", 20, branch_group=f"g{k}", branch_index=b, committed=b == 0)
        n.branch_label, n.score, n.rubric = label, score, {"rubric_items": []} if rubric else None
        t.nodes[nid] = n


def _tree(groups: list[list[tuple[float | None, bool]]]) -> Tree:
    t = Tree(task_id="t", env="textcraft", success=True)
    t.nodes["0"] = Node("0", None, 0, None, "goal", 20, success=True)
    for k, rows in enumerate(groups, start=1):
        _group(t, k, rows)
    return t


def _hint(stage: str, groups: list[list[Tree]], **kw) -> str:
    batch = build_stage_batch(stage, groups, "rubric", zero_variance="drop")
    return idle_hint(TrainConfig.make(**kw), stage, batch, groups)


def test_idle_execution_names_equal_outcomes():
    msg = idle_hint(TrainConfig.make(), "execution", SimpleNamespace(counts={}), [[_tree([])] * 2])
    assert "every rollout of a task had the same outcome" in msg and "sera sft" in msg
    assert "same outcome" not in idle_hint(TrainConfig.make(), "rubric", None, [])  # not used elsewhere


def test_idle_rubric_counts_mixed_groups_ranked_equally():
    tied = [(0.9, True), (0.9, False), (0.9, True), (0.9, False)]  # every child called a success
    groups = [[_tree([tied, tied, tied]), _tree([tied, tied, tied])], [_tree([tied] * 3), _tree([tied] * 3)]]
    msg = _hint("rubric", groups)
    assert "12 mixed branch groups, every rubric ranked its branches equally" in msg
    assert "same outcome" not in msg


def test_idle_rubric_no_mixed_group_and_no_group():
    same = [(0.9, True), (0.5, True)]
    msg = _hint("rubric", [[_tree([same, same]), _tree([same])]])
    assert "3 branch groups, none mixed" in msg
    msg = _hint("rubric", [[_tree([]), _tree([])]])
    assert "no rollout delegated" in msg and "no counterfactual branch group" in msg


def test_idle_rubric_equal_rewards_without_ties():
    # each task's groups rank their branches perfectly (R = 0 each): LOO advantages all 0
    good = [(0.9, True), (0.0, False)]
    msg = _hint("rubric", [[_tree([good]), _tree([good, good])]])
    assert "3 mixed branch groups (none tied)" in msg and "every advantage was 0" in msg


def test_idle_delegation_names_launches():
    msg = _hint("delegation", [[_tree([]), _tree([])]])
    assert "no agent wrote a launch" in msg
    batch = SimpleNamespace(counts={"launches": 5, "unaligned": 0, "no_launch": 0})
    msg = idle_hint(TrainConfig.make(), "delegation", batch, [[_tree([])] * 2])
    assert "5 launch points" in msg and "same launch reward" in msg


def test_idle_one_rollout_per_task():
    msg = _hint("rubric", [[_tree([[(0.9, True), (0.0, False)]])]])
    assert "every task had 1 rollout" in msg and "Rubric stage" in msg


# ---------------------------------------------------------------- timing: wall time, not summed durations
def _timed(role: str, start: float, end: float) -> CallRecord:
    return CallRecord(role=role, messages=[], text="", seconds=end - start, ended=end)


def test_scoring_time_is_the_union_of_overlapping_calls():
    assert busy_seconds([(0, 2), (1, 3)]) == 3.0  # not 4
    assert busy_seconds([(0, 1), (0.5, 0.7), (2, 3)]) == 2.0
    t = _tree([[(0.9, True), (0.0, False)]])
    t.nodes["0.1"].rubric_call = _timed("rubric", 100.0, 102.0)
    t.nodes["0.1"].score_call = _timed("score", 101.0, 103.0)  # overlaps the rubric call
    t.nodes["0.1~b1"].score_call = _timed("score", 110.0, 111.0)
    assert scoring_seconds([t]) == pytest.approx(4.0)  # [100, 103] + [110, 111]; the sum would be 5
    batch = build_stage_batch("rubric", [[t]], "rubric", zero_variance="drop")
    m = step_metrics(
        round=0, step=0, stage="rubric", trees=[t], batch=batch, train={}, execution_reward="rubric",
        t_rollout=12.0, t_train=1.0, replaced=0, t_round=14.5,
    )  # fmt: skip
    assert m["time/scoring_s"] == pytest.approx(4.0) and m["time/round_s"] == 14.5
    assert m["time/scoring_s"] <= m["time/rollout_s"] <= m["time/round_s"]


def test_timing_metrics_tail_is_what_scores_add_after_the_last_act_call():
    t, plain = _tree([[(0.9, True), (0.0, False)]]), _tree([[(0.9, True)]])
    act = CallRecord(role="act", messages=[], text="", output_ids=[1, 2, 3], seconds=4.0, ended=100.0)
    t.nodes["0"].steps = [Step(index=0, call=act, observation="")]
    t.nodes["0.1"].rubric_call = _timed("rubric", 95.0, 99.0)  # inside the agents' time
    t.nodes["0.1"].score_call = _timed("score", 99.0, 102.5)  # 2.5 s past the tree's last act call
    t.seconds, plain.seconds = 9.0, 3.0
    m = timing_metrics([t, plain])  # `plain` has no act call: no tail
    assert m["time/tail_max_s"] == pytest.approx(2.5) and m["time/tail_mean_s"] == pytest.approx(1.25)
    assert (m["time/tree_max_s"], m["gen/act_tokens"], m["gen/rubric_tokens"]) == (9.0, 3.0, 0.0)
    assert (m["gen/rubric_calls"], m["gen/score_calls"]) == (1.0, 1.0)
    t.nodes["0.1"].score_call = _timed("score", 96.0, 99.5)  # done before the last act call: no tail
    assert timing_metrics([t])["time/tail_max_s"] == 0.0


def test_runtime_calls_carry_their_interval(rubric_round):
    calls = [c for t in rubric_round for n in t.nodes.values() for c in (n.rubric_call, n.score_call) if c]
    assert calls and all(c.ended > 1e9 and c.seconds >= 0 for c in calls)  # wall clock, seconds since 1970
    # Each interval is rebuilt as (ended - seconds, ended) from epoch times (~1.8e9 s), whose float
    # spacing is ~2.4e-7 s: the union may exceed the plain sum by that much per call, never more.
    assert scoring_seconds(rubric_round) <= sum(c.seconds for c in calls) + 1e-6 * len(calls)
