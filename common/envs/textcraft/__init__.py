"""TextCraft-Synth (SPEC.md §2.1): a seeded recipe world, verified tasks, a shared-inventory world with
CodeAct tools, agent sessions with ``launch_subagent``, and a scripted oracle.

Map of the package:

* ``recipes.py`` -- the recipe-world generator and :class:`RecipeBook` (JSON table, stable hash)
* ``tasks.py``   -- planner/solver, task generator (train/val split by target item), task-file loader
* ``world.py``   -- :class:`TextCraftWorld`: shared inventory, ``craft``/``get_info``/``view_inventory``,
  fork/commit, root success
* ``prompts.py`` -- every prompt text (system prompt, first user message, observation notes)
* ``codeact.py`` -- parsing ``<thought>/<python>`` replies and formatting cell observations
* ``env.py``     -- :class:`TextCraftEnv` / :class:`TextCraftSession` (the ``common.envs.base`` contract)
* ``oracle.py``  -- a scripted solver policy (optionally delegating) and a minimal episode runner

Quick start: ``python -m common.envs.textcraft.oracle --n 40 --delegate``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # name -> submodule (imported on first use, so ``recipes``/``tasks`` never pull in the CodeAct worker)
    "LaunchRecord": "env",
    "TextCraftEnv": "env",
    "TextCraftSession": "env",
    "echo_launch_hook": "env",
    "EpisodeOutcome": "oracle",
    "drive": "oracle",
    "oracle_reply": "oracle",
    "run_episode": "oracle",
    "Recipe": "recipes",
    "RecipeBook": "recipes",
    "build_recipe_book": "recipes",
    "generate_recipe_book": "recipes",
    "DIFFICULTIES": "tasks",
    "CraftPlan": "tasks",
    "book_for_task": "tasks",
    "generate_tasks": "tasks",
    "goal_text": "tasks",
    "load_tasks": "tasks",
    "parse_goal_targets": "tasks",
    "plan_crafts": "tasks",
    "save_tasks": "tasks",
    "solve": "tasks",
    "split_targets": "tasks",
    "validate_task": "tasks",
    "TextCraftWorld": "world",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
