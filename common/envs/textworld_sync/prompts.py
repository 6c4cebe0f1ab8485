"""Every text a TextWorld-Sync agent reads, as template files in ``templates/`` (one place), and the
functions that fill them.

The structure follows the public SERA evaluation prompt builder
(``Runtime/prompts/textworld_evaluation.py``, OliverLeeXZ/SERA): the same sections (``# Task``,
``# Initial Observation``, ``# Valid Actions``, ``# Action Space``, ``# Delegation``), the same turn
header (``[Step i Observation]``), the same per-turn lines (``Budget used by current Agent``,
``Current Agent remaining budget``, ``Valid Actions``, ``Score``, ``Task Success``, ``Task Failure``,
``Done``), the same tags (``<TIPS>``, ``<action>``, ``<delegate>``, ``<finish>``) and JSON keys
(``goal``, ``delegations``, ``max_steps``), the same ``[SubAgent Results]`` and ``[Inventory Lookup]``
blocks. The prose is our own wording.

Two sets, as the public code has two builders: the EVALUATION set (``system.txt``, ``initial_user.txt``,
``turn.txt``: ``Runtime/prompts/textworld_evaluation.py``, with the decomposition advice, the
``BUDGET-AWARE COLLABORATION:`` paragraph, the ``Budget:`` line of the first message and the per-turn budget
lines) and the TRAINING set (``train_system.txt``, ``train_initial_user.txt``, ``train_turn.txt``:
``Runtime/prompts/textworld_training.py``, without them). ``load_prompts(DIR, prompt_set=...)`` picks one;
every other template is shared. Training rollouts use the training set, ``sera eval`` / ``sera rollout`` the
evaluation set (``common/run/rollout.py: make_env_with_prompts``). ``tools_description.txt`` is the child's
tool list the rubric writer reads (public ``textworld_continuous_policy/adapter.py: available_tools``).

Templates use ``string.Template`` placeholders (``${name}``; ``$$`` is a literal dollar sign), so JSON
braces need no escaping. Each file loses exactly one trailing newline when loaded. To evaluate with
other texts (for example the original ones), put files with the same names in a directory and call
``load_prompts(DIR)`` (``--prompts-dir DIR`` on the CLI): a file found there replaces the default, a missing
one keeps the default, an unknown file name or an unknown placeholder is an error naming the file (files of
the other template families, ``rubric_*``, ``score_*``, ``textcraft_*``, are left to their own loaders).

Print the prompts of a sample task: ``python -m common.envs.textworld_sync.prompts [DIR]``.
"""

from __future__ import annotations

import functools
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.templates import PromptTemplateError, load_template

TEMPLATE_DIR = Path(__file__).with_name("templates")
RUNTIME_PROMPTS = Path(__file__).resolve().parents[2] / "agent" / "prompts"
"""The runtime's own templates (``fork_budget.txt``, ...): one ``--prompts-dir`` serves both loaders."""
_SYSTEM = frozenset({"agent_id", "depth", "delegation_strategy"})
_INITIAL_USER = frozenset(
    {"task", "agent_max_steps", "observation", "valid_actions", "action_space", "delegation_section"}
)
_TURN = frozenset(
    {
        "index",
        "observation",
        "steps_used",
        "agent_max_steps",
        "remaining_steps",
        "valid_actions",
        "score",
        "task_success",
        "task_failure",
        "done",
        "subagent_note",
    }
)
FIELDS: dict[str, frozenset[str]] = {
    "system": _SYSTEM,
    "train_system": _SYSTEM,
    "delegation_strategy": frozenset({"max_depth", "depth"}),
    "action_space_delegate": frozenset(),
    "action_space_act": frozenset(),
    "initial_user": _INITIAL_USER,
    "train_initial_user": _INITIAL_USER,
    "delegation_section": frozenset(),
    "turn": _TURN,
    "train_turn": _TURN,
    "subagent_note": frozenset(),
    "inventory_lookup": frozenset({"inventory", "observation"}),
    "delegation_results": frozenset({"results", "observation"}),
    "subagent_result": frozenset(
        {
            "agent_id",
            "returned",
            "environment_success",
            "steps",
            "max_steps",
            "remaining_steps",
            "result",
            "final_observation",
        }
    ),
    "delegation_rejected": frozenset({"depth", "max_depth", "observation"}),
    "fork_budget_agent": frozenset({"parent_agent_id", "group"}),
    "tools_description": frozenset(),
    # the training runtime's own blocks (textworld_continuous_policy/env.py + the launch coordinator)
    "train_inventory_lookup": frozenset({"inventory", "observation"}),
    "train_delegation_results": frozenset({"results"}),
    "train_subagent_result": frozenset({"index", "result"}),
    "train_launch_report": frozenset({"message", "used", "budget", "remaining"}),
    "train_no_return": frozenset(),
    "train_budget_exhausted": frozenset(),
    "train_depth_refusal": frozenset({"goal", "depth", "max_depth"}),
    "train_branch_depth_refusal": frozenset({"max_depth"}),
}
"""Template name -> the placeholders it may use (all optional)."""
PROMPT_SETS = ("evaluation", "training")
"""``evaluation``: the public evaluation builder's texts; ``training``: the public training builder's."""
TRAINING_NAMES = {"system": "train_system", "initial_user": "train_initial_user", "turn": "train_turn"}
"""The templates the training set takes from other files (every other template is shared)."""
FINAL_OBSERVATION_CHARS = 1200
"""A child's final observation is cut to this many characters in the results block (public)."""


def _load_file(path: Path, name: str) -> string.Template:
    return string.Template(load_template(path, FIELDS[name]))


@dataclass(frozen=True)
class PromptSet:
    """The loaded templates of one prompt directory (defaults for files it does not hold)."""

    templates: dict[str, string.Template]
    source: str
    """Where they came from (``default`` or the user's directory)."""
    prompt_set: str = "evaluation"
    """``evaluation`` or ``training`` (which system / first-message / turn templates are used)."""

    def _name(self, name: str) -> str:
        return TRAINING_NAMES.get(name, name) if self.prompt_set == "training" else name

    def render(self, name: str, **fields: Any) -> str:
        return self.templates[self._name(name)].substitute({k: str(v) for k, v in fields.items()})

    @property
    def tools_description(self) -> str:
        """The child's tools as the rubric writer reads them (``tools_description.txt``)."""
        return self.render("tools_description")

    # ---- the agent's messages -------------------------------------------------------------------
    def system(self, agent_id: str, depth: int, max_depth: int, allow_subagents: bool = True) -> str:
        """The system message; the delegation strategy only when this agent may still delegate."""
        can_delegate = allow_subagents and depth < max_depth
        strategy = (
            self.render("delegation_strategy", max_depth=max_depth, depth=depth) if can_delegate else ""
        )
        return self.render("system", agent_id=agent_id, depth=depth, delegation_strategy=strategy)

    def initial_user(
        self,
        task: str,
        observation: str,
        infos: dict[str, Any],
        agent_max_steps: int,
        allow_subagents: bool = True,
    ) -> str:
        """The first user message. As in public, the action space offers delegation whenever sub-agents
        are enabled at all (the depth limit is enforced when a delegation arrives)."""
        return self.render(
            "initial_user",
            task=task,
            agent_max_steps=agent_max_steps,
            observation=observation,
            valid_actions=format_valid_actions(infos),
            action_space=self.render("action_space_delegate" if allow_subagents else "action_space_act"),
            delegation_section=self.render("delegation_section") if allow_subagents else "",
        )

    def turn(
        self,
        index: int,
        observation: str,
        infos: dict[str, Any],
        agent_max_steps: int,
        allow_subagents: bool = True,
    ) -> str:
        """The user message after the agent's ``index``-th reply (0-based), from that step's observation
        and infos."""
        used = min(index + 1, agent_max_steps)
        return self.render(
            "turn",
            index=index,
            observation=observation or "(No observation)",
            steps_used=used,
            agent_max_steps=agent_max_steps,
            remaining_steps=max(agent_max_steps - used, 0),
            valid_actions=format_valid_actions(infos),
            score=float(infos.get("score", 0.0)),
            task_success=bool(infos.get("tasksuccess", False)),
            task_failure=bool(infos.get("taskfailure", False)),
            done=bool(infos.get("done", False)),
            subagent_note=self.render("subagent_note") if allow_subagents else "",
        )

    # ---- observation blocks ---------------------------------------------------------------------
    def inventory_lookup(self, inventory: str, observation: str) -> str:
        return self.render(
            "inventory_lookup", inventory=inventory.strip() or "(empty)", observation=observation
        )

    def delegation_results(self, children: list[dict[str, Any]], observation: str) -> str:
        """``children``: dicts with agent_id, returned, environment_success, steps, max_steps, finish_message,
        final_observation (the public child record)."""
        results = "\n".join(
            self.render(
                "subagent_result",
                agent_id=c["agent_id"],
                returned=bool(c["returned"]),
                environment_success=bool(c["environment_success"]),
                steps=c["steps"],
                max_steps=c["max_steps"],
                remaining_steps=max(int(c["max_steps"]) - int(c["steps"]), 0),
                result=c.get("finish_message") or "(no explicit finish message)",
                final_observation=str(c.get("final_observation", ""))[:FINAL_OBSERVATION_CHARS],
            )
            for c in children
        )
        return self.render("delegation_results", results=results, observation=observation)

    def delegation_rejected(self, depth: int, max_depth: int, observation: str) -> str:
        return self.render("delegation_rejected", depth=depth, max_depth=max_depth, observation=observation)

    def fork_budget_agent(self, parent_agent_id: str, group: str) -> str:
        """The agent id of the pseudo-child a test-time fork-budget refusal reports (public
        ``rubric_selector.py: select_delegated_trajectory``)."""
        return self.render("fork_budget_agent", parent_agent_id=parent_agent_id, group=group)

    # ---- the training runtime's blocks (public textworld_continuous_policy/env.py) ------------------
    def train_inventory_lookup(self, inventory: str, observation: str) -> str:
        """``TextWorldEnv.step``: the inventory as ``infos`` has it (not stripped), then the observation."""
        return self.render("train_inventory_lookup", inventory=inventory, observation=observation)

    def train_launch_report(self, message: str, used: int, budget: int, remaining: int) -> str:
        """What one public training launch returns (``AsyncRubricRolloutCoordinator.launch_subagent``,
        ``verbose=True``): the child's finish message, else its error, then the budget line."""
        return self.render(
            "train_launch_report", message=message, used=used, budget=budget, remaining=remaining
        )

    def train_depth_refusal(self, goal: str, depth: int, max_depth: int) -> str:
        """What a launch past the depth limit returns in public training (``Not enough budget to launch
        subagent for goal ...`` + ``DepthAwareStepBudgetTracker``'s message and guidance)."""
        return self.render("train_depth_refusal", goal=goal, depth=depth, max_depth=max_depth)

    def train_branch_depth_refusal(self, max_depth: int) -> str:
        """What a launch past the depth limit returns in a Rubric-stage rollout (public
        ``textworld_two_stage_rollout.py``)."""
        return self.render("train_branch_depth_refusal", max_depth=max_depth)

    @property
    def train_budget_exhausted(self) -> str:
        """A child's error once its own budget is spent (platoon ``halt_episode``)."""
        return self.render("train_budget_exhausted")

    def train_delegation_results(self, reports: list[str]) -> str:
        """``_child_result_summary``: one line per launch, its report stripped (or the no-return text); no
        verdict, no final observation, no current observation."""
        lines = "\n".join(
            self.render("train_subagent_result", index=i, result=r.strip() or self.render("train_no_return"))
            for i, r in enumerate(reports)
        )
        return self.render("train_delegation_results", results=lines)


def format_valid_actions(infos: dict[str, Any]) -> str:
    """``- a`` per line, or ``(none)`` (public ``_valid_actions``)."""
    actions = infos.get("validActions", [])
    if not isinstance(actions, list):
        return str(actions)
    return "\n".join(f"- {a}" for a in actions) or "(none)"


@functools.cache
def _defaults() -> dict[str, string.Template]:
    missing = [n for n in FIELDS if not (TEMPLATE_DIR / f"{n}.txt").exists()]
    if missing:
        raise RuntimeError(
            f"the packaged TextWorld-Sync templates are missing {missing} in {TEMPLATE_DIR}; reinstall the package"
        )
    return {n: _load_file(TEMPLATE_DIR / f"{n}.txt", n) for n in FIELDS}


def load_prompts(directory: str | Path | None = None, prompt_set: str = "evaluation") -> PromptSet:
    """The default templates, with any ``NAME.txt`` found in ``directory`` replacing its default;
    ``prompt_set`` = ``evaluation`` (``sera eval``) or ``training`` (training rollouts)."""
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"prompt_set must be one of {PROMPT_SETS}, got {prompt_set!r}")
    templates = dict(_defaults())
    if directory is None:
        return PromptSet(templates, "default", prompt_set)
    d = Path(directory)
    if not d.is_dir():
        raise FileNotFoundError(f"prompt directory not found: {d} (pass a directory of NAME.txt templates)")
    for path in sorted(d.glob("*.txt")):
        name = path.stem
        if name.startswith(("rubric_", "score_", "textcraft_")) or (RUNTIME_PROMPTS / path.name).exists():
            continue  # other loaders' templates (the runtime's: common/agent/prompts)
        if name not in FIELDS:
            raise PromptTemplateError(
                f"{path}: unknown template name {name!r}; expected one of {sorted(FIELDS)}"
            )
        templates[name] = _load_file(path, name)
    return PromptSet(templates, str(d), prompt_set)


@functools.cache
def default_prompts(prompt_set: str = "evaluation") -> PromptSet:
    """The packaged templates (loaded once per set)."""
    return load_prompts(None, prompt_set)


if __name__ == "__main__":  # pragma: no cover - manual check
    import sys

    from common.envs.textworld_sync.tasks import generate_tasks
    from common.envs.textworld_sync.world import SyncWorld

    p = load_prompts(sys.argv[1] if len(sys.argv) > 1 else None)
    task = generate_tasks("train", 1, seed=0)[0]
    w = SyncWorld(task)
    obs, infos = w.observe_with_infos("0")
    print(p.system("0", 0, 3))
    print("-" * 80)
    print(p.initial_user(task["task_description"], obs, infos, 20))
    print("-" * 80)
    out = w.step("0", infos["validActions"][0])
    print(p.turn(0, out.observation, out.infos or {}, 20))
