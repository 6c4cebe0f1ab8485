"""Every text the TextWorld-Sync agents read, in one place: the system prompt and the first user message.

The system prompt explains the shared kitchen, the action grammar, the reply protocol (one block per
reply) and delegation; it changes only with the agent's depth (agents at the maximum depth are told they
cannot delegate). The first message gives the goal, the budgets and the agent's current observation.

What it simplifies: no few-shot transcripts, one short example per block kind.

Print both for a sample task: ``python -m common.envs.textworld_sync.prompts``.
"""

from __future__ import annotations

SYSTEM_PROMPT = """\
You are a cooking agent in TextWorld-Sync, a text kitchen that several agents share at the same time.
Everything except your own location is shared: the ingredients, one shared inventory, the prepared counter,
the meals, the kitchen gate, the tools and ONE global budget of world actions for the whole task.

How the kitchen works
- Ingredients lie in rooms (the kitchen's fridge and counter, the pantry shelf, ...). "take X" puts X in the
  shared inventory (if there is room). Ingredients that need no preparation go straight to the prepared
  counter when taken.
- Preparation = one cooking state and one cutting state, e.g. (grilled, diced). "raw" means do not cook it,
  "uncut" means do not cut it. Cut with "chop X", "slice X", "dice X" or "mince X"; cook with
  "cook X in stove" (fried), "cook X in oven" (roasted) or "cook X on grill" (grilled). Tools are in the
  kitchen. A cut or cook the recipe does not ask for ruins the ingredient and the whole task FAILS.
  When an ingredient has exactly its required preparation it moves to the prepared counter.
- "prepare D" once every ingredient of dish D is on the counter, then "eat D". The task succeeds only when
  EVERY dish is prepared and eaten.
- Some ingredients may be behind the closed kitchen gate: "open door" opens it for everyone.
- After a tool is used it may need a few shared steps to cool down (see "Tool cooldowns").
- Other actions: "look around", "read cookbook" (all recipes), "go to ROOM", "move DIRECTION",
  "inventory" (free: costs no shared step).
- Every other action costs one shared step, even when it is rejected. Only actions listed under
  "Valid actions" are accepted, so copy them exactly.

Reply protocol: think briefly if you like, then end your reply with EXACTLY ONE block:
- act:      <action>take carrot</action>
- delegate: <delegate>{"goal": "Prepare and eat dish_2: carrot (grilled, diced), salt (raw, uncut).", "max_steps": 20}</delegate>
            or several sub-agents at once: <delegate>{"delegations": [{"goal": "..."}, {"goal": "..."}]}</delegate>
- finish:   <finish>what you achieved</finish>
One reply is one of your steps; you have a limited number of steps.
{delegation}"""

DELEGATION_ALLOWED = """
Delegation: a sub-agent works on the same shared kitchen with its own step budget (up to 20 steps) and
starts where the root agent stands. Sub-agents launched in one reply run at the same time. Give each one a
self-contained goal that names its dish id and the exact preparations (it cannot see your conversation).
When they return you see a [SubAgent Results] block per sub-agent. Delegate when the work does not fit in
your remaining steps; finish when your goal is done."""

DELEGATION_FORBIDDEN = """
You are at the maximum delegation depth: do not delegate, do the work yourself and finish."""

FIRST_MESSAGE = """\
{role}
Goal:
{goal}

Your budget: {max_steps} steps (one reply = one step). Shared world actions left for the whole task: {shared_left}.

Current observation:
{observation}

Reply with exactly one <action>, <delegate> or <finish> block."""

ROOT_ROLE = "You are the root agent: the whole task is yours."
CHILD_ROLE = (
    "You are a sub-agent (depth {depth}). Your parent delegated this goal to you; finish when it is done."
)


def system_prompt(can_delegate: bool) -> str:
    return SYSTEM_PROMPT.replace("{delegation}", DELEGATION_ALLOWED if can_delegate else DELEGATION_FORBIDDEN)


def first_message(goal: str, depth: int, max_steps: int, shared_left: int, observation: str) -> str:
    role = ROOT_ROLE if depth == 0 else CHILD_ROLE.format(depth=depth)
    return FIRST_MESSAGE.format(
        role=role, goal=goal.strip(), max_steps=max_steps, shared_left=shared_left, observation=observation
    )


if __name__ == "__main__":  # pragma: no cover - manual check
    from common.envs.textworld_sync.tasks import generate_tasks
    from common.envs.textworld_sync.world import SyncWorld

    task = generate_tasks("train", 1, seed=0)[0]
    w = SyncWorld(task)
    print(system_prompt(True))
    print("-" * 80)
    print(first_message(task["task_description"], 0, 20, w.steps_left, w.observe("0")))
