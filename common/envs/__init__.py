"""Environment registry: ``make_env(name)`` and ``load_tasks(name, path)`` for the three benchmarks.

| name                | what                                                   | module                         |
|---------------------|--------------------------------------------------------|--------------------------------|
| `textcraft`         | TextCraft-Synth, CodeAct crafting (SPEC §2.1)          | common/envs/textcraft          |
| `textworld`         | TextWorld-Sync, multi-dish cooking, shared world (§2.2)| common/envs/textworld_sync     |
| `textworld-cooking` | real Microsoft TextWorld `tw-cooking` games            | common/envs/textworld_cooking  |

Imports are lazy so that ``textworld`` (an optional extra) is only needed for `textworld-cooking`.
"""

from __future__ import annotations

from typing import Any

from common.envs.base import Environment

ENV_NAMES = ("textcraft", "textworld", "textworld-cooking")


def make_env(name: str, **kwargs: Any) -> Environment:
    """Build an environment by name (see the table above)."""
    if name == "textcraft":
        from common.envs.textcraft import TextCraftEnv

        return TextCraftEnv(**kwargs)
    if name == "textworld":
        from common.envs.textworld_sync import TextWorldSyncEnv

        return TextWorldSyncEnv(**kwargs)
    if name == "textworld-cooking":
        from common.envs.textworld_cooking import TextWorldCookingEnv

        return TextWorldCookingEnv(**kwargs)
    raise ValueError(f"unknown environment {name!r}; choose one of {', '.join(ENV_NAMES)}")


def load_tasks(name: str, path: str) -> list[dict[str, Any]]:
    """Load and validate a task file for environment ``name`` (errors name file:line)."""
    if name == "textcraft":
        from common.envs.textcraft.tasks import load_tasks as load
    elif name == "textworld":
        from common.envs.textworld_sync.tasks import load_tasks as load
    elif name == "textworld-cooking":
        from common.envs.textworld_cooking import load_tasks as load
    else:
        raise ValueError(f"unknown environment {name!r}; choose one of {', '.join(ENV_NAMES)}")
    return load(path)


# Per-environment runtime defaults of the paper (SPEC.md §4, §5): prompt cap, output cap per call, stop.
ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    "textcraft": {"max_prompt_tokens": 10_240, "max_new_tokens": 512, "stop": ("</python>",)},
    "textworld": {"max_prompt_tokens": 13_312, "max_new_tokens": 3_072, "stop": ()},
    "textworld-cooking": {"max_prompt_tokens": 13_312, "max_new_tokens": 3_072, "stop": ()},
}


def runtime_config_for(name: str, **overrides: Any):
    """A :class:`~common.agent.runtime.RuntimeConfig` with the paper's caps for ``name`` plus overrides."""
    from common.agent.runtime import RuntimeConfig

    if name not in ENV_DEFAULTS:
        raise ValueError(f"unknown environment {name!r}; choose one of {', '.join(ENV_NAMES)}")
    return RuntimeConfig(**{**ENV_DEFAULTS[name], **overrides})
