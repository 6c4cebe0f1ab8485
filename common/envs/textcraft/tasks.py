"""TextCraft-Synth tasks: the craft planner/solver, the task generators and the task-file loader.

* :func:`plan_crafts` / :func:`solve` -- given a recipe book, an inventory and targets ("make N more of
  each on top of what is held"), compute the batched craft sequence: every intermediate is crafted once,
  in the amount all its consumers need (rounded up to whole recipe executions), in increasing crafting
  depth. This is the plan of the scripted oracle and the gold trajectory of ``generator="sera"`` tasks.
* :func:`generate_tasks` -- task records of one split. Two generators:

  - ``"paper"`` (default): the paper's own tasks, reproduced from the public generator by
    ``paper.py`` -- world seed 42, 2,522 train / 632 val tasks, public ids and order. ``seed=0`` keeps
    the public order; another seed is a seeded shuffle of the split. ``n`` is capped by the split size.
  - ``"sera"``: our earlier generator over our seed-0 world (``recipes.py``): any number of tasks,
    tiers cycled evenly, an inventory slack of 1.05-1.34x the minimum (the paper's: 3.3-8.9x), 20 steps.
    Kept because recorded fixtures and earlier runs were made with it (their rows name it in
    ``misc.recipe_book``, so they still load) and for ablations that need more tasks or tighter
    inventories than the paper's finite pools; it is not the paper's data.
* :func:`load_tasks` -- read a JSONL/JSON task file with ``file:line`` errors (``common.data.read_jsonl``).

Record format (the public SERA/platoon TextCraft-Synth rows, plus ``split`` and ``recipe_book`` in
``misc``)::

    {"id": "textcraft_synth.val.0", "goal": "Craft the following items: 2x a3_i3_13", "max_steps": 75,
     "misc": {"target_items": {...}, "initial_inventory": {...},
              "gold_trajectory": [{"action": "craft", "target": ["a9_i1", 4],
                                   "ingredients": {"raw_a1": 8}, "result_count": 12}, ...],
              "difficulty": "easy", "max_depth": 3, "num_craft_steps": 3, "split": "val",
              "recipe_book": {"generator": "paper", "seed": 42, "items_per_domain_tier": 25,
                              "sha256": "..."}}}

A gold step replays as ``craft(step["ingredients"], (item, step["result_count"]))``: ``target`` holds the
item and the number of recipe executions, ``ingredients`` and ``result_count`` are totals for the step.

Which world a record runs in (:func:`book_for_task`), first match wins:

1. ``misc.recipes`` -- an inline JSON table (see ``recipes.py``);
2. ``misc.recipes_path`` -- a table file, relative to the task file;
3. ``misc.recipe_book`` -- a generated world: ``{"generator": "paper", "seed": 42,
   "items_per_domain_tier": 25}`` (the paper's), or ``{"generator": "sera", "seed": N}`` (ours; rows
   written before generators had names carry only ``{"seed": N}`` and mean ours). A ``sha256`` given
   there must match the regenerated world;
4. nothing -- the paper's world (a public row carries no recipe book).

Loading checks that every named item exists in that world AND that the targets can be crafted from the
initial inventory there, so a row run in the wrong world fails at load time with ``file:line``.

Simplifies: one target item per task (as the public files); tasks with several targets load and run.
Run: ``python -m common.envs.textcraft.tasks --split val --n 632 --out val.jsonl`` (the paper's val set).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.data import read_jsonl, write_jsonl

from .recipes import RecipeBook, generate_recipe_book

DIFFICULTIES: dict[str, tuple[int, int, int, int]] = {
    # name: (min tier, max tier, min count, max count)
    "easy": (2, 3, 1, 3),
    "medium": (4, 6, 1, 3),
    "hard": (7, 9, 1, 2),
    "extreme": (10, 12, 1, 2),
}
SPLITS = ("train", "val")
VAL_FRACTION = 0.2
DEFAULT_MAX_STEPS = 20
GOAL_PREFIX = "Craft the following items: "
_GOAL_ITEM = re.compile(r"(\d+)\s*x\s+([A-Za-z0-9_\-:.]+)")


# --- goals -------------------------------------------------------------------------------------------
def goal_text(targets: Mapping[str, int]) -> str:
    """``Craft the following items: 3x a1_i5, 1x m0_i7_7``."""
    return GOAL_PREFIX + ", ".join(f"{n}x {item}" for item, n in targets.items())


def parse_goal_targets(goal: str) -> dict[str, int]:
    """Inverse of :func:`goal_text` (empty dict when the goal names no ``Nx item``)."""
    body = goal.split(GOAL_PREFIX, 1)[1] if GOAL_PREFIX in goal else goal
    body = body.split("\n", 1)[0]
    out: dict[str, int] = {}
    for m in _GOAL_ITEM.finditer(body):
        out[m.group(2)] = out.get(m.group(2), 0) + int(m.group(1))
    return out


# --- planning ----------------------------------------------------------------------------------------
@dataclass
class CraftPlan:
    """A batched craft sequence and the base items it lacks (empty when the plan is executable)."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    """Gold-format steps, in execution order (increasing crafting depth)."""
    missing_base: dict[str, int] = field(default_factory=dict)
    """Base item -> how many more are needed than held."""

    @property
    def feasible(self) -> bool:
        return not self.missing_base


def plan_crafts(book: RecipeBook, inventory: Mapping[str, int], targets: Mapping[str, int]) -> CraftPlan:
    """Plan crafting ``targets`` ON TOP of what ``inventory`` holds (held target items are kept).

    Every item reachable from the targets is visited once in decreasing crafting depth (all consumers of
    an item are deeper, so its total demand is known when it is visited); its deficit is crafted in
    ``ceil(deficit / result_count)`` executions. Executed in reverse (increasing depth), each craft finds
    its ingredients: they were crafted earlier in amounts that cover every consumer. Raises ValueError for
    unknown targets.

    >>> b = generate_recipe_book(0)
    >>> p = plan_crafts(b, {}, {"m0_i1": 1})
    >>> [s["target"] for s in p.steps], p.feasible
    ([['m0_i1', 1]], False)
    """
    for item, n in targets.items():
        if not book.knows(item):
            raise ValueError(f"unknown target item {item!r}")
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"target count for {item!r} must be a non-negative integer, got {n!r}")
    # Closure of the targets.
    closure: set[str] = set()
    stack = list(targets)
    while stack:
        item = stack.pop()
        if item in closure:
            continue
        closure.add(item)
        rec = book.recipe(item)
        if rec is not None:
            stack.extend(rec.ingredients)
    demand: dict[str, int] = {t: inventory.get(t, 0) + n for t, n in targets.items()}
    plan = CraftPlan()
    rev_steps: list[dict[str, Any]] = []
    for item in sorted(closure, key=lambda i: (-book.crafting_depth(i), i)):
        deficit = demand.get(item, 0) - inventory.get(item, 0)
        if deficit <= 0:
            continue
        rec = book.recipe(item)
        if rec is None:
            plan.missing_base[item] = deficit
            continue
        n_exec = -(-deficit // rec.result_count)
        ings = {ing: c * n_exec for ing, c in rec.ingredients.items()}
        for ing, c in ings.items():
            demand[ing] = demand.get(ing, 0) + c
        rev_steps.append(
            {
                "action": "craft",
                "target": [item, n_exec],
                "ingredients": ings,
                "result_count": n_exec * rec.result_count,
            }
        )
    plan.steps = rev_steps[::-1]
    plan.missing_base = dict(sorted(plan.missing_base.items()))
    return plan


def solve(
    book: RecipeBook, inventory: Mapping[str, int], targets: Mapping[str, int]
) -> list[dict[str, Any]] | None:
    """The gold craft sequence for ``targets`` from ``inventory``, or None when base items are lacking."""
    plan = plan_crafts(book, inventory, targets)
    return plan.steps if plan.feasible else None


def replay(book: RecipeBook, inventory: Mapping[str, int], steps: list[dict[str, Any]]) -> dict[str, int]:
    """Apply gold steps to a copy of ``inventory`` with plain bookkeeping (no tool strings); raises
    ValueError on a step that does not match its recipe or lacks ingredients. Used by tests/checks."""
    inv = dict(inventory)
    for k, st in enumerate(steps):
        item, n_exec = st["target"]
        rec = book.recipe(item)
        if rec is None:
            raise ValueError(f"step {k}: no recipe for {item}")
        want = {i: c * n_exec for i, c in rec.ingredients.items()}
        if want != st["ingredients"] or st["result_count"] != n_exec * rec.result_count:
            raise ValueError(f"step {k}: does not match the recipe of {item}")
        for i, c in want.items():
            if inv.get(i, 0) < c:
                raise ValueError(f"step {k}: needs {c} {i}, inventory has {inv.get(i, 0)}")
            inv[i] -= c
        inv[item] = inv.get(item, 0) + st["result_count"]
    return {k: v for k, v in inv.items() if v}


# --- train/val split ---------------------------------------------------------------------------------
def split_targets(book: RecipeBook, val_fraction: float = VAL_FRACTION) -> dict[str, dict[str, list[str]]]:
    """``{difficulty: {"train": items, "val": items}}``: per tier, a seeded shuffle of the tier's items,
    the last ``val_fraction`` held out. Depends on the recipe world only (its hash seeds the shuffle)."""
    rng = random.Random("split:" + book.stable_hash())
    out: dict[str, dict[str, list[str]]] = {}
    for diff, (lo, hi, _, _) in DIFFICULTIES.items():
        parts: dict[str, list[str]] = {"train": [], "val": []}
        for tier in range(lo, hi + 1):
            items = [i for i in book.items_of_tier(tier) if book.recipe(i) is not None]
            rng.shuffle(items)
            n_val = round(len(items) * val_fraction)
            if len(items) >= 2:
                n_val = max(1, n_val)
            parts["train"].extend(items[: len(items) - n_val])
            parts["val"].extend(items[len(items) - n_val :])
        out[diff] = parts
    return out


# --- generation --------------------------------------------------------------------------------------
def make_task(
    book: RecipeBook,
    targets: Mapping[str, int],
    rng: random.Random,
    task_id: str,
    *,
    difficulty: str,
    split: str,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> dict[str, Any]:
    """One verified record for ``targets``: base needs + buffer + 1-3 distractor base items."""
    targets = dict(targets)
    needs = plan_crafts(book, {}, targets).missing_base
    inventory = {b: n + rng.randint(0, max(1, n // 10)) for b, n in needs.items()}
    others = [b for b in book.base_items if b not in needs]
    for b in rng.sample(others, k=min(len(others), rng.randint(1, 3))):
        inventory[b] = rng.randint(1, 5)
    inventory = dict(sorted(inventory.items()))
    gold = solve(book, inventory, targets)
    if gold is None:  # cannot happen: the inventory covers the plan from empty
        raise AssertionError(f"generated task {task_id} is not solvable")
    return {
        "id": task_id,
        "goal": goal_text(targets),
        "max_steps": max_steps,
        "misc": {
            "target_items": targets,
            "initial_inventory": inventory,
            "gold_trajectory": gold,
            "difficulty": difficulty,
            "max_depth": max(book.crafting_depth(t) for t in targets),
            "num_craft_steps": len(gold),
            "split": split,
            "recipe_book": {"generator": "sera", "seed": book.seed, "sha256": book.stable_hash()},
        },
    }


GENERATORS = ("paper", "sera")
"""``paper``: the paper's tasks (default); ``sera``: our earlier generator (module docstring)."""


def _check_request(split: str, n: int, difficulty: str | None) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if difficulty is not None and difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {list(DIFFICULTIES)} or None, got {difficulty!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")


def generate_tasks(
    split: str,
    n: int,
    seed: int = 0,
    difficulty: str | None = None,
    *,
    generator: str = "paper",
    book_seed: int = 0,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> list[dict[str, Any]]:
    """``n`` task records of ``split`` ("train" or "val").

    ``generator="paper"`` (default): rows of the paper's split (``paper.paper_tasks``), restricted to
    ``difficulty`` when given; ``seed=0`` takes them in the public order, any other seed in a seeded
    shuffled order; asking for more than the split holds is a ValueError. ``book_seed`` and
    ``max_steps`` apply to ``generator="sera"`` only (:func:`generate_sera_tasks`).

    >>> [t["id"] for t in generate_tasks("val", 2)]
    ['textcraft_synth.val.0', 'textcraft_synth.val.1']
    """
    if generator == "sera":
        return generate_sera_tasks(split, n, seed, difficulty, book_seed=book_seed, max_steps=max_steps)
    if generator != "paper":
        raise ValueError(f"generator must be one of {GENERATORS}, got {generator!r}")
    _check_request(split, n, difficulty)
    from .paper import paper_difficulties, paper_rows

    picks = [i for i, d in enumerate(paper_difficulties(split)) if difficulty in (None, d)]  # type: ignore[arg-type]
    if n > len(picks):
        what = f"{difficulty} tasks" if difficulty else "tasks"
        raise ValueError(
            f"the paper's {split} split has {len(picks)} {what}, {n} were asked for: ask for at most "
            f"{len(picks)}, or use generator='sera' (our generator, any number of tasks)"
        )
    if seed != 0:
        random.Random(f"paper-order:{split}:{seed}").shuffle(picks)
    return paper_rows(split, picks[:n])  # type: ignore[arg-type]


def generate_sera_tasks(
    split: str,
    n: int,
    seed: int,
    difficulty: str | None = None,
    *,
    book_seed: int = 0,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> list[dict[str, Any]]:
    """``n`` records of ``split`` ("train" or "val") from OUR generator (``generator="sera"``), with ``seed``.

    ``difficulty=None`` cycles easy/medium/hard/extreme (balanced); a name restricts to that tier. Within a
    difficulty, the (target item, count) pairs of the split are dealt in a seeded shuffled order, so the
    first ``len(pairs)`` tasks are distinct; past that the deck is reshuffled (inventories still differ).
    The recipe world is ``generate_recipe_book(book_seed)``.
    """
    _check_request(split, n, difficulty)
    book = generate_recipe_book(book_seed)
    pools = split_targets(book)
    order = [difficulty] if difficulty else list(DIFFICULTIES)
    rng = random.Random(f"tasks:{split}:{seed}:{difficulty}:{book_seed}")
    decks: dict[str, list[tuple[str, int]]] = {}

    def deal(diff: str) -> tuple[str, int]:
        if not decks.get(diff):
            lo_c, hi_c = DIFFICULTIES[diff][2:]
            deck = [(i, c) for i in pools[diff][split] for c in range(lo_c, hi_c + 1)]
            if not deck:
                raise ValueError(f"no {split} target items for difficulty {diff}")
            rng.shuffle(deck)
            decks[diff] = deck
        return decks[diff].pop()

    out = []
    for k in range(n):
        diff = order[k % len(order)]
        item, count = deal(diff)
        tid = f"textcraft_synth.{split}.{seed}.{k}"
        out.append(
            make_task(book, {item: count}, rng, tid, difficulty=diff, split=split, max_steps=max_steps)
        )
    return out


# --- which world a record runs in ----------------------------------------------------------------------
_INLINE_CACHE: list[tuple[Any, RecipeBook]] = []
_PATH_CACHE: dict[tuple[str, float], RecipeBook] = {}


def book_for_task(task: Mapping[str, Any], base_dir: str | Path | None = None) -> RecipeBook:
    """The recipe world a record names (module docstring). Books are cached (inline tables by identity,
    files by path and mtime, generated worlds by seed)."""
    misc = task.get("misc") or {}
    if misc.get("recipes") is not None:
        table = misc["recipes"]
        for obj, book in _INLINE_CACHE:
            if obj is table:
                return book
        if not isinstance(table, Mapping):
            raise ValueError("misc.recipes must be a recipe table object")
        doc = table if "recipes" in table else {"recipes": table}
        book = RecipeBook.from_json(doc)
        _INLINE_CACHE.append((table, book))
        del _INLINE_CACHE[:-32]
        return book
    if misc.get("recipes_path"):
        path = Path(misc["recipes_path"])
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.exists():
            raise ValueError(f"misc.recipes_path {str(path)!r} does not exist")
        key = (str(path.resolve()), path.stat().st_mtime)
        if key not in _PATH_CACHE:
            _PATH_CACHE[key] = RecipeBook.load(path)
        return _PATH_CACHE[key]
    ref = misc.get("recipe_book")
    if ref is None:
        return _paper_book()  # a public row: the paper's world
    if not isinstance(ref, Mapping):
        raise ValueError("misc.recipe_book must be an object {generator, seed, sha256}")
    gen = ref.get("generator", "sera")
    seed = ref.get("seed", 0)
    if gen not in GENERATORS:
        raise ValueError(f"misc.recipe_book.generator must be one of {GENERATORS}, got {gen!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"misc.recipe_book.seed must be an integer, got {seed!r}")
    if gen == "paper":
        from .paper import ITEMS_PER_DOMAIN_TIER, paper_world

        per_tier = ref.get("items_per_domain_tier", ITEMS_PER_DOMAIN_TIER)
        if not isinstance(per_tier, int) or isinstance(per_tier, bool) or per_tier < 1:
            raise ValueError(
                f"misc.recipe_book.items_per_domain_tier must be a positive integer, got {per_tier!r}"
            )
        book = paper_world(seed, per_tier).book
    else:
        book = generate_recipe_book(seed)
    want = ref.get("sha256")
    if want and want != book.stable_hash():
        raise ValueError(
            f"the record names recipe world sha256={str(want)[:12]}..., but generator {gen!r} with seed "
            f"{seed} makes {book.stable_hash()[:12]}... (the generator changed): regenerate the tasks, or "
            "ship the table with the tasks via misc.recipes_path"
        )
    return book


def _paper_book() -> RecipeBook:
    from .paper import paper_world

    return paper_world().book


def world_name(task: Mapping[str, Any]) -> str:
    """A short human name of the world a record runs in (for error messages)."""
    misc = task.get("misc") or {}
    if misc.get("recipes") is not None:
        return "the inline table misc.recipes"
    if misc.get("recipes_path"):
        return f"the table {misc['recipes_path']}"
    ref = misc.get("recipe_book")
    if ref is None:
        return "the paper's world (no misc.recipe_book)"
    if isinstance(ref, Mapping):
        return f"the {ref.get('generator', 'sera')} world seed {ref.get('seed', 0)}"
    return "an unreadable misc.recipe_book"


# --- loading -----------------------------------------------------------------------------------------
def _check_counts(name: str, d: Any, *, positive: bool, nonempty: bool) -> None:
    if not isinstance(d, dict):
        raise TypeError(f"{name} must be an object {{item: count}}, got {type(d).__name__}")
    if nonempty and not d:
        raise ValueError(f"{name} must not be empty")
    for k, v in d.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < (1 if positive else 0):
            kind = "a positive" if positive else "a non-negative"
            raise ValueError(f"{name}[{k!r}] must be {kind} integer, got {v!r}")


def validate_task(task: dict[str, Any], base_dir: str | Path | None = None) -> None:
    """Raise ValueError/TypeError/KeyError when ``task`` is not a runnable TextCraft record. A relative
    ``misc.recipes_path`` is rewritten as an absolute path (relative to ``base_dir``)."""
    for key in ("id", "goal", "misc"):
        if key not in task:
            raise KeyError(f"missing field {key!r}")
    if not isinstance(task["id"], (str, int)) or isinstance(task["id"], bool):
        raise TypeError("id must be a string")
    if not isinstance(task["goal"], str):
        raise TypeError("goal must be a string")
    ms = task.get("max_steps", DEFAULT_MAX_STEPS)
    if not isinstance(ms, int) or isinstance(ms, bool) or ms <= 0:
        raise ValueError(f"max_steps must be a positive integer, got {ms!r}")
    misc = task["misc"]
    if not isinstance(misc, dict):
        raise TypeError("misc must be an object")
    if "target_items" not in misc:
        raise KeyError("missing field 'misc.target_items'")
    _check_counts("misc.target_items", misc["target_items"], positive=True, nonempty=True)
    _check_counts("misc.initial_inventory", misc.get("initial_inventory", {}), positive=False, nonempty=False)
    gold = misc.get("gold_trajectory", [])
    if not isinstance(gold, list):
        raise TypeError("misc.gold_trajectory must be a list")
    for k, st in enumerate(gold):
        ok = (
            isinstance(st, dict)
            and st.get("action") == "craft"
            and isinstance(st.get("target"), (list, tuple))
            and len(st["target"]) == 2
            and isinstance(st.get("ingredients"), dict)
            and isinstance(st.get("result_count"), int)
        )
        if not ok:
            raise ValueError(
                f"misc.gold_trajectory[{k}] must be {{action: 'craft', target: [item, n], ingredients, result_count}}"
            )
    if misc.get("recipes_path") and base_dir is not None:
        p = Path(misc["recipes_path"])
        if not p.is_absolute():
            misc["recipes_path"] = str((Path(base_dir) / p).resolve())
    book = book_for_task(task, base_dir)
    where = world_name(task)
    for item in misc["target_items"]:
        if not book.knows(item):
            raise ValueError(f"target item {item!r} does not exist in {where}")
        if book.recipe(item) is None:
            raise ValueError(f"target item {item!r} is a base item in {where} (nothing to craft)")
    for item in misc.get("initial_inventory", {}):
        if not book.knows(item):
            raise ValueError(f"inventory item {item!r} does not exist in {where}")
    lacking = plan_crafts(book, misc.get("initial_inventory", {}), misc["target_items"]).missing_base
    if lacking:
        short = ", ".join(f"{k} x{v}" for k, v in list(lacking.items())[:4])
        raise ValueError(
            f"the targets cannot be crafted from the initial inventory in {where} (short of {short}): "
            "a row made for another world needs misc.recipe_book or misc.recipes naming it"
        )


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    """Read and validate a task file (JSONL, a JSON array, or ``{"tasks": [...]}``). A malformed record
    raises :class:`common.data.TaskFileError` naming ``path:line``."""
    base_dir = Path(path).resolve().parent
    return read_jsonl(path, validate=lambda rec: validate_task(rec, base_dir))


def save_tasks(path: str | Path, tasks: list[dict[str, Any]]) -> int:
    return write_jsonl(path, tasks)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Generate TextCraft-Synth task records.")
    ap.add_argument("--split", choices=SPLITS, default="val")
    ap.add_argument("--n", type=int, default=632)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--difficulty", choices=list(DIFFICULTIES), default=None)
    ap.add_argument("--generator", choices=GENERATORS, default="paper")
    ap.add_argument("--book-seed", type=int, default=0, help="world seed of --generator sera")
    ap.add_argument("--out", type=str, default="")
    a = ap.parse_args()
    recs = generate_tasks(a.split, a.n, a.seed, a.difficulty, generator=a.generator, book_seed=a.book_seed)
    if a.out:
        save_tasks(a.out, recs)
        print(f"wrote {len(recs)} tasks to {a.out}")
    else:
        for r in recs[:5]:
            print(json.dumps({k: r[k] for k in ("id", "goal")} | {"difficulty": r["misc"]["difficulty"]}))
        steps = [r["misc"]["num_craft_steps"] for r in recs]
        print(
            f"{len(recs)} tasks; craft steps mean {sum(steps) / max(1, len(steps)):.1f}, max {max(steps, default=0)}"
        )
