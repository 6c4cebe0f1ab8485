"""Tests of the TextWorld-Sync environment contract: sessions, replies, delegation and results blocks.

Sessions are driven directly: launch hooks below build child sessions and run them with the oracle.

Run: ``pytest tests/test_textworld_sync_env.py -q``.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from common.envs.base import ChildResult, LaunchRequest
from common.envs.textworld_sync.env import SyncSession, TextWorldSyncEnv
from common.envs.textworld_sync.oracle import oracle_reply
from common.envs.textworld_sync.tasks import generate_tasks, make_row
from common.envs.textworld_sync.world import SyncWorld

TWO = [
    [("salt", ("raw", "uncut"), "pantry.shelf"), ("carrot", ("grilled", "diced"), "kitchen.fridge")],
    [("banana", ("fried", "uncut"), "kitchen.counter"), ("cilantro", ("raw", "chopped"), "kitchen.fridge")],
]


def make_task(dishes, **kw) -> dict:
    return make_row(dishes, description="hand-made test task", **kw)


ENV = TextWorldSyncEnv()


async def _no_launch(request: LaunchRequest) -> ChildResult:
    raise AssertionError("no delegation expected")


def root(task: dict, launch=_no_launch) -> tuple[SyncWorld, SyncSession]:
    w = ENV.make_world(task)
    return w, ENV.root_session(w, task, launch)


def oracle_hook(
    parent_ref: list, *, interleave: bool = False, fork: bool = False, created: list | None = None
):
    """A launch hook that builds a child session (on the live world, or on a fork committed afterwards)
    and runs it with the oracle."""

    async def launch(request: LaunchRequest) -> ChildResult:
        parent = parent_ref[0]
        world = parent.world.fork() if fork else parent.world
        ref: list = []
        parent.n_launched = getattr(parent, "n_launched", 0) + 1
        child = ENV.child_session(
            world,
            parent,
            request,
            f"{parent.agent_id}.{parent.n_launched}",
            oracle_hook(ref, interleave=interleave, fork=fork, created=created),
        )
        ref.append(child)
        if created is not None:
            created.append(child)
        child.first_user_message()
        for _ in range(child.max_steps):
            res = await child.step(oracle_reply(child))
            if interleave:
                await asyncio.sleep(0)
            if res.done:
                break
        if fork:
            parent.world.commit(world)
        return ChildResult(
            request=request,
            returned=child.finished,
            message=child.finish_message or "",
            steps_used=child.steps_used,
        )

    return launch


def test_prompts_and_first_message():
    w, s = root(make_task(TWO))
    assert "<action>" in s.system_prompt() and "<delegate>" in s.system_prompt()
    first = s.first_user_message()
    assert "hand-made test task" in first and "20 steps" in first and "Valid actions:" in first
    deep = SyncSession(w, agent_id="d", depth=3, goal="x", max_steps=5, launch=_no_launch, max_depth=3)
    assert "maximum delegation depth" in deep.system_prompt()


def test_action_invalid_reply_and_finish():
    w, s = root(make_task(TWO))

    async def go():
        r1 = await s.step("I take the carrot.\n<action>take carrot</action>")
        assert r1.info["accepted"] and not r1.done and "shared inventory" in r1.observation
        r2 = await s.step("hmm, let me think")
        assert r2.info["kind"] == "error" and "Invalid reply" in r2.observation and not r2.done
        r3 = await s.step("dice carrot")  # lenient: a bare valid action
        assert r3.info["lenient"] and r3.info["accepted"]
        r4 = await s.step("<action>juggle</action>")  # parsed, rejected by the world, costs a shared step
        assert r4.info["accepted"] is False and r4.info["counted"]
        r5 = await s.step("<finish>stopping early</finish>")
        assert r5.done and r5.finish_message == "stopping early"
        r6 = await s.step("<action>look around</action>")
        assert r6.done

    asyncio.run(go())
    assert w.steps_used == 3 and s.steps_used == 5
    assert s.finished and s.finish_message == "stopping early" and not s.success()


def test_own_budget_ends_the_agent():
    task = dict(make_task(TWO), max_steps=3)
    w, s = root(task)

    async def go():
        outs = [await s.step("<action>look around</action>") for _ in range(3)]
        assert [o.done for o in outs] == [False, False, True]
        assert "all 3 of your steps" in outs[-1].observation

    asyncio.run(go())
    assert not s.finished


def test_world_end_asks_to_finish_without_cutting_off():
    w, s = root(make_task(TWO, max_steps=2))

    async def go():
        await s.step("<action>look around</action>")
        r = await s.step("<action>look around</action>")
        assert not r.done and "Reply with <finish>" in r.observation
        r = await s.step("<finish>out of shared budget</finish>")
        assert r.done

    asyncio.run(go())


def _results_blocks(obs: str) -> list[str]:
    return [b for b in obs.split("[SubAgent Results]")[1:]]


@pytest.mark.parametrize("interleave", [False, True])
def test_delegation_runs_children_concurrently_and_reports_each(interleave):
    task = make_task(TWO)
    ref: list = []
    created: list = []
    w, s = root(task, oracle_hook(ref, interleave=interleave, created=created))
    ref.append(s)

    async def go():
        await s.step("<action>go to pantry</action>")
        reply = oracle_reply(s, delegate=True)
        assert reply.startswith("<action>take salt")  # the root fetches far-away raw items first
        await s.step(reply)
        await s.step("<action>go to kitchen</action>")
        return await s.step(oracle_reply(s, delegate=True))

    r = asyncio.run(go())
    assert r.info["kind"] == "delegate" and len(r.info["delegations"]) == 2
    blocks = _results_blocks(r.observation)
    assert len(blocks) == 2
    for k, b in enumerate(blocks, start=1):
        assert f"Sub-agent {k} of 2; goal: Prepare and eat dish_{k}" in b
        assert "returned: yes" in b and "environment_success: true" in b
        m = re.search(r"Budget used by subagent: (\d+)/20 steps", b)
        assert m and f"steps: {m.group(1)}" in b
        assert "result: Done: dish_" in b and "final observation:\nYou are in the kitchen" in b
    assert "[Your current view]" in r.observation
    assert w.root_success() and s.success()
    assert all(c.success() and c.depth == 1 for c in created)
    w.check_invariants()


def test_children_start_where_the_root_stands():
    task = make_task(TWO)
    seen: list[str] = []

    async def launch(request: LaunchRequest) -> ChildResult:
        child = ENV.child_session(s.world, s, request, "0.1", _no_launch)
        seen.append(s.world.location(child.agent_id))
        return ChildResult(request=request, returned=False)

    w, s = root(task, launch)

    async def go():
        await s.step("<action>go to garden</action>")
        return await s.step('<delegate>{"goal": "Prepare and eat dish_1"}</delegate>')

    r = asyncio.run(go())
    assert seen == ["garden"]
    b = _results_blocks(r.observation)[0]
    assert "returned: no" in b and "environment_success: false" in b and "result: (no message)" in b


def test_refused_and_crashing_launches_become_text():
    async def launch(request: LaunchRequest) -> ChildResult:
        if "refuse" in request.goal:
            return ChildResult(
                request=request, returned=False, refused=True, error="Launch refused: depth limit."
            )
        raise RuntimeError("boom")

    w, s = root(make_task(TWO), launch)
    r = asyncio.run(
        s.step('<delegate>{"delegations": [{"goal": "refuse dish_1"}, {"goal": "dish_2"}]}</delegate>')
    )
    a, b = _results_blocks(r.observation)
    assert (
        "(launch refused)" in a and "Launch refused: depth limit." in a and "environment_success: false" in a
    )
    assert "RuntimeError: boom" in b and "returned: no" in b
    assert w.steps_used == 0 and not r.done


def test_child_on_a_fork_is_committed_back():
    ref: list = []
    w, s = root(make_task(TWO), oracle_hook(ref, fork=True))
    ref.append(s)
    goals = {"delegations": [{"goal": "Prepare and eat dish_1"}, {"goal": "Prepare and eat dish_2"}]}
    r = asyncio.run(s.step(f"<delegate>{json.dumps(goals)}</delegate>"))
    assert r.info["kind"] == "delegate"
    assert w.root_success()  # both forks committed in turn (children run one after the other here)
    for b in _results_blocks(r.observation):
        assert "environment_success: true" in b and "final observation:\nYou are in" in b


def test_child_success_follows_its_goal():
    w = SyncWorld(make_task(TWO))
    kw = dict(max_steps=20, launch=_no_launch, start_from="0")
    dish = SyncSession(w, agent_id="a", depth=1, goal="Prepare and eat dish_2", **kw)
    item = SyncSession(w, agent_id="b", depth=1, goal="Get the carrot grilled and diced", **kw)
    vague = SyncSession(w, agent_id="c", depth=1, goal="help out", **kw)
    for a in ("take carrot", "dice carrot", "cook carrot on grill"):
        w.step("b", a)
    assert item.success() and not dish.success() and not vague.success()
    asyncio.run(vague.step("<finish>helped</finish>"))
    assert vague.success()


def test_many_concurrent_sessions_share_one_world_safely():
    task = generate_tasks("train", 1, seed=11, family="conflict", tier="hard")[0]
    w = ENV.make_world(task)
    sessions = [
        SyncSession(
            w,
            agent_id=f"0.{k}",
            depth=1,
            goal=f"Prepare and eat dish_{k % 4 + 1}",
            max_steps=20,
            launch=_no_launch,
            start_from="0",
        )
        for k in range(12)
    ]

    async def drive(sess: SyncSession) -> None:
        for _ in range(sess.max_steps):
            res = await sess.step(oracle_reply(sess))
            await asyncio.sleep(0)
            if res.done:
                break

    async def main() -> None:
        await asyncio.gather(*(drive(x) for x in sessions))

    asyncio.run(main())
    w.check_invariants()
    assert w.steps_used <= w.spec.max_steps
    assert w.failure is None
