"""Counterfactual branches as the public ``CounterfactualCollector`` (issue #20 item 8) and their judge and
score calls in one concurrent wave (issue #21).

Public ``three_stage_train/counterfactual.py``: all K branches run on isolated copies of one snapshot; once
every branch has ended, branch 0's final state is committed to the parent's environment and the launch
returns ``<branch 0's finish message>\\n\\nSelected branch: 0; counterfactual branches collected: K.\\n``.
"""

from __future__ import annotations

import asyncio
import json

from common.agent.runtime import RuntimeConfig, run_root
from common.envs import make_env
from common.envs.textcraft.oracle import oracle_reply as tc_oracle
from common.envs.textcraft.tasks import generate_tasks as tc_tasks
from common.policy.base import Completion, GenerationRequest, Policy
from common.policy.scripted import rubric_json, score_json

K = 4


class Scripted(Policy):
    """Deterministic replies: the root delegates its first target at step 0 and finishes at step 1; branch
    0 and branch 2 craft with the oracle, branches 1 and 3 give up. ``delays`` (per branch index) make the
    judge-free score calls return in another order; ``barrier`` holds every score call until all K are in
    flight (they must reach the policy in one wave)."""

    def __init__(
        self, world_log: list, live: list, delays: dict[int, int] | None = None, barrier: bool = False
    ):
        self.world_log, self.live, self.delays, self.barrier = world_log, live, delays or {}, barrier
        self.scores_in_flight, self.max_scores_in_flight = 0, 0
        self.all_scores_arrived = asyncio.Event() if barrier else None
        self.item: tuple[str, int] | None = None

    @staticmethod
    def branch(node_id: str) -> int:
        return int(node_id.split("~b")[1]) if "~b" in node_id else 0

    async def generate(self, request: GenerationRequest) -> Completion:
        nid = str(request.meta.get("node_id"))
        if request.role == "score":
            self.scores_in_flight += 1
            self.max_scores_in_flight = max(self.max_scores_in_flight, self.scores_in_flight)
            if self.barrier:
                if self.scores_in_flight == K:
                    self.all_scores_arrived.set()
                await asyncio.wait_for(self.all_scores_arrived.wait(), timeout=5)
            for _ in range(self.delays.get(self.branch(nid), 0)):
                await asyncio.sleep(0)
            self.scores_in_flight -= 1
            text = score_json(bool(request.meta.get("child_success")))
        elif request.role == "rubric":
            text = rubric_json("crafted")
        elif nid == "0":
            if request.meta["step"] == 0:
                item, n = next(iter(request.session.targets.items()))
                self.item = (item, n)
                text = f"<python>r = await launch_subagent({{'{item}': {n}}})\nprint(r)</python>"
            else:
                text = "<python>finish('done')</python>"
        else:
            # what the LIVE world holds while a branch acts: never a branch's craft
            self.world_log.append(dict(self.live[0].view_inventory()))
            text = (
                tc_oracle(request.session)
                if self.branch(nid) in (0, 2)
                else "<python>finish('gave up')</python>"
            )
        return Completion(text=text, prompt_ids=[1], output_ids=[2, 3], logprobs=[-0.1, -0.2])


def run_counterfactual(prompts_dir=None, **policy_kw):
    task = tc_tasks("train", 1, seed=4, difficulty="medium")[0]
    env = make_env("textcraft")
    live: list = []
    make_world = env.make_world
    env.make_world = lambda t: live.append(make_world(t)) or live[-1]
    log: list = []
    policy = Scripted(log, live, **policy_kw)
    cfg = RuntimeConfig(counterfactual_k=K, max_steps=6, temperature=0.0, prompts_dir=prompts_dir)
    tree = asyncio.run(run_root(task, env, policy, cfg))
    return tree, live[0], log, policy


def test_all_branches_run_on_forks_and_the_parent_continues_from_branch_zero():
    tree, live, seen_live, policy = run_counterfactual()
    item, n = policy.item
    branches = sorted(
        (nd for nd in tree.nodes.values() if nd.branch_group == "g1"), key=lambda b: b.branch_index
    )
    assert [b.branch_index for b in branches] == list(range(K))
    assert [b.committed for b in branches] == [True, False, False, False]
    assert [b.branch_label for b in branches] == [True, False, True, False]
    # no branch, branch 0 included, touched the live world while the group ran
    assert seen_live and all(inv.get(item, 0) == 0 for inv in seen_live)
    # then branch 0's final state was committed: the parent's world holds its craft, and the root succeeded
    assert live.view_inventory().get(item, 0) >= n and tree.success
    # the parent is told branch 0's finish message and the public group line, no budget line
    root_step = tree.root.steps[0]
    expected = f"{branches[0].finish_message}\n\nSelected branch: 0; counterfactual branches collected: {K}.\n"  # public text
    assert expected.endswith(f"\n\nSelected branch: 0; counterfactual branches collected: {K}.\n")
    assert expected.rstrip("\n") in root_step.observation
    assert "Budget used by subagent" not in root_step.observation


def test_the_report_is_a_template_of_the_prompts_dir(tmp_path):
    """--prompts-dir replaces the counterfactual report too (every model-visible text is a template)."""
    (tmp_path / "counterfactual_report.txt").write_text("MINE [$message] of $k\n")
    tree, *_ = run_counterfactual(prompts_dir=str(tmp_path))
    head = next(nd for nd in tree.nodes.values() if nd.branch_group == "g1" and nd.branch_index == 0)
    assert f"MINE [{head.finish_message}] of {K}" in tree.root.steps[0].observation


class NeverFinishes(Policy):
    """The root launches its first target at step 0 and finishes at step 1; every branch only prints, so it
    runs out of steps. Keeps every request (``requests``)."""

    def __init__(self):
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> Completion:
        self.requests.append(request)
        nid = str(request.meta.get("node_id"))
        if request.role == "rubric":
            text = rubric_json("crafted")
        elif request.role == "score":
            text = score_json(bool(request.meta.get("child_success")))
        elif nid == "0":
            if request.meta["step"] == 0:
                item, n = next(iter(request.session.targets.items()))
                text = f"<python>r = await launch_subagent({{'{item}': {n}}})\nprint(r)</python>"
            else:
                text = "<python>finish('done')</python>"
        else:
            text = "<python>print('still thinking')</python>"
        return Completion(text=text, prompt_ids=[1], output_ids=[2], logprobs=[-0.1])


def run_exhausting(prompts_dir=None, **cfg):
    task = tc_tasks("train", 1, seed=4, difficulty="medium")[0]
    policy = NeverFinishes()
    config = RuntimeConfig(counterfactual_k=2, max_steps=3, temperature=0.0, prompts_dir=prompts_dir, **cfg)
    return asyncio.run(run_root(task, make_env("textcraft"), policy, config)), policy


def test_a_branch_that_ran_out_of_steps_is_reported_as_such():
    """Public ``CounterfactualCollector``: ``finish_message or error_message or "Subagent branch i completed."``;
    a budget-exhausted platoon episode has ``error_message = "WARNING: Exhausted budget when running episode.
    Halting episode; task may be incomplete."`` (``episode/loop.py: halt_episode``). Before #36 the parent was
    told "Subagent branch 0 completed." for a branch that had run out of steps."""
    tree, _ = run_exhausting()
    head = next(nd for nd in tree.nodes.values() if nd.branch_group == "g1" and nd.branch_index == 0)
    assert head.finish_message is None and head.steps_used == head.max_steps
    seen = tree.root.steps[0].observation
    public = (
        "WARNING: Exhausted budget when running episode. Halting episode; task may be incomplete.\n\n"
        "Selected branch: 0; counterfactual branches collected: 2."
    )
    assert public in seen and "completed" not in seen


def test_the_budget_warning_is_a_template_of_the_prompts_dir(tmp_path):
    (tmp_path / "branch_exhausted.txt").write_text("OUT OF STEPS\n")
    tree, _ = run_exhausting(prompts_dir=str(tmp_path))
    assert "OUT OF STEPS\n\nSelected branch: 0" in tree.root.steps[0].observation


def test_branch_message_order_finish_error_budget_completed():
    from common.agent.runtime import _Rollout, programmatic_judge
    from common.agent.tree import Node

    ro = _Rollout(make_env("textcraft"), NeverFinishes(), RuntimeConfig(), {"id": "t"}, programmatic_judge)

    def node(**kw):
        return Node(node_id="0.1", parent_id="0", depth=1, fork_step=0, goal="g", max_steps=0, **kw)

    exhausted = "WARNING: Exhausted budget when running episode. Halting episode; task may be incomplete."
    assert ro.branch_message(node(finish_message="made it", error="boom")) == "made it"
    assert ro.branch_message(node(error="boom")) == "boom"
    assert ro.branch_message(node()) == exhausted  # 0 of 0 steps left
    ended_early = node(branch_index=0)
    ended_early.max_steps = 5  # the shared world ended before the branch's budget did
    assert ro.branch_message(ended_early) == "Subagent branch 0 completed."


def test_rubric_stage_depth_refusal_is_the_collectors_text():
    """Public ``counterfactual.py``: in a Rubric-stage rollout a launch past the depth limit returns
    ``Cannot launch subagent beyond max_subagent_depth={m}; complete the task in the current agent.``; the
    other stages keep the environment's own refusal."""
    public = "Cannot launch subagent beyond max_subagent_depth=0; complete the task in the current agent."
    tree, _ = run_exhausting(max_depth=0)
    assert public in tree.root.steps[0].observation and tree.root.steps[0].refused_launches == 1
    task = tc_tasks("train", 1, seed=4, difficulty="medium")[0]
    config = RuntimeConfig(counterfactual_k=1, max_steps=3, temperature=0.0, max_depth=0)
    flat = asyncio.run(run_root(task, make_env("textcraft"), NeverFinishes(), config))
    assert flat.root.steps[0].refused_launches == 1
    assert "Cannot launch subagent beyond" not in flat.root.steps[0].observation


def test_branches_are_scored_with_the_rubric_stage_length():
    """Public ``Scripts/Main/textworld/sera.sh``: ``rubric_generation_ranking.max_scoring_tokens=512`` (the
    Execution stage's scorer keeps 1,024); TextCraft's ``sera.sh`` uses 1,024 for both."""
    from common.train_config import paper_profile

    assert paper_profile("textworld")["branch_score_max_new_tokens"] == 512
    assert paper_profile("textworld")["score_max_new_tokens"] == 1024
    assert paper_profile("textcraft")["branch_score_max_new_tokens"] == 1024
    _, policy = run_exhausting(branch_score_max_new_tokens=77, score_max_new_tokens=99)
    lengths = {r.sampling.max_new_tokens for r in policy.requests if r.role == "score"}
    assert lengths == {77}
    _, policy = run_exhausting(score_max_new_tokens=99)  # unset: the Execution-stage length
    assert {r.sampling.max_new_tokens for r in policy.requests if r.role == "score"} == {99}


def test_judge_and_score_calls_go_out_in_one_wave():
    """All K score calls are in flight together (a barrier that needs all K would time out otherwise)."""
    tree, *_, policy = run_counterfactual(barrier=True)
    assert policy.max_scores_in_flight == K
    assert all(nd.score is not None for nd in tree.nodes.values() if nd.branch_group)


def _stable(tree) -> str:
    """The tree without wall-clock fields (call durations and end times)."""
    d = tree.to_dict()

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in ("seconds", "ended")}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x

    return json.dumps(strip(d), sort_keys=True)


def test_recorded_tree_does_not_depend_on_the_order_the_calls_return():
    """Concurrent judging/scoring keeps every result on its own branch: the tree recorded when the score
    calls return in branch order equals the tree recorded when they return in reverse order."""
    in_order, *_ = run_counterfactual(delays={b: b for b in range(K)})
    reversed_, *_ = run_counterfactual(delays={b: K - b for b in range(K)})
    assert _stable(in_order) == _stable(reversed_)
    scores = [nd.score for nd in sorted(in_order.nodes.values(), key=lambda x: x.node_id) if nd.branch_group]
    assert sorted(scores) == [0.0, 0.0, 1.0, 1.0]


# ---- which launches form groups, and the environment budget (public CounterfactualEnvironmentBudget) ------
class Delegating(Policy):
    """Every agent below ``max_depth`` launches a child for its first target at each of its first
    ``launches`` steps (the root) or at step 0 (a child), then finishes. Rubrics and scores parse."""

    def __init__(self, launches: int):
        self.launches = launches

    async def generate(self, request: GenerationRequest) -> Completion:
        nid, step = str(request.meta.get("node_id")), request.meta.get("step")
        if request.role == "score":
            text = score_json(bool(request.meta.get("child_success")))
        elif request.role == "rubric":
            text = rubric_json("crafted")
        elif step < (self.launches if nid == "0" else 1):  # a new cell each step (no loop detection)
            item, n = next(iter(request.session.targets.items()))
            text = f"<python>r{step} = await launch_subagent({{'{item}': {n}}})\nprint(r{step})</python>"
        else:
            text = "<python>finish('done')</python>"
        return Completion(text=text, prompt_ids=[1], output_ids=[2, 3], logprobs=[-0.1, -0.2])


async def _alternating(request, node, session, world) -> bool:
    """Branch labels: even branches succeed, odd ones fail (every group is mixed)."""
    return (node.branch_index or 0) % 2 == 0


def run_delegating(launches: int, max_depth: int, seed: int = 4):
    task = tc_tasks("train", 1, seed=seed, difficulty="medium")[0]
    # 20 steps: in TextCraft a child's steps count against its parent's budget (the depth-aware tracker)
    cfg = RuntimeConfig(counterfactual_k=K, max_steps=20, max_depth=max_depth, temperature=0.0)
    return asyncio.run(run_root(task, make_env("textcraft"), Delegating(launches), cfg, judge=_alternating))


def _groups(tree) -> dict[str, list]:
    out: dict[str, list] = {}
    for n in tree.nodes.values():
        if n.branch_group:
            out.setdefault(n.branch_group, []).append(n)
    return out


def test_a_group_is_formed_while_fewer_than_the_cap_environments_exist():
    # public reserve(): created starts at 1 (the root's environment) and grows by K per group; a launch forms
    # a group while created < 16. K = 4: 1 -> 5 -> 9 -> 13 -> 17, so the root's 6 launches give 4 groups and
    # 2 plain children (a hard cap at +K-1 would have given 5 groups: 1 -> 4 -> ... -> 16)
    tree = run_delegating(launches=6, max_depth=1)
    groups = _groups(tree)
    assert len(groups) == 4 and all(len(g) == K for g in groups.values())
    assert tree.meta["counterfactual_groups"] == 4 and tree.meta["envs_used"] == 1 + 4 * K
    plain = [n for n in tree.children("0") if n.branch_group is None]
    assert len(plain) == 2 and all(n.committed for n in plain)


def test_launches_inside_uncommitted_branches_form_groups_too():
    # public: the collector's launcher is a context variable the branch tasks inherit, so a launch inside
    # branch 1..K-1 draws on the same budget and its group is trained. The root's group (1 -> 5) leaves room
    # for 3 more: 3 of its 4 branches' launches form groups (5 -> 9 -> 13 -> 17), the 4th runs plain
    tree = run_delegating(launches=1, max_depth=2)
    groups = _groups(tree)
    assert len(groups) == 4 and tree.meta["envs_used"] == 17
    nested = {g: ns for g, ns in groups.items() if ns[0].depth == 2}
    assert len(nested) == 3
    under = {g: tree.nodes[ns[0].parent_id] for g, ns in nested.items()}
    in_branches = [g for g, parent in under.items() if not parent.committed]
    assert len(in_branches) >= 2  # at most one of them sits under the committed branch 0
    for g in in_branches:  # a group inside an uncommitted branch stays uncommitted, branch 0 included
        assert not any(n.committed for n in groups[g])
    for g, parent in under.items():
        if parent.committed:  # under branch 0: its own branch 0 continues the committed line
            assert [n.committed for n in sorted(groups[g], key=lambda n: n.branch_index)] == [True] + [
                False
            ] * (K - 1)
    # the Rubric stage trains them: one datum per mixed group, those inside branches included
    from common.rl.batch import build_stage_batch

    batch = build_stage_batch("rubric", [[tree, run_delegating(launches=1, max_depth=2)]])
    assert batch.counts["mixed_groups"] == 8 and len(batch.datums) == 8
    assert sum(d.depth == 1 for d in batch.datums) == 6  # rubrics written by depth-1 agents


class EveryAgentDelegates(Policy):
    """Every agent, at every depth, launches its first target at step 0 and finishes at step 1."""

    async def generate(self, request: GenerationRequest) -> Completion:
        if request.role == "rubric":
            text = rubric_json("crafted")
        elif request.role == "score":
            text = score_json(bool(request.meta.get("child_success")))
        elif request.meta["step"] == 0:
            item, n = next(iter(request.session.targets.items()))
            text = f"<python>r = await launch_subagent({{'{item}': {n}}})\nprint(r)</python>"
        else:
            text = "<python>finish('done')</python>"
        return Completion(text=text, prompt_ids=[1], output_ids=[2], logprobs=[-0.1])


def test_rubric_stage_depth_refusal_follows_the_branch_the_agent_runs_under():
    """Public ``counterfactual.py`` checks the depth of the enclosing ``current_branch`` (the root's 0, a
    branch's own depth), not the agent's: an agent inside a counterfactual branch at the limit gets the
    collector's text, an ordinary agent (launched once the environment budget is spent, through
    ``launch_subagent_default``) gets the step-budget tracker's ``Not enough budget ...`` (audit 2026-12-06
    N3: every depth refusal of the Rubric stage had the collector's text)."""
    task = tc_tasks("train", 1, seed=4, difficulty="medium")[0]
    collector = "Cannot launch subagent beyond max_subagent_depth=2; complete the task in the current agent."
    tracker = "Not enough budget to launch subagent for goal"

    def refusals(max_envs: int) -> dict[str, tuple[bool, str]]:
        cfg = RuntimeConfig(
            counterfactual_k=2, max_envs_per_rollout=max_envs, max_depth=2, max_steps=3, temperature=0.0
        )
        tree = asyncio.run(run_root(task, make_env("textcraft"), EveryAgentDelegates(), cfg))
        deep = [n for n in tree.nodes.values() if n.depth == 2]
        assert deep and all(n.steps and n.steps[0].refused_launches == 1 for n in deep)
        return {n.node_id: (n.branch_group is not None, n.steps[0].observation) for n in deep}

    # budget 3: one group at depth 1 (1 + 2 environments); its branches' children are ordinary agents
    ordinary = refusals(3)
    assert not any(branch for branch, _ in ordinary.values())
    assert all(tracker in obs and collector not in obs for _, obs in ordinary.values())
    # budget 16: groups at depths 1 and 2; the depth-2 agents are branches at the limit
    branches = refusals(16)
    assert all(branch for branch, _ in branches.values())
    assert all(collector in obs and tracker not in obs for _, obs in branches.values())
