"""Tests of the TextCraft-Synth task generators, solver and loader.

The generator tests here pin OUR generator (``generator="sera"``, seed-0 world); the paper's generator,
now the default, is pinned by tests/test_textcraft_paper.py. The loader tests run on the default.

Run: ``pytest tests/test_textcraft_tasks.py -q``.
"""

from __future__ import annotations

import json

import pytest

from common.data import TaskFileError
from common.envs.textcraft.recipes import generate_recipe_book
from common.envs.textcraft.tasks import (
    DIFFICULTIES,
    book_for_task,
    generate_tasks,
    goal_text,
    load_tasks,
    parse_goal_targets,
    plan_crafts,
    replay,
    save_tasks,
    solve,
    split_targets,
)
from common.envs.textcraft.world import TextCraftWorld


@pytest.fixture(scope="module")
def sample():
    return generate_tasks("train", 60, seed=1, generator="sera") + generate_tasks(
        "val", 40, seed=2, generator="sera"
    )


@pytest.mark.parametrize("generator", ["paper", "sera"])
def test_generation_is_deterministic(generator):
    a = generate_tasks("train", 12, seed=5, generator=generator)
    b = generate_tasks("train", 12, seed=5, generator=generator)
    assert json.dumps(a) == json.dumps(b)
    c = generate_tasks("train", 12, seed=6, generator=generator)
    assert json.dumps(a) != json.dumps(c)


def test_record_format(sample):
    t = sample[0]
    assert set(t) >= {"id", "goal", "max_steps", "misc"}
    m = t["misc"]
    assert set(m) >= {
        "target_items",
        "initial_inventory",
        "gold_trajectory",
        "difficulty",
        "max_depth",
        "num_craft_steps",
        "recipe_book",
    }
    assert t["goal"] == goal_text(m["target_items"])
    assert parse_goal_targets(t["goal"]) == m["target_items"]
    assert goal_text({"a1_i5": 3}) == "Craft the following items: 3x a1_i5"
    assert m["num_craft_steps"] == len(m["gold_trajectory"])
    assert m["recipe_book"]["sha256"] == generate_recipe_book(0).stable_hash()
    step = m["gold_trajectory"][0]
    assert step["action"] == "craft" and isinstance(step["target"], list) and len(step["target"]) == 2
    assert len({t["id"] for t in sample}) == len(sample)


def test_difficulty_tiers_counts_and_balance(sample):
    book = generate_recipe_book(0)
    per = {d: 0 for d in DIFFICULTIES}
    for t in generate_tasks("train", 40, seed=3, generator="sera"):
        m = t["misc"]
        lo, hi, cmin, cmax = DIFFICULTIES[m["difficulty"]]
        per[m["difficulty"]] += 1
        ((item, n),) = m["target_items"].items()
        assert lo <= book.tier(item) <= hi and cmin <= n <= cmax
        assert m["max_depth"] == book.crafting_depth(item)
    assert set(per.values()) == {10}
    only = generate_tasks("val", 8, seed=3, difficulty="hard", generator="sera")
    assert {t["misc"]["difficulty"] for t in only} == {"hard"}


def test_every_task_solvable_and_gold_replays_through_world(sample):
    book = generate_recipe_book(0)
    for t in sample:
        m = t["misc"]
        inv, targets = m["initial_inventory"], m["target_items"]
        assert solve(book, inv, targets) == m["gold_trajectory"]
        # Through the real tool, with its strings.
        w = TextCraftWorld(book, inv, targets)
        for st in m["gold_trajectory"]:
            out = w.craft(st["ingredients"], (st["target"][0], st["result_count"]))
            assert out.startswith("Successfully crafted"), out
        w.root_finish_message = "done"
        assert w.root_success()
        assert replay(book, inv, m["gold_trajectory"]) == w.inventory


def test_inventory_is_base_needs_plus_buffer_plus_distractors(sample):
    book = generate_recipe_book(0)
    for t in sample:
        m = t["misc"]
        needs = plan_crafts(book, {}, m["target_items"]).missing_base
        inv = m["initial_inventory"]
        assert all(book.is_base(i) for i in inv)
        for b, n in needs.items():
            assert n <= inv[b] <= n + max(1, n // 10)
        distractors = set(inv) - set(needs)
        assert 1 <= len(distractors) <= 3


def test_train_val_targets_disjoint():
    book = generate_recipe_book(0)
    split = split_targets(book)
    for d, parts in split.items():
        assert not set(parts["train"]) & set(parts["val"])
        n = len(parts["train"]) + len(parts["val"])
        assert 0.15 <= len(parts["val"]) / n <= 0.25, d
    train = {
        i for t in generate_tasks("train", 200, seed=0, generator="sera") for i in t["misc"]["target_items"]
    }
    val = {i for t in generate_tasks("val", 200, seed=0, generator="sera") for i in t["misc"]["target_items"]}
    assert train and val and not train & val
    # The split depends on the world only, never on the sampling seed.
    val2 = {
        i for t in generate_tasks("val", 200, seed=99, generator="sera") for i in t["misc"]["target_items"]
    }
    assert not train & val2


def test_solver_counts_on_top_of_held_targets_and_reports_missing():
    book = generate_recipe_book(0)
    item = "a1_i5"
    base = plan_crafts(book, {}, {item: 2}).missing_base
    steps = solve(book, {**base, item: 5}, {item: 2})
    assert steps is not None
    assert replay(book, {**base, item: 5}, steps)[item] >= 7
    short = dict(base)
    k = next(iter(short))
    short[k] -= 1
    assert solve(book, short, {item: 2}) is None
    assert plan_crafts(book, short, {item: 2}).missing_base == {k: 1}


def test_loader_reports_file_and_line(tmp_path):
    tasks = generate_tasks("val", 3, seed=0)
    path = tmp_path / "tasks.jsonl"
    save_tasks(path, tasks)
    assert [t["id"] for t in load_tasks(path)] == [t["id"] for t in tasks]
    lines = path.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["misc"]["target_items"] = {"a1_i5": 0}
    lines[1] = json.dumps(bad)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TaskFileError) as ei:
        load_tasks(path)
    assert ei.value.line == 2 and f"{path}:2:" in str(ei.value)
    lines[1] = "{not json"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TaskFileError, match=":2:"):
        load_tasks(path)
    unknown = json.loads(lines[0])
    unknown["misc"]["target_items"] = {"no_such_item": 1}
    path.write_text(json.dumps(unknown) + "\n")
    with pytest.raises(TaskFileError, match=r":1: .*no_such_item"):
        load_tasks(path)


def test_loader_rejects_world_hash_mismatch(tmp_path):
    t = generate_tasks("val", 1, seed=0)[0]
    t["misc"]["recipe_book"]["sha256"] = "0" * 64
    path = tmp_path / "t.jsonl"
    save_tasks(path, [t])
    with pytest.raises(TaskFileError, match="generator changed"):
        load_tasks(path)


def test_record_can_carry_or_point_at_its_own_recipe_table(tmp_path):
    table = {
        "recipes": {
            "plank": {"ingredients": {"log": 1}, "result_count": 4},
            "stick": {"ingredients": {"plank": 2}, "result_count": 4},
        }
    }
    rec = {
        "id": "ext-1",
        "goal": "Craft the following items: 4x stick",
        "max_steps": 20,
        "misc": {"target_items": {"stick": 4}, "initial_inventory": {"log": 1}, "recipes": table},
    }
    book = book_for_task(rec)
    assert book.recipe("stick").result_count == 4
    assert solve(book, {"log": 1}, {"stick": 4}) is not None
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "wood.json").write_text(json.dumps(table))
    rec2 = json.loads(json.dumps(rec))
    del rec2["misc"]["recipes"]
    rec2["misc"]["recipes_path"] = "tables/wood.json"
    path = tmp_path / "ext.jsonl"
    path.write_text(json.dumps(rec) + "\n" + json.dumps(rec2) + "\n")
    loaded = load_tasks(path)
    assert book_for_task(loaded[1]).stable_hash() == book.stable_hash()
