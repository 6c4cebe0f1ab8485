"""The runtime's paper protocol: what the rubric writer and scorer may see, the prompt cap on every
call, and test-time selection (N candidates at temperature 1.0, four selection modes, the fork cap).

Run: ``pytest tests/test_runtime_protocol.py`` (a few seconds; the hf-tiny test loads SmolLM2's tokenizer).
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections.abc import Callable

import pytest

from common.agent.runtime import (
    RuntimeConfig,
    run_root,
    select_candidate,
)
from common.envs import make_env
from common.envs.base import AgentSession, Environment, LaunchRequest, StepResult, World
from common.envs.textcraft.oracle import oracle_reply as tc_oracle
from common.envs.textcraft.tasks import generate_tasks as tc_tasks
from common.policy.base import Completion, GenerationRequest, Policy
from common.policy.context import estimate_tokens
from common.policy.scripted import rubric_json, score_json

SECRET = "SECRET_PREPARATION_grilled_diced"


# ---- a minimal environment whose world holds state no agent can observe ------------------------------
class SecretWorld(World):
    """A counter everybody sees and a secret only ``describe()`` (hidden state) reveals."""

    def __init__(self) -> None:
        self.counter = 0
        self.finished_root = False

    def fork(self) -> SecretWorld:
        return copy.deepcopy(self)

    def commit(self, branch: World) -> None:
        self.__dict__.update(copy.deepcopy(branch.__dict__))

    def root_success(self) -> bool:
        return self.finished_root and self.counter >= 1

    def describe(self) -> str:
        return f"counter={self.counter}; every ingredient needs {SECRET}; agent 0.1 is in the cellar"


class SecretSession(AgentSession):
    """Replies: ``DELEGATE`` (launch one child), ``INC`` (counter += 1), ``FINISH`` (done), else a look."""

    def __init__(self, world: SecretWorld, agent_id: str, depth: int, launch, goal: str, max_steps: int = 20):
        self.world, self.agent_id, self.depth, self.launch, self.goal = world, agent_id, depth, launch, goal
        self.max_steps, self.steps_used, self.finished, self.finish_message = max_steps, 0, False, None

    def system_prompt(self) -> str:
        return "SYSTEM: act with INC, DELEGATE or FINISH."

    def first_user_message(self) -> str:
        return f"TASK: {self.goal}\nYou are in the kitchen. Counter: {self.world.counter}."

    async def step(self, reply: str) -> StepResult:
        self.steps_used += 1
        if reply.startswith("DELEGATE"):
            res = await self.launch(LaunchRequest(goal="increment the counter once", max_steps=3))
            return StepResult(observation=f"child said: {res.message or res.error}")
        if reply.startswith("INC"):
            self.world.counter += 1
            return StepResult(observation=f"PARENT_VISIBLE_OBS counter is now {self.world.counter}")
        if reply.startswith("FINISH"):
            self.finished, self.finish_message = True, "done"
            if self.depth == 0:
                self.world.finished_root = True
            return StepResult(observation="finished", done=True, finish_message="done")
        return StepResult(observation=f"PARENT_VISIBLE_OBS you look around ({len(reply)} chars said)")

    def success(self) -> bool:
        return self.world.counter >= 1 and self.finished


class ViewSession(SecretSession):
    """The same, exposing its own view explicitly."""

    def visible_state(self):
        return {"counter_seen": self.world.counter, "agent": self.agent_id}


class SecretEnv(Environment):
    name = "secret"
    tools_description = "INC, DELEGATE, FINISH"

    def __init__(self, session_cls=SecretSession):
        self.session_cls = session_cls

    def make_world(self, task):
        return SecretWorld()

    def root_session(self, world, task, launch):
        return self.session_cls(world, "0", 0, launch, task["goal"])

    def child_session(self, world, parent, request, agent_id, launch):
        return self.session_cls(world, agent_id, parent.depth + 1, launch, request.goal, request.max_steps)


class Recorder(Policy):
    """``fn(request)`` answers; every request is kept."""

    def __init__(self, fn: Callable[[GenerationRequest], str], tokenizer=None):
        self.fn, self.requests, self.tokenizer = fn, [], tokenizer

    async def generate(self, request: GenerationRequest) -> Completion:
        self.requests.append(request)
        await asyncio.sleep(0)
        return Completion(text=self.fn(request), prompt_ids=[1], output_ids=[2], logprobs=[-0.1])


def secret_script(req: GenerationRequest) -> str:
    if req.role == "rubric":
        return rubric_json("g")
    if req.role == "score":
        return score_json(bool(req.meta.get("child_success")))
    step, depth = req.meta["step"], req.meta["depth"]
    if depth == 0:
        return ["LOOK", "DELEGATE", "FINISH"][min(step, 2)]
    return ["INC", "FINISH"][min(step, 1)]


# ---- 1. only what the parent saw ----------------------------------------------------------------------------
@pytest.mark.parametrize("session_cls", [SecretSession, ViewSession])
def test_rubric_and_score_prompts_hold_no_hidden_state(session_cls):
    policy = Recorder(secret_script)
    tree = asyncio.run(
        run_root({"goal": "raise the counter"}, SecretEnv(session_cls), policy, RuntimeConfig())
    )
    assert tree.success
    rubric_req = next(r for r in policy.requests if r.role == "rubric")
    score_req = next(r for r in policy.requests if r.role == "score")
    for req in (rubric_req, score_req):
        text = json.dumps(req.messages)
        assert SECRET not in text and "cellar" not in text  # World.describe() never reaches them
    rubric_user = rubric_req.messages[1]["content"]
    parent_step1 = next(
        r for r in policy.requests if r.role == "act" and r.meta == {"node_id": "0", "depth": 0, "step": 1}
    )
    for m in parent_step1.messages:  # the parent's exact prompt messages at the delegating step
        assert json.dumps(m["content"])[1:-1] in json.dumps(rubric_user)
    assert "DELEGATE" in rubric_user.split("[Parent Step: Delegation Decision]")[1]
    pre = rubric_user.split("[Observable Pre-call Environment]\n")[1].split("\n")[0]
    score_payload = json.loads(score_req.messages[1]["content"].split("\n\n")[1])
    if session_cls is ViewSession:  # the session's own view, the parent's before and the child's after
        assert json.loads(pre) == {"agent": "0", "counter_seen": 0}
        assert score_payload["final_environment_state"] == {"agent": "0.1", "counter_seen": 1}
    else:  # default: the last observation the agent received
        assert json.loads(pre) == {"observation": "PARENT_VISIBLE_OBS you look around (4 chars said)"}
        assert score_payload["final_environment_state"] == {"observation": "finished"}
    assert score_payload["trajectory"]["steps"][0]["raw_response"] == "INC"


# ---- 2. the prompt cap on every call --------------------------------------------------------------------------
def test_runtime_caps_every_prompt_without_a_tokenizer():
    long = "o" * 4000

    def fn(req: GenerationRequest) -> str:
        if req.role != "act":
            return secret_script(req)
        return "LOOK " + long if req.meta["step"] < 9 else "FINISH"

    policy = Recorder(fn)
    cfg = RuntimeConfig(max_prompt_tokens=3000, max_steps=10)
    tree = asyncio.run(run_root({"goal": "look a lot"}, SecretEnv(), policy, cfg))
    sizes = [estimate_tokens(r.messages) for r in policy.requests]
    assert max(sizes) <= 3000 and len(sizes) == 10
    late = policy.requests[-1].messages
    assert late[0]["role"] == "system" and late[1]["content"].startswith("TASK: look a lot")
    assert "earlier messages were omitted" in late[1]["content"]  # oldest turns went first
    assert tree.meta["truncated_calls"] > 0
    assert tree.root.steps[-1].call.prompt_truncated and not tree.root.steps[0].call.prompt_truncated
    assert tree.root.steps[-1].call.messages == late  # the record holds what was actually sent


def test_runtime_caps_with_the_policys_tokenizer():
    from common.policy.context import render_prompt_ids
    from common.policy.models import load_tokenizer

    tok = load_tokenizer("smollm2")

    def fn(req: GenerationRequest) -> str:
        if req.role != "act":
            return secret_script(req)
        return "LOOK " + "word " * 300 if req.meta["step"] < 5 else "FINISH"

    policy = Recorder(fn, tokenizer=tok)
    cfg = RuntimeConfig(max_prompt_tokens=700, max_steps=6)
    tree = asyncio.run(run_root({"goal": "g"}, SecretEnv(), policy, cfg))
    sizes = [len(render_prompt_ids(tok, r.messages)) for r in policy.requests]
    assert max(sizes) <= 700
    full = [{"role": "system", "content": tree.root.steps[0].call.messages[0]["content"]}]
    full += tree.root.steps[0].call.messages[1:]
    for s in tree.root.steps[:-1]:
        full += [{"role": "assistant", "content": s.call.text}, {"role": "user", "content": s.observation}]
    assert len(render_prompt_ids(tok, full)) > 700  # the uncut chat would not have fitted
    assert tree.root.steps[-1].call.prompt_truncated


# ---- 3. test-time selection -------------------------------------------------------------------------------------
def test_select_candidate_rules():
    rng = random.Random(0)
    assert select_candidate("first", [0.1, 0.9], [False, True], rng) == 0
    assert select_candidate("rubric", [0.1, 0.9], [], rng) == 1
    assert select_candidate("rubric", [0.7, 0.7], [], rng) == 0  # tie -> 0
    assert select_candidate("rubric", [None, None], [], rng) == 0  # failures -> 0
    assert select_candidate("rubric", [None, 0.0], [], rng) == 1  # the only valid score (public rule)
    assert select_candidate("oracle", [], [False, True], rng) == 1
    assert select_candidate("oracle", [], [None, False], rng) == 0
    picks = {select_candidate("random", [0, 0], [], random.Random(s)) for s in range(20)}
    assert picks == {0, 1}
    with pytest.raises(ValueError, match="--selection-mode must be one of first, random, oracle, rubric"):
        RuntimeConfig(selection_mode="best")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_forks_per_task"):
        RuntimeConfig(best_of_n=4, max_forks_per_task=2)


class SamplingScript(Policy):
    """A seeded sampling policy for the children: at temperature 0 always the same reply, above 0 a
    draw seeded by the request's seed. The root delegates once, then finishes."""

    def __init__(self):
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> Completion:
        self.requests.append(request)
        if request.role in ("rubric", "score"):
            return Completion(text=secret_script(request))
        if request.meta["depth"] == 0:
            return Completion(text=["DELEGATE", "FINISH"][min(request.meta["step"], 1)])
        sp = request.sampling
        if sp.temperature == 0:
            return Completion(text="INC" if request.meta["step"] == 0 else "FINISH")
        r = random.Random(sp.seed).random()
        return Completion(text=f"LOOK {r:.6f}" if request.meta["step"] == 0 else ("INC", "FINISH")[r < 0.5])


def test_candidates_are_sampled_at_temperature_one_and_differ_under_greedy_eval():
    policy = SamplingScript()
    cfg = RuntimeConfig(best_of_n=2, temperature=0.0)
    tree = asyncio.run(run_root({"goal": "g"}, SecretEnv(), policy, cfg))
    cands = sorted((n for n in tree.nodes.values() if n.branch_group), key=lambda n: n.branch_index)
    assert len(cands) == 2
    assert cands[0].steps[0].call.text != cands[1].steps[0].call.text  # the two candidates differ
    assert all(s.call.sampling["temperature"] == 1.0 for c in cands for s in c.steps)
    assert all(s.call.sampling["temperature"] == 0.0 for s in tree.root.steps)  # the eval temperature
    rubric = next(r for r in policy.requests if r.role == "rubric")
    assert rubric.sampling.temperature == 0.0 and rubric.sampling.max_new_tokens == 1024
    first_cand_act = next(
        i for i, r in enumerate(policy.requests) if r.role == "act" and r.meta["depth"] == 1
    )
    assert policy.requests.index(rubric) < first_cand_act  # frozen before any candidate acts
    scores = [r for r in policy.requests if r.role == "score"]
    assert len(scores) == 2 and all(
        r.sampling.temperature == 0.0 and r.sampling.max_new_tokens == 512 for r in scores
    )


def test_hf_tiny_candidates_differ():
    from common.policy.hf import HFPolicy

    hf = HFPolicy("tiny", dtype="float32", device="cpu", max_batch_size=2)

    class RootScripted(Policy):
        async def generate(self, request: GenerationRequest) -> Completion:
            if request.role in ("rubric", "score") or request.meta["depth"] == 0:
                text = (
                    secret_script(request)
                    if request.role != "act"
                    else ["DELEGATE", "FINISH"][min(request.meta["step"], 1)]
                )
                return Completion(text=text)
            request.sampling.max_new_tokens = 12
            return await hf.generate(request)

    cfg = RuntimeConfig(best_of_n=2, temperature=0.0, max_steps=2)
    tree = asyncio.run(run_root({"goal": "g"}, SecretEnv(), RootScripted(), cfg))
    cands = sorted((n for n in tree.nodes.values() if n.branch_group), key=lambda n: n.branch_index)
    assert len(cands) == 2 and cands[0].steps[0].call.sampling["temperature"] == 1.0
    assert cands[0].steps[0].call.output_ids != cands[1].steps[0].call.output_ids


def _tc_two_candidates(mode: str, seed: int = 0):
    """TextCraft: the root delegates its first target once; candidate 0 gives up, candidate 1 crafts."""
    task = tc_tasks("train", 1, seed=4, difficulty="medium")[0]
    env = make_env("textcraft")
    worlds = []
    make_world = env.make_world
    env.make_world = lambda t: worlds.append(make_world(t)) or worlds[-1]
    item = {}

    def fn(req: GenerationRequest) -> str:
        nid = req.meta.get("node_id")
        if req.role == "rubric":
            return rubric_json("g")
        if req.role == "score":
            return score_json(bool(req.meta.get("child_success")))
        if nid == "0":
            if req.meta["step"] == 0:
                name, n = next(iter(req.session.targets.items()))
                item["name"] = name
                return f"<python>r = await launch_subagent({{'{name}': {n}}})\nprint(r)</python>"
            return "<python>finish('done')</python>"
        if nid == "0.1":
            return "<python>finish('I did nothing')</python>"
        return tc_oracle(req.session)

    policy = Recorder(fn)
    cfg = RuntimeConfig(best_of_n=2, selection_mode=mode, seed=seed, temperature=0.0)
    tree = asyncio.run(run_root(task, env, policy, cfg))
    crafted = worlds[0].view_inventory().get(item["name"], 0) > 0
    return tree, policy, crafted


@pytest.mark.parametrize("mode,winner", [("rubric", 1), ("oracle", 1), ("first", 0)])
def test_each_selection_mode_commits_as_specified(mode, winner):
    tree, policy, crafted = _tc_two_candidates(mode)
    c0, c1 = tree.nodes["0.1"], tree.nodes["0.2~c1"]
    assert [c0.committed, c1.committed] == [winner == 0, winner == 1]
    assert tree.root.steps[0].launched == [(c0, c1)[winner].node_id]
    assert crafted == (winner == 1)  # the live world holds the committed candidate's crafts
    roles = [r.role for r in policy.requests]
    if mode == "rubric":
        assert roles.count("rubric") == 1 and roles.count("score") == 2 and (c0.score, c1.score) == (0.0, 1.0)
    else:  # only the rubric mode writes and scores rubrics (public selector)
        assert "rubric" not in roles and "score" not in roles
    if mode == "oracle":
        assert (c0.branch_label, c1.branch_label) == (False, True)


def test_random_selection_is_seeded_and_uses_both_candidates():
    from common.agent.runtime import _seed

    def pick(seed: int) -> int:  # the runtime's rng for the group whose first candidate is node 0.1
        return select_candidate("random", [None, None], [], random.Random(_seed(seed, "0.1", -2)))

    seeds = {pick(s): s for s in range(20)}
    assert set(seeds) == {0, 1}
    for winner, seed in sorted(seeds.items()):
        tree, _, crafted = _tc_two_candidates("random", seed)
        assert tree.nodes["0.2~c1"].committed == (winner == 1) == crafted  # the seeded pick was committed


def test_fork_cap_refuses_launches_past_it():
    policy = Recorder(
        lambda r: secret_script(r) if r.role != "act" else ("DELEGATE" if r.meta["depth"] < 3 else "FINISH")
    )
    cfg = RuntimeConfig(best_of_n=2, max_forks_per_task=6, max_steps=3, temperature=0.0)
    tree = asyncio.run(run_root({"goal": "g"}, SecretEnv(), policy, cfg))
    assert tree.meta["forks_used"] == 6 and tree.meta["selection_groups"] == 3
    assert tree.meta["fork_refusals"] > 0
    forked = [n for n in tree.nodes.values() if n.branch_group]
    assert len(forked) == 6  # never more clones than the cap
    refused = [s for n in tree.nodes.values() for s in n.steps if s.refused_launches]
    budget = "Fork budget exhausted; complete this delegation locally."  # the public wording
    assert refused and all(budget in s.observation for s in refused)


def test_small_cap_cuts_the_trajectory_never_the_frozen_rubric():
    def fn(req: GenerationRequest) -> str:
        if req.role != "act":
            return secret_script(req)
        if req.meta["depth"] == 0:
            return ["DELEGATE", "FINISH"][min(req.meta["step"], 1)]
        return ("LOOK " + "z" * 3000) if req.meta["step"] < 5 else "FINISH"

    policy = Recorder(fn)
    cfg = RuntimeConfig(max_prompt_tokens=1500, max_steps=6)
    asyncio.run(run_root({"goal": "g"}, SecretEnv(), policy, cfg))
    score = next(r for r in policy.requests if r.role == "score")
    assert estimate_tokens(score.messages) <= 1500
    user = score.messages[1]["content"]
    assert '"frozen_rubric": {"failure_conditions"' in user and '"delegated_task": "increment' in user
    assert '"omitted_steps"' in user  # the middle of the child's trajectory gave way


# ---- 4. issue #36: what the scorer sees, metadata keys, the cap of rubric and score calls -----------------------
def _tc_run(child_fn, cfg: RuntimeConfig, context: str = ""):
    """TextCraft: the root launches its first target (with ``context``) at step 0 and finishes at step 1;
    agents below the root answer ``child_fn(request)``."""
    task = tc_tasks("train", 1, seed=4, difficulty="medium")[0]
    arg = f", context={context!r}" if context else ""

    def fn(req: GenerationRequest) -> str:
        if req.role == "rubric":
            return rubric_json("g")
        if req.role == "score":
            return score_json(bool(req.meta.get("child_success")))
        if req.meta["node_id"] == "0":
            if req.meta["step"] == 0:
                name, n = next(iter(req.session.targets.items()))
                return f"<python>r = await launch_subagent({{'{name}': {n}}}{arg})\nprint(r)</python>"
            return "<python>finish('done')</python>"
        return child_fn(req)

    policy = Recorder(fn)
    tree = asyncio.run(run_root(task, make_env("textcraft"), policy, cfg))
    return tree, policy


def _score_payload(policy: Recorder, node_id: str) -> dict:
    req = next(r for r in policy.requests if r.role == "score" and r.meta["node_id"] == node_id)
    return json.loads(req.messages[1]["content"].split("\n\n")[1])


@pytest.mark.parametrize(
    "reply, state",
    [
        ("<python>finish('crafted what I could')</python>", "inventory"),
        ("<python>finish('')</python>", "empty"),  # finish() without a message: no final inventory
        ("<python>print('thinking')</python>", "empty"),  # ran out of steps
    ],
)
def test_execution_stage_final_state_needs_a_finish_message_where_the_environment_says_so(
    reply, state, monkeypatch
):
    """Public TextCraft ``adapters/textcraft.py: final_state_from_trajectory`` returns ``{"inventory": ...}``
    only from a step where ``finish()`` got a non-empty message (platoon sets ``final_inventory`` there),
    else ``{}``. An environment opts in with ``session.score_state_needs_finish``."""
    from common.envs.textcraft.env import TextCraftSession

    cfg = RuntimeConfig(max_steps=2, temperature=0.0)
    assert TextCraftSession.score_state_needs_finish is True  # TextCraft opts in, as the public adapter
    tree, policy = _tc_run(lambda r: reply, cfg)
    final = _score_payload(policy, "0.1")["final_environment_state"]
    assert (set(final) == {"inventory"}) if state == "inventory" else final == {}
    monkeypatch.setattr(TextCraftSession, "score_state_needs_finish", False)
    tree, policy = _tc_run(lambda r: reply, cfg)  # without the flag: the child's view, always
    assert set(_score_payload(policy, "0.1")["final_environment_state"]) == {"inventory"}


def test_the_parents_context_reaches_the_scorer_and_the_childs_own_rubric_writer():
    """Public TextCraft ``launch_subagent`` appends ``Context provided from parent agent: ...`` to the child's
    goal; that string is the scorer's ``delegated_task`` and ``task_goal`` (``async_pipeline.py``:
    ``child_goal=goal``, ``serialize_agent_trajectory``: ``task.goal``) and the ``[Parent Task]`` of the
    child's own children (``parent_task=env.task.goal``)."""

    def child(req: GenerationRequest) -> str:
        if req.meta["node_id"] == "0.1" and req.meta["step"] == 0:
            name, n = next(iter(req.session.targets.items()))
            return f"<python>r = await launch_subagent({{'{name}': {n}}})\nprint(r)</python>"
        return "<python>finish('ok')</python>"

    tree, policy = _tc_run(child, RuntimeConfig(max_steps=3, temperature=0.0), context="use the ore")
    payload = _score_payload(policy, "0.1")
    goal = tree.nodes["0.1"].goal
    assert payload["delegated_task"].startswith(goal) and payload["delegated_task"].endswith("use the ore")
    assert payload["trajectory"]["task_goal"] == payload["delegated_task"]
    grandchild_rubric = next(
        r for r in policy.requests if r.role == "rubric" and r.meta["node_id"] == "0.1.1"
    )
    parent_task = (
        grandchild_rubric.messages[1]["content"].split("[Parent Task]\n")[1].split("\n\n[Parent Meta")[0]
    )
    assert parent_task == payload["delegated_task"]


def test_rubric_metadata_keys_in_training_and_at_test_time():
    """Training (public ``async_pipeline.py: _build_rubric_messages``): ``parent_trajectory_id`` and the
    parent's step; test time (``rubric_selector.py`` called from ``evaluator.py``): ``parent_agent_id`` and
    ``step * 100 + the delegation's index in the step``."""
    for cfg, expected in (
        (RuntimeConfig(), {"child_depth": 1, "fork_step": 1, "parent_depth": 0, "parent_trajectory_id": "0"}),
        (
            RuntimeConfig(best_of_n=2, temperature=0.0),
            {"child_depth": 1, "fork_step": 100, "parent_agent_id": "0", "parent_depth": 0},
        ),
    ):
        policy = Recorder(secret_script)
        asyncio.run(run_root({"goal": "raise the counter"}, SecretEnv(), policy, cfg))
        user = next(r for r in policy.requests if r.role == "rubric").messages[1]["content"]
        meta = user.split("[Parent Metadata Visible To Rubric Generator]\n")[1].split("\n")[0]
        assert json.loads(meta) == expected


def test_rubric_and_score_calls_get_the_context_left_after_their_own_output():
    """Public ``three_stage_train/policy_client.py: ArealPolicyClient``: a rubric or score call's prompt cap is
    ``max_prompt_tokens + default_completion_tokens - max_completion_tokens`` (TextCraft training: 9,600 + 512
    - 1,024 = 9,088); an agent step keeps ``max_prompt_tokens``."""

    def fn(req: GenerationRequest) -> str:
        if req.role != "act":
            return secret_script(req)
        if req.meta["depth"] == 0:
            return (
                "LOOK " + "o" * 4000
                if req.meta["step"] < 3
                else ("DELEGATE" if req.meta["step"] == 3 else "FINISH")
            )
        return ["INC", "FINISH"][min(req.meta["step"], 1)]

    policy = Recorder(fn)
    cfg = RuntimeConfig(max_prompt_tokens=4000, max_new_tokens=64, rubric_max_new_tokens=1024, max_steps=6)
    tree = asyncio.run(run_root({"goal": "g"}, SecretEnv(), policy, cfg))
    rubric = next(r for r in policy.requests if r.role == "rubric")
    assert estimate_tokens(rubric.messages) <= 4000 + 64 - 1024
    assert tree.nodes["0.1"].rubric_call.prompt_truncated  # the uncut request would have fitted 4,000
    assert max(estimate_tokens(r.messages) for r in policy.requests if r.role == "act") <= 4000
    from common.agent.runtime import _Rollout, programmatic_judge

    ro = _Rollout(
        SecretEnv(), policy, RuntimeConfig(max_prompt_tokens=9600, max_new_tokens=512), {}, programmatic_judge
    )
    assert (ro.prompt_cap(512), ro.prompt_cap(1024), ro.prompt_cap(20_000)) == (9600, 9088, 1)


class RubricStageRefusalSession(SecretSession):
    def counterfactual_depth_refusal(self, request, depth, max_depth):
        return f"Cannot launch subagent beyond max_subagent_depth={max_depth}."


def test_an_environment_can_word_the_rubric_stage_depth_refusal():
    """Public TextWorld ``textworld_two_stage_rollout.py`` refuses with ``Cannot launch subagent beyond
    max_subagent_depth={m}.``: a session's ``counterfactual_depth_refusal`` replaces the TextCraft text there."""
    policy = Recorder(secret_script)
    cfg = RuntimeConfig(counterfactual_k=2, max_depth=0)
    tree = asyncio.run(run_root({"goal": "g"}, SecretEnv(RubricStageRefusalSession), policy, cfg))
    assert tree.root.steps[1].observation == "child said: Cannot launch subagent beyond max_subagent_depth=0."
