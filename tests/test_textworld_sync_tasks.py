"""Tests of TextWorld-Sync task loading (public rows, manifest form, file:line errors) and generation.

The public sample rows ship with the package (``common/envs/textworld_sync/public_sample.jsonl``, a copy of
the four rows of ``shared/sample_tasks/textworld_sync_sample.jsonl``).

Run: ``pytest tests/test_textworld_sync_tasks.py -q``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.data import TaskFileError
from common.envs.textworld_sync.oracle import sample_tasks_path
from common.envs.textworld_sync.tasks import (
    FAMILIES,
    RUNTIME_BANDS,
    TIER_BANDS,
    TIERS,
    food_catalogue,
    generate_tasks,
    load_tasks,
    normalize_row,
    validate_row,
)
from common.envs.textworld_sync.world import SyncWorld

SAMPLE = sample_tasks_path()


def test_public_sample_rows_load_unchanged():
    rows = load_tasks(SAMPLE)
    raw = [json.loads(line) for line in Path(SAMPLE).read_text().splitlines() if line.strip()]
    assert rows == raw  # flat rows are not converted
    assert {r["difficulty"] for r in rows} == {"easy", "medium", "hard", "extreme"}
    w = SyncWorld(rows[2])  # resource_constrained hard: capacity 1, cooldown 1
    assert w.spec.capacity == 1 and w.spec.cooldown == 1 and w.spec.max_steps == 82


def test_manifest_form_is_lifted_to_the_flat_form(tmp_path):
    rows = load_tasks(SAMPLE)
    manifest_rows = []
    for r in rows:
        m = {k: r[k] for k in ("difficulty", "task_id", "task_description", "seed")}
        m["fold"] = r["split"]
        m["game_params"] = json.dumps(r["game_params"])
        m["generation_properties"] = {k: r[k] for k in ("dishes", "parallelism", "task_family", "task_view")}
        manifest_rows.append(m)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"dataset": "x", "tasks": manifest_rows}, indent=2))
    loaded = load_tasks(path)
    assert [r["dishes"] for r in loaded] == [r["dishes"] for r in rows]
    assert [r["game_params"] for r in loaded] == [r["game_params"] for r in rows]
    assert loaded[0]["split"] == "test"
    for a, b in zip(loaded, rows, strict=True):
        assert SyncWorld(a).spec == SyncWorld(b).spec


V9_ROW_KEYS = (
    "difficulty",
    "fold",
    "game",
    "game_params",
    "generation_properties",
    "seed",
    "task_description",
    "task_id",
)
V9_GEN_KEYS = (
    "base_game",
    "dishes",
    "generation",
    "parallelism",
    "task_descriptions",
    "task_family",
    "task_view",
)


def test_the_public_1400_row_manifest_shape_loads_unchanged(tmp_path):
    """Dataset/eval/textworld_multidish_test_1400_v9.json (OliverLeeXZ/SERA): a manifest object whose rows
    keep ``game_params`` as a JSON string and the recipe under ``generation_properties``. Rebuilt here in
    that exact shape from the public sample rows (the file's first row is sample row 0)."""
    from common.envs.textworld_sync.oracle import solve

    rows = load_tasks(SAMPLE)
    assert rows[0]["task_id"] == "cookingworld_multidish_test_multi_dish_fork_join_easy_0000"
    tasks = []
    for r in rows:
        gp = {k: r[k] for k in V9_GEN_KEYS}
        params = json.dumps(r["game_params"], separators=(",", ":"), sort_keys=True)
        tasks.append(
            {
                "difficulty": r["difficulty"],
                "fold": "test",
                "game": "cookingworld_multidish",
                "game_params": params,
                "generation_properties": gp,
                "seed": r["seed"],
                "task_description": r["task_description"],
                "task_id": r["task_id"],
            }  # fmt: skip
        )
    assert all(tuple(sorted(t)) == V9_ROW_KEYS for t in tasks)
    doc = {
        "dataset": "TextWorldExpress-MultiDish-V9-Test", "difficulty_counts": {}, "game_selection":
        "cookingworld_multidish", "schema_version": 1, "source_files": {}, "source_sha256": "", "split": "test",
        "task_count": len(tasks), "task_family_counts": {}, "tasks": tasks,
    }  # fmt: skip
    path = tmp_path / "textworld_multidish_test_1400_v9.json"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True))
    loaded = load_tasks(path)
    assert [r["task_id"] for r in loaded] == [r["task_id"] for r in rows]
    for a, b in zip(loaded, rows, strict=True):
        assert SyncWorld(a).spec == SyncWorld(b).spec
        assert a["generation_properties"] == b_gp(b)
        assert solve(a).success


def b_gp(row: dict) -> dict:
    return {k: row[k] for k in V9_GEN_KEYS}


def _row(**over):
    row = generate_tasks("train", 1, seed=0)[0]
    row.update(over)
    return row


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda r: r.pop("dishes"), "missing required key 'dishes'"),
        (lambda r: r.update(task_description=""), "task_description"),
        (lambda r: r["parallelism"].update(shared_environment_max_steps=0), "shared_environment_max_steps"),
        (lambda r: r["dishes"][0]["recipe"][0].update(preparation=["steamed"]), "unknown preparation"),
        (lambda r: r["dishes"][0]["recipe"][0].pop("preparation"), "no 'preparation'"),
        (lambda r: r["dishes"][1]["recipe"].append(dict(r["dishes"][0]["recipe"][0])), "two dishes"),
        (lambda r: r.update(dishes=[]), "non-empty"),
        (lambda r: r.update(game_params="{not json"), "invalid record"),
    ],
)
def test_malformed_row_reports_file_and_line(tmp_path, mutate, needle):
    good = generate_tasks("train", 3, seed=0)
    bad = json.loads(json.dumps(good[1]))
    mutate(bad)
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [good[0], bad, good[2]]) + "\n")
    with pytest.raises(TaskFileError) as e:
        load_tasks(path)
    assert e.value.line == 2 and e.value.path == str(path)
    assert f"{path}:2:" in str(e.value) and needle in str(e.value), str(e.value)


def test_bad_json_and_duplicate_ids_report_the_line(tmp_path):
    rows = generate_tasks("train", 2, seed=0)
    p = tmp_path / "a.jsonl"
    p.write_text(json.dumps(rows[0]) + "\n\n{oops\n")
    with pytest.raises(TaskFileError, match=r"a\.jsonl:3: invalid JSON"):
        load_tasks(p)
    p.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[0]) + "\n")
    with pytest.raises(TaskFileError, match=r"a\.jsonl:2: .*duplicate task_id"):
        load_tasks(p)
    with pytest.raises(FileNotFoundError):
        load_tasks(tmp_path / "missing.jsonl")


def test_catalogue_comes_from_textworld_and_splits_differ():
    from textworld.challenges.tw_cooking import cooking

    train, dev, test = food_catalogue("train"), food_catalogue("dev"), food_catalogue("test")
    assert set(train) == set(cooking.FOODS_SPLITS["train"])
    assert set(cooking.FOODS_SPLITS["valid"]) <= set(dev) and not set(cooking.FOODS_SPLITS["test"]) & set(dev)
    assert set(cooking.FOODS_SPLITS["test"]) <= set(test)
    # train foods keep the fold's preparations (textworld holds preparations out per fold)
    assert test["white onion"].preparations == tuple(
        sorted(cooking.FOOD_PREPARATIONS_SPLITS["test"]["white onion"])
    )
    assert train["carrot"].locations == ("kitchen.fridge", "garden")
    with pytest.raises(ValueError):
        food_catalogue("nope")


def test_generation_is_deterministic_and_seeded():
    a = generate_tasks("train", 10, seed=7)
    assert a == generate_tasks("train", 10, seed=7)
    assert a != generate_tasks("train", 10, seed=8)
    assert [r["task_family"] for r in a[:7]] == list(FAMILIES)
    assert {r["difficulty"] for r in generate_tasks("dev", 8, seed=0, family="conflict")} == set(TIERS)
    assert len({r["task_id"] for r in generate_tasks("test", 28, seed=0)}) == 28


def test_generated_rows_have_the_public_schema():
    public_keys = set(json.loads(Path(SAMPLE).read_text().splitlines()[0]))
    dish_keys = {"dish_id", "estimated_branch_work", "ingredient_names", "recipe"}
    ing_keys = {"branch_work", "candidate_source_locations", "name", "preparation", "requires_preparation"}
    for r in generate_tasks("test", 28, seed=1):
        assert set(r) == public_keys
        assert all(set(d) == dish_keys and all(set(i) == ing_keys for i in d["recipe"]) for d in r["dishes"])


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("family", FAMILIES)
def test_generated_rows_respect_family_and_tier(family, tier):
    for split in ("train", "dev", "test"):
        foods = food_catalogue(split)
        for r in generate_tasks(split, 2, seed=3, family=family, tier=tier):
            validate_row(normalize_row(r))
            band, rband = TIER_BANDS[tier], RUNTIME_BANDS[tier]
            n = len(r["dishes"])
            assert band["dish_count"][0] <= n <= band["dish_count"][1]
            lo, hi = rband["shared_environment_max_steps"]
            par = r["parallelism"]
            assert lo <= par["shared_environment_max_steps"] <= hi
            assert par["mechanisms"]["tool_cooldown_steps"] in rband["tool_cooldown_steps"]
            names = [i["name"] for d in r["dishes"] for i in d["recipe"]]
            assert len(names) == len(set(names))  # disjoint ingredients
            for d in r["dishes"]:
                assert band["ingredients_per_dish"][0] <= len(d["recipe"]) <= band["ingredients_per_dish"][1]
                prepared = sum(i["requires_preparation"] for i in d["recipe"])
                sampled = r["generation"]["v7_sampled_parameters"]
                lo_p, hi_p = (
                    sampled["min_prepared_ingredients_per_dish"],
                    sampled["max_prepared_ingredients_per_dish"],
                )
                assert lo_p <= prepared <= hi_p  # public sample_recipe bounds
                if hi_p < len(d["recipe"]):  # bounded: the others are raw+uncut
                    assert prepared == lo_p
                for i in d["recipe"]:
                    assert tuple(i["preparation"]) in foods[i["name"]].preparations
            assert par["estimated_sequential_actions"] + 2 <= par["shared_environment_max_steps"]
            assert r["task_view"] == ("coarse" if tier == "extreme" else "structured")
            if tier == "extreme":  # coarse: no preparations in the description
                assert "(raw, uncut)" not in r["task_description"] and "cookbook" in r["task_description"]
            else:
                assert all(
                    f"{i['name']} ({', '.join(i['preparation'])})" in r["task_description"]
                    for d in r["dishes"]
                    for i in d["recipe"]
                )
            w = SyncWorld(r)
            if family == "dependency_gate":
                assert w.spec.gated_dishes == frozenset(range(1, n)) and not w.spec.gate_initially_open
            if family == "resource_constrained":
                assert par["resource_capacity"]["inventory"] == w.spec.capacity >= 1
            if family == "conflict":
                assert par["resource_conflict"] is True
            if family == "hierarchical":
                assert par["hierarchy_depth"] == 2 and len(par["dependencies"]) == n + len(names)
            work = [d["estimated_branch_work"] for d in r["dishes"]]
            if family == "critical_path":
                assert work[-1] > max(work[:-1])
            if family == "load_balanced":
                assert max(work) > min(work)


def test_paper_mix_matches_the_public_v9_split_sizes():
    from collections import Counter

    from common.envs.textworld_sync.tasks import paper_mix

    train = paper_mix("train")
    assert len(train) == 1500 and Counter(t for _, t in train) == {"medium": 900, "extreme": 450, "hard": 150}
    per_family = Counter(f for f, t in train if t == "medium")
    assert [per_family[f] for f in FAMILIES] == [129, 129, 129, 129, 128, 128, 128]  # public allocate_counts
    assert [t for _, t in train[:1]] == ["medium"] and train[-1] == ("hierarchical", "hard")
    dev, test = paper_mix("dev"), paper_mix("test")
    assert len(dev) == 200 and Counter(t for _, t in dev) == {t: 50 for t in TIERS}
    assert len(test) == 1400 and set(Counter(test).values()) == {50} and len(Counter(test)) == 28
    assert paper_mix("valid") == dev
    small = Counter(t for _, t in paper_mix("train", 30))
    assert small == {"medium": 18, "extreme": 9, "hard": 3}


def test_generate_tasks_with_the_paper_mix():
    rows = generate_tasks("train", 20, seed=3, mix="paper")
    assert len({r["task_id"] for r in rows}) == 20
    assert {r["difficulty"] for r in rows} == {"medium", "extreme", "hard"}
    assert rows == generate_tasks("train", 20, seed=3, mix="paper")
    with pytest.raises(ValueError, match="drop family/tier"):
        generate_tasks("train", 2, seed=0, tier="easy", mix="paper")
    with pytest.raises(ValueError, match="unknown mix"):
        generate_tasks("train", 2, seed=0, mix="balanced")


def test_task_texts_follow_the_public_generator_format():
    from common.envs.textworld_sync.tasks import describe_dishes

    for row in load_tasks(SAMPLE):
        cap = row["generation"]["v7_sampled_parameters"]["inventory_capacity"]
        assert describe_dishes(row["dishes"], row["task_family"], cap) == row["task_descriptions"], row[
            "task_id"
        ]
