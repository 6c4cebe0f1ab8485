"""The TextCraft-Synth world: one shared inventory over an immutable recipe book, and the three state tools.

Every agent of a rollout (root and children) acts on the SAME :class:`TextCraftWorld` unless the runtime
hands a child a ``fork()``. The tools are plain methods with the exact semantics and error strings of
SPEC.md §2.1; they never raise on bad arguments, they return ``"Error: ..."`` strings (the model reads
them as observations):

* ``craft(ingredients, target)`` -- ``target = (item, total_count)``; ``total_count`` must be a multiple
  of the recipe's ``result_count``; ``ingredients`` must equal the recipe scaled by
  ``total_count // result_count`` exactly (no missing, no extra, no wrong amounts); the inventory must
  hold them. Success: ``Successfully crafted 6 a1_i5(s)``. The strings are the public environment's
  (``platoon/textcraft/env.py``), e.g. ``Error: All 1 recipe(s) failed for a1_i5. Errors:\nRecipe 1:
  Wrong amount of m3_ore. Need 4, provided 2`` (every item has exactly one recipe, numbered from 1).
* ``get_info(items)`` -- per item ``{item, can_craft, is_base, in_inventory, crafting_depth, recipes}``;
  ``crafting_depth`` is the item's tier, as the public ``get_crafting_depth`` (in the paper's world a
  tier-2 item made from base items only reports 2, although one craft makes it).
* ``view_inventory()`` -- a copy of the inventory.

``fork()`` copies the inventory dict only (the book, the targets and the initial inventory are immutable
and shared), which keeps it at a few microseconds. ``commit(branch)`` copies a branch's state into this
world IN PLACE (the same dict object), so sessions holding this world see it.

Root success (SPEC): the root called finish with a non-empty message AND every target's count rose by at
least the required amount over the initial inventory (items already present never count).

Deviations from the public tools (docs/fidelity/textcraft_data.md): a list ``[item, count]`` target is
accepted like a tuple (tool calls may cross a process boundary as JSON), ``True``/``False`` are not
counts, ``get_info`` accepts one name as well as a list and adds an ``error`` key for unknown items.
Simplifies: crafting is atomic and instantaneous; there is no capacity limit.
Run: covered by ``pytest tests/test_textcraft_world.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base import World
from .recipes import RecipeBook

SUCCESS_PREFIX = "Successfully crafted"


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _tname(x: Any) -> str:
    return type(x).__name__


class TextCraftWorld(World):
    """Shared inventory + recipe book of one task."""

    __slots__ = ("book", "inventory", "targets", "initial_inventory", "root_finish_message")

    def __init__(
        self,
        book: RecipeBook,
        inventory: Mapping[str, int],
        targets: Mapping[str, int],
        initial_inventory: Mapping[str, int] | None = None,
    ):
        self.book: RecipeBook = book
        self.inventory: dict[str, int] = {k: int(v) for k, v in inventory.items() if v}
        """The live inventory (item -> count > 0). Mutated in place by craft and commit."""
        self.targets: dict[str, int] = dict(targets)
        """The root task's targets (net gains required on top of ``initial_inventory``)."""
        self.initial_inventory: dict[str, int] = dict(
            self.inventory if initial_inventory is None else initial_inventory
        )
        """The inventory at task start (never mutated; shared by forks)."""
        self.root_finish_message: str | None = None
        """Set by the root session when it calls finish (None: the root has not finished)."""

    # --- World contract -------------------------------------------------------------------------------
    def fork(self) -> TextCraftWorld:
        w = object.__new__(TextCraftWorld)
        w.book = self.book
        w.inventory = self.inventory.copy()
        w.targets = self.targets
        w.initial_inventory = self.initial_inventory
        w.root_finish_message = self.root_finish_message
        return w

    def commit(self, branch: World) -> None:
        if not isinstance(branch, TextCraftWorld):
            raise TypeError(f"can only commit a TextCraftWorld, got {_tname(branch)}")
        if branch.book is not self.book and branch.book.stable_hash() != self.book.stable_hash():
            raise ValueError("cannot commit a branch of a different recipe world")
        inv = self.inventory
        inv.clear()
        inv.update(branch.inventory)
        self.root_finish_message = branch.root_finish_message

    def net_gain(self, item: str, since: Mapping[str, int] | None = None) -> int:
        """Count now minus count in ``since`` (default: the initial inventory)."""
        base = self.initial_inventory if since is None else since
        return self.inventory.get(item, 0) - base.get(item, 0)

    def targets_met(self, targets: Mapping[str, int], since: Mapping[str, int]) -> bool:
        """Every target rose by at least its count since the snapshot ``since``."""
        inv = self.inventory
        return all(inv.get(t, 0) - since.get(t, 0) >= n for t, n in targets.items())

    def root_success(self) -> bool:
        msg = self.root_finish_message
        if not msg or not msg.strip():
            return False
        return self.targets_met(self.targets, self.initial_inventory)

    def describe(self) -> str:
        inv = ", ".join(f"{k}: {v}" for k, v in sorted(self.inventory.items())) or "(empty)"
        prog = ", ".join(f"{t}: {self.net_gain(t)}/{n} crafted" for t, n in self.targets.items())
        return f"Inventory: {{{inv}}}\nTask targets (net gain/required): {prog}"

    # --- tools ----------------------------------------------------------------------------------------
    def craft(self, ingredients: Any, target: Any) -> str:
        """Craft ``target = (item, total_count)`` from exactly the scaled recipe ``ingredients``."""
        if not isinstance(ingredients, dict):
            return f"Error: ingredients must be a dict, got {_tname(ingredients)}"
        if not isinstance(target, (tuple, list)) or len(target) != 2:
            return "Error: target must be a tuple of (item_name, count)"
        item, count = target
        if not isinstance(item, str):
            return f"Error: target item must be a string, got {_tname(item)}"
        if not _is_int(count):
            return f"Error: target count must be an int, got {_tname(count)}"
        if count <= 0:
            return f"Error: target count must be positive, got {count}"
        for ing, n in ingredients.items():
            if not isinstance(ing, str):
                return f"Error: ingredient name must be a string, got {_tname(ing)}"
            if not _is_int(n):
                return f"Error: ingredient count for {ing} must be an int, got {_tname(n)}"
            if n <= 0:
                return f"Error: ingredient count for {ing} must be positive, got {n}"
        rec = self.book.recipes.get(item)
        if rec is None:
            return f"Error: No recipe found for {item}"
        head = f"Error: All 1 recipe(s) failed for {item}. Errors:\nRecipe 1: "
        if count % rec.result_count:
            return head + f"Target count {count} is not divisible by recipe result count {rec.result_count}"
        n_exec = count // rec.result_count
        for ing, per in rec.ingredients.items():
            if ing not in ingredients:
                return head + f"Missing required ingredient {ing}"
            if ingredients[ing] != per * n_exec:
                return head + f"Wrong amount of {ing}. Need {per * n_exec}, provided {ingredients[ing]}"
        extra = [i for i in ingredients if i not in rec.ingredients]
        if extra:
            return head + f"Extra ingredients not required: {', '.join(extra)}"
        inv = self.inventory
        short = [
            f"{i}: need {n}, have {inv.get(i, 0)}"
            for i in rec.ingredients
            if inv.get(i, 0) < (n := ingredients[i])
        ]
        if short:
            return head + f"Insufficient ingredients in inventory: {', '.join(short)}"
        for i, n in ingredients.items():
            left = inv[i] - n
            if left:
                inv[i] = left
            else:
                del inv[i]
        inv[item] = inv.get(item, 0) + count
        return f"{SUCCESS_PREFIX} {count} {item}(s)"

    def item_info(self, item: Any) -> dict[str, Any]:
        if not isinstance(item, str):
            return {"item": repr(item), "error": f"item names must be strings, got {_tname(item)}"}
        book = self.book
        rec = book.recipes.get(item)
        info: dict[str, Any] = {
            "item": item,
            "can_craft": rec is not None,
            "is_base": book.is_base(item),
            "in_inventory": self.inventory.get(item, 0),
            "crafting_depth": book.tiers.get(item, 0),
            "recipes": (
                [{"ingredients": dict(rec.ingredients), "result_count": rec.result_count}] if rec else []
            ),
        }
        if not book.knows(item):
            info["error"] = f"Unknown item: {item}"
        return info

    def get_info(self, items: Any) -> list[dict[str, Any]] | str:
        """Info for each item of ``items`` (a single name is accepted too)."""
        if isinstance(items, str):
            items = [items]
        if not isinstance(items, (list, tuple, set, frozenset)):
            return f"Error: items must be a list of item names, got {_tname(items)}"
        return [self.item_info(i) for i in items]

    def view_inventory(self) -> dict[str, int]:
        return dict(self.inventory)
