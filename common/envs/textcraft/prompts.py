"""Every text a TextCraft-Synth agent reads that is not a tool result, as template files in one place.

The templates live in ``templates/textcraft_*.txt`` beside this module (shipped as package data). Their structure
and fixed formats follow the paper's CodeAct agent as platoon renders it (``prompt_builder.py`` with the Jinja
templates ``user-initial``, ``user-observation``, ``user-next-action-str``; the depth-aware TextCraft agent and
budget tracker); the instructions are in this project's words. The conversation grows turn by turn
("sequence extension"):

* **system** (``textcraft_system.txt``): the crafting role, "craft on top of what you hold", a ``<TIPS>`` block
  (crafting strategy, delegation strategy), then ``<thought>`` / ``<python>`` and the notebook-style execution;
* **first user message** (``textcraft_user_initial.txt``): ``# Task`` (``textcraft_task.txt``: ``Your Goal: ...`` and
  ``Budget: You have a total budget of N steps ...`` with the budget the session enforces),
  ``# Action Space`` (``textcraft_action_space.txt``: the five functions, signatures and examples) and the
  next-action line (``textcraft_next_action.txt``). A child's goal carries its parent's context
  (``textcraft_child_goal.txt``: ``Context provided from parent agent: ...``);
* **each observation** (``textcraft_observation.txt``, placeholders ``$index``, ``$output``, ``$error``,
  ``$next_action``): ``[Cell i Output]`` (``i`` counts steps from 0), then ``$output`` = the cell's output
  as the paper's IPython shell captures it (prints, the ``Out[1]: ...`` value line, the traceback of an
  exception the cell raised; ``codeact.cell_slots``), or ``textcraft_no_output.txt`` (``(No output)``) when
  there is none, then ``$error`` = ``textcraft_error.txt`` (``Error: ...``) when the error slot is not empty
  (what the cell wrote to stderr, or the message of a cell that never ran), else empty; the error follows
  the output with no separator of its own, as platoon's ``user-observation`` renders it;
* **past assistant turns** are rebuilt from the parsed reply (``textcraft_history_thought.txt`` and
  ``textcraft_history_code.txt``, joined by a newline; a part the reply lacks is left out), as platoon's
  ``_format_action_for_history``; the runtime asks the session for them (``assistant_turn``);
* **errors of a cell that never ran**: syntax error, empty cell, unawaited ``launch_subagent``, task
  introspection (``textcraft_syntax_error.txt``, ``textcraft_empty_cell.txt``, ``textcraft_unawaited.txt``, ``textcraft_introspection.txt``);
* **what a parent reads back** from a child (``textcraft_launch_report.txt``: the child's finish message, then
  ``Budget used by subagent: u/N steps. Total remaining budget for the current task is R steps.`` and a final
  newline, R = the parent's own budget minus its steps before the current one), a launch refused at the depth
  limit (``textcraft_depth_refusal.txt``: ``Not enough budget to launch subagent for goal ...``) and the loop
  detector's finish message (``textcraft_loop_finish.txt``);
* **the child's tools as the rubric writer reads them** (``textcraft_tools_description.txt``: the short list
  of tool names, as public ``stages/common.py: rubric_context``).

``load_prompts(prompts_dir)`` reads them; a file of the same name in ``prompts_dir`` (the CLI's
``--prompts-dir DIR``) replaces the packaged one, so a user holding the original texts can evaluate the
released checkpoints with them and get the public rendering byte for byte. Rules (``string.Template``):
``$name`` / ``${name}`` are placeholders, ``$$`` is a literal dollar; the file's final newline is dropped (a
file that ends in two newlines yields a text that ends in one); a placeholder a template may not use is an
error naming ``file:line``.

Simplifies: one system prompt for every depth (the runtime refuses launches past the maximum depth and
says so); no Jinja conditionals (the code chooses what fills ``$output`` and ``$error``).
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
    "observation": frozenset({"index", "output", "error", "next_action"}),
    "no_output": frozenset(),
    "error": frozenset({"error"}),
    "syntax_error": frozenset({"line", "message"}),
    "empty_cell": frozenset(),
    "unawaited": frozenset({"name"}),
    "introspection": frozenset({"name"}),
    "unawaited_runtime": frozenset({"count"}),
    "launch_report": frozenset({"message", "used", "budget", "remaining"}),
    "depth_refusal": frozenset({"goal", "depth", "max_depth"}),
    "history_thought": frozenset({"thought"}),
    "history_code": frozenset({"code"}),
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
        """``[Cell index Output]``, the output slot (or ``(No output)``), ``Error: ...`` right after it when
        the error slot is not empty, then the next line of the template (platoon's ``user-observation``)."""
        return self._fill(
            "observation",
            index=index,
            output=output if output else self.texts["no_output"],
            error=self._fill("error", error=error) if error else "",
            next_action=self.texts["next_action"],
        )

    def assistant_turn(self, thought: str | None, code: str | None) -> str:
        """A past reply as the next prompts show it: rebuilt from its parsed parts (platoon's
        ``_format_action_for_history``); a missing or empty part is left out."""
        parts = []
        if thought:
            parts.append(self._fill("history_thought", thought=thought))
        if code:
            parts.append(self._fill("history_code", code=code))
        return "\n".join(parts)

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
    def launch_report(self, message: str, steps_used: int, max_steps: int, remaining: int) -> str:
        """The child's message, its steps out of its budget, and ``remaining``: the parent's own steps left."""
        return self._fill(
            "launch_report", message=message, used=steps_used, budget=max_steps, remaining=remaining
        )

    def depth_refusal(self, goal: str, depth: int, max_depth: int) -> str:
        """What ``await launch_subagent(...)`` returns past the maximum depth (no child runs)."""
        return self._fill("depth_refusal", goal=goal, depth=depth, max_depth=max_depth)

    def child_did_not_finish(self, reason: str | None) -> str:
        return self._fill("child_not_finished", reason=reason or self.texts["child_no_reason"])

    def finish_recorded(self, message: str) -> str:
        """What ``finish(message)`` returns to the cell (``textcraft_finish_recorded.txt``; public
        ``agents/actions/common.py: finish`` returns the message itself)."""
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
    >>> print(p.observation(0, "5\\n", None))
    [Cell 0 Output]
    5
    <BLANKLINE>
    Write your next step.
    >>> print(p.observation(1, "", "No code available to execute."))
    [Cell 1 Output]
    (No output)Error: No code available to execute.
    Write your next step.
    """
    return _load(str(prompts_dir) if prompts_dir is not None else None)


# --- module-level helpers with the packaged templates (kept for callers that do not pass a directory) ---
def system_prompt(max_steps: int = 20) -> str:
    return load_prompts().system(max_steps)


def first_user_message(goal: str, max_steps: int, context: str = "") -> str:
    return load_prompts().first_user_message(goal, max_steps, context)


def launch_report(message: str, steps_used: int, max_steps: int, remaining: int) -> str:
    return load_prompts().launch_report(message, steps_used, max_steps, remaining)


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
