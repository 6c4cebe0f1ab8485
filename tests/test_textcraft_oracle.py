"""The scripted oracle solves generated TextCraft-Synth tasks through the real tools and sessions, with
and without delegation (recursive, parallel at the root), and the depth limit refuses launches.

Run: ``pytest tests/test_textcraft_oracle.py -q``.
"""

from __future__ import annotations

import asyncio
import collections

import pytest

from common.envs.textcraft.env import TextCraftEnv
from common.envs.textcraft.oracle import drive, lookup_reply, oracle_reply, run_episode
from common.envs.textcraft.tasks import generate_tasks, plan_crafts


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks("val", 100, seed=0) + generate_tasks("train", 100, seed=0)


def run_all(tasks, reply_fn, **kw):
    async def go():
        env = TextCraftEnv()
        return [await run_episode(env, t, reply_fn, **kw) for t in tasks]

    return asyncio.run(go())


def test_oracle_solves_every_task_of_a_200_task_sample(tasks):
    # The first 100 paper tasks of each split (the public mix: 51/74/43/32 over easy/medium/hard/extreme).
    per_tier = collections.Counter(t["misc"]["difficulty"] for t in tasks)
    assert set(per_tier) == {"easy", "medium", "hard", "extreme"} and min(per_tier.values()) >= 30, per_tier
    outs = run_all(tasks, oracle_reply)
    failed = [o.root.agent_id for o in outs if not o.success]
    assert not failed, failed
    assert all(o.root.steps_used == 1 and len(o.sessions) == 1 for o in outs)


def test_oracle_with_parallel_delegation(tasks):
    subset = tasks[::3]

    def fn(s):
        return oracle_reply(s, delegate=True)

    outs = run_all(subset, fn)
    assert all(o.success for o in outs), [o.root.agent_id for o in outs if not o.success]
    delegated = [o for o in outs if len(o.sessions) > 1]
    assert len(delegated) >= len(subset) // 2
    for o in delegated:
        assert all(s.depth == 1 for s in o.sessions[1:])
        assert all(s.success() for s in o.sessions[1:])  # children craft their targets on top of held
        assert o.root.launches and {r.step for r in o.root.launches} == {1}  # one delegation event


def test_recursive_delegation_and_depth_limit(tasks):
    subset = [t for t in tasks if t["misc"]["difficulty"] in ("hard", "extreme")][:6]

    def deep(s):
        return oracle_reply(s, delegate=True, max_delegation_depth=3)

    outs = run_all(subset, deep, max_depth=3)
    assert all(o.success for o in outs)
    assert max(s.depth for o in outs for s in o.sessions) == 3

    def too_deep(s):  # depth-1 agents try to delegate but max_depth=1 refuses; they then craft
        return oracle_reply(s, delegate=True, max_delegation_depth=2)

    outs = run_all(subset[:4], too_deep, max_depth=1)
    assert all(o.success for o in outs)
    refused = [r for o in outs for s in o.sessions if s.depth == 1 for r in s.launches if r.result.refused]
    assert refused and all("refused" in r.result.error for r in refused)
    assert max(s.depth for o in outs for s in o.sessions) == 1


def test_oracle_replans_after_interference():
    t = generate_tasks("val", 1, seed=0, difficulty="medium")[0]

    async def go():
        env = TextCraftEnv()
        world = env.make_world(t)
        from common.envs.textcraft.env import echo_launch_hook

        s = env.root_session(world, t, echo_launch_hook)
        # Someone else crafts the first gold step before the oracle acts: its plan must adapt.
        st = t["misc"]["gold_trajectory"][0]
        assert world.craft(st["ingredients"], (st["target"][0], st["result_count"])).startswith("Success")
        while not (await s.step(oracle_reply(s))).done:
            pass
        return s

    s = asyncio.run(go())
    assert s.success()


def test_look_up_prints_every_recipe_the_plan_then_uses(tasks):
    """With look_up an agent's first cell walks its recipe tree with get_info; its output holds every
    recipe (item, result count, ingredients) of the craft plan the next reply runs, so a model trained on
    these trajectories can copy the plan's facts from its own context instead of inventing them."""

    async def no_launch(request):  # this test's agents never delegate
        raise AssertionError("unexpected launch")

    async def go(task):
        env = TextCraftEnv()
        session = env.root_session(env.make_world(task), task, no_launch)
        first = await session.step(oracle_reply(session, look_up=True))
        plan = plan_crafts(session.world.book, session.world.inventory, dict(session.targets))
        await drive(session, lambda s: oracle_reply(s, look_up=True))  # the rest, until it halts
        return session, first, plan

    for task in tasks[::20]:
        session, first, plan = asyncio.run(go(task))
        assert session.success(), task["id"]
        assert session.steps_used >= 2  # the look-up, then the work
        assert "get_info(todo)" in lookup_reply(session)
        for st in plan.steps:
            item = st["target"][0]
            rec = session.world.book.recipe(item)
            line = f"{item} x {rec.result_count} <- {dict(rec.ingredients)}"
            assert line in first.observation, (line, first.observation)
    # without look_up nothing changes: one step per agent, as before
    assert all(o.root.steps_used == 1 for o in run_all(tasks[::20], oracle_reply))
