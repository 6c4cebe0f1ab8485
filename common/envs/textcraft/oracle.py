"""A scripted oracle for TextCraft-Synth: writes CodeAct replies that solve the task from the LIVE state.

``oracle_reply(session)`` plans with the solver on the session's current inventory (its targets still
missing, counted on top of what was held when the agent started) and answers with one cell that runs the
whole craft sequence and calls ``finish`` only if every craft succeeded; if something went wrong (another
agent used a shared ingredient) the next reply re-plans from the new state. With ``delegate=True`` an agent
shallower than ``max_delegation_depth`` first hands the targets' direct intermediate ingredients to
sub-agents in ONE cell, ``await asyncio.gather(launch_subagent(...), ...)`` at the root, one awaited
launch after the other below it, then crafts what remains. Only ingredients consumed by nothing but the
targets are delegated, so no child's plan double-counts another child's work; plans made one after the
other on the shared inventory add up to the single plan's amounts (round-ups carry over as leftovers),
while plans made at the same moment round up twice, which is why deeper levels launch sequentially.

With ``look_up=True`` every agent's first reply is a recipe walk with ``get_info`` (``lookup_reply``), so a
trajectory shows the facts it then uses; ``sera sft`` trains on such trajectories (the plain oracle plans
from the recipe book, which a model never sees).

It is a policy for tests, benchmarks and smoke runs (the lead wraps it into the Policy interface), and it
proves that the tools, the prompts' contract and delegation can solve every generated task.

``run_episode`` is a tiny stand-in for the runtime (children on the shared world, depth limit, budgets)
used by tests and benchmarks; the real runtime with rubrics lives in ``common/agent``.

Run: ``python -m common.envs.textcraft.oracle --n 40 [--delegate] [--look-up]`` prints the success rate.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..base import ChildResult, LaunchHook, LaunchRequest, StepResult
from . import prompts
from .env import TextCraftEnv, TextCraftSession
from .tasks import generate_tasks, plan_crafts
from .world import SUCCESS_PREFIX

MAX_CHILDREN = 4


def remaining_targets(session: TextCraftSession) -> dict[str, int]:
    """Targets not yet met: required minus net gain since the agent started (only positive entries)."""
    inv, start = session.world.inventory, session.start_inventory
    out = {}
    for t, n in session.targets.items():
        left = n - (inv.get(t, 0) - start.get(t, 0))
        if left > 0:
            out[t] = left
    return out


def _reply(thought: str, code: str) -> str:
    return f"<thought>{thought}</thought>\n<python>\n{code}\n</python>"


def _delegable(session: TextCraftSession, todo: dict[str, int]) -> dict[str, int]:
    """Direct intermediate ingredients of the targets whose only consumers in the plan are targets,
    with the amounts the plan crafts of them (children craft these on top of what is held)."""
    plan = plan_crafts(session.world.book, session.world.inventory, todo)
    consumers: dict[str, set[str]] = {}
    made: dict[str, int] = {}
    for st in plan.steps:
        item = st["target"][0]
        made[item] = st["result_count"]
        for ing in st["ingredients"]:
            consumers.setdefault(ing, set()).add(item)
    book = session.world.book
    out: dict[str, int] = {}
    for t in todo:
        rec = book.recipe(t)
        for ing in rec.ingredients if rec else ():
            if ing in made and ing not in todo and consumers.get(ing, set()) <= set(todo):
                out[ing] = made[ing]
    # Deepest first: they are the most work; cap the fan-out.
    best = sorted(out, key=lambda i: (-book.crafting_depth(i), i))[:MAX_CHILDREN]
    return {i: out[i] for i in best}


def lookup_reply(session: TextCraftSession) -> str:
    """A cell that walks the recipe tree of the targets with ``get_info`` and prints every recipe: the same
    code for every task but the target names, which are in the goal. After it, everything the craft plan
    needs (recipes, result counts, held counts) is in the agent's own context."""
    code = (
        f"todo = {json.dumps(list(session.targets))}\n"
        "seen = set(todo)\n"
        "while todo:\n"
        "    infos, todo = get_info(todo), []\n"
        "    for info in infos:\n"
        "        if not info['recipes']:\n"
        "            print(info['item'], 'base, held', info['in_inventory'])\n"
        "        for rec in info['recipes']:\n"
        "            print(info['item'], 'x', rec['result_count'], '<-', rec['ingredients'], 'held', info['in_inventory'])\n"
        "            for ing in rec['ingredients']:\n"
        "                if ing not in seen:\n"
        "                    seen.add(ing)\n"
        "                    todo.append(ing)"
    )
    return _reply("First I look up the recipes of my targets and their ingredients.", code)


def oracle_reply(
    session: TextCraftSession, delegate: bool = False, max_delegation_depth: int = 1, look_up: bool = False
) -> str:
    """The next CodeAct reply of the oracle for ``session`` (see the module docstring). With ``look_up``
    every agent's first reply is :func:`lookup_reply`, so that what follows is grounded in what the agent
    saw (the oracle itself plans from the recipe book, which a model never sees: a model trained on
    trajectories that craft without looking learns to invent recipes)."""
    if look_up and session.steps_used == 0:
        return lookup_reply(session)
    todo = remaining_targets(session)
    if not todo:
        return _reply(
            "All my targets are crafted.", f"finish({json.dumps('Crafted ' + _goal_list(session))})"
        )
    if delegate and session.depth < max_delegation_depth and not session.launches:
        subs = _delegable(session, todo)
        if subs:
            context = prompts.child_context(session.goal)
            calls = ",\n    ".join(
                f"launch_subagent({json.dumps({i: n})}, context={json.dumps(context)})"
                for i, n in subs.items()
            )
            if session.depth == 0:
                code = f"reports = await asyncio.gather(\n    {calls},\n)\nfor r in reports:\n    print(r)"
                return _reply(f"Delegating {len(subs)} independent intermediates in parallel.", code)
            # Below the root, one child at a time: each child then plans on the inventory its predecessor
            # left, so batch round-ups never add up across concurrently made plans.
            code = "\n".join(f"print(await {c})" for c in calls.split(",\n    "))
            return _reply(f"Delegating {len(subs)} intermediates one after the other.", code)
    plan = plan_crafts(session.world.book, session.world.inventory, todo)
    if not plan.feasible:
        want = ", ".join(f"{n}x {t}" for t, n in todo.items())
        msg = f"Cannot craft {want}: missing base items {plan.missing_base}"
        return _reply(
            "The inventory lacks base items; I cannot finish the task.", f"finish({json.dumps(msg)})"
        )
    steps = ",\n    ".join(
        f"({json.dumps(st['ingredients'])}, ({json.dumps(st['target'][0])}, {st['result_count']}))"
        for st in plan.steps
    )
    done_msg = json.dumps("Crafted " + _goal_list(session))
    code = (
        f"plan = [\n    {steps},\n]\n"
        "ok = True\n"
        "for ingredients, target in plan:\n"
        "    out = craft(ingredients, target)\n"
        f"    if not out.startswith({json.dumps(SUCCESS_PREFIX)}):\n"
        "        print(out)\n"
        "        ok = False\n"
        "        break\n"
        'print(f"{len(plan)} crafts planned, ok={ok}")\n'
        "if ok:\n"
        f"    finish({done_msg})"
    )
    return _reply(f"Crafting {len(plan.steps)} batched recipes bottom-up from the current inventory.", code)


FLAWS = ("wrong_amount", "false_finish", "wrong_then_finish")
"""The mistakes :func:`flawed_reply` makes (one per agent): a plan with one wrong ingredient amount at every
craft cell (the craft fails, ``ok=False``, no finish); a ``finish`` that claims the targets are crafted
right after the look-up (nothing was crafted); the wrong plan once, then the same false claim."""


def flawed_reply(session: TextCraftSession, flaw: str, look_up: bool = True) -> str:
    """The oracle's reply with one realistic mistake (:data:`FLAWS`), for scoring examples that FAIL in the
    oracle's own words: the same look-up cell, thoughts, code template and finish message as a successful
    child, so only the observations and the final inventory show that the child failed. (Children played
    by the random policy fail in another style, ``<thought>Random step.</thought>``, so a scorer trained
    on them learns who wrote a trajectory instead of whether it succeeded.)"""
    if flaw not in FLAWS:
        raise ValueError(f"unknown flaw {flaw!r}; expected one of {FLAWS}")
    if look_up and session.steps_used == 0:
        return lookup_reply(session)
    first_craft = session.steps_used == (1 if look_up else 0)
    if flaw == "false_finish" or (flaw == "wrong_then_finish" and not first_craft):
        return _reply(
            "All my targets are crafted.", f"finish({json.dumps('Crafted ' + _goal_list(session))})"
        )
    reply = oracle_reply(session)
    if "plan = [" not in reply:  # nothing left to craft or infeasible: the oracle's own reply
        return reply
    # one wrong amount: the first ingredient of the plan's last craft, one more than the recipe needs
    todo = remaining_targets(session)
    plan = plan_crafts(session.world.book, session.world.inventory, todo)
    last = plan.steps[-1]
    ing, n = next(iter(last["ingredients"].items()))
    right = f"({json.dumps(last['ingredients'])}, ({json.dumps(last['target'][0])}, {last['result_count']}))"
    wrong = f"({json.dumps({**last['ingredients'], ing: n + 1})}, ({json.dumps(last['target'][0])}, {last['result_count']}))"
    head, _, tail = reply.rpartition(right)
    return head + wrong + tail


def _goal_list(session: TextCraftSession) -> str:
    return ", ".join(f"{n}x {t}" for t, n in session.targets.items()) + "."


# --- a minimal runtime for tests and benchmarks -------------------------------------------------------
ReplyFn = Callable[[TextCraftSession], str]


@dataclass
class EpisodeOutcome:
    """What :func:`run_episode` returns."""

    success: bool
    root: TextCraftSession
    sessions: list[TextCraftSession] = field(default_factory=list)
    """Every session of the tree, root first."""
    steps: int = 0
    """Model calls over the whole tree."""


async def drive(session: TextCraftSession, reply_fn: ReplyFn) -> list[StepResult]:
    """Step ``session`` with ``reply_fn`` until it halts."""
    results = []
    while True:
        res = await session.step(reply_fn(session))
        results.append(res)
        if res.done:
            return results


async def run_episode(
    env: TextCraftEnv,
    task: dict[str, Any],
    reply_fn: ReplyFn | None = None,
    *,
    max_depth: int = 3,
    fork_children: bool = False,
) -> EpisodeOutcome:
    """Run one task with ``reply_fn`` (default: the oracle without delegation) for every agent. Children
    run on the shared world (or on a fork that is committed back when ``fork_children``); launches past
    ``max_depth`` are refused."""
    reply_fn = reply_fn or oracle_reply
    world = env.make_world(task)
    sessions: list[TextCraftSession] = []
    ids = itertools.count(1)

    def hook_for(parent_ref: list[TextCraftSession]) -> LaunchHook:
        async def launch(request: LaunchRequest) -> ChildResult:
            parent = parent_ref[0]
            if parent.depth + 1 > max_depth:
                return ChildResult(
                    request=request,
                    returned=False,
                    refused=True,
                    error=f"Launch refused: sub-agents cannot be launched beyond depth {max_depth}; "
                    "craft these items yourself.",
                )
            child_ref: list[TextCraftSession] = []
            target_world = world.fork() if fork_children else world
            child = env.child_session(
                target_world, parent, request, f"{parent.agent_id}.{next(ids)}", hook_for(child_ref)
            )
            child_ref.append(child)
            sessions.append(child)
            results = await drive(child, reply_fn)
            if fork_children:
                world.commit(target_world)
            err = next((r.error for r in results if r.error), None)
            return ChildResult(
                request=request,
                returned=child.finished,
                message=child.finish_message or "",
                steps_used=child.steps_used,
                error=err,
            )

        return launch

    root_ref: list[TextCraftSession] = []
    root = env.root_session(world, task, hook_for(root_ref))
    root_ref.append(root)
    sessions.insert(0, root)
    await drive(root, reply_fn)
    return EpisodeOutcome(
        success=root.success(), root=root, sessions=sessions, steps=sum(s.steps_used for s in sessions)
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Run the scripted oracle on generated TextCraft-Synth tasks.")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--split", default="val")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--delegate", action="store_true")
    ap.add_argument("--look-up", action="store_true", help="every agent first looks its recipes up")
    a = ap.parse_args()

    def fn(s: TextCraftSession) -> str:
        return oracle_reply(s, delegate=a.delegate, look_up=a.look_up)

    async def main() -> None:
        env = TextCraftEnv()
        tasks = generate_tasks(a.split, a.n, a.seed)
        outs = [await run_episode(env, t, fn) for t in tasks]
        ok = sum(o.success for o in outs)
        print(
            f"oracle (delegate={a.delegate}, look_up={a.look_up}): {ok}/{len(outs)} solved; mean agents/task "
            f"{sum(len(o.sessions) for o in outs) / len(outs):.2f}; mean steps {sum(o.steps for o in outs) / len(outs):.2f}"
        )

    asyncio.run(main())
