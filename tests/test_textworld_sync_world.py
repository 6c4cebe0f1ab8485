"""Tests of the TextWorld-Sync shared world: action rules, scoring, budget, fork/commit, concurrency, speed.

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

from common.envs.textworld_sync.tasks import generate_tasks, make_row
from common.envs.textworld_sync.world import COOK_RESULT, CUT_VERBS, SyncWorld, bench_sync, parse_preparation


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
    "dice carrot",
    "cook carrot on grill",
    "take banana",
    "cook banana in stove",
    "take cilantro",
    "chop cilantro",
    "go to pantry",
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
    assert parse_preparation([]) == ("raw", "uncut")
    with pytest.raises(ValueError):
        parse_preparation(["boiled"])
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
    assert w.score()["completed_dishes"] == 2
    after = w.step("0", "look around")
    assert not after.accepted and not after.counted and after.done
    assert w.steps_used == len(SOLUTION)


def test_raw_items_go_straight_to_the_counter_and_tools_need_the_kitchen():
    w = SyncWorld(make_task(TWO))
    w.step("0", "take carrot")
    w.step("0", "go to pantry")
    assert "dice carrot" not in w.valid_actions("0")
    out = w.step("0", "dice carrot")
    assert not out.accepted and "kitchen" in out.message
    out = w.step("0", "take salt")
    assert out.accepted and "prepared counter" in out.message
    st = w.state()
    assert st.counter == ("salt",) and st.inventory == ("carrot",)


def test_half_done_is_zero():
    w = SyncWorld(make_task(TWO))
    run(w, SOLUTION[:11])  # dish_1 eaten, dish_2 ingredients ready but not prepared
    assert w.score()["completed_dishes"] == 1
    assert not w.root_success() and not w.over


def test_prepared_but_not_eaten_is_failure():
    w = SyncWorld(make_task(TWO))
    run(w, SOLUTION[:-1])
    assert w.state().meals == {"dish_1": "eaten", "dish_2": "prepared"}
    assert not w.root_success()


@pytest.mark.parametrize(
    "wrong",
    ["slice carrot", "cook carrot in oven", "chop carrot"],
)
def test_wrong_irreversible_preparation_fails_the_task(wrong):
    w = SyncWorld(make_task(TWO))
    w.step("0", "take carrot")
    out = w.step("0", wrong)
    assert out.accepted and out.done and not out.success
    assert out.failure and "carrot" in out.failure
    assert "ruined" in out.message
    assert not w.root_success() and w.over
    assert w.score()["failure"]
    # nothing counts any more, not even a correct action
    later = w.step("0", "dice carrot")
    assert not later.accepted and not later.counted


def test_cooking_something_that_must_stay_raw_fails():
    w = SyncWorld(make_task(TWO))
    w.step("0", "take cilantro")
    out = w.step("0", "cook cilantro on grill")
    assert out.failure and not w.root_success()


def test_rejected_actions_consume_the_shared_budget_but_inventory_does_not():
    w = SyncWorld(make_task(TWO, max_steps=5))
    for _ in range(10):
        out = w.step("0", "inventory")
        assert out.accepted and not out.counted
    assert w.steps_used == 0
    out = w.step("0", "fly to the moon")
    assert not out.accepted and out.counted and "still cost one shared step" in out.message
    out = w.step("0", "take salt")  # valid syntax, wrong room: rejected, counted
    assert not out.accepted and out.counted
    assert w.steps_used == 2 and w.steps_left == 3
    run(w, ["look around"] * 3)
    assert w.over and w.steps_used == 5 and not w.root_success()
    out = w.step("0", "look around")
    assert not out.counted and out.done and w.steps_used == 5
    assert "budget" in w.observe("0").lower()


def test_capacity_limits_takes():
    w = SyncWorld(make_task(TWO, capacity=1))
    assert w.step("0", "take carrot").accepted
    assert "take banana" not in w.valid_actions("0")
    out = w.step("0", "take banana")
    assert not out.accepted and "full" in out.message
    run(w, ["dice carrot", "cook carrot on grill"])  # ready -> slot freed
    assert w.step("0", "take banana").accepted


def test_limit_inventory_flag_means_one_slot_and_explicit_capacity_wins():
    assert SyncWorld(make_task(TWO, limit=1)).spec.capacity == 1
    assert SyncWorld(make_task(TWO, limit=1, capacity=3)).spec.capacity == 3
    assert SyncWorld(make_task(TWO)).spec.capacity == 0


def test_gate_hides_gated_dishes_until_opened():
    w = SyncWorld(make_task(TWO, doors=1, gated=("dish_2",)))
    obs = w.observe("0")
    assert "banana" not in obs.split("Valid actions")[0].split("Visible objects:")[1].split("\n")[0]
    assert "take banana" not in w.valid_actions("0") and "take carrot" in w.valid_actions("0")
    assert not w.step("0", "take banana").accepted
    assert w.step("0", "open door").accepted
    assert w.state().gate_open and "open door" not in w.valid_actions("0")
    assert w.step("0", "take banana").accepted


def test_doors_without_gated_dishes_only_close_the_gate():
    w = SyncWorld(make_task(TWO, doors=1))
    assert not w.state().gate_open
    assert "take banana" in w.valid_actions("0")


def test_cooldown_blocks_the_tool_for_the_next_global_steps():
    task = make_task(
        [[("carrot", ("raw", "diced"), "kitchen.fridge"), ("banana", ("raw", "sliced"), "kitchen.counter")]],
        cooldown=1,
    )
    w = SyncWorld(task)
    run(w, ["take carrot", "take banana"])
    assert w.step("0", "dice carrot").accepted
    assert w.state().cooldowns["knife"] == 1
    assert "slice banana" not in w.valid_actions("0")
    out = w.step("0", "slice banana")
    assert not out.accepted and "cooling" in out.message  # rejected, still counted: advances the cooldown
    assert w.state().cooldowns["knife"] == 0
    assert w.step("0", "slice banana").accepted


def test_cooldown_is_advanced_by_other_agents_and_not_by_inventory():
    task = make_task(
        [[("carrot", ("raw", "diced"), "kitchen.fridge"), ("banana", ("raw", "sliced"), "kitchen.counter")]],
        cooldown=2,
    )
    w = SyncWorld(task)
    w.add_agent("0.1")
    run(w, ["take carrot", "take banana", "dice carrot"])
    assert w.state().cooldowns["knife"] == 2
    w.step("0.1", "inventory")
    assert w.state().cooldowns["knife"] == 2
    w.step("0.1", "look around")
    w.step("0.1", "look around")
    assert w.state().cooldowns["knife"] == 0
    assert w.step("0", "slice banana").accepted


def test_children_start_where_the_root_stands_and_keep_their_own_view():
    w = SyncWorld(make_task(TWO))
    w.step("0", "go to pantry")
    w.add_agent("0.1")
    assert w.location("0.1") == "pantry"
    w.step("0.1", "move south")
    assert w.location("0.1") == "kitchen" and w.location("0") == "pantry"
    assert w.state().agent_steps == {"0": 1, "0.1": 1}


def test_distractors_are_visible_but_not_takeable():
    w = SyncWorld(make_task(TWO, distractors=6))
    assert len(w.spec.distractors) == 6
    name, room = w.spec.distractors[0]
    if room != 0:
        w.step("0", f"go to {w.spec.rooms[room]}")
    assert name in w.observe("0")
    out = w.step("0", f"take {name}")
    assert not out.accepted and "spoiled" in out.message


def test_read_cookbook_lists_every_preparation():
    w = SyncWorld(make_task(TWO))
    out = w.step("0", "read cookbook")
    assert out.accepted and "carrot (grilled, diced)" in out.message and "salt (raw, uncut)" in out.message


def test_observation_has_every_required_field():
    w = SyncWorld(make_task(TWO, doors=1, cooldown=1))
    obs = w.observe("0")
    for part in (
        "You are in the kitchen",
        "Visible objects:",
        "Kitchen gate: closed",
        "Tool cooldowns: knife ready",
        "Shared inventory (0/unlimited)",
        "Prepared counter (0)",
        "- dish_1: 0/2 ingredients ready",
        "Shared steps remaining: 60/60",
        "Valid actions: look around | inventory | read cookbook",
    ):
        assert part in obs, part
    assert "carrot" in w.describe() and "needs grilled, diced" in w.describe()


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


# ---- fork / commit ---------------------------------------------------------------------------------
def test_fork_is_isolated_both_ways():
    w = SyncWorld(make_task(TWO))
    w.step("0", "take carrot")
    b = w.fork()
    b.step("0", "dice carrot")
    b.add_agent("ghost")
    assert w.state().items[1].cut == "uncut" and b.state().items[1].cut == "diced"
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
    for a in ("look around", "open door", "take carrot", "read cookbook") * 8:
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


# ---- validity: _check must agree with the valid-action list -------------------------------------------
def _universe(w: SyncWorld) -> list[str]:
    sp = w.spec
    acts = ["look around", "inventory", "read cookbook", "open door", "fly", "take", "cook salt in sink"]
    acts += [f"go to {r}" for r in sp.rooms] + [f"move {d}" for d in ("north", "south", "east", "west", "up")]
    for it in sp.items:
        acts.append(f"take {it.name}")
        acts += [f"{v} {it.name}" for v in ("chop", "slice", "dice", "mince")]
        acts += [f"cook {it.name} {p}" for p in ("in stove", "in oven", "on grill")]
    acts += [f"prepare {d}" for d in sp.dish_ids] + [f"eat {d}" for d in sp.dish_ids] + ["eat dish_9"]
    acts += [f"take {n}" for n, _ in sp.distractors[:2]]
    return acts


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=30), st.booleans())
def test_accepted_iff_in_valid_list(choices, cooldown):
    w = SyncWorld(
        make_task(TWO, capacity=1, doors=1, gated=("dish_2",), cooldown=int(cooldown), distractors=4)
    )
    universe = _universe(w)
    for c in choices:
        valid = set(w.valid_actions("0"))
        for a in universe:
            assert w.fork().step("0", a).accepted == (a in valid), (a, sorted(valid))
        # mostly valid moves so the state progresses
        pool = sorted(valid) if c % 4 else universe
        w.step("0", pool[c % len(pool)])
        w.check_invariants()


# ---- concurrency ------------------------------------------------------------------------------------
def _safe(w: SyncWorld, action: str) -> bool:
    """False for valid-but-ruinous preparations (so the hammering agents keep the world alive longer)."""
    for it in w.spec.items:
        if action.endswith(" " + it.name) and action.split(" ")[0] in CUT_VERBS:
            return CUT_VERBS[action.split(" ")[0]] == it.cut
        if action.startswith(f"cook {it.name} "):
            return COOK_RESULT[action.rsplit(" ", 1)[1]] == it.cook
    return True


def _hammer(w: SyncWorld, agent: str, n: int, seed: int, stats: dict) -> None:
    rng = random.Random(seed)
    counted = 0
    for _ in range(n):
        # never eat (the world would end on success) and never ruin: every attempt keeps counting
        acts = [a for a in w.valid_actions(agent) if _safe(w, a) and not a.startswith("eat ")]
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
        # nothing lost, nothing double-counted (only the free "inventory" lookups do not count)
        n_free = sum(not e["counted"] for e in w.events())
        assert sum(stats.values()) == w.steps_used == 8 * 400 - n_free
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
            out = w.step(aid, rng.choice([a for a in w.valid_actions(aid) if _safe(w, a)] + ["bogus"]))
            n += out.counted
            await asyncio.sleep(0)
        return n

    async def main() -> list[int]:
        return await asyncio.gather(*(agent(f"0.{k}", k) for k in range(16)))

    counts = asyncio.run(main())
    w.check_invariants()
    assert sum(counts) == w.steps_used <= budget
    assert w.over
