"""TextWorld-Sync (SPEC.md §2.2): a multi-dish cooking world shared by every agent of the recursive tree.

* ``world``    -- :class:`SyncWorld`, the locked pure-Python coordinator (fork / commit / root_success);
* ``protocol`` -- the public ``extract_decision`` / ``extract_action`` (and the stricter ``parse_reply``);
* ``env``      -- :class:`TextWorldSyncEnv` and :class:`SyncSession` (the environment contract);
* ``prompts``  -- ``load_prompts(dir)``: every agent-facing text, as template files in ``templates/``;
* ``tasks``    -- load public SERA rows, generate new ones (7 families x 4 tiers);
* ``oracle``   -- a scripted policy that solves tasks within every budget.

The names below are imported lazily (so ``python -m common.envs.textworld_sync.<module>`` runs cleanly).
Quick check: ``python -m common.envs.textworld_sync.oracle`` solves the shared sample rows.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SyncSession": "env",
    "TextWorldSyncEnv": "env",
    "OracleRun": "oracle",
    "oracle_reply": "oracle",
    "run_oracle_episode": "oracle",
    "sample_tasks_path": "oracle",
    "solve": "oracle",
    "Delegation": "protocol",
    "ParsedReply": "protocol",
    "parse_reply": "protocol",
    "extract_action": "protocol",
    "extract_decision": "protocol",
    "PromptSet": "prompts",
    "load_prompts": "prompts",
    "FAMILIES": "tasks",
    "TIERS": "tasks",
    "food_catalogue": "tasks",
    "generate_task": "tasks",
    "generate_tasks": "tasks",
    "load_tasks": "tasks",
    "normalize_row": "world",
    "validate_row": "tasks",
    "GoalScope": "world",
    "SyncStep": "world",
    "SyncWorld": "world",
    "WorldState": "world",
    "bench_sync": "world",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
