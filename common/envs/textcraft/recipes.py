"""TextCraft-Synth recipe worlds: a seeded generator and the :class:`RecipeBook` it produces (SPEC.md §2.1).

A recipe world has 5 material domains (metal ``m``, crystal ``c``, organic ``o``, arcane ``a``, tech ``t``),
each with 10 sub-domains (``m0`` .. ``m9``), and tiers 0..12:

* tier 0 = base items, one per sub-domain: ``m3_ore`` / ``c7_ore`` for metal and crystal, ``raw_o1`` /
  ``raw_a4`` / ``raw_t0`` for organic, arcane and tech. Base items have no recipe.
* tiers 1..12 = crafted items, ``25 - tier // 3`` of them per domain and tier. Item ``i`` of a tier belongs
  to sub-domain ``i % 10`` and is named ``{sub}_i{tier}`` (``a1_i5``); from tier 6 on the tier is repeated
  (``m0_i7_7``); items past the tenth of a tier get their index appended (``a1_i5_11``, ``m0_i7_7_10``).
* cross-domain items at tiers 10-12: every pair of domains at tier 10 (``x10_mc``), every triple at 11
  (``x11_mca``), every quadruple plus all five at 12 (``x12_mcoa``, ``x12_all``).

Every item has exactly one recipe: 1-6 distinct ingredients (tier 1: one; more at higher tiers) drawn from
the two tiers below in its domain, sometimes one tier further down, always at least one from the tier
just below (so an item's crafting depth equals its tier). Each ingredient is needed once or twice; the
recipe yields ``result_count`` items per execution (tier 1: 2-4, tier 2: 2-3, tiers 3-5: 1-2, >= 6: 1).
Seed 0 gives 1,466 items.

What it simplifies: one recipe per item (the public TextCraft has tag recipes and alternatives). The
generator here follows the public TextCraft-Synth *format* (names, tiers, counts) but is our own
(``generator="sera"`` in task rows): no seed of it reproduces the paper's world. The paper's world, its
generator reproduced draw for draw, is ``paper.paper_world()`` (a :class:`RecipeBook` too), and it is the
default world of task rows (``tasks.book_for_task``). Worlds made elsewhere are run by loading their table
with :meth:`RecipeBook.from_json`.

JSON table (``RecipeBook.to_json()``, format ``sera-textcraft-recipes/v1``)::

    {"format": "sera-textcraft-recipes/v1", "seed": 0,
     "items":   {"m0_ore": {"tier": 0, "domain": "m"}, "m0_i1": {"tier": 1, "domain": "m"}, ...},
     "recipes": {"m0_i1": {"ingredients": {"m0_ore": 1}, "result_count": 3}, ...}}

``items`` is optional on input (tiers then default to crafting depths, domains to ""); an item is a base
item iff it has no recipe. A recipe value may also be a one-element list (the public per-item list form).

Run: ``python -m common.envs.textcraft.recipes --seed 0 [--out book.json]`` prints a summary (and writes
the table).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "sera-textcraft-recipes/v1"
DOMAINS: tuple[str, ...] = ("m", "c", "o", "a", "t")
"""Domain letters in canonical order (metal, crystal, organic, arcane, tech)."""
DOMAIN_NAMES: dict[str, str] = {"m": "metal", "c": "crystal", "o": "organic", "a": "arcane", "t": "tech"}
SUBDOMAINS = 10
MAX_TIER = 12


def items_per_tier(tier: int) -> int:
    """Crafted items per domain at ``tier`` (1..12): 25, 24, ... thinning out slowly with the tier."""
    return 25 - tier // 3


def base_item_name(domain: str, sub: int) -> str:
    """``m3_ore`` / ``c7_ore`` for metal and crystal, ``raw_o1`` for the other domains."""
    return f"{domain}{sub}_ore" if domain in ("m", "c") else f"raw_{domain}{sub}"


def crafted_item_name(domain: str, tier: int, index: int) -> str:
    """Name of the ``index``-th crafted item of ``domain`` at ``tier`` (see the module docstring)."""
    name = f"{domain}{index % SUBDOMAINS}_i{tier}"
    if tier >= 6:
        name += f"_{tier}"
    if index >= SUBDOMAINS:
        name += f"_{index}"
    return name


def _result_count_range(tier: int) -> tuple[int, int]:
    if tier == 1:
        return (2, 4)
    if tier == 2:
        return (2, 3)
    if tier <= 5:
        return (1, 2)
    return (1, 1)


def _num_ingredients(tier: int, rng: random.Random) -> int:
    if tier == 1:
        return 1
    if tier == 2:
        return 2
    if tier <= 7:
        return 2 + rng.randint(0, min(2, tier // 3))
    if tier <= 11:
        return 3 + rng.randint(0, 2)
    return 4 + rng.randint(0, 2)


def _ingredient_count(tier: int, rng: random.Random) -> int:
    """Once or twice; twice is common at low tiers and rare above tier 4 (keeps base needs bounded)."""
    if tier <= 4:
        return rng.randint(1, 2)
    return 2 if rng.random() < 0.1 else 1


@dataclass(frozen=True)
class Recipe:
    """The one recipe of an item: ``ingredients`` consumed per execution, ``result_count`` produced."""

    ingredients: dict[str, int]
    """Ingredient name -> count per execution (treat as read-only)."""
    result_count: int
    """Items produced by one execution."""


@dataclass(frozen=True, eq=False)
class RecipeBook:
    """An immutable recipe world. Shared by every world/fork of every task that names it.

    >>> book = generate_recipe_book(0)
    >>> book.is_base("m3_ore"), book.tier("a1_i5"), book.recipe("m3_ore")
    (True, 5, None)
    """

    tiers: dict[str, int]
    """Every item -> its tier (base items: 0)."""
    recipes: dict[str, Recipe]
    """Crafted item -> its recipe. Items without a recipe are base items."""
    domains: dict[str, str] = field(default_factory=dict)
    """Item -> domain letter (``m``/``c``/``o``/``a``/``t``; ``x`` for cross-domain; "" when unknown)."""
    seed: int | None = None
    """The generator seed, or None for tables made elsewhere."""
    _depth: dict[str, int] = field(init=False, repr=False)
    _items: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        unknown = sorted({i for r in self.recipes.values() for i in r.ingredients} - set(self.tiers))
        if unknown:
            raise ValueError(f"recipe ingredients not listed as items: {unknown[:5]}")
        missing = sorted(set(self.recipes) - set(self.tiers))
        if missing:
            raise ValueError(f"recipes for items not listed as items: {missing[:5]}")
        object.__setattr__(self, "_depth", _crafting_depths(self.tiers, self.recipes))
        object.__setattr__(self, "_items", tuple(self.tiers))

    # --- queries -------------------------------------------------------------------------------------
    @property
    def items(self) -> tuple[str, ...]:
        """All item names (base items first, then by tier)."""
        return self._items

    @property
    def base_items(self) -> tuple[str, ...]:
        return tuple(i for i in self._items if i not in self.recipes)

    def recipe(self, item: str) -> Recipe | None:
        """The item's recipe, or None for base and unknown items."""
        return self.recipes.get(item)

    def knows(self, item: str) -> bool:
        return item in self.tiers

    def is_base(self, item: str) -> bool:
        """True for known items without a recipe (unknown items are not base items)."""
        return item in self.tiers and item not in self.recipes

    def tier(self, item: str) -> int:
        """The item's tier; raises KeyError for unknown items."""
        return self.tiers[item]

    def crafting_depth(self, item: str) -> int:
        """Longest chain of crafts from base items: 0 for base items, 1 + max over ingredients otherwise
        (0 for unknown items)."""
        return self._depth.get(item, 0)

    def items_of_tier(self, tier: int) -> list[str]:
        return [i for i in self._items if self.tiers[i] == tier]

    def __len__(self) -> int:
        return len(self._items)

    # --- serialisation -------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The documented JSON table (module docstring); ``from_json(to_json())`` is an identical book."""
        return {
            "format": FORMAT,
            "seed": self.seed,
            "items": {i: {"tier": self.tiers[i], "domain": self.domains.get(i, "")} for i in self._items},
            "recipes": {
                i: {"ingredients": dict(r.ingredients), "result_count": r.result_count}
                for i, r in self.recipes.items()
            },
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RecipeBook:
        """Build a book from a JSON table (ours, or one made by another generator). Raises ValueError
        with the offending item on malformed tables, unknown ingredients or recipe cycles."""
        if not isinstance(doc, Mapping):
            raise ValueError(f"recipe table must be a JSON object, got {type(doc).__name__}")
        raw_recipes = doc.get("recipes")
        if not isinstance(raw_recipes, Mapping) or not raw_recipes:
            raise ValueError(
                "recipe table needs a non-empty 'recipes' object {item: {ingredients, result_count}}"
            )
        recipes: dict[str, Recipe] = {}
        for item, rec in raw_recipes.items():
            if isinstance(rec, list):
                if len(rec) != 1:
                    raise ValueError(
                        f"recipe for {item!r}: exactly one recipe per item is supported, got {len(rec)}"
                    )
                rec = rec[0]
            if not isinstance(rec, Mapping):
                raise ValueError(f"recipe for {item!r} must be an object")
            ings = rec.get("ingredients")
            rc = rec.get("result_count", 1)
            if not isinstance(ings, Mapping) or not ings:
                raise ValueError(f"recipe for {item!r}: 'ingredients' must be a non-empty object")
            for ing, n in ings.items():
                if not isinstance(ing, str) or not _is_pos_int(n):
                    raise ValueError(
                        f"recipe for {item!r}: ingredient {ing!r} needs a positive integer count, got {n!r}"
                    )
            if not _is_pos_int(rc):
                raise ValueError(f"recipe for {item!r}: result_count must be a positive integer, got {rc!r}")
            recipes[str(item)] = Recipe(
                ingredients={k: int(v) for k, v in ings.items()}, result_count=int(rc)
            )
        raw_items = doc.get("items") or {}
        if not isinstance(raw_items, Mapping):
            raise ValueError("'items' must be an object {item: {tier, domain}}")
        names: list[str] = list(raw_items)
        seen = set(names)
        for item, rec in recipes.items():
            for n in itertools.chain([item], rec.ingredients):
                if n not in seen:
                    seen.add(n)
                    names.append(n)
        # Tiers default to crafting depths (computed on a provisional book).
        depths = _crafting_depths({n: 0 for n in names}, recipes)
        tiers: dict[str, int] = {}
        domains: dict[str, str] = {}
        for n in names:
            meta = raw_items.get(n) or {}
            if not isinstance(meta, Mapping):
                raise ValueError(f"items[{n!r}] must be an object")
            t = meta.get("tier", depths[n])
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                raise ValueError(f"items[{n!r}].tier must be a non-negative integer, got {t!r}")
            tiers[n] = t
            domains[n] = str(meta.get("domain", ""))
        # Base first, then by tier, keeping the table's order within a tier.
        order = sorted(range(len(names)), key=lambda k: (tiers[names[k]], k))
        tiers = {names[k]: tiers[names[k]] for k in order}
        seed = doc.get("seed")
        return cls(
            tiers=tiers,
            recipes=recipes,
            domains={n: domains[n] for n in tiers},
            seed=seed if isinstance(seed, int) else None,
        )

    @classmethod
    def load(cls, path: str | Path) -> RecipeBook:
        """Read a JSON table from ``path`` (errors name the file)."""
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: invalid JSON in recipe table: {e.msg}") from None
        try:
            return cls.from_json(doc)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    @functools.cached_property
    def _hash(self) -> str:
        canon = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode("utf-8")).hexdigest()

    def stable_hash(self) -> str:
        """sha256 (hex) of the canonical JSON table: names a world independently of how it was built."""
        return self._hash


def _is_pos_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _crafting_depths(tiers: Mapping[str, int], recipes: Mapping[str, Recipe]) -> dict[str, int]:
    """Longest craft chain per item, iteratively (no recursion limit); ValueError on a recipe cycle."""
    depth: dict[str, int] = {}
    for root in tiers:
        if root in depth:
            continue
        stack: list[tuple[str, bool]] = [(root, False)]
        on_path: set[str] = set()
        while stack:
            item, expanded = stack.pop()
            if item in depth:
                continue
            rec = recipes.get(item)
            if rec is None:
                depth[item] = 0
                continue
            if expanded:
                on_path.discard(item)
                depth[item] = 1 + max(depth[i] for i in rec.ingredients)
                continue
            if item in on_path:
                raise ValueError(f"recipe cycle through {item!r}")
            on_path.add(item)
            stack.append((item, True))
            for ing in rec.ingredients:
                if ing not in depth:
                    if ing in on_path:
                        raise ValueError(f"recipe cycle through {ing!r}")
                    stack.append((ing, False))
    return depth


# --- the generator ------------------------------------------------------------------------------------
def _cross_domain_combos() -> list[tuple[int, str, tuple[str, ...]]]:
    out: list[tuple[int, str, tuple[str, ...]]] = []
    for tier, k in ((10, 2), (11, 3), (12, 4)):
        for combo in itertools.combinations(DOMAINS, k):
            out.append((tier, f"x{tier}_{''.join(combo)}", combo))
    out.append((12, "x12_all", DOMAINS))
    return out


def build_recipe_book(seed: int = 0) -> RecipeBook:
    """Generate a fresh recipe world from ``seed`` (deterministic; see the module docstring)."""
    rng = random.Random(seed)
    tiers: dict[str, int] = {}
    domains: dict[str, str] = {}
    recipes: dict[str, Recipe] = {}
    by_dt: dict[tuple[str, int], list[str]] = {}  # (domain, tier) -> items in index order
    sub_of: dict[str, int] = {}

    for d in DOMAINS:
        names = [base_item_name(d, s) for s in range(SUBDOMAINS)]
        by_dt[(d, 0)] = names
        for s, n in enumerate(names):
            tiers[n], domains[n], sub_of[n] = 0, d, s

    for tier in range(1, MAX_TIER + 1):
        for d in DOMAINS:
            made: list[str] = []
            for idx in range(items_per_tier(tier)):
                name = crafted_item_name(d, tier, idx)
                sub = idx % SUBDOMAINS
                recipes[name] = _make_recipe(rng, d, tier, sub, by_dt, sub_of)
                tiers[name], domains[name], sub_of[name] = tier, d, sub
                made.append(name)
            by_dt[(d, tier)] = made

    for tier, name, combo in _cross_domain_combos():
        ings: dict[str, int] = {}
        for j, d in enumerate(combo):
            # The first domain's ingredient comes from the tier just below (depth == tier); the others
            # from one to three tiers below.
            t = tier - 1 if j == 0 else tier - rng.randint(1, 3)
            ings[rng.choice(by_dt[(d, t)])] = rng.randint(1, 2)
        recipes[name] = Recipe(ingredients=ings, result_count=1)
        tiers[name], domains[name] = tier, "x"

    tiers = dict(sorted(tiers.items(), key=lambda kv: kv[1]))  # by tier, generation order within a tier
    return RecipeBook(tiers=tiers, recipes=recipes, domains={i: domains[i] for i in tiers}, seed=seed)


def _make_recipe(
    rng: random.Random,
    domain: str,
    tier: int,
    sub: int,
    by_dt: Mapping[tuple[str, int], list[str]],
    sub_of: Mapping[str, int],
) -> Recipe:
    def pick(pool: list[str], taken: set[str]) -> str | None:
        free = [p for p in pool if p not in taken]
        if not free:
            return None
        same = [p for p in free if sub_of[p] == sub]
        # Half of the picks stay in the item's own sub-domain family when it has candidates.
        if same and rng.random() < 0.5:
            return rng.choice(same)
        return rng.choice(free)

    n = _num_ingredients(tier, rng)
    below = by_dt[(domain, tier - 1)]
    two_below = by_dt[(domain, tier - 2)] if tier >= 2 else []
    chosen: list[str] = []
    taken: set[str] = set()
    first = pick(below, taken)
    assert first is not None
    chosen.append(first)
    taken.add(first)
    # Sometimes one ingredient from further down (tier - 3 or tier - 4).
    if tier >= 3 and len(chosen) < n and rng.random() < 0.3:
        deep_tier = max(0, tier - rng.randint(3, 4))
        deep = pick(by_dt[(domain, deep_tier)], taken)
        if deep is not None:
            chosen.append(deep)
            taken.add(deep)
    while len(chosen) < n:
        pool = below if (not two_below or rng.random() < 0.6) else two_below
        nxt = pick(pool, taken)
        if nxt is None:
            break
        chosen.append(nxt)
        taken.add(nxt)
    ings = {c: _ingredient_count(tier, rng) for c in chosen}
    lo, hi = _result_count_range(tier)
    return Recipe(ingredients=ings, result_count=rng.randint(lo, hi))


@functools.lru_cache(maxsize=8)
def generate_recipe_book(seed: int = 0) -> RecipeBook:
    """The recipe world for ``seed``, generated once per process and shared (books are immutable)."""
    return build_recipe_book(seed)


def summarize(book: RecipeBook) -> dict[str, Any]:
    """Counts per tier, recipe sizes and the hash, for humans."""
    per_tier = {t: len(book.items_of_tier(t)) for t in range(MAX_TIER + 1)}
    sizes = [len(r.ingredients) for r in book.recipes.values()]
    return {
        "seed": book.seed,
        "items": len(book),
        "base_items": len(book.base_items),
        "per_tier": per_tier,
        "ingredients_per_recipe": {k: sizes.count(k) for k in sorted(set(sizes))},
        "sha256": book.stable_hash(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Generate a TextCraft-Synth recipe world and print a summary.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=str, default="", help="write the JSON table here")
    args = ap.parse_args()
    b = build_recipe_book(args.seed)
    print("\n".join(f"{k}: {v}" for k, v in summarize(b).items()))
    if args.out:
        b.save(args.out)
        print(f"wrote {args.out}")
