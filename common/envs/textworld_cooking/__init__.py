"""Real Microsoft TextWorld ``tw-cooking`` games as a SERA environment (needs ``pip install textworld``).

| module      | what                                                                          |
|-------------|-------------------------------------------------------------------------------|
| `games.py`  | offline, seeded, cached game generation; task records (`generate_tasks`, ...)  |
| `env.py`    | `TextWorldCookingEnv`: one real game, one avatar, agents act in turn           |
| `oracle.py` | `oracle_reply(session)`: follows the game's walkthrough                        |

Importing this package does not import ``textworld``; building a world or generating a game does.
Quick start: ``python -m common.envs.textworld_cooking.oracle --tier medium --seed 1``.
"""

from common.envs.textworld_cooking.env import (
    DEFAULT_GOAL,
    TextWorldCookingEnv,
    TextWorldCookingSession,
    TextWorldCookingWorld,
    format_subagent_results,
)
from common.envs.textworld_cooking.games import (
    TIERS,
    CookingSettings,
    default_cache_dir,
    game_metadata,
    generate_game,
    generate_tasks,
    load_tasks,
    request_infos,
    resolve_game_file,
    save_tasks,
)
from common.envs.textworld_cooking.oracle import oracle_command, oracle_reply, walkthrough_progress

__all__ = [
    "DEFAULT_GOAL",
    "TIERS",
    "CookingSettings",
    "TextWorldCookingEnv",
    "TextWorldCookingSession",
    "TextWorldCookingWorld",
    "default_cache_dir",
    "format_subagent_results",
    "game_metadata",
    "generate_game",
    "generate_tasks",
    "load_tasks",
    "oracle_command",
    "oracle_reply",
    "request_infos",
    "resolve_game_file",
    "save_tasks",
    "walkthrough_progress",
]
