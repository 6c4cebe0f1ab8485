"""Tests of the TextWorld-Sync shared world: the public rules, scoring, budget, observation, fork/commit,
concurrency, speed; plus the ``rules="strict"`` option.

Run: ``pytest tests/test_textworld_sync_world.py -q``.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.envs.textworld_sync.oracle import sample_tasks_path
from common.envs.textworld_sync.tasks import (
    FAMILIES,
    TIERS,
    generate_task,
    generate_tasks,
    load_tasks,
    make_row,
)
from common.envs.textworld_sync.world import ROOMS, SyncWorld, bench_sync, parse_preparation, prep_set


def make_task(dishes, *, limit: int = 0, doors: int = 0, **kw) -> dict:
    return make_row(
        dishes, limit_inventory=bool(limit), doors=bool(doors), description="hand-made test task", **kw
    )


TWO = [
    [("salt", ("raw", "uncut"), "pantry.shelf"), ("carrot", ("grilled", "diced"), "kitchen.fridge")],
    [("banana", ("fried", "uncut"), "kitchen.counter"), ("cilantro", ("raw", "chopped"), "kitchen.fridge")],
]
SOLUTION = [
    "take carrot",
    "take banana",
    "take cilantro",
    "go to pantry",  # preparing works in any room (public)
    "dice carrot",
    "cook carrot on grill",
    "cook banana in stove",
    "chop cilantro",
    "take salt",
    "prepare dish_1",
    "eat dish_1",
    "prepare dish_2",
    "eat dish_2",
]


def run(w: SyncWorld, actions: list[str], agent: str = "0") -> list:
    return [w.step(agent, a) for a in actions]


def test_preparation_conventions():
    assert parse_preparation(["raw", "uncut"]) == ("raw", "uncut")
    assert parse_preparation(["grilled", "diced"]) == ("grilled", "diced")
    assert parse_preparation(["sliced"]) == ("raw", "sliced")
    assert prep_set([]) == {"raw", "uncut"} and prep_set(["boiled", "uncut"]) == {"boiled", "uncut"}
    with pytest.raises(ValueError):
        parse_preparation(["steamed"])
    with pytest.raises(ValueError):
        parse_preparation(["fried", "grilled"])


def test_scripted_solution_succeeds_and_ends_the_world():
    w = SyncWorld(make_task(TWO))
    outs = run(w, SOLUTION)
    assert all(o.accepted for o in outs), [o.message for o in outs if not o.accepted]
    assert outs[-1].reward == 1.0 and outs[-1].done and outs[-1].success
    assert sum(o.reward for o in outs) == 1.0
    assert w.root_success() and w.over
    assert w.steps_used == len(SOLUTION)
    assert w.score()["completed_dishes"] == 2 and w.score()["score"] == 1.0
    after = w.step("0", "look around")
    assert not after.accepted and not after.counted and after.done
    assert w.steps_used == len(SOLUTION)


def test_only_the_missing_expected_preparations_are_listed_in_any_room():
    w = SyncWorld(make_task(TWO))
    run(w, ["take carrot", "take banana", "go to garden"])
    valid = w.valid_actions("0")
    prep = [a for a in valid if a.split(" ")[0] in ("chop", "slice", "dice", "mince", "cook")]
    assert prep == ["dice carrot", "cook carrot on grill", "cook banana in stove"]
    w.step("0", "dice carrot")
    assert "dice carrot" not in w.valid_actions("0") and "cook carrot on grill" in w.valid_actions("0")
    assert not w.step("0", "slice banana").accepted and w.failure is None  # not listed: rejected, counted
    w.step("0", "cook carrot on grill")
    st_ = w.state()
    assert st_.counter == ("carrot",) and st_.inventory == ("banana",)


def test_raw_items_go_straight_to_the_counter():
    w = SyncWorld(make_task(TWO))
    run(w, ["go to pantry", "take salt"])
    assert w.state().counter == ("salt",) and w.state().inventory == ()


def test_half_done_and_uneaten_are_zero():
    w = SyncWorld(make_task(TWO))
    run(w, SOLUTION[:11])
    assert w.score()["completed_dishes"] == 1 and not w.root_success() and w.score()["score"] == 0.0
    w.step("0", "prepare dish_2")
    assert not w.root_success() and not w.over


def test_invalid_and_look_actions_consume_the_shared_budget():
    w = SyncWorld(make_task(TWO, max_steps=5))
    for a in ("fly to the moon", "Take carrot", "look around", "read cookbook"):
        out = w.step("0", a)
        assert out.counted
    assert w.steps_used == 4 and w.state().inventory == ()
    assert w.step("0", "look around").done and w.over and not w.root_success()


def test_read_cookbook_reveals_nothing_and_distractors_are_never_shown():
    w = SyncWorld(make_task(TWO, distractors=6))
    out = w.step("0", "read cookbook")
    assert out.accepted and "grilled" not in out.observation and "diced" not in out.observation
    for room in w.spec.rooms:
        w2 = w.fork()
        if room != "kitchen":
            w2.step("0", f"go to {room}")
        obs = w2.observe("0")
        visible = obs.split("Visible objects: ")[1].split("\n")[0]
        names = {it.name for it in w.spec.items}
        assert visible == "(none)" or set(visible.split(", ")) <= names, visible
        assert all(
            a in ("take knife",) or a[5:] in names for a in w2.valid_actions("0") if a.startswith("take ")
        )


def test_rooms_moves_and_sources_follow_the_public_tables():
    task = make_task(
        [[("egg", ("raw", "uncut"), "backyard.bush"), ("oil", ("raw", "uncut"), "garden")]], locations=7
    )
    w = SyncWorld(task)
    assert w.spec.rooms == ROOMS[:7] and ROOMS[4:7] == ("hallway", "dining room", "garage")
    assert [it.room for it in w.spec.items] == ["kitchen", "garden"]  # unknown source room -> kitchen
    assert SyncWorld(make_task(TWO, locations=2)).spec.rooms == ROOMS[:4]
    assert SyncWorld(make_task(TWO, locations=50)).spec.rooms == ROOMS
    moves = [a for a in w.valid_actions("0") if a.startswith("move ")]
    assert moves == ["move north", "move south", "move east", "move west"]
    w.step("0", "move south")
    assert w.location("0") == "dining room"
    w.step("0", "move east")  # absolute directions: from anywhere
    assert w.location("0") == "garden"
    assert "move east" not in w.valid_actions("0")
    small = SyncWorld(make_task(TWO, locations=4))
    assert "move south" not in small.valid_actions("0")  # the dining room does not exist


def test_take_knife_is_listed_in_the_kitchen_and_changes_nothing():
    w = SyncWorld(make_task(TWO))
    assert "take knife" in w.valid_actions("0")
    out = w.step("0", "take knife")
    assert out.accepted and out.counted and w.state().inventory == ()
    w.step("0", "go to garden")
    assert "take knife" not in w.valid_actions("0")


def test_capacity_flag_is_the_capacity_and_explicit_capacity_wins():
    assert SyncWorld(make_task(TWO, limit=1)).spec.capacity == 1
    assert SyncWorld(make_task(TWO)).spec.capacity == 0
    assert SyncWorld(make_task(TWO, limit=1, capacity=2)).spec.capacity == 2
    w = SyncWorld(make_task(TWO, capacity=1))
    w.step("0", "take carrot")
    assert not any(a.startswith("take ") and a != "take knife" for a in w.valid_actions("0"))
    assert not w.step("0", "take banana").accepted


def test_gate_hides_gated_dishes_until_opened():
    w = SyncWorld(make_task(TWO, doors=1, gated=("dish_2",)))
    obs = w.observe("0")
    assert "Shared kitchen gate: closed." in obs and "banana" not in obs and "carrot" in obs
    assert "take banana" not in w.valid_actions("0") and "open door" in w.valid_actions("0")
    w.step("0", "open door")
    assert "take banana" in w.valid_actions("0") and "open door" not in w.valid_actions("0")
    assert "Shared kitchen gate: open." in w.observe("0")


def test_cooldown_blocks_the_tool_for_the_next_global_steps_and_shows_in_the_observation():
    w = SyncWorld(make_task(TWO, cooldown=2))
    run(w, ["take carrot", "take cilantro", "dice carrot"])
    assert "Shared tool cooldowns: knife:2." in w.observe("0")
    assert "chop cilantro" not in w.valid_actions("0")
    w.add_agent("0.1")
    w.step("0.1", "look around")  # any agent's step ticks the shared cooldowns
    assert "Shared tool cooldowns: knife:1." in w.observe("0")
    w.step("0", "bogus")  # rejected steps too
    assert "Shared tool cooldowns: none." in w.observe("0") and "chop cilantro" in w.valid_actions("0")


def test_observation_and_infos_have_the_public_fields():
    w = SyncWorld(make_task(TWO, max_steps=40))
    out = w.step("0", "take carrot")
    lines = out.observation.split("\n")
    assert lines[0] == "You are in the kitchen."
    assert lines[1] == "Visible objects: banana, cilantro"
    assert lines[2:5] == [
        "Shared kitchen gate: open.",
        "Shared tool cooldowns: none.",
        "Shared prepared counter: (empty)",
    ]
    assert lines[5] == "Dish progress:"
    assert lines[6] == "- dish_1: 0/2 ingredients prepared, meal_prepared=False, meal_eaten=False"
    assert lines[-2:] == ["Shared steps remaining: 39", "Valid Actions are listed below."]
    inf = out.infos
    assert set(inf) == {
        "validActions", "inventory", "score", "tasksuccess", "taskfailure", "done", "steps",
        "remaining_shared_steps", "agent_location", "completed_dishes", "total_dishes",
    }  # fmt: skip
    assert inf["inventory"] == "carrot" and inf["remaining_shared_steps"] == 39 and inf["steps"] == 1
    assert inf["validActions"] == w.valid_actions("0") and inf["total_dishes"] == 2


def test_children_start_where_the_root_stands_and_keep_their_own_view():
    w = SyncWorld(make_task(TWO))
    w.step("0", "go to pantry")
    w.add_agent("0.1")
    assert w.location("0.1") == "pantry"
    w.step("0.1", "go to garden")
    assert w.location("0") == "pantry" and w.location("0.1") == "garden"


def test_goal_parsing_and_goal_success():
    w = SyncWorld(make_task(TWO))
    sc = w.parse_goal("Prepare and eat dish_1 (salt raw, carrot grilled diced).")
    assert sc.dishes == (0,) and sc.eat and set(sc.items) == {0, 1}
    assert not w.goal_success(sc)
    items_only = w.parse_goal("Get the carrot diced and grilled onto the counter.")
    assert items_only.items == (1,) and not items_only.dishes
    run(w, ["take carrot", "dice carrot", "cook carrot on grill"])
    assert w.goal_success(items_only) and not w.goal_success(sc)
    assert not w.parse_goal("do something useful").parsable
    assert w.parse_goal("work on dish 2").dishes == (1,)


# ---- no listed action can fail a task (public rules) -----------------------------------------------
def _walk(task: dict, seed: int, n: int = 150) -> SyncWorld:
    """A seeded random walk taking only listed actions until the world ends."""
    rng = random.Random(seed)
    w = SyncWorld(task)
    w.add_agent("0.1")
    for k in range(n):
        if w.over:
            break
        agent = "0" if k % 3 else "0.1"
        w.step(agent, rng.choice(w.valid_actions(agent)))
        assert w.failure is None and not w.state().failure
    w.check_invariants()
    return w


@pytest.mark.parametrize("family", FAMILIES)
def test_no_listed_action_fails_a_generated_task(family):
    for tier in TIERS:
        task = generate_task("test", family, tier, 0, seed=1)
        for seed in range(3):
            assert _walk(task, seed).failure is None


def test_no_listed_action_fails_a_public_sample_row():
    path = sample_tasks_path()
    assert path is not None, "the public sample rows ship with the package"
    for row in load_tasks(path):
        for seed in range(5):
            assert _walk(row, seed).failure is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**31), st.sampled_from(FAMILIES), st.sampled_from(TIERS))
def test_no_listed_action_fails_property(seed, family, tier):
    _walk(generate_task("train", family, tier, seed % 5, seed=seed % 3), seed, n=80)


def test_strict_rules_offer_wrong_preparations_that_fail_the_task():
    w = SyncWorld(make_task(TWO), rules="strict")
    run(w, ["take carrot", "go to garden"])
    assert not [a for a in w.valid_actions("0") if a.endswith(" carrot") and not a.startswith("take")]
    w.step("0", "go to kitchen")
    valid = w.valid_actions("0")
    assert {"chop carrot", "slice carrot", "dice carrot", "mince carrot"} <= set(valid)
    assert {"cook carrot in stove", "cook carrot in oven", "cook carrot on grill"} <= set(valid)
    out = w.step("0", "slice carrot")
    assert out.accepted and out.done and w.failure and not w.root_success()
    assert "Task Failure" not in out.observation and out.infos["taskfailure"] is True
    good = SyncWorld(make_task(TWO), rules="strict")
    assert all(o.accepted for o in run(good, [a for a in SOLUTION if a != "go to pantry"][:7]))
    assert good.failure is None
    with pytest.raises(ValueError):
        SyncWorld(make_task(TWO), rules="lenient")


# ---- fork / commit ---------------------------------------------------------------------------------
def test_fork_is_isolated_both_ways():
    w = SyncWorld(make_task(TWO))
    w.step("0", "take carrot")
    b = w.fork()
    b.step("0", "dice carrot")
    b.add_agent("ghost")
    assert w.state().items[1].actual == frozenset() and b.state().items[1].actual == {"diced"}
    assert not w.has_agent("ghost")
    w.step("0", "go to pantry")
    assert b.location("0") == "kitchen"
    assert w.steps_used == 2 and b.steps_used == 2
    assert len(w.events()) == 2 and len(b.events()) == 2


def test_commit_writes_back_in_place_and_keeps_existing_views():
    w = SyncWorld(make_task(TWO))
    w.add_agent("0.1")
    w.step("0.1", "take carrot")
    b = w.fork()
    run(b, ["dice carrot", "cook carrot on grill"], agent="0.1")
    b.add_agent("0.1.1")
    w.add_agent("0.2")  # registered on the live world after the fork
    w.step("0.2", "go to garden")
    live_id = id(w)
    w.commit(b)
    assert id(w) == live_id
    st = w.state()
    assert st.counter == ("carrot",) and st.steps_used == 3
    assert w.location("0.2") == "garden"  # a view only known here is still valid
    assert w.has_agent("0.1.1")
    assert "You are in the garden" in w.observe("0.2")
    w.check_invariants()
    assert w.step("0.1", "take banana").accepted  # the old view keeps working


def test_commit_of_another_task_is_refused():
    w = SyncWorld(make_task(TWO))
    other = dict(make_task(TWO), task_id="other")
    with pytest.raises(ValueError):
        w.commit(SyncWorld(other))
    with pytest.raises(TypeError):
        w.commit(object())  # type: ignore[arg-type]


def test_fork_is_fast_on_an_extreme_task():
    task = generate_tasks("test", 1, seed=0, family="hierarchical", tier="extreme")[0]
    w = SyncWorld(task)
    for a in ("look around", "open door", "go to garden", "read cookbook") * 8:
        w.step("0", a)
    for k in range(5):
        w.add_agent(f"0.{k}")
    t0 = time.perf_counter()
    for _ in range(2000):
        w.fork()
    fork_us = (time.perf_counter() - t0) / 2000 * 1e6
    print(f"fork: {fork_us:.1f} us")
    assert fork_us < 200


def test_step_throughput():
    task = generate_tasks("test", 1, seed=0, family="conflict", tier="extreme")[0]
    res = bench_sync(task, n_steps=5000, n_forks=200)
    print(f"bench_sync: {res}")
    assert res["steps_per_s"] > 5000  # ~25-30k on one laptop core; lenient for slow CI


# ---- validity: accepted iff listed ------------------------------------------------------------------
def _universe(w: SyncWorld) -> list[str]:
    sp = w.spec
    acts = ["look around", "inventory", "read cookbook", "open door", "fly", "take", "cook salt in sink"]
    acts += [f"go to {r}" for r in ROOMS] + [f"move {d}" for d in ("north", "south", "east", "west", "up")]
    acts += ["take knife", "Take carrot", "distractor_1", "take distractor_1"]
    for it in sp.items:
        acts.append(f"take {it.name}")
        acts += [f"{v} {it.name}" for v in ("chop", "slice", "dice", "mince")]
        acts += [f"cook {it.name} {p}" for p in ("in stove", "in oven", "on grill")]
    acts += [f"prepare {d}" for d in sp.dish_ids] + [f"eat {d}" for d in sp.dish_ids] + ["eat dish_9"]
    return acts


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=30), st.booleans())
def test_accepted_iff_in_valid_list(choices, cooldown):
    w = SyncWorld(
        make_task(TWO, capacity=1, doors=1, gated=("dish_2",), cooldown=int(cooldown), distractors=4)
    )
    universe = _universe(w)
    for c in choices:
        if w.over:
            break
        valid = set(w.valid_actions("0"))
        for a in universe:
            always = a in ("look around", "inventory")
            assert w.fork().step("0", a).accepted == (a in valid or always), (a, sorted(valid))
        pool = sorted(valid) if c % 4 else universe  # mostly valid moves so the state progresses
        w.step("0", pool[c % len(pool)])
        w.check_invariants()


# ---- concurrency ------------------------------------------------------------------------------------
def _hammer(w: SyncWorld, agent: str, n: int, seed: int, stats: dict) -> None:
    rng = random.Random(seed)
    counted = 0
    for _ in range(n):
        # never eat (the world would end on success) and never ruin: every attempt keeps counting
        acts = [a for a in w.valid_actions(agent) if not a.startswith("eat ")]
        a = rng.choice(acts) if rng.random() < 0.8 else rng.choice(["dance", "take salt", "eat dish_9"])
        out = w.step(agent, a)
        counted += out.counted
        if rng.random() < 0.05:
            f = w.fork()
            f.check_invariants()
    stats[agent] = counted


def test_threads_hammering_one_world_keep_every_invariant():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        _threads_trials()
    finally:
        sys.setswitchinterval(old)


def _threads_trials() -> None:
    task = generate_tasks("train", 1, seed=3, family="resource_constrained", tier="hard")[0]
    task["parallelism"]["shared_environment_max_steps"] = 100_000  # never runs out during the test
    for trial in range(3):
        w = SyncWorld(task)
        agents = [f"0.{k}" for k in range(8)]
        for a in agents:
            w.add_agent(a)
        stats: dict[str, int] = {}
        threads = [
            threading.Thread(target=_hammer, args=(w, a, 400, trial * 100 + k, stats))
            for k, a in enumerate(agents)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        w.check_invariants()
        # nothing lost, nothing double-counted: every attempt on the live world counts
        assert sum(stats.values()) == w.steps_used == 8 * 400
        assert w.state().agent_steps == {"0": 0, **stats}
        assert [e["seq"] for e in w.events()] == list(range(1, len(w.events()) + 1))


def test_asyncio_tasks_hammering_one_world_respect_the_global_budget():
    task = generate_tasks("train", 1, seed=4, family="conflict", tier="extreme")[0]
    w = SyncWorld(task)
    budget = w.spec.max_steps

    async def agent(aid: str, seed: int) -> int:
        rng = random.Random(seed)
        w.add_agent(aid)
        n = 0
        for _ in range(200):
            out = w.step(aid, rng.choice(w.valid_actions(aid) + ["bogus"]))
            n += out.counted
            await asyncio.sleep(0)
        return n

    async def main() -> list[int]:
        return await asyncio.gather(*(agent(f"0.{k}", k) for k in range(16)))

    counts = asyncio.run(main())
    w.check_invariants()
    assert sum(counts) == w.steps_used <= budget
    assert w.over
