"""Environment registry: ``make_env(name)`` and ``load_tasks(name, path)`` for the three benchmarks.

| name                | what                                                   | module                         |
|---------------------|--------------------------------------------------------|--------------------------------|
| `textcraft`         | TextCraft-Synth, CodeAct crafting (SPEC §2.1)          | common/envs/textcraft          |
| `textworld`         | TextWorld-Sync, multi-dish cooking, shared world (§2.2)| common/envs/textworld_sync     |
| `textworld-cooking` | real Microsoft TextWorld `tw-cooking` games            | common/envs/textworld_cooking  |

Imports are lazy so that ``textworld`` (an optional extra) is only needed for `textworld-cooking`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from common.envs.base import Environment

ENV_NAMES = ("textcraft", "textworld", "textworld-cooking")


_FACTORIES: dict[str, Callable[..., Environment]] = {}
_LOADERS: dict[str, Callable[[str], list[dict[str, Any]]]] = {}


def register_env(
    spec: EnvSpec,
    factory: Callable[..., Environment],
    load_tasks: Callable[[str], list[dict[str, Any]]] | None = None,
) -> None:
    """Add your own environment: ``make_env(spec.name)`` builds it with ``factory``, the trainers read its
    rules from ``spec``, and ``load_tasks(spec.name, path)`` uses ``load_tasks`` (default: plain JSONL).
    See tutorials/10_your_own_environment.py."""
    ENV_SPECS[spec.name] = spec
    _FACTORIES[spec.name] = factory
    if load_tasks is not None:
        _LOADERS[spec.name] = load_tasks


def make_env(name: str, **kwargs: Any) -> Environment:
    """Build an environment by name (see the table above, or :func:`register_env`)."""
    if name in _FACTORIES:
        return _FACTORIES[name](**kwargs)
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
    if name in _FACTORIES:
        from common.data import read_jsonl

        return _LOADERS.get(name, read_jsonl)(path)
    if name == "textcraft":
        from common.envs.textcraft.tasks import load_tasks as load
    elif name == "textworld":
        from common.envs.textworld_sync.tasks import load_tasks as load
    elif name == "textworld-cooking":
        from common.envs.textworld_cooking import load_tasks as load
    else:
        raise ValueError(f"unknown environment {name!r}; choose one of {', '.join(ENV_NAMES)}")
    return load(path)


@dataclass(frozen=True)
class EnvSpec:
    """What the trainer, the evaluator and the CLI need to know about an environment, in one place.

    These are the environment's own rules (SPEC.md §4, §5), not run settings: a tier reads them from here
    instead of testing ``cfg.env == "textcraft"`` in its loop.
    """

    name: str
    """Registry name (``--env``)."""
    stop: tuple[str, ...]
    """Stop strings of agent steps (TextCraft: generation may stop at ``</python>``)."""
    paper_steps: int
    """Optimizer steps of the paper's training run."""
    zero_variance: Literal["drop", "keep"]
    """Execution stage: a task group without signal is dropped (and replaced) or kept at zero advantage."""
    replace_flat_groups: bool
    """Execution stage: roll out another task in place of a group without signal."""
    aggregation: Literal["task_weighted", "macro_over_tiers"]
    """How `sera eval` averages success over tiers."""
    filter_error_steps: bool = False
    """Execution stage: a successful agent's steps whose cell failed give no datum (TextCraft; public
    ``trainer.py: build_workflows`` passes ``filter_errors=is_craft``). The rule: :mod:`common.rl.filters`."""

    @property
    def caps(self):
        """The paper's token caps (context, prompt at eval / in training, output): one definition, in
        :data:`common.policy.context.PAPER_CAPS`."""
        from common.policy.context import PAPER_CAPS

        return PAPER_CAPS[self.name]

    def generate_tasks(self, split: str, n: int, seed: int, tier: str | None = None) -> list[dict[str, Any]]:
        """A generated task pool of this environment. ``tier``: one tier, None = all tiers, or ``"paper"``
        = the paper's training mix (TextCraft: medium tasks of the paper split, as the public training
        config; TextWorld-Sync: the paper's tier/family proportions)."""
        if self.name == "textcraft":
            from common.envs.textcraft.tasks import generate_tasks

            return generate_tasks(
                split=split, n=n, seed=seed, difficulty="medium" if tier == "paper" else tier
            )
        if self.name == "textworld":
            from common.envs.textworld_sync.tasks import generate_tasks as gen_tw

            if tier == "paper":
                return gen_tw(split=split, n=n, seed=seed, mix="paper")
            return gen_tw(split=split, n=n, seed=seed, tier=tier)
        if self.name != "textworld-cooking":
            raise ValueError(f"environment {self.name!r} has no task generator; pass a task file (--tasks)")
        from common.envs.textworld_cooking import generate_tasks as gen_cooking

        return gen_cooking(n=n, seed=seed, settings="medium" if tier in (None, "paper") else tier)


ENV_SPECS: dict[str, EnvSpec] = {
    "textcraft": EnvSpec(
        "textcraft", ("</python>",), 250, "drop", True, "task_weighted", filter_error_steps=True
    ),
    "textworld": EnvSpec("textworld", (), 400, "keep", False, "macro_over_tiers"),
    "textworld-cooking": EnvSpec("textworld-cooking", (), 400, "keep", False, "macro_over_tiers"),
}
"""The one definition of every environment's rules (its token caps: :attr:`EnvSpec.caps`)."""


def env_spec(name: str) -> EnvSpec:
    """The :class:`EnvSpec` of ``name`` (a clear error for an unknown name)."""
    if name not in ENV_SPECS:
        raise ValueError(f"unknown environment {name!r}; choose one of {', '.join(ENV_NAMES)}")
    return ENV_SPECS[name]
