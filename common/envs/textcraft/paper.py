"""The paper's TextCraft-Synth data: its recipe world (seed 42) and its train/val task splits.

This module re-implements, line by line in our own words, the public generator that made the paper's
data (``OliverLeeXZ/SERA: Runtime/vendor/platoon/textcraft/synth_tasks.py`` with the recipe generator
``ApGa/platoon: plugins/textcraft/platoon/textcraft/synth_recipe_generator.py``), including the ORDER in
which it draws Python ``random`` numbers, so that the same seeds give the same world and the same tasks:

* :func:`paper_world` -- ``SynthRecipeDatabase.generate_all_recipes(seed=42, items_per_domain_tier=25)``
  with generic names: 5 domains x (10 base items + tiers 1..12 with ``25 - tier // 3`` items) + 12
  cross-domain items = 1,452 items. One recipe per item.
* :func:`paper_tasks` -- ``create_synth_datasets(seed=42, num_samples_train=10000,
  num_samples_val=1000)``: items of each tier 1..12 shuffled and split 80/20 into train-only and val-only
  targets; tasks drawn per difficulty (easy 2-3, medium 4-6, hard 7-9, extreme 10-12) until the target
  count or ``30 x target`` attempts; duplicates (same item and count) rejected; the pools run out at
  2,522 train tasks (588/852/544/538) and 632 val tasks (147/213/136/136); both lists are shuffled with
  ``Random(seed + 1)`` and renumbered ``textcraft_synth.{split}.{i}``.

Every draw the public code makes is made here, in the same order and by the same algorithm
(:class:`Draws` restates CPython's ``randint``/``sample``/``choice``/``shuffle`` on the raw generator),
because a single extra or missing draw shifts every later task. The gold trajectory is the two-phase
solver of platoon's copy, the one that made the shipped rows (SERA's vendored copy has a different
solver; the choice changes no task, see the ledger). One input of the public generator is NOT fixed by its seed: the distractor
base item is ``rng.choice(list(recipe_db.base_items))`` over a Python ``set`` of strings, whose order
follows the per-process string hash (``PYTHONHASHSEED``). Which base item is picked decides whether a
``randint(1, 5)`` follows, so the public code yields different task orders and inventories from run to
run. We fix that order to :data:`BASE_ORDER` (see its docstring and docs/fidelity/textcraft_data.md);
everything else -- the world, the item split, the split sizes and tier counts, the difficulty at every
index -- does not depend on it and matches the public generator exactly.

Rows are in the SERA/platoon format plus ``misc.split`` and ``misc.recipe_book`` (the world's name)::

    {"id": "textcraft_synth.val.0", "goal": "Craft the following items: 2x t2_i3_12", "max_steps": 75,
     "misc": {"target_items": {...}, "initial_inventory": {...}, "gold_trajectory": [...],
              "difficulty": "easy", "max_depth": 3, "num_craft_steps": 3, "split": "val",
              "recipe_book": {"generator": "paper", "seed": 42, "items_per_domain_tier": 25,
                              "sha256": "..."}}}

A gold step is the public solver's certificate: ``target = [item, executions]``, ``ingredients`` and
``result_count`` are totals for the step (replay: ``craft(step["ingredients"], (item,
step["result_count"]))``).

Cost: the world takes ~30 ms, both splits ~3 s on one core (330k draw attempts, most of them rejected
duplicates, and 200k gold craft steps); both are cached per process.
Run: ``python -m common.envs.textcraft.paper --split val [--out FILE] [--hash-seed N]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gzip
import hashlib
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from common.data import cache_root, write_bytes_atomic

from .recipes import Recipe, RecipeBook

PAPER_SEED = 42
"""``create_synth_datasets(seed=42)``: seeds the recipe world, the item split and the task draws."""
ITEMS_PER_DOMAIN_TIER = 25
"""Items per domain at tier 0 (with repeats, see :func:`paper_world`) and at tier 1 (fewer above)."""
NUM_SAMPLES = {"train": 10_000, "val": 1_000}
"""Requested tasks per split (the pools run out first: 2,522 and 632 are produced)."""
DIFFICULTY_SHARE = {"easy": 0.25, "medium": 0.35, "hard": 0.25, "extreme": 0.15}
"""Requested share of each difficulty (dict order is the generation order)."""
PAPER_DIFFICULTIES: dict[str, tuple[int, int, int]] = {
    # name: (min tier, max tier, max count per target); one target per task
    "easy": (2, 3, 3),
    "medium": (4, 6, 3),
    "hard": (7, 9, 2),
    "extreme": (10, 12, 2),
}
VAL_ITEM_FRACTION = 0.2
"""Share of each tier's items held out as val-only targets."""
MAX_STEPS = 75
"""The public fixed step budget of every task."""
ATTEMPTS_PER_TASK = 30
"""The public generator gives up on a difficulty after ``30 x target count`` draws."""

DOMAINS = ("m", "c", "o", "a", "t")
"""metal, crystal, organic, arcane, tech: the public ``MaterialDomain`` order."""
# tier -> (name suffix, base ingredient count, (min, max) result count)
TIERS: dict[int, tuple[str, int, tuple[int, int]]] = {
    1: ("i1", 1, (2, 4)),
    2: ("i2", 2, (2, 3)),
    3: ("i3", 2, (1, 2)),
    4: ("i4", 2, (1, 2)),
    5: ("i5", 2, (1, 2)),
    6: ("i6", 2, (1, 1)),
    7: ("i7", 2, (1, 1)),
    8: ("i8", 3, (1, 1)),
    9: ("i9", 3, (1, 1)),
    10: ("i10", 3, (1, 1)),
    11: ("i11", 3, (1, 1)),
    12: ("i12", 4, (1, 1)),
}
# (name, tier, domains): the public cross-domain items, in its order.
CROSS_DOMAIN: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    ("x10_mc", 10, ("m", "c")),
    ("x10_ot", 10, ("o", "t")),
    ("x10_am", 10, ("a", "m")),
    ("x10_ct", 10, ("c", "t")),
    ("x11_mct", 11, ("m", "c", "t")),
    ("x11_oam", 11, ("o", "a", "m")),
    ("x11_act", 11, ("a", "c", "t")),
    ("x11_tca", 11, ("t", "c", "a")),
    ("x12_mcat", 12, ("m", "c", "a", "t")),
    ("x12_oacm", 12, ("o", "a", "c", "m")),
    ("x12_tcoa", 12, ("t", "c", "o", "a")),
    ("x12_all", 12, DOMAINS),
)


def _base_name(domain: str, prefix: str) -> str:
    return f"{prefix}_ore" if domain in ("m", "c") else f"raw_{prefix}"


BASE_ORDER: tuple[str, ...] = tuple(_base_name(d, f"{d}{k}") for d in DOMAINS for k in range(10))
"""The order of the 50 base items that the distractor draw ``rng.choice(all_base)`` indexes.

The public code takes ``list(recipe_db.base_items)`` of a ``set``, i.e. CPython's hash-table order,
which changes with ``PYTHONHASHSEED``; it is therefore not a property of the public algorithm. We use
the set's insertion order (domain by domain, ``m0_ore`` .. ``raw_t9``): what the public code yields in any
process where the set happens to iterate in insertion order, and what an insertion-ordered container
(a ``dict``) would give. See docs/fidelity/textcraft_data.md for what this does and does not change."""


class Draws:
    """The ``random.Random`` methods the public generator calls, written out on top of the two raw
    Mersenne-Twister outputs (``getrandbits``, ``random``) exactly as CPython 3.11/3.12 implements them,
    so the data cannot change if a later Python changes ``randrange``/``sample``/``shuffle`` internals.

    >>> a, b = Draws(7), random.Random(7)
    >>> [a.randint(1, 6) for _ in range(5)] == [b.randint(1, 6) for _ in range(5)]
    True
    """

    __slots__ = ("_bits", "random")

    def __init__(self, seed: int):
        gen = random.Random(seed)
        self._bits = gen.getrandbits
        self.random = gen.random
        """A float in [0, 1) from 53 random bits (``random.Random.random``)."""

    def below(self, n: int) -> int:
        """Uniform in [0, n): ``k = n.bit_length()`` bits, redrawn while >= n (``_randbelow``)."""
        k = n.bit_length()
        r = self._bits(k)
        while r >= n:
            r = self._bits(k)
        return r

    def randint(self, a: int, b: int) -> int:
        return a + self.below(b - a + 1)

    def choice(self, seq: Any) -> Any:
        return seq[self.below(len(seq))]

    def sample_one(self, seq: list[str]) -> str:
        """``random.sample(seq, 1)[0]``: both of its code paths draw one ``_randbelow(len(seq))``."""
        return seq[self.below(len(seq))]

    def shuffle(self, items: list[Any]) -> None:
        """Fisher-Yates from the end, as ``random.shuffle``."""
        for i in reversed(range(1, len(items))):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]


def base_order_for_hash_seed(
    hash_seed: int, items_per_domain_tier: int = ITEMS_PER_DOMAIN_TIER
) -> tuple[str, ...]:
    """``list(recipe_db.base_items)`` as the public code sees it in a process started with
    ``PYTHONHASHSEED=hash_seed``: the set is rebuilt in the public insertion order in a child interpreter
    (this one's string hash is already fixed). The order depends on the CPython version too (3.11
    changed the string hash); the published rows replay with 3.11/3.12 (tests/test_textcraft_paper.py).
    """
    if not 0 <= hash_seed <= 4_294_967_295:
        raise ValueError(f"PYTHONHASHSEED must be in [0, 4294967295], got {hash_seed}")
    names = [_base_name(d, f"{d}{i % 10}") for d in DOMAINS for i in range(items_per_domain_tier)]
    code = "import json, sys\nitems = set()\nfor n in json.load(sys.stdin):\n    items.add(n)\nprint(json.dumps(list(items)))"
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(names),
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return tuple(json.loads(out.stdout))


@dataclass(frozen=True)
class PaperWorld:
    """The generated recipe world with the public generator's own lists (their order drives later draws)."""

    book: RecipeBook
    """The recipe table (tiers = the public ``item_depths``; one recipe per item)."""
    items_by_tier: dict[int, list[str]]
    """tier -> items in generation order (tier 0 repeats each base name 2-3 times, as the public list)."""
    base_items: tuple[str, ...]
    """The 50 distinct base items in :data:`BASE_ORDER`."""
    cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """Memo tables of the planner (pure functions of the world)."""

    def depth(self, item: str) -> int:
        """The public ``get_crafting_depth``: the item's tier (0 for base and unknown items)."""
        return self.book.tiers.get(item, 0)


def _pick_recipe(
    rng: Draws,
    tier: int,
    domain_tiers: dict[int, list[str]],
) -> tuple[dict[str, int], int] | None:
    """One recipe at ``tier`` from the domain's lower tiers: (ingredients, result_count), or None."""
    _, base_n, (lo, hi) = TIERS[tier]
    # Candidates from the two tiers below, with their distance (repeats in the list are kept).
    cands: list[tuple[str, int]] = []
    for t in range(max(0, tier - 2), tier):
        cands.extend((item, tier - t) for item in domain_tiers[t])
    # From tier 4 on, one more candidate from three or four tiers down.
    if tier >= 4:
        deep = rng.choice(range(max(0, tier - 4), tier - 2))
        if domain_tiers[deep]:
            cands.append((rng.choice(domain_tiers[deep]), tier - deep))
    if not cands:
        return None
    n = min(base_n + rng.randint(0, min(2, tier // 3)), len(cands), 6)
    weights = [1.0 / (dist + 1) for _, dist in cands]
    free = list(range(len(cands)))
    chosen: list[str] = []
    for _ in range(n):
        if not free:
            break
        # Roulette wheel over the remaining candidates (weights favour the nearer tier).
        r = rng.random() * sum(weights[k] for k in free)
        acc = 0.0
        for k in free:
            acc += weights[k]
            if acc >= r:
                chosen.append(cands[k][0])
                free.remove(k)
                break
    if not chosen:
        return None
    ings: dict[str, int] = {}
    for item in chosen:  # a name chosen twice keeps its last count (the public dict assignment)
        ings[item] = rng.randint(1, 2 if tier <= 4 else 1)
    return ings, rng.randint(lo, hi)


@functools.lru_cache(maxsize=4)
def paper_world(seed: int = PAPER_SEED, items_per_domain_tier: int = ITEMS_PER_DOMAIN_TIER) -> PaperWorld:
    """The public ``SynthRecipeDatabase`` for ``seed`` (generic names), cached per process.

    >>> w = paper_world()
    >>> len(w.book), len(w.base_items), w.book.recipe("m2_i1_12")
    (1452, 50, Recipe(ingredients={'m9_ore': 1}, result_count=2))
    """
    rng = Draws(seed)  # the public code seeds the global generator: the same stream
    tiers: dict[str, int] = {}
    domains: dict[str, str] = {}
    recipes: dict[str, Recipe] = {}
    by_tier: dict[int, list[str]] = {t: [] for t in range(13)}
    by_domain: dict[str, dict[int, list[str]]] = {}
    for d in DOMAINS:
        dom: dict[int, list[str]] = by_domain.setdefault(d, {t: [] for t in range(13)})
        prefixes = [f"{d}{k}" for k in range(10)]
        for i in range(items_per_domain_tier):
            name = _base_name(d, prefixes[i % 10])  # repeats from i = 10 on, kept in the lists
            tiers[name], domains[name] = 0, d
            by_tier[0].append(name)
            dom[0].append(name)
        for tier in range(1, 13):
            suffix = TIERS[tier][0]
            for i in range(max(1, items_per_domain_tier - tier // 3)):
                name = f"{prefixes[i % 10]}_{suffix}" + (f"_{tier}" if tier >= 6 else "")
                if name in tiers:
                    name = f"{name}_{i}"
                picked = _pick_recipe(rng, tier, dom)
                if picked is None:
                    continue
                recipes[name] = Recipe(ingredients=picked[0], result_count=picked[1])
                tiers[name], domains[name] = tier, d
                by_tier[tier].append(name)
                dom[tier].append(name)
    for name, tier, doms in CROSS_DOMAIN:
        ings: dict[str, int] = {}
        for d in doms:
            # The first non-empty tier among tier-3 .. tier-1 of each domain gives one ingredient.
            for t in range(max(1, tier - 3), tier):
                if by_domain[d][t]:
                    ings[rng.choice(by_domain[d][t])] = rng.randint(1, 2)
                    break
        if len(ings) >= 2:
            recipes[name] = Recipe(ingredients=ings, result_count=1)
            tiers[name], domains[name] = tier, "x"
            by_tier[tier].append(name)
    ordered = {n: tiers[n] for t in range(13) for n in dict.fromkeys(by_tier[t])}
    book = RecipeBook(
        tiers=ordered,
        recipes=recipes,
        domains={n: domains[n] for n in ordered},
        seed=seed,
    )
    base = tuple(dict.fromkeys(by_tier[0]))  # distinct, in insertion order: BASE_ORDER for 25 per tier
    return PaperWorld(book=book, items_by_tier=by_tier, base_items=base)


# --- the public planner --------------------------------------------------------------------------------
def base_needs(world: PaperWorld, targets: dict[str, int]) -> dict[str, int]:
    """The public ``extract_base_materials_synth(db, targets, {})``: base items per target, expanded
    through the recipes WITHOUT dividing by result counts (an over-estimate: this is where the paper's
    inventory slack comes from), in first-reached order.

    >>> base_needs(paper_world(), {"m2_i2_12": 1})
    {'m9_ore': 1, 'm3_ore': 1}
    """
    needs: dict[str, int] = {}
    for item, count in targets.items():
        for b, m in _per_one(world, item).items():
            if m * count > 0:
                needs[b] = needs.get(b, 0) + m * count
    return needs


def _per_one(world: PaperWorld, item: str) -> dict[str, int]:
    """Base items under ONE ``item`` (ingredient counts multiplied down, result counts ignored); cached
    on the world (read-only result)."""
    cache = world.cache.setdefault("per_one", {})
    if item not in cache:
        rec = world.book.recipes.get(item)
        if rec is None:
            cache[item] = {item: 1} if world.book.is_base(item) else {}
        else:
            out: dict[str, int] = {}
            for ing, k in rec.ingredients.items():
                for b, m in _per_one(world, ing).items():
                    out[b] = out.get(b, 0) + m * k
            cache[item] = out
    return cache[item]


def _requirements(world: PaperWorld, targets: dict[str, int]) -> dict[str, int]:
    """Phase 1 of the public solver: the recipe TREE of every target, each node asking for ``count`` of
    its item and ``ceil(count / result_count) x k`` of each ingredient (rounding per node, never
    pooled), summed per item; keys in depth-first first-visit order.

    The tree can have millions of nodes at tier 12, but only a few hundred distinct (item, count)
    nodes: we walk that DAG once and weight each node by the number of tree paths that reach it.
    """
    book = world.book
    kids_of = world.cache.setdefault("kids", {})

    def kids(node: tuple[str, int]) -> list[tuple[str, int]]:
        if node not in kids_of:
            rec = book.recipes.get(node[0])
            execs = 0 if rec is None else -(-node[1] // rec.result_count)
            kids_of[node] = [] if rec is None else [(ing, execs * k) for ing, k in rec.ingredients.items()]
        return kids_of[node]

    first: dict[str, None] = {}
    post: list[tuple[str, int]] = []
    seen: set[tuple[str, int]] = set()

    def walk(node: tuple[str, int]) -> None:
        first.setdefault(node[0])
        if node in seen:  # its subtree's items were all visited the first time
            return
        seen.add(node)
        for child in kids(node):
            walk(child)
        post.append(node)

    paths: dict[tuple[str, int], int] = {}
    for item, count in targets.items():
        walk((item, count))
        paths[(item, count)] = paths.get((item, count), 0) + 1
    totals: dict[str, int] = {}
    for node in reversed(post):  # parents before children
        n_paths = paths.get(node, 0)
        totals[node[0]] = totals.get(node[0], 0) + node[1] * n_paths
        for child in kids(node):
            paths[child] = paths.get(child, 0) + n_paths
    return {item: totals[item] for item in first}


def gold_trajectory(
    world: PaperWorld, targets: dict[str, int], inventory: dict[str, int]
) -> list[dict[str, Any]] | None:
    """The public two-phase solver (``solve_crafting_task_synth`` of the shipped data): (1) total
    requirement per item over the recipe tree of every target, (2) craft every crafted item in increasing
    depth (ties: first-visit order), only what the inventory lacks, rounded up to whole executions.
    None when an ingredient runs short. Steps are ``{"action": "craft", "target": [item, executions],
    "ingredients": totals, "result_count": total}``.

    >>> gold_trajectory(paper_world(), {"m2_i2_12": 1}, {"m9_ore": 2, "m3_ore": 1})[-1]["target"]
    ['m2_i2_12', 1]
    """
    book = world.book
    for item in targets:
        if not book.knows(item):
            return None
    need = _requirements(world, targets)
    inv = dict(inventory)
    steps: list[dict[str, Any]] = []
    crafted = sorted((i for i in need if book.recipes.get(i) is not None), key=world.depth)
    for item in crafted:
        short = need[item] - inv.get(item, 0)
        if short <= 0:
            continue
        rec = book.recipes[item]
        execs = -(-short // rec.result_count)
        uses = {ing: execs * k for ing, k in rec.ingredients.items()}
        if any(inv.get(ing, 0) < n for ing, n in uses.items()):
            return None
        for ing, n in uses.items():
            inv[ing] -= n
            if inv[ing] <= 0:
                del inv[ing]
        inv[item] = inv.get(item, 0) + execs * rec.result_count
        steps.append(
            {
                "action": "craft",
                "target": [item, execs],
                "ingredients": uses,
                "result_count": execs * rec.result_count,
            }
        )
    return steps


# --- the public task generator ---------------------------------------------------------------------------
def _split_items(world: PaperWorld, rng: Draws) -> dict[str, dict[int, list[str]]]:
    """Per tier 1..12: shuffle the tier's items, the first 80% are train-only targets, the rest val-only."""
    out: dict[str, dict[int, list[str]]] = {"train": {}, "val": {}}
    for tier in range(1, 13):
        items = list(world.items_by_tier[tier])
        if not items:
            continue
        rng.shuffle(items)
        cut = int(len(items) * (1 - VAL_ITEM_FRACTION))
        out["train"][tier], out["val"][tier] = items[:cut], items[cut:]
    return out


def _draw_task(
    world: PaperWorld,
    rng: Draws,
    candidates: list[str],
    difficulty: str,
    seen: set[str],
    with_gold: bool = True,
) -> dict[str, Any] | None:
    """One public ``create_task_from_pool`` attempt over ``candidates`` (the split's items of the
    difficulty's tiers, in tier order): a task row without id, or None (duplicate or unsolvable)."""
    max_count = PAPER_DIFFICULTIES[difficulty][2]
    if not candidates:
        return None
    rng.randint(1, 1)  # the number of targets: max_targets is 1 everywhere, but the draw happens
    item = rng.sample_one(candidates)
    targets = {item: rng.randint(1, max_count)}
    key = str(sorted(targets.items()))
    if key in seen:
        return None
    needs = base_needs(world, targets)
    if not needs:
        return None
    inventory = {b: n + rng.randint(0, max(1, n // 2)) for b, n in needs.items()}
    for _ in range(rng.randint(1, 3)):  # 1-3 distractor draws; one already held draws no count
        extra = rng.choice(world.base_items)
        if extra not in inventory:
            inventory[extra] = rng.randint(1, 5)
    # The public solver never rejects here (the inventory covers base_needs, which bounds its phase-1
    # totals), so skipping it changes no draw; with_gold=True still runs and checks it.
    gold = gold_trajectory(world, targets, inventory) if with_gold else []
    if gold is None:
        return None
    seen.add(key)
    return {
        "goal": "Craft the following items: " + ", ".join(f"{n}x {i}" for i, n in targets.items()),
        "max_steps": MAX_STEPS,
        "misc": {
            "target_items": targets,
            "initial_inventory": inventory,
            "gold_trajectory": gold,
            "difficulty": difficulty,
            "max_depth": max(world.depth(t) for t in targets),
            "num_craft_steps": len(gold),
        },
    }


def world_ref(world: PaperWorld, items_per_domain_tier: int = ITEMS_PER_DOMAIN_TIER) -> dict[str, Any]:
    """The ``misc.recipe_book`` value naming this world (``tasks.book_for_task`` resolves it)."""
    return {
        "generator": "paper",
        "seed": world.book.seed,
        "items_per_domain_tier": items_per_domain_tier,
        "sha256": world.book.stable_hash(),
    }


SPLITS_CACHE_VERSION = 1
"""Part of the disk cache's key (with the generator's source): bump it when the stored layout changes."""


def _splits_cache_file(seed: int, items_per_domain_tier: int, base_order: tuple[str, ...] | None, with_gold: bool):
    """Where :func:`_splits` keeps one generation on disk: ``$SERA_CACHE/textcraft/paper_splits-<key>.json.gz``,
    the key a hash of the arguments and of this module's and recipes.py's source (an edit re-generates)."""
    here = Path(__file__).resolve()
    h = hashlib.sha256(repr((SPLITS_CACHE_VERSION, seed, items_per_domain_tier, base_order, with_gold)).encode())
    for source in (here, here.with_name("recipes.py")):
        h.update(source.read_bytes())
    return cache_root() / "textcraft" / f"paper_splits-{h.hexdigest()[:16]}.json.gz"


@functools.lru_cache(maxsize=4)
def _splits(
    seed: int, items_per_domain_tier: int, base_order: tuple[str, ...] | None, with_gold: bool = True
) -> dict[str, tuple[str, ...]]:
    """:func:`_make_splits`, kept on disk: drawing the 3,154 tasks (some 330,000 draws) takes ~3 s of one core
    in every process that asks for a task (each ``sera train`` and ``sera data``); reading them back ~0.2 s. A
    missing, unreadable or damaged file is drawn again (and rewritten when the cache is writable; nothing is
    lost when it is not)."""
    path = _splits_cache_file(seed, items_per_domain_tier, base_order, with_gold)
    try:
        stored = json.loads(gzip.decompress(path.read_bytes()))
        return {k: tuple(v) for k, v in stored.items()}
    except (OSError, EOFError, ValueError, AttributeError):
        pass
    out = _make_splits(seed, items_per_domain_tier, base_order, with_gold)
    try:
        write_bytes_atomic(path, gzip.compress(json.dumps(out).encode(), compresslevel=1))
    except OSError:
        pass
    return out


def _make_splits(
    seed: int, items_per_domain_tier: int, base_order: tuple[str, ...] | None, with_gold: bool = True
) -> dict[str, tuple[str, ...]]:
    """Draw the paper's train and val tasks (the public generator's procedure, see the module docstring)."""
    world = paper_world(seed, items_per_domain_tier)
    if base_order is not None:
        if sorted(base_order) != sorted(world.base_items):
            raise ValueError("base_order must list every base item of the world exactly once")
        world = dataclasses.replace(world, base_items=tuple(base_order), cache=world.cache)
    rng = Draws(seed)
    pools = _split_items(world, rng)
    ref = world_ref(world, items_per_domain_tier)
    out: dict[str, list[dict[str, Any]]] = {}
    for split in ("train", "val"):
        total = NUM_SAMPLES[split]
        want = {d: int(total * share) for d, share in DIFFICULTY_SHARE.items()}
        want["medium"] += total - sum(want.values())
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for diff, n_want in want.items():
            lo, hi, _ = PAPER_DIFFICULTIES[diff]
            candidates = [item for t in range(lo, hi + 1) for item in pools[split].get(t, [])]
            made = attempts = 0
            while made < n_want and attempts < n_want * ATTEMPTS_PER_TASK:
                attempts += 1
                row = _draw_task(world, rng, candidates, diff, seen, with_gold)
                if row is not None:
                    row["misc"]["split"] = split
                    row["misc"]["recipe_book"] = ref
                    rows.append(row)
                    made += 1
        out[split] = rows
    shuffler = Draws(seed + 1)  # train first, then val, from one generator
    for split in ("train", "val"):
        shuffler.shuffle(out[split])
    # Stored as JSON text so callers always get fresh, independent copies; difficulties on the side.
    stored: dict[str, tuple[str, ...]] = {}
    for split, rows in out.items():
        stored[split] = tuple(
            json.dumps({"id": f"textcraft_synth.{split}.{i}", **r}) for i, r in enumerate(rows)
        )
        stored[f"{split}:difficulty"] = tuple(r["misc"]["difficulty"] for r in rows)
    return stored


def paper_tasks(
    split: Literal["train", "val"],
    *,
    seed: int = PAPER_SEED,
    items_per_domain_tier: int = ITEMS_PER_DOMAIN_TIER,
    base_order: tuple[str, ...] | None = None,
    gold: bool = True,
) -> list[dict[str, Any]]:
    """The paper's tasks of ``split`` in the public order (fresh dicts; the generation is cached).

    ``base_order`` replaces :data:`BASE_ORDER` (e.g. the set order of one ``PYTHONHASHSEED``, to replay
    what the public code printed in such a process); it must list the 50 base items. ``gold=False``
    leaves ``gold_trajectory`` empty (and ``num_craft_steps`` 0): same tasks, three times faster.

    >>> val = paper_tasks("val")
    >>> len(val), val[0]["id"], val[0]["misc"]["difficulty"]
    (632, 'textcraft_synth.val.0', 'easy')
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    key = None if base_order is None else tuple(base_order)
    return [json.loads(s) for s in _splits(seed, items_per_domain_tier, key, gold)[split]]


def paper_difficulties(split: Literal["train", "val"]) -> list[str]:
    """The difficulty of every task of the paper's ``split``, in order (cheap: no row is decoded)."""
    return list(_splits(PAPER_SEED, ITEMS_PER_DOMAIN_TIER, None, True)[f"{split}:difficulty"])


def paper_rows(split: Literal["train", "val"], indices: list[int]) -> list[dict[str, Any]]:
    """Rows ``indices`` of the paper's ``split`` (fresh dicts), decoding only those."""
    rows = _splits(PAPER_SEED, ITEMS_PER_DOMAIN_TIER, None, True)[split]
    return [json.loads(rows[i]) for i in indices]


def main() -> None:
    ap = argparse.ArgumentParser(description="Write the paper's TextCraft-Synth tasks (JSONL).")
    ap.add_argument("--split", choices=("train", "val"), default="val")
    ap.add_argument("--out", default="", help="write the rows here (default: print a summary)")
    ap.add_argument(
        "--hash-seed",
        type=int,
        default=None,
        help="replay the public code as run under PYTHONHASHSEED=N (default: our fixed base-item order)",
    )
    a = ap.parse_args()
    order = None if a.hash_seed is None else base_order_for_hash_seed(a.hash_seed)
    rows = paper_tasks(a.split, base_order=order)
    if a.out:
        from common.data import write_jsonl

        write_jsonl(a.out, rows)
        print(f"wrote {len(rows)} tasks to {a.out}")
        return
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["misc"]["difficulty"]] = counts.get(r["misc"]["difficulty"], 0) + 1
    print(f"{len(rows)} {a.split} tasks: {counts}")
    for r in rows[:3]:
        print(json.dumps({"id": r["id"], "goal": r["goal"], "inventory": r["misc"]["initial_inventory"]}))


if __name__ == "__main__":
    main()
