"""TextWorld-Sync task records: load the public SERA rows, and generate new ones in the same schema.

Loading (:func:`load_tasks`) reads flat JSONL rows or a manifest JSON (``{"tasks": [...]}``) through
``common.data.read_jsonl``, so a malformed row is reported as ``file:line: reason``. Rows stay plain dicts
(no conversion into a world); :func:`normalize_row` only lifts the manifest form (``generation_properties``
holding ``dishes``/``parallelism``, ``game_params`` as a JSON string) to the flat form of
``shared/sample_tasks/textworld_sync_sample.jsonl``.

Generation (:func:`generate_tasks`) samples the 7 families x 4 tiers of SPEC.md §2.2 with the tier bands
of the public benchmark (dishes 2/2-4/4-5/5, ingredients 3/3-4/4/4, budgets 115-125/95-100/75-90/65-80,
cooldown 0/0-1/1/1, tighter inventory and more preparation at higher tiers, coarse descriptions at
extreme, task texts in the public generator's format). Foods, their allowed (cook, cut) preparations and where they are found come from the
``textworld`` package's cooking challenge (``textworld.challenges.tw_cooking.cooking``); the train / dev /
test splits use its train / valid / test food folds (valid and test = that fold's own foods with every
preparation, plus the train foods with the fold's preparations, exactly as TextWorld builds them).

What it simplifies: feasibility is checked with a closed-form action count (work + prepare/eat + gate
+ 2 moves <= budget), not by search; the oracle tests confirm it.

Run: ``python -m common.envs.textworld_sync.tasks --split train --n 14 --out /tmp/tw_sync.jsonl``.
"""

from __future__ import annotations

import argparse
import functools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.data import TaskFileError, read_jsonl, write_jsonl
from common.envs.textworld_sync.world import build_spec, normalize_row, parse_preparation

FAMILIES = (
    "multi_dish_fork_join",
    "critical_path",
    "load_balanced",
    "resource_constrained",
    "dependency_gate",
    "conflict",
    "hierarchical",
)
TIERS = ("easy", "medium", "hard", "extreme")
REQUIRED_KEYS = ("task_id", "difficulty", "dishes", "game_params", "parallelism", "task_description")
SPLIT_FOLDS = {"train": "train", "dev": "valid", "valid": "valid", "test": "test"}
"""Our split name -> the textworld cooking food fold."""

TIER_BANDS: dict[str, dict[str, Any]] = {
    # (min, max) ints are sampled uniformly, lists are choices.
    "easy": {
        "dish_count": (2, 2),
        "ingredients_per_dish": (3, 3),
        "num_locations": (5, 6),
        "num_distractor_items": (3, 5),
        "include_doors": [False],
        "limit_inventory_size": [False],
        "inventory_capacity": (2, 2),
        "min_prepared_ingredients_per_dish": (1, 1),
        "max_prepared_ingredients_per_dish": (1, 2),
        "preparation_complexity": ["low", "medium"],
    },
    "medium": {
        "dish_count": (2, 4),
        "ingredients_per_dish": (3, 4),
        "num_locations": (7, 10),
        "num_distractor_items": (6, 12),
        "include_doors": [True],
        "limit_inventory_size": [True],
        "inventory_capacity": (1, 2),
        "min_prepared_ingredients_per_dish": (2, 3),
        "max_prepared_ingredients_per_dish": (3, 3),
        "preparation_complexity": ["medium", "high"],
    },
    "hard": {
        "dish_count": (4, 5),
        "ingredients_per_dish": (4, 4),
        "num_locations": (10, 11),
        "num_distractor_items": (12, 18),
        "include_doors": [True],
        "limit_inventory_size": [True],
        "inventory_capacity": (1, 1),
        "min_prepared_ingredients_per_dish": (3, 3),
        "max_prepared_ingredients_per_dish": (3, 3),
        "preparation_complexity": ["high"],
    },
    "extreme": {
        "dish_count": (5, 5),
        "ingredients_per_dish": (4, 4),
        "num_locations": (10, 11),
        "num_distractor_items": (16, 20),
        "include_doors": [True],
        "limit_inventory_size": [True],
        "inventory_capacity": (1, 1),
        "min_prepared_ingredients_per_dish": (3, 3),
        "max_prepared_ingredients_per_dish": (3, 3),
        "preparation_complexity": ["high"],
    },
}
RUNTIME_BANDS: dict[str, dict[str, Any]] = {
    "easy": {"shared_environment_max_steps": (115, 125), "tool_cooldown_steps": [0]},
    "medium": {"shared_environment_max_steps": (95, 100), "tool_cooldown_steps": [0, 1]},
    "hard": {"shared_environment_max_steps": (75, 90), "tool_cooldown_steps": [1]},
    "extreme": {"shared_environment_max_steps": (65, 80), "tool_cooldown_steps": [1]},
}
TASK_VIEW = {"easy": "structured", "medium": "structured", "hard": "structured", "extreme": "coarse"}
_DEFAULT_BOTTLENECKS = ["kitchen", "meal_preparation", "meal_eating"]
PAPER_TIER_COUNTS: dict[str, tuple[tuple[str, int], ...]] = {
    "train": (("medium", 900), ("extreme", 450), ("hard", 150)),
    "dev": (("easy", 50), ("medium", 50), ("hard", 50), ("extreme", 50)),
    "test": tuple((t, 50 * len(FAMILIES)) for t in TIERS),
}
"""The paper's V9 split sizes per tier, in the public generation order (``Dataset/generation/textworld_v9.json``:
train 1,500 = medium 900 + extreme 450 + hard 150, no easy; dev 200 = 50 per tier; test 1,400 = 50 per
family and tier). ``valid`` is an alias of ``dev``."""


# ---- loading --------------------------------------------------------------------------------------
def validate_row(row: dict[str, Any]) -> None:
    """Raise ValueError/TypeError/KeyError naming what is wrong with a (normalized) row."""
    for key in REQUIRED_KEYS:
        if key not in row:
            raise ValueError(f"missing required key {key!r}")
    if not isinstance(row["task_id"], str) or not row["task_id"].strip():
        raise ValueError("task_id must be a non-empty string")
    if not isinstance(row["task_description"], str) or not row["task_description"].strip():
        raise ValueError("task_description must be a non-empty string")
    if not isinstance(row["game_params"], dict):
        raise TypeError("game_params must be an object (or a JSON string of one)")
    par = row["parallelism"]
    if not isinstance(par, dict):
        raise TypeError("parallelism must be an object")
    budget = par.get("shared_environment_max_steps")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0:
        raise ValueError(
            f"parallelism.shared_environment_max_steps must be a positive integer, got {budget!r}"
        )
    dishes = row["dishes"]
    if not isinstance(dishes, list) or not dishes:
        raise ValueError("dishes must be a non-empty list")
    for d, dish in enumerate(dishes):
        if not isinstance(dish, dict) or "dish_id" not in dish or "recipe" not in dish:
            raise ValueError(f"dishes[{d}] needs 'dish_id' and 'recipe'")
        if not isinstance(dish["recipe"], list) or not dish["recipe"]:
            raise ValueError(f"dishes[{d}].recipe must be a non-empty list")
        for k, ing in enumerate(dish["recipe"]):
            if not isinstance(ing, dict) or not isinstance(ing.get("name"), str) or not ing["name"].strip():
                raise ValueError(f"dishes[{d}].recipe[{k}] needs a non-empty 'name'")
            if "preparation" not in ing:
                raise ValueError(f"dishes[{d}].recipe[{k}] ({ing['name']}) has no 'preparation'")
            parse_preparation(ing["preparation"])
    build_spec(row)  # anything else the world cannot use (duplicate names, bad capacity, ...)


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    """Read public-format TextWorld-Sync rows (JSONL or manifest JSON). Errors name the file and line."""
    seen: set[str] = set()

    def check(record: dict[str, Any]) -> None:
        row = normalize_row(record)
        validate_row(row)
        if row["task_id"] in seen:
            raise ValueError(f"duplicate task_id {row['task_id']!r}")
        seen.add(row["task_id"])

    return [normalize_row(r) for r in read_jsonl(path, validate=check)]


# ---- the food catalogue ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Food:
    """One food of the textworld cooking catalogue."""

    name: str
    preparations: tuple[tuple[str, str], ...]
    """Allowed (cook, cut) pairs in this split."""
    locations: tuple[str, ...]
    """Where it can be found (``kitchen.fridge``, ``garden``, ...); the world uses the first."""


@functools.cache
def food_catalogue(split: str) -> dict[str, Food]:
    """Foods of a split (train / dev / test) from ``textworld.challenges.tw_cooking``."""
    fold = SPLIT_FOLDS.get(split)
    if fold is None:
        raise ValueError(f"unknown split {split!r}; use one of {sorted(SPLIT_FOLDS)}")
    try:
        from textworld.challenges.tw_cooking import cooking
    except ImportError as e:  # pragma: no cover - textworld is installed in CI
        raise RuntimeError(
            "generating TextWorld-Sync tasks needs the textworld package: pip install 'textworld==1.7.0' "
            "(or pip install -e '.[textworld]')"
        ) from e
    if fold == "train":
        preps = {f: list(cooking.FOOD_PREPARATIONS_SPLITS["train"][f]) for f in cooking.FOODS_SPLITS["train"]}
    else:
        preps = {f: list(p) for f, p in cooking.get_food_preparations(cooking.FOODS_SPLITS[fold]).items()}
        preps.update({f: list(p) for f, p in cooking.FOOD_PREPARATIONS_SPLITS[fold].items()})
    return {
        name: Food(name, tuple(sorted(tuple(p) for p in opts)), tuple(cooking.FOODS[name]["locations"]))
        for name, opts in sorted(preps.items())
    }


# ---- generation -----------------------------------------------------------------------------------
def _sample(spec: Any, rng: random.Random) -> Any:
    if isinstance(spec, tuple):
        return rng.randint(spec[0], spec[1])
    return rng.choice(spec)


def _work(prep: tuple[str, str]) -> int:
    return 1 + (prep[0] != "raw") + (prep[1] != "uncut")


def _choose_prep(options: list[tuple[str, str]], rng: random.Random, complexity: str) -> tuple[str, str]:
    """Public ``choose_preparation``: low = the least work, high = the most (ties by name), else random."""
    if complexity == "low":
        return min(options, key=lambda p: (_work(p), p))
    if complexity == "high":
        return max(options, key=lambda p: (_work(p), p))
    return rng.choice(options)


def _sample_recipe(
    rng: random.Random,
    foods: dict[str, Food],
    used: set[str],
    n_ingredients: int,
    min_prepared: int,
    max_prepared: int,
    complexity: str,
) -> list[dict[str, Any]]:
    """One dish's recipe, by the public ``sample_recipe`` algorithm: ``min_prepared`` foods that need a
    preparation; when ``max_prepared < n_ingredients`` the others are raw+uncut (raw-only foods first),
    else they are any foods with any of their preparations; redrawn until the prepared count lies in
    ``[min_prepared, max_prepared]``. Foods are disjoint across dishes (``used``)."""
    trivial = ("raw", "uncut")
    names = sorted(set(foods) - used)
    if len(names) < n_ingredients:
        raise ValueError("not enough disjoint foods in this split")
    prepable = [n for n in names if any(p != trivial for p in foods[n].preparations)]
    if len(prepable) < min_prepared:
        raise ValueError("not enough foods with a non-trivial preparation")
    bounded = max_prepared < n_ingredients
    for _ in range(256):
        required = rng.sample(prepable, min_prepared)
        rest = [n for n in names if n not in required]
        k = n_ingredients - min_prepared
        if bounded:
            rawable = [n for n in rest if trivial in foods[n].preparations]
            if len(rawable) < k:
                continue
            raw_only = [n for n in rawable if foods[n].preparations == (trivial,)]
            simple = rng.sample(raw_only, min(len(raw_only), k))
            simple += rng.sample([n for n in rawable if n not in simple], k - len(simple))
        else:
            simple = rng.sample(rest, k)
        chosen = required + simple
        rng.shuffle(chosen)
        recipe = []
        for name in chosen:
            options = list(foods[name].preparations)
            if name in required:
                options = [p for p in options if p != trivial]
            elif bounded:
                options = [p for p in options if p == trivial]
            prep = _choose_prep(options, rng, complexity)
            recipe.append(
                {
                    "branch_work": _work(prep),
                    "candidate_source_locations": list(foods[name].locations),
                    "name": name,
                    "preparation": list(prep),
                    "requires_preparation": prep != trivial,
                }
            )
        if min_prepared <= sum(r["requires_preparation"] for r in recipe) <= max_prepared:
            used.update(chosen)
            return recipe
    raise ValueError("could not sample a recipe within the preparation bounds")


FAMILY_CONTEXT: dict[str, tuple[str, ...]] = {
    "resource_constrained": (
        "The shared inventory can hold at most {capacity} ingredients at once.",
        "The kitchen and preparation tools are shared across all dishes.",
    ),
    "dependency_gate": ("Some ingredient locations are behind an access gate that must be opened first.",),
    "conflict": ("Several dishes require shared kitchen tools; coordinate their use.",),
    "hierarchical": (
        "Each dish contains multiple ingredient-level objectives that can be handled as a group.",
    ),
    "critical_path": ("The dishes do not require equal amounts of preparation work.",),
    "load_balanced": ("The preparation workloads of the dishes are intentionally different.",),
}
"""The family's extra task-text lines (public ``render_family_context``; data format, kept verbatim)."""


def describe_dishes(dishes: list[dict[str, Any]], family: str, inventory_capacity: int) -> dict[str, str]:
    """The ``structured`` and ``coarse`` task texts of a row, in the public generator's format
    (``render_structured`` / ``render_coarse`` + the family's context lines): the texts the paper's
    models were trained and evaluated on."""
    n = len(dishes)
    structured = [
        f"Prepare and eat {n} independent dishes. Complete every dish.",
        "The dishes are separate objectives and may be prepared independently before the final meal actions.",
    ]
    for dish in dishes:
        structured.append(f"Dish {dish['dish_id']}: prepare the following ingredients:")
        structured += [f"- {r['name']} ({', '.join(r['preparation'])})" for r in dish["recipe"]]
    structured.append("After all required ingredients for a dish are ready, prepare and eat that dish.")
    coarse = [f"Prepare and eat {n} dishes. Check the cookbook and complete every dish."]
    coarse += [f"Dish {d['dish_id']} uses: {', '.join(r['name'] for r in d['recipe'])}." for d in dishes]
    extra = [line.format(capacity=inventory_capacity) for line in FAMILY_CONTEXT.get(family, ())]
    return {"structured": "\n".join(structured + extra), "coarse": "\n".join(coarse + extra)}


def generate_task(split: str, family: str, tier: str, index: int, seed: int) -> dict[str, Any]:
    """One task row (public schema), fully determined by its arguments."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; use one of {FAMILIES}")
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; use one of {TIERS}")
    foods = food_catalogue(split)
    fold = SPLIT_FOLDS[split]
    task_seed = int.from_bytes(
        random.Random(f"tw-sync/{split}/{family}/{tier}/{index}/{seed}").randbytes(4), "little"
    )
    last: Exception | None = None
    for attempt in range(32):
        rng = random.Random(task_seed + attempt * 1_000_003)
        try:
            return _build(rng, foods, split, fold, family, tier, index, task_seed)
        except ValueError as e:
            last = e
    raise RuntimeError(f"could not generate a feasible {family}/{tier} task: {last}")


def _build(
    rng: random.Random,
    foods: dict[str, Food],
    split: str,
    fold: str,
    family: str,
    tier: str,
    index: int,
    seed: int,
) -> dict[str, Any]:
    band, rband = TIER_BANDS[tier], RUNTIME_BANDS[tier]
    profile = {k: _sample(v, rng) for k, v in band.items()}
    runtime = {k: _sample(v, rng) for k, v in rband.items()}
    n = profile["dish_count"]
    complexity = [profile["preparation_complexity"]] * n
    gated: list[str] = []
    if family == "critical_path":
        complexity = ["low"] * max(0, n - 2) + ["medium", "high"][-n:]
    elif family == "load_balanced":
        complexity = ["low"] * (n - 1) + ["high"]
    elif family == "dependency_gate":
        profile["include_doors"] = True
        gated = [f"dish_{k}" for k in range(2, n + 1)]
    used: set[str] = set()
    dishes = []
    for d in range(n):
        recipe = _sample_recipe(
            rng,
            foods,
            used,
            profile["ingredients_per_dish"],
            profile["min_prepared_ingredients_per_dish"],
            profile["max_prepared_ingredients_per_dish"],
            complexity[d],
        )
        dishes.append(
            {
                "dish_id": f"dish_{d + 1}",
                "estimated_branch_work": sum(r["branch_work"] for r in recipe),
                "ingredient_names": [r["name"] for r in recipe],
                "recipe": recipe,
            }
        )
    work = [dish["estimated_branch_work"] for dish in dishes]
    if family == "critical_path" and n > 1 and work[-1] <= max(work[:-1]):
        raise ValueError("critical_path draw without a strictly longest branch")
    if family == "load_balanced" and max(work) == min(work):
        raise ValueError("load_balanced draw with equal branch work")
    total = sum(work)
    critical = max(work) + 2 * n
    doors = bool(profile["include_doors"])
    sequential = total + 2 * n + int(doors)
    if sequential + 2 > runtime["shared_environment_max_steps"]:
        raise ValueError(
            f"infeasible draw: {sequential} + 2 actions > budget {runtime['shared_environment_max_steps']}"
        )
    dependencies: list[dict[str, str]] = []
    if family == "dependency_gate":
        dependencies = [{"from": "gate_1", "to": d, "type": "door"} for d in gated]
    elif family == "hierarchical":
        for dish in dishes:
            dependencies.append({"from": "root", "to": dish["dish_id"], "type": "decompose"})
            dependencies += [
                {"from": dish["dish_id"], "to": f"{dish['dish_id']}::{r['name']}", "type": "decompose"}
                for r in dish["recipe"]
            ]
    bottlenecks = {"resource_constrained": ["knife", "stove", "kitchen"], "conflict": ["knife", "stove"]}
    capacity: dict[str, int] | None = {"conflict": {"knife": 1, "stove": 1}}.get(family)
    if family == "resource_constrained":
        capacity = {"inventory": int(profile["inventory_capacity"])}
    descriptions = describe_dishes(dishes, family, int(profile["inventory_capacity"]))
    view = TASK_VIEW[tier]
    params = {
        "includeDoors": int(doors),
        "limitInventorySize": int(bool(profile["limit_inventory_size"])),
        "numDishes": n,
        "numDistractorItems": profile["num_distractor_items"],
        "numIngredientsPerDish": profile["ingredients_per_dish"],
        "numIngredientsTotal": sum(len(dish["recipe"]) for dish in dishes),
        "numLocations": profile["num_locations"],
    }
    return {
        "base_game": "cookingworld",
        "difficulty": tier,
        "dishes": dishes,
        "game": "cookingworld_multidish",
        "game_params": params,
        "generation": {
            "generator": "sera-reference",
            "require_disjoint_ingredients": True,
            "requires_composite_environment": True,
            "requires_composite_scorer": True,
            "source_db_fold": fold,
            "source_db_seed": seed,
            "task_family": family,
            "v7_parameter_band": {k: _band_json(v) for k, v in TIER_BANDS[tier].items()},
            "v7_runtime_band": {k: _band_json(v) for k, v in RUNTIME_BANDS[tier].items()},
            "v7_sampled_parameters": profile,
            "v7_sampled_runtime": runtime,
            "v7_seed": seed,
        },
        "parallelism": {
            "branches": n,
            "critical_path_estimate": critical,
            "dependencies": dependencies,
            "estimated_sequential_actions": sequential,
            "hierarchy_depth": 2 if family == "hierarchical" else 1,
            "ideal_parallel_speedup": round(total / critical, 4),
            "ingredient_disjoint": True,
            "mechanisms": {"tool_cooldown_steps": runtime["tool_cooldown_steps"]},
            "pattern": "fork_join" if family == "multi_dish_fork_join" else family,
            "resource_capacity": capacity,
            "resource_conflict": family == "conflict",
            "shared_bottlenecks": bottlenecks.get(family, list(_DEFAULT_BOTTLENECKS)),
            "shared_environment_max_steps": runtime["shared_environment_max_steps"],
            "total_branch_work": total,
        },
        "schema_version": 1,
        "seed": seed,
        "source_fold": split,
        "split": split,
        "task_description": descriptions[view],
        "task_descriptions": descriptions,
        "task_family": family,
        "task_id": f"cookingworld_multidish_{split}_{family}_{tier}_{index:04d}",
        "task_view": view,
    }


def make_row(
    dishes: list[list[tuple[str, tuple[str, str], str]]],
    *,
    task_id: str = "hand_made",
    capacity: int | None = None,
    limit_inventory: bool = False,
    doors: bool = False,
    gated: tuple[str, ...] = (),
    cooldown: int = 0,
    max_steps: int = 60,
    locations: int = 5,
    distractors: int = 0,
    description: str = "A hand-made TextWorld-Sync task.",
) -> dict[str, Any]:
    """A minimal hand-written row: ``dishes = [[(name, (cook, cut), source_location), ...], ...]``.

    >>> make_row([[("salt", ("raw", "uncut"), "pantry.shelf")]])["dishes"][0]["dish_id"]
    'dish_1'
    """
    return {
        "task_id": task_id,
        "difficulty": "easy",
        "dishes": [
            {
                "dish_id": f"dish_{d + 1}",
                "recipe": [
                    {"name": n, "preparation": list(p), "candidate_source_locations": [src]}
                    for n, p, src in dish
                ],
            }
            for d, dish in enumerate(dishes)
        ],
        "game_params": {
            "includeDoors": int(doors),
            "limitInventorySize": int(limit_inventory),
            "numLocations": locations,
            "numDistractorItems": distractors,
        },
        "parallelism": {
            "shared_environment_max_steps": max_steps,
            "mechanisms": {"tool_cooldown_steps": cooldown},
            "dependencies": [{"from": "gate_1", "to": g, "type": "door"} for g in gated],
            "resource_capacity": {"inventory": capacity} if capacity else None,
        },
        "task_description": description,
    }


def _band_json(v: Any) -> dict[str, Any]:
    return {"min": v[0], "max": v[1]} if isinstance(v, tuple) else {"choices": list(v)}


def _split_evenly(total: int, n: int) -> list[int]:
    """``total`` items over ``n`` buckets, the first ``total % n`` one larger (public ``allocate_counts``)."""
    base, rem = divmod(total, n)
    return [base + int(k < rem) for k in range(n)]


def paper_mix(split: str, n: int | None = None) -> list[tuple[str, str]]:
    """The (family, tier) of each row of a paper-mix split, in the public order: tier by tier in
    :data:`PAPER_TIER_COUNTS` order, family by family within a tier, each tier's count spread over the 7
    families as the public ``allocate_counts`` does. ``n`` (default: the paper's split size) rescales the
    tier counts proportionally (largest remainders first, ties in tier order).

    >>> len(paper_mix("train")), paper_mix("train")[0], paper_mix("train")[-1]
    (1500, ('multi_dish_fork_join', 'medium'), ('hierarchical', 'hard'))
    >>> from collections import Counter; Counter(t for _, t in paper_mix("train", 100))
    Counter({'medium': 60, 'extreme': 30, 'hard': 10})
    """
    key = "dev" if split == "valid" else split
    if key not in PAPER_TIER_COUNTS:
        raise ValueError(f"unknown split {split!r}; use one of {sorted(PAPER_TIER_COUNTS)} (or valid)")
    tiers = PAPER_TIER_COUNTS[key]
    total = sum(c for _, c in tiers)
    n = total if n is None else n
    if n < 0:
        raise ValueError("n must be >= 0")
    exact = [c * n / total for _, c in tiers]
    counts = [int(x) for x in exact]
    for k in sorted(range(len(tiers)), key=lambda k: -(exact[k] - counts[k]))[: n - sum(counts)]:
        counts[k] += 1
    out: list[tuple[str, str]] = []
    for (tier, _), count in zip(tiers, counts, strict=True):
        for fam, m in zip(FAMILIES, _split_evenly(count, len(FAMILIES)), strict=True):
            out += [(fam, tier)] * m
    return out


def generate_tasks(
    split: str,
    n: int,
    seed: int,
    family: str | None = None,
    tier: str | None = None,
    mix: str = "cycle",
) -> list[dict[str, Any]]:
    """``n`` reproducible rows. ``mix="cycle"`` (default): without ``family``/``tier`` the rows cycle through
    every family, then every tier (row i: family ``FAMILIES[i % 7]``, tier ``TIERS[(i // 7) % 4]``); fixing
    one cycles the other. ``mix="paper"``: the paper's tier and family proportions of ``split``
    (:func:`paper_mix`; train has no easy tasks), ``family``/``tier`` must then be None."""
    if n < 0:
        raise ValueError("n must be >= 0")
    if mix == "paper":
        if family or tier:
            raise ValueError("mix='paper' fixes the family and tier of every row; drop family/tier")
        seen: dict[tuple[str, str], int] = {}
        rows = []
        for fam, tr in paper_mix(split, n):
            k = seen[(fam, tr)] = seen.get((fam, tr), -1) + 1
            rows.append(generate_task(split, fam, tr, k, seed))
        return rows
    if mix != "cycle":
        raise ValueError(f"unknown mix {mix!r}; use 'cycle' or 'paper'")
    rows = []
    for i in range(n):
        fam = family or FAMILIES[i % len(FAMILIES)]
        if tier:
            tr = tier
        elif family:
            tr = TIERS[i % len(TIERS)]
        else:
            tr = TIERS[(i // len(FAMILIES)) % len(TIERS)]
        rows.append(generate_task(split, fam, tr, i, seed))
    return rows


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - thin CLI
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--split", default="train", choices=sorted(SPLIT_FOLDS))
    p.add_argument("--n", type=int, default=28)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--family", choices=FAMILIES)
    p.add_argument("--tier", choices=TIERS)
    p.add_argument("--mix", choices=("cycle", "paper"), default="cycle")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    n = write_jsonl(a.out, generate_tasks(a.split, a.n, a.seed, a.family, a.tier, a.mix))
    load_tasks(a.out)  # round-trip check
    print(f"wrote {n} tasks to {a.out}")


__all__ = [
    "FAMILIES",
    "TIERS",
    "Food",
    "TaskFileError",
    "food_catalogue",
    "generate_task",
    "generate_tasks",
    "load_tasks",
    "make_row",
    "describe_dishes",
    "normalize_row",
    "paper_mix",
    "validate_row",
]

if __name__ == "__main__":  # pragma: no cover
    main()
