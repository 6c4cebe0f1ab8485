"""A scripted TextWorld-Sync oracle: protocol replies that solve a task within every budget.

``oracle_reply(session, delegate=None)`` reads the session's world (it is an oracle: it knows every
recipe) and answers with one protocol block. It plans against the shared rules:

* scope: the root owns every dish; a child owns what its goal names (``SyncWorld.parse_goal``);
* per step, in order: eat a prepared dish; prepare a dish whose ingredients are all ready; finish the
  preparation of an ingredient in the shared inventory (anywhere under the public rules; in the kitchen
  under ``rules="strict"``), picking a tool that is not cooling down; open the gate if a needed ingredient is behind it; take the next ingredient
  (this room first, kitchen items before far-away raw ones, which need no tools); when the inventory is
  full of other agents' ingredients, help prepare them; otherwise wait (``look around``);
* delegation: ``delegate=True`` always delegates one dish per child when the scope still has >= 2
  unfinished dishes; ``delegate=None`` (auto) only when the remaining world actions do not fit in the
  agent's remaining own steps; ``delegate=False`` never. Before delegating, the root opens the gate and
  fetches the far-away raw ingredients itself (children start where the root stands, so this saves a
  walk per child), then waits for the children and finishes whatever is left.

``solve(task, delegate=None, interleave=False)`` runs a whole episode with a launch hook that builds
child sessions and drives them with the oracle (``interleave=True`` yields to the event loop between
steps so siblings really interleave on the shared world).

What it simplifies: greedy, not optimal -- it never plans tool interleavings across agents and waits
(``look around``, one shared step) when blocked; the closed-form step estimate ignores contention.

Run: ``python -m common.envs.textworld_sync.oracle [tasks.jsonl]`` (default: the shared sample rows).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.envs.base import ChildResult, LaunchRequest
from common.envs.textworld_sync.env import SyncSession, TextWorldSyncEnv
from common.envs.textworld_sync.protocol import format_action, format_delegate, format_finish
from common.envs.textworld_sync.world import (
    BASE,
    COOK_TOOL,
    CUT_VERB,
    ItemView,
    SyncWorld,
    WorldState,
)


@dataclass(frozen=True)
class _Scope:
    items: tuple[int, ...]
    dishes: tuple[str, ...]
    eat: bool


def _scope(session: SyncSession, st: WorldState) -> _Scope:
    if session.is_root or not session.scope.parsable:
        return _Scope(tuple(range(len(st.items))), tuple(st.meals), True)
    sp = session.world.spec
    sc = session.scope
    dish_level = bool(sc.dishes) and (sc.eat or not (sc.items or sc.prepare))
    items = set(sc.items)
    if sc.dishes and (dish_level or not sc.items):
        for d in sc.dishes:
            items.update(sp.dish_items[d])
    dishes = tuple(sp.dish_ids[d] for d in sc.dishes) if (dish_level or not sc.items) else ()
    return _Scope(tuple(sorted(items)), dishes, dish_level)


def _needed_ops(it: ItemView) -> list[tuple[str, str]]:
    return [] if it.status == "ready" else list(it.needed)


def _prep_text(expected: frozenset[str]) -> str:
    """``{"diced", "grilled"}`` -> ``grilled, diced`` (cooking state first, as the task texts write it)."""
    cook = [p for p in ("raw", *COOK_TOOL) if p in expected]
    cut = [p for p in ("uncut", *CUT_VERB) if p in expected]
    return ", ".join(cook + cut) or ", ".join(sorted(BASE))


def _dish_items(st: WorldState, dish: str) -> list[ItemView]:
    return [it for it in st.items if it.dish_id == dish]


def _dish_done(st: WorldState, dish: str, eat: bool) -> bool:
    return st.meals[dish] == "eaten" if eat else st.meals[dish] != "none"


def _scope_done(st: WorldState, sc: _Scope) -> bool:
    return all(st.items[i].status == "ready" for i in sc.items) and all(
        _dish_done(st, d, sc.eat) for d in sc.dishes
    )


def _remaining_actions(st: WorldState, sc: _Scope, loc: str) -> int:
    """Closed-form estimate of the world actions the scope still needs (single agent)."""
    n, rooms, needs_tools = 0, set(), False
    for i in sc.items:
        it = st.items[i]
        if it.status == "source":
            n += 1
            rooms.add(it.room)
        if it.status in ("source", "held"):
            ops = _needed_ops(it)
            n += len(ops)
            needs_tools |= bool(ops)
    n += sum(2 if st.meals[d] == "none" else 1 for d in sc.dishes if not _dish_done(st, d, sc.eat))
    n += len(rooms - {loc}) + (1 if st.strict and needs_tools and loc != "kitchen" else 0)
    n += int(not st.gate_open and any(st.items[i].gated and st.items[i].status == "source" for i in sc.items))
    return n


def next_action(st: WorldState, sc: _Scope, agent_id: str) -> str | None:
    """The oracle's next world action for ``agent_id`` on scope ``sc`` (None when the scope is done)."""
    loc = st.locations.get(agent_id, "kitchen")
    items = st.items
    for d in sc.dishes:
        if sc.eat and st.meals[d] == "prepared":
            return f"eat {d}"
    for d in sc.dishes:
        if st.meals[d] == "none" and all(it.status == "ready" for it in _dish_items(st, d)):
            return f"prepare {d}"
    held = [i for i in sc.items if items[i].status == "held"]
    if held and st.strict and loc != "kitchen":
        return "go to kitchen"
    for i in held:
        for act, tool in _needed_ops(items[i]):
            if not st.cooldowns[tool]:
                return act
    pending = [i for i in sc.items if items[i].status == "source"]
    if pending and not st.gate_open and any(items[i].gated for i in pending):
        return "open door"
    full = bool(st.capacity) and len(st.inventory) >= st.capacity
    if pending and not full:
        here = [i for i in pending if items[i].room == loc]
        if here:
            return f"take {items[here[0]].name}"
        kitchen = [i for i in pending if items[i].room == "kitchen"]
        return f"go to {items[(kitchen or pending)[0]].room}"
    if loc == "kitchen" or not st.strict:  # blocked: help with other agents' held ingredients
        for it in items:
            if it.status == "held":
                for act, tool in _needed_ops(it):
                    if not st.cooldowns[tool]:
                        return act
    if _scope_done(st, sc):
        return None
    if st.failure is not None:
        return None
    return "look around"


def _child_goal(st: WorldState, dish: str) -> str:
    parts = ", ".join(f"{it.name} ({_prep_text(it.expected)})" for it in _dish_items(st, dish))
    return (
        f"Prepare and eat {dish}. Its ingredients and their required preparations: {parts}. Take each "
        f"ingredient, give it exactly that preparation, then 'prepare {dish}' and "
        f"'eat {dish}'. Finish when {dish} has been eaten."
    )


def oracle_reply(session: SyncSession, delegate: bool | None = None, child_steps: int = 20) -> str:
    """One protocol reply for ``session`` (see the module docstring)."""
    world: SyncWorld = session.world
    st = world.state()
    sc = _scope(session, st)
    loc = st.locations.get(session.agent_id, "kitchen")
    if st.failure is not None:
        return format_finish(f"The task failed: {st.failure}.")
    if _scope_done(st, sc):
        done = ", ".join(sc.dishes) or ", ".join(st.items[i].name for i in sc.items)
        return format_finish(f"Done: {done} " + ("prepared and eaten." if sc.dishes else "ready."))
    if st.over:
        return format_finish("The shared task ended before my goal was complete.")
    open_dishes = [d for d in sc.dishes if not _dish_done(st, d, sc.eat)]
    steps_left = session.max_steps - session.steps_used
    can = session.depth < session.max_depth and session.delegation_events == 0 and len(open_dishes) >= 2
    if delegate is None:
        want = can and _remaining_actions(st, sc, loc) + 1 > steps_left
    else:
        want = can and delegate
    if want:
        pending = [st.items[i] for i in sc.items if st.items[i].status == "source"]
        if not st.gate_open and any(it.gated for it in pending):
            return format_action("open door")
        far_raw = [it for it in pending if it.room != "kitchen" and not _needed_ops(it)]
        full = bool(st.capacity) and len(st.inventory) >= st.capacity
        if far_raw and not full and steps_left > 3:
            here = [it for it in far_raw if it.room == loc]
            return format_action(f"take {here[0].name}" if here else f"go to {far_raw[0].room}")
        if loc != "kitchen":
            return format_action("go to kitchen")
        return format_delegate([(_child_goal(st, d), child_steps) for d in open_dishes])
    act = next_action(st, sc, session.agent_id)
    if act is None:
        return format_finish("Nothing more I can do for my goal.")
    return format_action(act)


# ---- running whole episodes ------------------------------------------------------------------------
@dataclass
class OracleRun:
    """The outcome of :func:`solve`."""

    success: bool
    world: SyncWorld
    root: SyncSession
    sessions: list[SyncSession] = field(default_factory=list)
    """Every session, root first."""

    @property
    def global_steps(self) -> int:
        return self.world.steps_used

    @property
    def max_depth_used(self) -> int:
        return max(s.depth for s in self.sessions)


async def run_oracle_episode(
    task: dict[str, Any],
    *,
    delegate: bool | None = None,
    interleave: bool = False,
    max_depth: int = 3,
    world: SyncWorld | None = None,
    rules: str = "public",
) -> OracleRun:
    """Run root + children with the oracle on one world; launches past ``max_depth`` are refused."""
    env = TextWorldSyncEnv(max_depth=max_depth, rules=rules)
    world = world or env.make_world(task)
    sessions: list[SyncSession] = []
    counters: dict[str, itertools.count] = {}

    def hook_for(ref: list[SyncSession]):
        async def launch(request: LaunchRequest) -> ChildResult:
            parent = ref[0]
            if parent.depth + 1 > max_depth:
                return ChildResult(
                    request=request, returned=False, refused=True, error="Launch refused: depth limit."
                )
            n = next(counters.setdefault(parent.agent_id, itertools.count(1)))
            child_ref: list[SyncSession] = []
            child = env.child_session(
                parent.world, parent, request, f"{parent.agent_id}.{n}", hook_for(child_ref)
            )
            child_ref.append(child)
            sessions.append(child)
            await drive(child)
            return ChildResult(
                request=request,
                returned=child.finished,
                message=child.finish_message or "",
                steps_used=child.steps_used,
            )

        return launch

    async def drive(s: SyncSession) -> None:
        s.first_user_message()
        for _ in range(s.max_steps):
            result = await s.step(oracle_reply(s, delegate=delegate))
            if interleave:
                await asyncio.sleep(0)
            if result.done:
                break

    root_ref: list[SyncSession] = []
    root = env.root_session(world, task, hook_for(root_ref))
    root_ref.append(root)
    sessions.append(root)
    await drive(root)
    return OracleRun(success=world.root_success(), world=world, root=root, sessions=sessions)


def solve(task: dict[str, Any], **kwargs: Any) -> OracleRun:
    """Blocking wrapper of :func:`run_oracle_episode`."""
    return asyncio.run(run_oracle_episode(task, **kwargs))


PUBLIC_SAMPLE = Path(__file__).resolve().with_name("public_sample.jsonl")
"""Four public TextWorld-Sync rows (the paper's released format, unchanged), shipped with the package so
that the loader and the rules are checked against real rows on every machine."""


def sample_tasks_path() -> Path:
    """The public sample rows shipped with the package (:data:`PUBLIC_SAMPLE`)."""
    return PUBLIC_SAMPLE


def main(argv: list[str]) -> int:  # pragma: no cover - manual check
    from common.envs.textworld_sync.tasks import load_tasks

    path = Path(argv[0]) if argv else sample_tasks_path()
    if not path.exists():
        print(f"no task file at {path}; pass one as the first argument")
        return 2
    ok = 0
    rows = load_tasks(path)
    for row in rows:
        run = solve(row)
        ok += run.success
        print(
            f"{row['task_id']}: success={run.success} global_steps={run.global_steps}/"
            f"{run.world.spec.max_steps} agents={len(run.sessions)} root_steps={run.root.steps_used}"
        )
    print(f"{ok}/{len(rows)} solved")
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
