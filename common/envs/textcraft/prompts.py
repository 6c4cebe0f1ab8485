"""Every text a TextCraft-Synth agent reads that is not a tool result, as template files in one place.

The templates live in ``templates/textcraft_*.txt`` beside this module (shipped as package data). Their structure
follows the paper's CodeAct agent (public platoon/SERA code): the conversation grows turn by turn
("sequence extension"):

* **system** (``textcraft_system.txt``): the crafting role, "craft on top of what you hold", ``<thought>`` then
  ``<python>``, the notebook-style execution, the recommendation to delegate;
* **first user message** (``textcraft_user_initial.txt``): ``# Task`` (``textcraft_task.txt``: ``Your Goal: ...`` and
  ``Budget: You have a total budget of N steps ...`` with the budget the session enforces),
  ``# Action Space`` (``textcraft_action_space.txt``: the five functions, signatures and examples) and the
  next-action line (``textcraft_next_action.txt``). A child's goal carries its parent's context
  (``textcraft_child_goal.txt``: ``Context provided from parent agent: ...``);
* **each observation** (``textcraft_observation.txt``): ``[Cell i Output]`` (``i`` counts steps from 0), the
  output, ``Error: ...`` (``textcraft_error.txt``) or ``(No output)``, then the next-action line;
* **errors of a cell that never ran**: syntax error, empty cell, unawaited ``launch_subagent``, task
  introspection (``textcraft_syntax_error.txt``, ``textcraft_empty_cell.txt``, ``textcraft_unawaited.txt``, ``textcraft_introspection.txt``);
* **what a parent reads back** from a child (``textcraft_launch_report.txt``: the child's finish message, then
  ``Budget used by subagent: u/N steps.``) and the loop detector's finish message (``textcraft_loop_finish.txt``).

``load_prompts(prompts_dir)`` reads them; a file of the same name in ``prompts_dir`` (the CLI's
``--prompts DIR``) replaces the packaged one, so a user holding the original texts can evaluate the
released checkpoints with them. Rules (``string.Template``): ``$name`` / ``${name}`` are placeholders,
``$$`` is a literal dollar; the file's final newline is dropped; a placeholder a template may not use is
an error naming ``file:line``.

Simplifies: one system prompt for every depth (the runtime refuses launches past the maximum depth and
says so); no Jinja conditionals.
Run: ``python -m common.envs.textcraft.prompts`` prints a root agent's first two messages.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from common.templates import PromptTemplateError, load_template, pick, user_dir

__all__ = ["PromptTemplateError", "TextCraftPrompts", "load_prompts"]

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
"""The packaged templates (``pyproject`` package data must include ``*.txt``)."""
PREFIX = "textcraft_"
"""Every TextCraft template file is ``textcraft_<name>.txt``, so one ``--prompts-dir`` can hold the
templates of every environment and of the rubric writer and scorer without name clashes."""

SPEC: dict[str, frozenset[str]] = {
    "system": frozenset({"max_steps"}),
    "task": frozenset({"goal", "max_steps"}),
    "child_goal": frozenset({"goal", "context"}),
    "user_initial": frozenset({"task", "action_space", "next_action", "max_steps"}),
    "action_space": frozenset(),
    "next_action": frozenset(),
    "observation": frozenset({"index", "body", "next_action"}),
    "no_output": frozenset(),
    "error": frozenset({"error"}),
    "syntax_error": frozenset({"line", "message"}),
    "empty_cell": frozenset(),
    "unawaited": frozenset({"name"}),
    "introspection": frozenset({"name"}),
    "unawaited_runtime": frozenset({"count"}),
    "launch_report": frozenset({"message", "used", "budget"}),
    "child_not_finished": frozenset({"reason"}),
    "child_no_reason": frozenset(),
    "finish_recorded": frozenset({"message"}),
    "loop_finish": frozenset(),
    "tools_description": frozenset(),
}
"""Template name -> the placeholders it may use."""


@dataclass(frozen=True)
class TextCraftPrompts:
    """The loaded templates and the functions that fill them."""

    texts: dict[str, str]
    """Template name -> text."""
    sources: dict[str, str]
    """Template name -> the file it was read from."""

    def _fill(self, template: str, /, **values: Any) -> str:
        return Template(self.texts[template]).substitute({k: str(v) for k, v in values.items()})

    # --- the conversation -----------------------------------------------------------------------------
    def system(self, max_steps: int) -> str:
        return self._fill("system", max_steps=max_steps)

    def goal(self, goal: str, context: str = "") -> str:
        """The goal as the agent reads it (a child's carries the parent's context)."""
        return self._fill("child_goal", goal=goal, context=context) if context else goal

    def first_user_message(self, goal: str, max_steps: int, context: str = "") -> str:
        task = self._fill("task", goal=self.goal(goal, context), max_steps=max_steps)
        return self._fill(
            "user_initial",
            task=task,
            action_space=self.texts["action_space"],
            next_action=self.texts["next_action"],
            max_steps=max_steps,
        )

    def observation(self, index: int, output: str, error: str | None) -> str:
        """``[Cell index Output]``, the output, ``Error: ...`` or ``(No output)``, the next-action line."""
        parts = []
        if output and output.strip():
            parts.append(output.rstrip("\n"))
        if error:
            parts.append(self._fill("error", error=error.rstrip("\n")))
        body = "\n".join(parts) if parts else self.texts["no_output"]
        return self._fill("observation", index=index, body=body, next_action=self.texts["next_action"])

    # --- errors of cells that never ran -----------------------------------------------------------------
    def syntax_error(self, line: str, message: str) -> str:
        return self._fill("syntax_error", line=line, message=message)

    def empty_cell(self) -> str:
        return self.texts["empty_cell"]

    def unawaited(self, names: tuple[str, ...]) -> str:
        return "\n".join(self._fill("unawaited", name=n) for n in names)

    def introspection(self, names: tuple[str, ...]) -> str:
        return "\n".join(self._fill("introspection", name=n) for n in names)

    def unawaited_runtime(self, count: int) -> str:
        return self._fill("unawaited_runtime", count=count)

    # --- delegation and finishing -----------------------------------------------------------------------
    def launch_report(self, message: str, steps_used: int, max_steps: int) -> str:
        return self._fill("launch_report", message=message, used=steps_used, budget=max_steps)

    def child_did_not_finish(self, reason: str | None) -> str:
        return self._fill("child_not_finished", reason=reason or self.texts["child_no_reason"])

    def finish_recorded(self, message: str) -> str:
        return self._fill("finish_recorded", message=message)

    @property
    def loop_finish_message(self) -> str:
        return self.texts["loop_finish"]

    @property
    def tools_description(self) -> str:
        return self.texts["tools_description"]


@functools.lru_cache(maxsize=16)
def _load(prompts_dir: str | None) -> TextCraftPrompts:
    user = user_dir(prompts_dir)
    paths = {name: pick(f"{PREFIX}{name}.txt", TEMPLATE_DIR, user) for name in SPEC}
    texts = {name: load_template(path, SPEC[name]) for name, path in paths.items()}
    return TextCraftPrompts(texts, {name: str(path) for name, path in paths.items()})


def load_prompts(prompts_dir: str | Path | None = None) -> TextCraftPrompts:
    """The TextCraft templates; files in ``prompts_dir`` replace the packaged ones of the same name.

    >>> p = load_prompts()
    >>> print(p.first_user_message("Craft the following items: 2x m1_i3", 25).split("\\n")[2:4])
    ['Your Goal: Craft the following items: 2x m1_i3', 'Budget: You have a total budget of 25 steps to complete this task.']
    >>> print(p.observation(0, "", "NameError: name 'x' is not defined"))
    [Cell 0 Output]
    Error: NameError: name 'x' is not defined
    <BLANKLINE>
    Give your next step: a brief <thought> </thought>, then the code to run in <python> </python>.
    """
    return _load(str(prompts_dir) if prompts_dir is not None else None)


# --- module-level helpers with the packaged templates (kept for callers that do not pass a directory) ---
def system_prompt(max_steps: int = 20) -> str:
    return load_prompts().system(max_steps)


def first_user_message(goal: str, max_steps: int, context: str = "") -> str:
    return load_prompts().first_user_message(goal, max_steps, context)


def launch_report(message: str, steps_used: int, max_steps: int) -> str:
    return load_prompts().launch_report(message, steps_used, max_steps)


def child_did_not_finish(reason: str | None) -> str:
    return load_prompts().child_did_not_finish(reason)


def child_context(parent_goal: str) -> str:
    """Default context the oracle passes to its children."""
    return f"This is an ingredient for my own goal: {parent_goal}"


def __getattr__(name: str) -> str:
    if name == "TOOLS_DESCRIPTION":
        return load_prompts().tools_description
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    p = load_prompts()
    print(p.system(25))
    print("-" * 80)
    print(p.first_user_message("Craft the following items: 3x m2_i5", 25))
