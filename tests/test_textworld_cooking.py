"""Real TextWorld cooking games: cached deterministic generation, the walkthrough oracle, fork/commit
isolation, rejected commands and a delegation round trip through a test launch hook.

Needs ``textworld`` (``pip install textworld==1.7.0``); the whole module is skipped without it. Games are
generated into a temporary cache (about 1 s each). Run: ``pytest tests/test_textworld_cooking.py -q``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("textworld", reason="textworld is not installed (pip install textworld==1.7.0)")

from common.envs.base import ChildResult, LaunchRequest  # noqa: E402
from common.envs.textworld_cooking import (  # noqa: E402
    CookingSettings,
    TextWorldCookingEnv,
    TextWorldCookingWorld,
    game_metadata,
    generate_game,
    generate_tasks,
    load_tasks,
    oracle_command,
    oracle_reply,
    save_tasks,
    walkthrough_progress,
)

SETTINGS = CookingSettings(recipe=2, take=2, go=6, open=True, cook=True, cut=True)
SEED = 11


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tw_games")


@pytest.fixture(scope="module")
def game(cache):
    return generate_game(SETTINGS, SEED, cache)


@pytest.fixture(scope="module")
def env(cache):
    return TextWorldCookingEnv(cache_dir=str(cache))


def _task(max_steps: int = 60) -> dict:
    return {"task_id": "t", "settings": SETTINGS.to_dict(), "seed": SEED, "max_steps": max_steps}


async def _no_launch(request: LaunchRequest) -> ChildResult:
    raise AssertionError("this test does not delegate")


def _run(coro):
    return asyncio.run(coro)


# ---- generation --------------------------------------------------------------------------------------


def test_generation_is_cached_and_deterministic(game, cache, tmp_path):
    mtime = game.stat().st_mtime_ns
    t0 = time.perf_counter()
    again = generate_game(SETTINGS.to_dict(), SEED, cache)
    assert again == game and time.perf_counter() - t0 < 0.5, "a cached game must be returned at once"
    assert game.stat().st_mtime_ns == mtime

    other = generate_game(SETTINGS, SEED, tmp_path / "other_cache")
    assert other != game
    assert other.with_suffix(".json").read_bytes() == game.with_suffix(".json").read_bytes()
    meta = game_metadata(game)
    assert meta["walkthrough"] == game_metadata(other)["walkthrough"]
    assert meta["walkthrough"][-2:] == ["prepare meal", "eat meal"]


def test_settings_validation_and_keys():
    assert SETTINGS.key() == "r2-t2-g6-open-cook-cut"
    assert CookingSettings.from_any("easy").recipe == 1
    with pytest.raises(ValueError, match="go must be one of"):
        CookingSettings(go=4)
    with pytest.raises(ValueError, match="take must be"):
        CookingSettings(recipe=1, take=2)
    with pytest.raises(ValueError, match="unknown tier"):
        CookingSettings.from_any("impossible")


def test_task_records_round_trip(tmp_path):
    tasks = generate_tasks(4, seed=3, settings=SETTINGS, max_steps=30)
    assert tasks == generate_tasks(4, seed=3, settings=SETTINGS, max_steps=30)
    assert len({t["seed"] for t in tasks}) == 4
    assert all(t["max_steps"] == 30 and t["goal"] for t in tasks)
    path = tmp_path / "tasks.jsonl"
    save_tasks(path, tasks)
    assert load_tasks(path) == tasks
    path.write_text('{"task_id": "x", "max_steps": 5}\n')
    with pytest.raises(ValueError, match=r"tasks.jsonl:1: .*game_file"):
        load_tasks(path)


# ---- playing -----------------------------------------------------------------------------------------


def test_oracle_wins_a_generated_game(env, game):
    task = _task()
    world = env.make_world(task)
    assert world.game_file == str(game)
    session = env.root_session(world, task, _no_launch)
    assert "Admissible commands:" in session.first_user_message()
    result = None
    for _ in range(session.max_steps):
        result = _run(session.step(oracle_reply(session)))
        if result.done:
            break
    assert world.root_success() and session.success()
    assert result is not None and result.done and result.finish_message
    assert session.steps_used <= len(world.walkthrough) + 1
    assert "Game: WON" in world.describe()


def test_oracle_recovers_from_another_agents_detour(env):
    world = env.make_world(_task())
    while not any(a.startswith("take ") and "knife" not in a and "cookbook" not in a for a in world.actions):
        world.act("0", oracle_command(world))
    item = next(a for a in world.actions if a.startswith("take ")).split(" from ")[0][len("take ") :]
    nxt = oracle_command(world)
    detour = next(c for c in world.admissible_commands if c.startswith("go ") and c != nxt)
    assert world.act("other", detour).accepted and world.act("other", f"drop {item}").accepted
    for _ in range(80):
        if world.over:
            break
        world.act("0", oracle_command(world))
    assert world.root_success(), world.actions


def test_fork_isolation_and_commit(env):
    world = env.make_world(_task())
    for _ in range(3):
        assert world.act("0", oracle_command(world)).accepted
    before = (list(world.actions), world.score, world.admissible_commands, world.steps_taken)

    branch = world.fork()
    for _ in range(4):
        assert branch.act("b", oracle_command(branch)).accepted
    assert (list(world.actions), world.score, world.admissible_commands, world.steps_taken) == before
    assert branch.actions[:3] == before[0] and len(branch.actions) == 7

    # acting on the original does not leak into the fork either
    twin = world.fork()
    world.act("0", "look")
    assert twin.actions == before[0]

    world.commit(branch)
    assert world.actions == branch.actions and world.score == branch.score
    assert world.admissible_commands == branch.admissible_commands
    with pytest.raises(RuntimeError, match="committed"):
        branch.act("b", "look")
    # the committed world keeps playing from the branch's state, and the oracle still wins from there
    while not world.over:
        assert world.act("0", oracle_command(world)).accepted
    assert world.root_success() and not twin.root_success()


def test_spec_round_trip_replays_the_state(env):
    world = env.make_world(_task())
    for _ in range(5):
        world.act("0", oracle_command(world))
    copy = TextWorldCookingWorld.from_spec(world.to_spec())
    assert copy.actions == world.actions and copy.score == world.score
    assert copy.admissible_commands == world.admissible_commands


def test_rejected_actions_cost_a_step(env):
    world = env.make_world(_task())
    session = env.root_session(world, _task(), _no_launch)
    admissible = list(world.admissible_commands)
    res = _run(session.step("<action>fly to the moon</action>"))
    assert res.info["accepted"] is False and not res.done
    assert "not an admissible command" in res.observation
    assert session.steps_used == 1 and world.steps_taken == 1 and world.actions == []
    assert world.admissible_commands == admissible

    res = _run(session.step("I think I will just wander around."))
    assert res.info["kind"] == "error" and "Invalid reply" in res.observation and session.steps_used == 2

    res = _run(session.step(f"<action>{admissible[0].upper()}</action>"))  # case-insensitive match
    assert res.info["accepted"] is True and world.actions == [admissible[0]]


def test_shared_world_budget_ends_agents(env):
    task = {**_task(), "max_world_steps": 2}
    world = env.make_world(task)
    session = env.root_session(world, task, _no_launch)
    assert not _run(session.step("<action>look</action>")).done
    res = _run(session.step("<action>fly</action>"))
    assert res.done and world.budget_left == 0 and "budget is exhausted" in res.observation


# ---- delegation --------------------------------------------------------------------------------------


def test_delegate_round_trip_through_a_launch_hook(env):
    world = env.make_world(_task())
    seen: list[LaunchRequest] = []

    async def launch(request: LaunchRequest) -> ChildResult:
        seen.append(request)
        child = env.child_session(world, root, request, "0.1", _no_launch)
        assert child.depth == 1 and child.max_steps == request.max_steps
        for _ in range(child.max_steps):
            res = await child.step(oracle_reply(child))
            if res.done:
                break
        assert child.success(), "the child made progress and returned a message"
        return ChildResult(
            request=request,
            returned=child.finished,
            message=child.finish_message or "",
            steps_used=child.steps_used,
        )

    root = env.root_session(world, _task(), launch)
    res = _run(root.step('<delegate>{"goal": "Collect the ingredients", "max_steps": 8}</delegate>'))
    assert [r.goal for r in seen] == ["Collect the ingredients"] and seen[0].max_steps == 8
    assert root.steps_used == 1 and not res.done
    assert "[SubAgent Results]" in res.observation
    assert "returned: yes" in res.observation and "Budget used by subagent: 8/8 steps" in res.observation
    assert "environment_success: true" in res.observation and "[Your current view]" in res.observation
    assert len(world.actions) == 7  # 7 commands, then the child finished on its last step
    assert walkthrough_progress(world.walkthrough, world.actions) >= 7
    # the root carries on from the child's state and wins
    for _ in range(40):
        if _run(root.step(oracle_reply(root))).done:
            break
    assert world.root_success() and root.steps_used < len(world.walkthrough)


def test_refused_launches_are_reported(env):
    world = env.make_world(_task())

    async def refuse(request: LaunchRequest) -> ChildResult:
        return ChildResult(request=request, returned=False, refused=True, error="Launch refused: max depth.")

    root = env.root_session(world, _task(), refuse)
    reply = '<delegate>{"delegations": [{"goal": "a"}, {"goal": "b", "max_steps": 3}]}</delegate>'
    res = _run(root.step(reply))
    assert res.observation.count("launch refused") == 2 and "Launch refused: max depth." in res.observation
    assert root.steps_used == 1 and world.actions == []


def test_runtime_round_trip_with_the_delegating_oracle(env):
    """The shared runtime drives the env end to end (rubrics, best-of-2 forks and commit included)."""
    runtime = pytest.importorskip("common.agent.runtime")
    policy_mod = pytest.importorskip("common.policy")
    policy = policy_mod.make_policy("oracle", env="textworld-cooking", delegate=True)
    task = _task(max_steps=6)  # too short for the walkthrough alone: the root must delegate
    tree = _run(runtime.run_root(task, env, policy, runtime.RuntimeConfig(best_of_n=2)))
    assert tree.success
    nodes = list(tree.nodes.values())
    assert any(n.depth == 1 for n in nodes) and all(n.error is None for n in nodes)
