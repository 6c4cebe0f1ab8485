"""The recursive runtime on both environments with scripted, replay and function policies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from common.agent.runtime import RuntimeConfig, run_root
from common.envs import make_env
from common.envs.textcraft.oracle import oracle_reply as tc_oracle
from common.envs.textcraft.tasks import generate_tasks as tc_tasks
from common.envs.textworld_sync.oracle import oracle_reply as tw_oracle
from common.envs.textworld_sync.tasks import generate_tasks as tw_tasks
from common.policy.base import Completion, GenerationRequest, Policy
from common.policy.scripted import OraclePolicy, ReplayPolicy, rubric_json, score_json
from common.rl.batch import build_stage_batch


class FnPolicy(Policy):
    """Replies from ``fn(request)``; records (role, node_id) of every call in order."""

    def __init__(self, fn: Callable[[GenerationRequest], str]):
        self.fn, self.calls = fn, []

    async def generate(self, request: GenerationRequest) -> Completion:
        self.calls.append((request.role, request.meta.get("node_id")))
        await asyncio.sleep(0)  # let siblings interleave
        return Completion(text=self.fn(request), prompt_ids=[1], output_ids=[2, 3], logprobs=[-0.1, -0.2])


def oracle_fn(reply: Callable, **kw) -> Callable[[GenerationRequest], str]:
    def fn(req: GenerationRequest) -> str:
        if req.role == "rubric":
            return rubric_json("goal")
        if req.role == "score":
            return score_json(bool(req.meta.get("child_success")))
        return reply(req.session, **kw)

    return fn


def run(task, env: str, policy: Policy, **cfg) -> object:
    return asyncio.run(run_root(task, make_env(env), policy, RuntimeConfig(**cfg)))


def test_textcraft_delegation_reaches_depth_three_with_rubrics_before_children():
    task = tc_tasks("train", 1, seed=4, difficulty="hard")[0]
    policy = FnPolicy(oracle_fn(tc_oracle, delegate=True, max_delegation_depth=3))
    tree = run(task, "textcraft", policy)
    assert tree.success and tree.depth_max() == 3
    for node in tree.nodes.values():
        if node.parent_id is None:
            continue
        assert node.rubric is not None and node.score == (1.0 if node.success else 0.0)
        order = [i for i, c in enumerate(policy.calls) if c[1] == node.node_id]
        roles = [policy.calls[i][0] for i in order]
        assert roles[0] == "rubric" and roles[-1] == "score"  # frozen before the child acts, scored after
        assert set(roles[1:-1]) == {"act"}
    # the frozen rubric is immutable and equals what was parsed
    child = next(n for n in tree.nodes.values() if n.depth == 1)
    assert json.loads(json.dumps(child.rubric))["rubric_items"][0]["name"] == "goal_completed"


def test_depth_limit_refuses_and_costs_only_the_step():
    task = tc_tasks("train", 1, seed=4, difficulty="hard")[0]
    policy = FnPolicy(oracle_fn(tc_oracle, delegate=True, max_delegation_depth=3))
    tree = run(task, "textcraft", policy, max_depth=1)
    assert tree.depth_max() == 1
    refused = [s for n in tree.nodes.values() if n.depth == 1 for s in n.steps if s.refused_launches]
    # the environment's refusal (public depth-aware tracker: "Not enough budget to launch subagent for goal ...")
    text = refused[0].observation
    assert "Not enough budget to launch subagent for goal Craft the following items:" in text
    assert "maximum depth of 1" in text
    assert tree.success  # the refused agents did the work themselves


def test_budget_exhaustion_and_malformed_replies_become_observations():
    task = tc_tasks("train", 1, seed=1, difficulty="easy")[0]
    tree = run(
        task,
        "textcraft",
        ReplayPolicy(["no code here"] * 3 + ["<python>print(undefined_name)</python>"]),
        max_steps=4,
    )
    root = tree.root
    assert not tree.success and root.steps_used == 4 and not root.finished and root.error is None
    assert "(No output)Error: No code available to execute." in root.steps[0].observation
    assert "NameError" in root.steps[3].observation and "undefined_name" in root.steps[3].observation


def test_steps_record_the_cells_output_and_error_for_the_error_filter():
    # a successful TextCraft root whose first cell raises: its Step records the cell's output and error slot
    # (from the session's info), so the Execution stage leaves that step out (common/rl/filters.py)
    from common.rl.filters import is_error_step

    task = tc_tasks("train", 1, seed=1, difficulty="easy")[0]

    def fn(req: GenerationRequest) -> str:
        if req.meta.get("step") == 0:
            return "<python>print(undefined_name)</python>"
        return oracle_fn(tc_oracle)(req)

    tree = run(task, "textcraft", FnPolicy(fn), max_steps=8)
    steps = tree.root.steps
    assert tree.success and len(steps) >= 2
    assert [is_error_step(s) for s in steps] == [True] + [False] * (len(steps) - 1)
    assert "undefined_name" in steps[0].cell_output + steps[0].cell_error
    batch = build_stage_batch("execution", [[tree]], zero_variance="keep")
    assert len(batch.datums) == len(steps) - 1 and batch.counts["error_steps_dropped"] == 1


def test_textworld_concurrent_siblings_share_the_world():
    task = tw_tasks("train", 1, seed=2, tier="hard")[0]
    policy = FnPolicy(oracle_fn(tw_oracle, delegate=True))
    tree = run(task, "textworld", policy)
    assert tree.success
    kids = tree.children("0")
    assert len(kids) >= 2 and len({k.fork_step for k in kids}) == 1  # one delegation event
    acts = [nid for role, nid in policy.calls if role == "act" and nid in {k.node_id for k in kids}]
    first_done = max(i for i, n in enumerate(acts) if n == kids[0].node_id)
    assert any(n != kids[0].node_id for n in acts[:first_done])  # siblings interleaved (ran concurrently)
    assert "[SubAgent Results]" in tree.root.steps[kids[0].fork_step].observation


def test_rubric_and_score_parse_failures_are_recorded_and_drop_that_child():
    task = tc_tasks("train", 1, seed=4, difficulty="medium")[0]
    base = oracle_fn(tc_oracle, delegate=True)
    seen = {"rubric": 0}

    def fn(req: GenerationRequest) -> str:
        if req.role == "rubric":
            seen["rubric"] += 1
            return "I will not write JSON" if seen["rubric"] == 1 else rubric_json("g")
        if req.role == "score" and req.meta["node_id"].endswith(".2"):
            return '{"success": true, "final_score": 0.0}'  # success with s = 0: a parse failure
        return base(req)

    tree = run(task, "textcraft", FnPolicy(fn))
    kids = tree.children("0")
    assert len(kids) >= 2
    first, second = kids[0], kids[1]
    assert first.rubric is None and "rubric" in first.rubric_error and first.score is None
    assert second.rubric is not None and second.score is None and second.score_error
    batch = build_stage_batch("execution", [[tree, tree]], zero_variance="keep")
    ids = {d.trajectory_id.split("/")[-1] for d in batch.datums}
    assert first.node_id not in ids and second.node_id not in ids and "0" in ids
    assert batch.counts["dropped_children"] == 4  # two children x two rollouts


def test_agent_exception_ends_that_agent_only():
    task = tc_tasks("train", 1, seed=4, difficulty="medium")[0]
    base = oracle_fn(tc_oracle, delegate=True)

    def fn(req: GenerationRequest) -> str:
        if req.role == "act" and req.meta["node_id"] == "0.1":
            raise RuntimeError("model server went away")
        return base(req)

    tree = run(task, "textcraft", FnPolicy(fn))
    assert tree.nodes["0.1"].error == "RuntimeError: model server went away" and not tree.nodes["0.1"].success
    assert tree.root.error is None and tree.root.steps_used >= 2  # the parent carried on


def test_best_of_two_commits_the_better_candidate():
    task = tc_tasks("train", 1, seed=4, difficulty="medium")[0]
    env = make_env("textcraft")
    worlds = []
    make_world = env.make_world
    env.make_world = lambda t: worlds.append(make_world(t)) or worlds[-1]
    launched = {}

    def fn(req: GenerationRequest) -> str:
        nid = req.meta.get("node_id")
        if req.role == "rubric":
            return rubric_json("g")
        if req.role == "score":
            return score_json(bool(req.meta.get("child_success")))
        if nid == "0":
            if req.meta["step"] == 0:
                item, n = next(iter(req.session.targets.items()))
                launched["item"] = item
                return f"<python>r = await launch_subagent({{'{item}': {n}}})\nprint(r)</python>"
            return "<python>finish('done')</python>"
        if nid == "0.1":  # candidate 0 gives up
            return "<python>finish('I did nothing')</python>"
        return tc_oracle(req.session)  # candidate 1 crafts the target

    tree = asyncio.run(run_root(task, env, FnPolicy(fn), RuntimeConfig(best_of_n=2)))
    c0, c1 = tree.nodes["0.1"], tree.nodes["0.2~c1"]
    assert (c0.score, c1.score) == (0.0, 1.0)
    assert c1.committed and not c0.committed and tree.root.steps[0].launched == ["0.2~c1"]
    assert worlds[0].view_inventory().get(launched["item"], 0) > 0  # the live world holds candidate 1's craft
    assert tree.success


def test_best_of_two_ties_go_to_candidate_zero():
    task = tw_tasks("train", 1, seed=2, tier="medium")[0]
    tree = run(task, "textworld", OraclePolicy(lambda s: tw_oracle(s, delegate=True)), best_of_n=2)
    groups = {}
    for n in tree.nodes.values():
        if n.branch_group:
            groups.setdefault(n.branch_group, []).append(n)
    assert groups and tree.success
    for nodes in groups.values():
        winner = [n for n in nodes if n.committed]
        assert len(winner) == 1 and winner[0].branch_index == 0  # equal scores -> candidate 0


def test_counterfactual_branches_share_one_rubric_and_run_on_forks():
    task = tc_tasks("train", 1, seed=4, difficulty="medium")[0]
    tree = run(task, "textcraft", OraclePolicy(lambda s: tc_oracle(s, delegate=True)), counterfactual_k=4)
    groups = {}
    for n in tree.nodes.values():
        if n.branch_group:
            groups.setdefault(n.branch_group, []).append(n)
    assert groups and tree.success and tree.meta["envs_used"] <= 16
    for nodes in groups.values():
        assert sorted(n.branch_index for n in nodes) == [0, 1, 2, 3]
        assert len({json.dumps(n.rubric) for n in nodes}) == 1  # one rubric per group
        assert [n.committed for n in sorted(nodes, key=lambda n: n.branch_index)] == [
            True,
            False,
            False,
            False,
        ]
        assert all(n.branch_label for n in nodes)  # every branch crafted its targets on its own fork


@pytest.mark.parametrize("env,difficulty", [("textcraft", "easy"), ("textworld", "easy")])
def test_oracle_rollout_roundtrips_through_the_log(tmp_path, env, difficulty):
    from common.agent.log import append_tree, read_trees

    task = (
        tc_tasks("train", 1, seed=0, difficulty=difficulty)
        if env == "textcraft"
        else tw_tasks("train", 1, seed=0, tier=difficulty)
    )[0]
    reply = tc_oracle if env == "textcraft" else tw_oracle
    tree = run(task, env, OraclePolicy(reply))
    append_tree(tmp_path / "log.jsonl", tree)
    again = read_trees(tmp_path / "log.jsonl")[0]
    assert again.to_dict() == json.loads(json.dumps(tree.to_dict())) and again.success


def test_textworld_rubric_and_score_prompts_hold_only_what_the_agents_saw():
    """Coarse (extreme-tier) task: the preparations are not in the task text. Every preparation word in
    a rubric prompt must come from the parent's own messages or reply, in a score prompt from the
    child's own trajectory or the frozen rubric; World.describe() never reaches either prompt."""
    task = tw_tasks("train", 1, seed=2, tier="extreme")[0]
    preps = {p for d in task["dishes"] for ing in d["recipe"] for p in ing["preparation"]} - {"uncut", "raw"}
    assert not any(p in task["task_description"] for p in preps)  # hidden from the root's task text
    policy = FnPolicy(oracle_fn(tw_oracle, delegate=True))
    seen: list[GenerationRequest] = []
    policy.fn = lambda req, base=policy.fn: seen.append(req) or base(req)
    tree = run(task, "textworld", policy)
    rubric_reqs = [r for r in seen if r.role == "rubric"]
    score_reqs = [r for r in seen if r.role == "score"]
    assert rubric_reqs and score_reqs
    checked = 0
    for req in rubric_reqs:
        child = tree.nodes[req.meta["node_id"]]
        parent = tree.nodes[child.parent_id]
        call = parent.steps[child.fork_step].call
        view = json.dumps(call.messages) + call.text
        prompt = json.dumps(req.messages)
        for p in preps:
            if p not in view:
                checked += 1
                assert p not in prompt, (p, child.node_id)
        assert "needs " not in prompt and "Agents:" not in prompt
    for req in score_reqs:
        child = tree.nodes[req.meta["node_id"]]
        view = json.dumps(child.rubric) + "".join(
            json.dumps(s.call.messages) + s.call.text + s.observation for s in child.steps
        )
        prompt = json.dumps(req.messages)
        for p in preps:
            if p not in view:
                checked += 1
                assert p not in prompt, (p, child.node_id)
    assert checked > 0  # the test did check some preparation the agents never saw


class InFlightPolicy(FnPolicy):
    """FnPolicy whose calls stay in flight for a few event-loop turns (no wall clock); records, for every
    call, the (role, node_id) of the calls in flight beside it when it started or while it ran."""

    def __init__(self, fn: Callable[[GenerationRequest], str]):
        super().__init__(fn)
        self.live: dict[int, tuple[str, str]] = {}
        self.beside: list[tuple[tuple[str, str], tuple[str, str]]] = []
        self.started = asyncio.Event()  # set at every call's start (a score call waits for the next one)

    async def generate(self, request: GenerationRequest) -> Completion:
        me, key = (request.role, request.meta.get("node_id")), object()
        self.beside += [(me, other) for other in self.live.values()]
        self.beside += [(other, me) for other in self.live.values()]
        self.live[id(key)] = me
        self.started.set()
        self.started = asyncio.Event()
        try:
            if request.role == "score":  # stay in flight until the next call of the tree starts
                await asyncio.wait_for(self.started.wait(), timeout=60)
            for _ in range(4):
                await asyncio.sleep(0)
            return await super().generate(request)
        finally:
            del self.live[id(key)]


def test_rubric_and_score_calls_are_in_flight_beside_the_agents_they_do_not_block():
    """Issue #49.4: the rubric call of a child goes out with the child's first act call (its chat was built
    from the parent's view before the child started), and a child's score call is in flight while its
    parent takes its next step. Results as before: every child rubric-ed, scored, the tree solved."""
    task = tc_tasks("train", 1, seed=4, difficulty="hard")[0]
    policy = InFlightPolicy(oracle_fn(tc_oracle, delegate=True, max_delegation_depth=2))
    tree = run(task, "textcraft", policy)
    assert tree.success
    children = [n for n in tree.nodes.values() if n.parent_id is not None]
    assert children and all(n.rubric is not None and n.score is not None for n in children)
    pairs = set(policy.beside)
    for n in children:
        assert (("rubric", n.node_id), ("act", n.node_id)) in pairs, n.node_id  # rubric beside its child
    # a score call beside its parent's next step (siblings run together, so one of them is the last)
    assert any((("score", n.node_id), ("act", n.parent_id)) in pairs for n in children)
    # the rubric still goes out first, the score after the child's last call
    for n in children:
        roles = [r for r, node in policy.calls if node == n.node_id]
        assert roles[0] == "rubric" and roles[-1] == "score" and set(roles[1:-1]) == {"act"}


def test_a_tree_cut_by_its_deadline_cancels_its_deferred_score_calls():
    """A score call still in flight when the tree's deadline fires is cancelled with the tree (never left
    running), and the tree comes back recorded."""

    class SlowScores(FnPolicy):
        cancelled = 0

        async def generate(self, request: GenerationRequest) -> Completion:
            if request.role == "score":
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    SlowScores.cancelled += 1
                    raise
            return await super().generate(request)

    task = tc_tasks("train", 1, seed=4, difficulty="hard")[0]
    policy = SlowScores(oracle_fn(tc_oracle, delegate=True, max_delegation_depth=1))
    tree = run(task, "textcraft", policy, tree_timeout_s=2.0)
    assert tree.meta.get("deadline") == "tree"
    assert SlowScores.cancelled >= 1  # the score calls in flight were cancelled, not left running
