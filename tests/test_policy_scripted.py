"""Scripted policies (replay / random / oracle) and ``make_policy`` spec parsing.

Run: ``pytest tests/test_policy_scripted.py``.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from common.agent.rubric import parse_rubric, parse_score
from common.envs.base import ChildResult, LaunchRequest
from common.policy import make_policy
from common.policy.base import GenerationRequest, Policy
from common.policy.scripted import (
    OraclePolicy,
    RandomPolicy,
    ReplayExhaustedError,
    ReplayPolicy,
    rubric_json,
    score_json,
)


def gen(policy: Policy, role: str = "act", session=None, meta=None, messages=None) -> str:
    req = GenerationRequest(messages=messages or [], role=role, session=session, meta=meta or {})
    comp = asyncio.run(policy.generate(req))
    assert comp.finish_reason == "scripted" and comp.output_ids == [] and comp.logprobs == []
    return comp.text


async def _refuse(request: LaunchRequest) -> ChildResult:
    return ChildResult(request=request, returned=False, error="refused in test", refused=True)


# ------------------------------------------------------------------------------------------ replay
def test_replay_global_queue_and_exhaustion(tmp_path):
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(["a", "b"]))
    policy = ReplayPolicy(path)
    assert [gen(policy), gen(policy, role="score")] == ["a", "b"]
    with pytest.raises(ReplayExhaustedError, match="exhausted after 2 replies"):
        gen(policy)


def test_replay_per_role_queues():
    policy = ReplayPolicy({"act": ["a1", "a2"], "rubric": ["r1"], "*": ["any"]})
    assert gen(policy, "rubric") == "r1"
    assert gen(policy, "act") == "a1"
    assert gen(policy, "score") == "any"  # no score queue -> the '*' fallback
    assert gen(policy, "act") == "a2"
    with pytest.raises(ReplayExhaustedError, match="role 'rubric'"):
        gen(policy, "rubric")
    with pytest.raises(ReplayExhaustedError, match="no replies for role 'score'"):
        gen(ReplayPolicy({"act": ["x"]}), "score")


def test_replay_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        ReplayPolicy(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        ReplayPolicy(bad)


# ---------------------------------------------------------------------------- rubric / score JSON
def test_template_rubric_and_score_parse():
    rubric = parse_rubric(rubric_json("Craft 2x a1_i5"))
    assert len(rubric.items) == 4 and abs(sum(i.weight for i in rubric.items) - 1) < 1e-9
    ok = parse_score(score_json(True))
    assert ok.success and ok.final_score == 1.0
    bad = parse_score(score_json(False, n_items=6))
    assert not bad.success and bad.final_score == 0.0


def test_oracle_rubric_and_score_roles():
    policy = OraclePolicy(lambda s: "never called")
    assert len(parse_rubric(gen(policy, "rubric")).items) == 4
    assert parse_score(gen(policy, "score", meta={"child_success": True})).success
    assert not parse_score(gen(policy, "score", meta={"child_success": False})).success
    prompt = [
        {"role": "user", "content": "Score the sub-agent now, as one JSON object with 6 criterion scores."}
    ]
    assert (
        len(parse_score(gen(policy, "score", meta={"child_success": True}, messages=prompt)).criterion_scores)
        == 6
    )

    class S:
        def success(self) -> bool:
            return False

    assert not parse_score(gen(policy, "score", session=S())).success


def test_random_policy_valid_actions_and_seeding():
    class Sess:
        def valid_actions(self):
            return ["go to kitchen", "take apple", "look around"]

    texts = [gen(RandomPolicy(seed=1, finish_prob=0.0), session=Sess()) for _ in range(3)]
    assert all(t.startswith("<action>") and t[8:-9] in Sess().valid_actions() for t in texts)
    a, b = RandomPolicy(seed=5), RandomPolicy(seed=5)
    assert [gen(a, session=Sess()) for _ in range(10)] == [gen(b, session=Sess()) for _ in range(10)]
    r = RandomPolicy(seed=2)
    assert len(parse_rubric(gen(r, "rubric")).items) == 4
    parse_score(gen(r, "score"))  # valid whichever way it goes


def test_random_and_oracle_on_textcraft_sessions():
    from common.envs.textcraft.env import TextCraftEnv
    from common.envs.textcraft.tasks import generate_tasks

    env = TextCraftEnv()
    task = generate_tasks("val", 1, seed=0, difficulty="easy")[0]

    async def run(policy: Policy, steps: int):
        world = env.make_world(task)
        session = env.root_session(world, task, _refuse)
        session.first_user_message()
        for _ in range(steps):
            comp = await policy.generate(GenerationRequest(messages=[], session=session))
            result = await session.step(comp.text)
            if result.done:
                break
        return session

    session = asyncio.run(run(RandomPolicy(seed=0), 5))
    assert session.steps_used >= 1
    oracle = make_policy("oracle", env="textcraft")
    assert isinstance(oracle, OraclePolicy)
    assert asyncio.run(run(oracle, 5)).success()


def test_oracle_on_textworld_sync_session():
    from common.envs.textworld_sync.env import TextWorldSyncEnv
    from common.envs.textworld_sync.tasks import generate_task

    env = TextWorldSyncEnv()
    task = generate_task("train", "multi_dish_fork_join", "easy", 0, seed=0)
    policy = make_policy("oracle:textworld", delegate=False)

    async def run():
        world = env.make_world(task)
        session = env.root_session(world, task, _refuse)
        session.first_user_message()
        for _ in range(session.max_steps):
            comp = await policy.generate(GenerationRequest(messages=[], session=session))
            if (await session.step(comp.text)).done:
                break
        return world

    assert asyncio.run(run()).root_success()
    rnd = gen(
        RandomPolicy(seed=0, finish_prob=0.0), session=env.root_session(env.make_world(task), task, _refuse)
    )
    assert rnd.startswith("<action>")


# ------------------------------------------------------------------------------------------ make_policy
def test_make_policy_specs(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('["x"]')
    assert isinstance(make_policy(f"replay:{path}"), ReplayPolicy)
    assert isinstance(make_policy("random", seed=3), RandomPolicy)
    assert isinstance(make_policy("random:4"), RandomPolicy)
    from common.policy.openai import OpenAIPolicy

    p = make_policy("openai:http://127.0.0.1:9#my-model")
    assert isinstance(p, OpenAIPolicy) and p.base_url == "http://127.0.0.1:9/v1" and p.model == "my-model"
    p = make_policy("openai:http://127.0.0.1:9/v1")
    assert p.model is None
    from common.policy.hf import HFPolicy

    hf = make_policy("hf:tiny", dtype="float32")
    assert isinstance(hf, HFPolicy) and hf.trainable


@pytest.mark.parametrize(
    ("spec", "kw", "match"),
    [
        ("", {}, "empty policy spec"),
        ("gpt", {}, "unknown policy spec"),
        ("replay", {}, "needs a file"),
        ("hf:", {}, "needs a model"),
        ("openai:", {}, "needs a URL"),
        ("oracle", {}, "needs the environment"),
        ("oracle", {"env": "chess"}, "no oracle for env"),
        ("random:abc", {}, "integer seed"),
    ],
)
def test_make_policy_bad_specs(spec, kw, match):
    with pytest.raises(ValueError, match=match):
        make_policy(spec, **kw)
