"""Every piece of text the TextCraft-Synth agent reads that is not a tool result: the system prompt, the
first user message, and the notes the session adds to observations (SPEC.md §2.1).

All prompt text lives in this one module so it can be read, diffed and changed in one place. The wording is
our own. The system prompt explains: the reply format ``<thought>...</thought><python>...</python>``; the
five tools with one example each; that targets count ON TOP of what is already held; that independent
intermediates may be delegated to sub-agents (recursively, in parallel when independent); that launches
must be awaited; the step budget.

Simplifies: one prompt for every depth; the runtime refuses launches past the maximum depth, and the
refusal text tells the model so.
Run: ``python -m common.envs.textcraft.prompts`` prints the system prompt and a sample first message.
"""

from __future__ import annotations

from collections.abc import Mapping

SYSTEM_PROMPT = """\
You are a crafting agent in TextCraft, a world of procedurally generated items. Base items (names like \
m3_ore, c7_ore, raw_o1) cannot be crafted; every other item (a1_i5, m0_i7_7, x10_mc, ...) has exactly one \
recipe. Item names carry no meaning: look recipes up with get_info.

You act by writing Python. Each reply has exactly this form:
<thought>your reasoning about what to do next</thought>
<python>
# code to run
</python>
The code runs in a persistent namespace (variables and functions you define stay available in later \
replies); top-level `await` works. Everything you print, plus any error, is shown to you as the next \
observation. Each reply costs one step of your budget of {max_steps} steps, so do a lot in each step: \
loops and helper functions are encouraged.

Tools (already defined in the namespace):

1. craft(ingredients: dict, target: tuple[str, int]) -> str
   Consumes `ingredients` from the inventory and adds target[1] items of target[0]. target[1] must be a \
multiple of the recipe's result_count; `ingredients` must be the recipe's ingredients each multiplied by \
target[1] // result_count, exactly (nothing missing, nothing extra). Returns "Successfully crafted ..." or \
an "Error: ..." string that says what was wrong.
   Example (recipe {{"m3_ore": 2}} with result_count 3; 2 executions):
   print(craft({{"m3_ore": 4}}, ("m3_i1", 6)))

2. get_info(items: list) -> list[dict]
   For each item: {{"item", "can_craft", "is_base", "in_inventory", "crafting_depth", "recipes"}}; \
"recipes" is a list of {{"ingredients": {{name: count per execution}}, "result_count": int}}; \
crafting_depth is 0 for base items and the longest chain of crafts below the item otherwise.
   Example: info = get_info(["a1_i5", "raw_a1"]); print(info[0]["recipes"])

3. view_inventory() -> dict
   The current inventory {{item: count}}.
   Example: print(view_inventory())

4. finish(message: str)
   Ends your work; call it once your targets are crafted, with a short non-empty summary. Calling \
finish is required: work that is never finished counts as failed.
   Example: finish("Crafted 3x a1_i5.")

5. async launch_subagent(targets: dict, context: str = "") -> str
   Starts a sub-agent that crafts `targets` ({{item: count}}) in the same shared inventory and returns \
its report (its finish message and the steps it used). A sub-agent has its own budget of steps, which \
does not use yours. It must be awaited: a launch that is not awaited never runs. Independent \
sub-targets can run in parallel with asyncio.gather; a sub-agent may itself delegate further.
   Example: print(await launch_subagent({{"a1_i4": 2}}, context="ingredient for 3x a1_i5"))
   Parallel example:
   reports = await asyncio.gather(launch_subagent({{"a1_i4": 2}}), launch_subagent({{"a2_i3": 1}}))

Rules and advice:
- Targets count ON TOP of what is already in the inventory: "Craft 3x a1_i5" with 1 a1_i5 held means \
you must end with 4. Items that were there before you started never count.
- Plan from the recipes: find every intermediate item you need, how many, and craft bottom-up (lower \
crafting_depth first), rounding up to whole recipe executions.
- The inventory is shared with other agents working on the same task: check it before relying on it.
- Delegate when a task is deep: intermediates that do not depend on each other can be handed to \
sub-agents (in parallel), then you craft what remains. Small tasks are faster to do yourself.
"""

TOOLS_DESCRIPTION = (
    "A TextCraft sub-agent writes Python in a persistent namespace with these tools: "
    "craft(ingredients: dict, target: (item, count)) crafts from the SHARED inventory (the count must be a "
    "multiple of the recipe's result_count and the ingredients must match the recipe exactly, scaled); "
    "get_info(items) returns recipes, crafting depths and held counts; view_inventory() returns the shared "
    "inventory; finish(message) ends the sub-agent with a report; await launch_subagent(targets, context) "
    "delegates further. Its targets count on top of what the inventory held when it started; it succeeds "
    "when it calls finish after crafting them."
)
"""Shown to the rubric writer as the child's tools (``Environment.tools_description``)."""

CHILD_CONTEXT_HEADER = "Context from the agent that launched you:"


def system_prompt(max_steps: int = 20) -> str:
    """The system message (identical for every depth)."""
    return SYSTEM_PROMPT.format(max_steps=max_steps)


def format_inventory(inventory: Mapping[str, int]) -> str:
    if not inventory:
        return "(empty)"
    return ", ".join(f"{k}: {v}" for k, v in sorted(inventory.items()))


def first_user_message(goal: str, inventory: Mapping[str, int], max_steps: int, context: str = "") -> str:
    """Goal (+ the parent's context for children), the current inventory, the budget, what to do next."""
    parts = [f"Your goal: {goal}"]
    if context:
        parts.append(f"{CHILD_CONTEXT_HEADER}\n{context}")
    parts.append(f"Current inventory: {format_inventory(inventory)}")
    parts.append(
        f"You have {max_steps} steps. Reply with <thought>...</thought><python>...</python>; "
        "call finish(message) when the targets are crafted."
    )
    return "\n\n".join(parts)


def parse_error_observation(error: str) -> str:
    """Observation for a reply that could not be parsed (the step still counts; the parser's error
    already says which format is expected)."""
    return f"Your reply could not be run: {error}"


def steps_left_note(steps_left: int) -> str:
    """Appended to every observation so the agent can pace itself."""
    if steps_left == 1:
        return "\n[1 step left: finish in your next reply.]"
    return f"\n[{steps_left} steps left.]"


BUDGET_EXHAUSTED = "\n[Step budget exhausted: you have been stopped without finishing.]"
UNAWAITED_LAUNCH = (
    "\nNote: launch_subagent(...) was called without `await`, so that sub-agent never ran. "
    "Write `await launch_subagent(...)`, or `await asyncio.gather(launch_subagent(...), ...)`."
)
FINISH_RECORDED = "Finished: {message}"


def launch_report(message: str, steps_used: int, max_steps: int) -> str:
    """What a parent reads back from a sub-agent (the budget line as in SPEC §1)."""
    return f"{message}\n\nBudget used by subagent: {steps_used}/{max_steps} steps."


def child_did_not_finish(reason: str | None) -> str:
    if reason:
        return f"The sub-agent did not finish: {reason}"
    return "The sub-agent did not finish (it ran out of steps without calling finish)."


def child_context(parent_goal: str) -> str:
    """Default context the oracle passes to its children."""
    return f"This is an ingredient for my own goal: {parent_goal}"


if __name__ == "__main__":
    print(system_prompt(20))
    print("-" * 80)
    print(first_user_message("Craft the following items: 3x a1_i5", {"raw_a1": 12, "raw_a4": 3}, 20))
