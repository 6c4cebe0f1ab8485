"""Tests of the TextCraft-Synth world: tool semantics and error strings, success rule, fork/commit.

Run: ``pytest tests/test_textcraft_world.py -q``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.envs.textcraft.recipes import RecipeBook, generate_recipe_book
from common.envs.textcraft.tasks import plan_crafts, solve
from common.envs.textcraft.world import TextCraftWorld

# A small hand-made world: plank <- 1 log (x4); stick <- 2 plank (x4); torch <- 1 stick + 1 coal (x1).
TABLE = {
    "recipes": {
        "plank": {"ingredients": {"log": 1}, "result_count": 4},
        "stick": {"ingredients": {"plank": 2}, "result_count": 4},
        "torch": {"ingredients": {"stick": 1, "coal": 1}, "result_count": 1},
    }
}


@pytest.fixture()
def world():
    return TextCraftWorld(RecipeBook.from_json(TABLE), {"log": 3, "coal": 2}, {"torch": 2})


def test_craft_success_and_inventory(world):
    assert world.craft({"log": 2}, ("plank", 8)) == "Successfully crafted 8 plank(s)"
    assert world.view_inventory() == {"log": 1, "coal": 2, "plank": 8}
    assert world.craft({"log": 1}, ["plank", 4]) == "Successfully crafted 4 plank(s)"  # list target ok
    assert "log" not in world.inventory  # exhausted items disappear


@pytest.mark.parametrize(
    ("ingredients", "target", "expected"),
    [
        ({"log": 1}, ("nope", 4), "Error: No recipe found for nope"),
        ({"log": 1}, ("log", 1), "Error: No recipe found for log"),
        # The public environment's strings (platoon/textcraft/env.py), recipe numbered from 1.
        (
            {"log": 1},
            ("plank", 3),
            "Error: All 1 recipe(s) failed for plank. Errors:\n"
            "Recipe 1: Target count 3 is not divisible by recipe result count 4",
        ),
        ({"log": 1}, ("plank", 8), "Recipe 1: Wrong amount of log. Need 2, provided 1"),
        ({"coal": 1}, ("plank", 4), "Recipe 1: Missing required ingredient log"),
        ({"log": 1, "coal": 1}, ("plank", 4), "Recipe 1: Extra ingredients not required: coal"),
        ({"log": 4}, ("plank", 16), "Recipe 1: Insufficient ingredients in inventory: log: need 4, have 3"),
        (["log"], ("plank", 4), "Error: ingredients must be a dict, got list"),
        ({"log": 1}, "plank", "Error: target must be a tuple of (item_name, count)"),
        ({"log": 1}, ("plank", 4, 1), "Error: target must be a tuple of (item_name, count)"),
        ({"log": 1}, (3, 4), "Error: target item must be a string, got int"),
        ({"log": 1}, ("plank", 4.0), "Error: target count must be an int"),
        ({"log": 1}, ("plank", True), "Error: target count must be an int"),
        ({"log": 1}, ("plank", 0), "Error: target count must be positive"),
        ({"log": "1"}, ("plank", 4), "Error: ingredient count for log must be an int, got str"),
        ({"log": -1}, ("plank", 4), "Error: ingredient count for log must be positive, got -1"),
        ({1: 1}, ("plank", 4), "Error: ingredient name must be a string, got int"),
    ],
)
def test_craft_error_strings(world, ingredients, target, expected):
    before = dict(world.inventory)
    out = world.craft(ingredients, target)
    assert out.startswith("Error") and expected in out, out
    assert world.inventory == before  # a failed craft changes nothing


def test_get_info(world):
    (plank, log) = world.get_info(["plank", "log"])
    assert plank == {
        "item": "plank",
        "can_craft": True,
        "is_base": False,
        "in_inventory": 0,
        "crafting_depth": 1,
        "recipes": [{"ingredients": {"log": 1}, "result_count": 4}],
    }
    assert log["is_base"] and not log["can_craft"] and log["in_inventory"] == 3 and log["recipes"] == []
    assert world.get_info("torch")[0]["crafting_depth"] == 3  # a single name is accepted
    (unk,) = world.get_info(["what"])
    assert "Unknown item" in unk["error"] and not unk["can_craft"] and not unk["is_base"]
    assert world.get_info(5).startswith("Error: items must be a list")
    plank["recipes"][0]["ingredients"]["log"] = 99  # callers cannot corrupt the book
    assert world.book.recipe("plank").ingredients["log"] == 1


def _craft_two_torches(w):
    assert w.craft({"log": 1}, ("plank", 4)).startswith("Successfully")
    assert w.craft({"plank": 2}, ("stick", 4)).startswith("Successfully")
    assert w.craft({"stick": 2, "coal": 2}, ("torch", 2)).startswith("Successfully")


def test_root_success_rules(world):
    assert not world.root_success()  # nothing crafted, no finish
    _craft_two_torches(world)
    assert not world.root_success()  # crafted but no finish
    world.root_finish_message = "   "
    assert not world.root_success()  # empty finish message
    world.root_finish_message = "done"
    assert world.root_success()


def test_pre_existing_targets_do_not_count():
    w = TextCraftWorld(RecipeBook.from_json(TABLE), {"log": 3, "coal": 2, "torch": 5}, {"torch": 2})
    w.root_finish_message = "I already have torches"
    assert not w.root_success()
    _craft_two_torches(w)
    assert w.root_success() and w.inventory["torch"] == 7


def test_fork_isolation_and_commit(world):
    live_inv = world.inventory
    f = world.fork()
    assert f.book is world.book and f.inventory == world.inventory and f.inventory is not live_inv
    _craft_two_torches(f)
    assert world.inventory == {"log": 3, "coal": 2}  # nothing leaked into the live world
    world.craft({"log": 1}, ("plank", 4))
    assert "plank" not in f.inventory or f.inventory["plank"] == 2  # and nothing leaked into the fork
    world.commit(f)
    assert world.inventory is live_inv  # in place: sessions holding the dict see it
    assert world.inventory == f.inventory and world.inventory["torch"] == 2
    f.craft({"log": 1}, ("plank", 4))
    assert world.inventory != f.inventory  # still isolated after commit
    with pytest.raises(TypeError):
        world.commit(object())


def test_describe_mentions_inventory_and_progress(world):
    text = world.describe()
    assert "log: 3" in text and "torch: 0/2" in text


# --- properties (hypothesis) ----------------------------------------------------------------------------
_BOOK = generate_recipe_book(0)
_NAMES = st.sampled_from(["log", "plank", "stick", "torch", "coal", "gold"])
_ANY = st.one_of(st.none(), st.integers(-3, 9), st.floats(allow_nan=True), st.text(max_size=3), st.booleans())


@settings(max_examples=150, deadline=None)
@given(
    ingredients=st.one_of(
        st.dictionaries(st.one_of(_NAMES, st.integers()), st.one_of(st.integers(-2, 12), _ANY)), _ANY
    ),
    target=st.one_of(
        st.tuples(_NAMES, st.integers(-2, 17)), st.tuples(_ANY, _ANY), _ANY, st.lists(_ANY, max_size=3)
    ),
)
def test_craft_never_raises_and_failures_change_nothing(ingredients, target):
    w = TextCraftWorld(RecipeBook.from_json(TABLE), {"log": 3, "coal": 2, "plank": 5}, {"torch": 1})
    before = dict(w.inventory)
    out = w.craft(ingredients, target)
    assert isinstance(out, str)
    if out.startswith("Successfully"):
        assert w.inventory != before
    else:
        assert out.startswith("Error") and w.inventory == before
    assert all(v > 0 for v in w.inventory.values())


@settings(max_examples=40, deadline=None)
@given(
    item=st.sampled_from([i for i in _BOOK.items if 2 <= _BOOK.tier(i) <= 8]),
    count=st.integers(1, 3),
    held=st.dictionaries(
        st.sampled_from([i for i in _BOOK.items if _BOOK.tier(i) <= 4]), st.integers(0, 6), max_size=6
    ),
)
def test_plans_from_any_inventory_execute_through_the_tool(item, count, held):
    needs = plan_crafts(_BOOK, held, {item: count}).missing_base
    inv = {**held, **{b: held.get(b, 0) + n for b, n in needs.items()}}
    steps = solve(_BOOK, inv, {item: count})
    assert steps is not None
    w = TextCraftWorld(_BOOK, inv, {item: count})
    for s in steps:
        assert w.craft(s["ingredients"], (s["target"][0], s["result_count"])).startswith("Successfully")
    w.root_finish_message = "done"
    assert w.root_success()
