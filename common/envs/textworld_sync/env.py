"""TextWorld-Sync as a SERA environment: the :class:`Environment` factory and the per-agent session.

``TextWorldSyncEnv.make_world(task)`` builds one :class:`SyncWorld` per task; every agent of the recursive
tree gets a :class:`SyncSession` (its view: agent id, depth, goal, own step budget) on that world or on a
fork of it. ``await session.step(reply)`` parses the reply (``protocol.parse_reply``) and

* ``<action>``  -> one atomic world step; the observation is the agent's view afterwards;
* ``<delegate>`` -> one :class:`LaunchRequest` per child, all launched concurrently through the runtime's
  hook (``asyncio.gather``); the observation is one ``[SubAgent Results]`` block per child (returned?,
  environment_success, steps, ``Budget used by subagent: u/20 steps``, result text, final observation)
  followed by the agent's own view. Depth limits and refusals are the runtime hook's business;
* ``<finish>``  -> the agent halts with its message;
* anything else -> an explanatory observation (the agent paid its own step, not a shared one).

An agent also halts when its own budget is spent. When the shared world has ended (success, failure or
global budget spent) agents are told so and asked to finish; they are not cut off, so a child that
completed the last dish still returns its report.

Success of a child (``session.success()`` and ``environment_success`` in the results block): the progress
its goal text asks for, judged on the world -- the dish ids it names must be eaten when it says "eat" (or
names no ingredient), the ingredients it names must be on the prepared counter with exactly their
preparation; a goal naming neither falls back to "the child called finish". The root's success is
``world.root_success()``.

What it simplifies: the session keeps no chat history (the runtime does); a refused or crashed launch is
reported in the results block like any other child.

Run a scripted episode end to end: ``python -m common.envs.textworld_sync.oracle``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from common.envs.base import (
    AgentSession,
    ChildResult,
    Environment,
    LaunchHook,
    LaunchRequest,
    StepResult,
    World,
)
from common.envs.textworld_sync import prompts
from common.envs.textworld_sync.protocol import Delegation, parse_reply
from common.envs.textworld_sync.tasks import normalize_row
from common.envs.textworld_sync.world import SyncWorld

_ENDED = (
    "\nThe shared task has ended; no action can change it any more. Reply with <finish>your summary</finish>."
)


class SyncSession(AgentSession):
    """One agent's view of a :class:`SyncWorld` (see the module docstring)."""

    def __init__(
        self,
        world: SyncWorld,
        *,
        agent_id: str,
        depth: int,
        goal: str,
        max_steps: int,
        launch: LaunchHook,
        max_depth: int = 3,
        is_root: bool = False,
        context: str = "",
        start_from: str | None = None,
        max_child_steps: int = 20,
    ):
        if not isinstance(world, SyncWorld):
            raise TypeError(f"a SyncSession needs a SyncWorld, got {type(world).__name__}")
        world.add_agent(agent_id, start_from)
        self.world = world
        self.agent_id = agent_id
        self.depth = depth
        self.goal = goal
        self.context = context
        self.max_steps = max_steps
        self.max_depth = max_depth
        self.max_child_steps = max_child_steps
        self.is_root = is_root
        self.launch = launch
        self.steps_used = 0
        self.finished = False
        self.finish_message: str | None = None
        self.halted = False
        self.delegation_events = 0
        self.scope = world.parse_goal(goal)
        self.last_observation = ""
        self.history: list[dict[str, Any]] = []
        self._children: dict[int, list[SyncSession]] = {}

    # ---- AgentSession ----------------------------------------------------------------------------
    def system_prompt(self) -> str:
        return prompts.system_prompt(can_delegate=self.depth < self.max_depth)

    def first_user_message(self) -> str:
        goal = self.goal + (f"\nContext from your parent: {self.context}" if self.context else "")
        self.last_observation = self.world.observe(self.agent_id)
        return prompts.first_message(
            goal, self.depth, self.max_steps, self.world.steps_left, self.last_observation
        )

    def valid_actions(self) -> list[str]:
        return self.world.valid_actions(self.agent_id)

    async def step(self, reply: str) -> StepResult:
        if self.halted:
            return StepResult(
                observation="This agent has already halted.", done=True, info={"kind": "halted"}
            )
        self.steps_used += 1
        parsed = parse_reply(
            reply, self.world.valid_actions(self.agent_id), max_child_steps=self.max_child_steps
        )
        info: dict[str, Any] = {"kind": parsed.kind, "lenient": parsed.lenient}
        done, finish_message = False, None
        if parsed.kind == "action":
            out = self.world.step(self.agent_id, parsed.action or "")
            info.update(action=parsed.action, accepted=out.accepted, counted=out.counted, reward=out.reward)
            obs = out.observation + (_ENDED if out.done else "")
        elif parsed.kind == "delegate":
            obs = await self._delegate(parsed.delegations, info)
            obs += _ENDED if self.world.over else ""
        elif parsed.kind == "finish":
            self.finished, done = True, True
            self.finish_message = finish_message = parsed.message
            obs = f"You finished: {parsed.message}"
        else:
            info["error"] = parsed.error
            obs = (
                f"Invalid reply: {parsed.error}\n(This cost you one of your own steps but no shared step.)\n\n"
                + self.world.observe(self.agent_id)
            )
        if not done and self.steps_used >= self.max_steps:
            done = True
            obs += f"\nYou have used all {self.max_steps} of your steps; this agent stops here."
        self.halted = done
        self.last_observation = obs
        self.history.append({"reply": reply, "kind": parsed.kind, "observation": obs})
        return StepResult(observation=obs, done=done, finish_message=finish_message, info=info)

    def success(self) -> bool:
        if self.is_root:
            return self.world.root_success()
        if self.scope.parsable:
            return self.world.goal_success(self.scope)
        return self.finished

    # ---- delegation ------------------------------------------------------------------------------
    def register_child(self, request: LaunchRequest, child: SyncSession) -> None:
        """Called by ``child_session``: lets the results block show the child's final observation."""
        self._children.setdefault(id(request), []).append(child)

    async def _delegate(self, delegations: tuple[Delegation, ...], info: dict[str, Any]) -> str:
        self.delegation_events += 1
        requests = [LaunchRequest(goal=d.goal, context=d.context, max_steps=d.max_steps) for d in delegations]
        results = await asyncio.gather(*(self.launch(r) for r in requests), return_exceptions=True)
        blocks, summary = [], []
        for k, (req, res) in enumerate(zip(requests, results, strict=True), start=1):
            if isinstance(res, BaseException):
                if not isinstance(res, Exception):
                    raise res
                res = ChildResult(request=req, returned=False, error=f"{type(res).__name__}: {res}")
            text, ok = self._format_child(k, len(requests), res)
            blocks.append(text)
            summary.append(
                {"goal": req.goal, "returned": res.returned, "refused": res.refused, "success": ok}
            )
        info["delegations"] = summary
        return "\n\n".join(blocks) + "\n\n[Your current view]\n" + self.world.observe(self.agent_id)

    def _format_child(self, k: int, n: int, res: ChildResult) -> tuple[str, bool]:
        req = res.request
        child = self._find_child(req)
        scope = self.world.parse_goal(req.goal)
        if res.refused:
            ok = False
        elif scope.parsable:
            ok = self.world.goal_success(scope)
        else:
            ok = res.returned
        if child is not None and self.world.has_agent(child.agent_id):
            final = self.world.observe(child.agent_id)
        elif child is not None:
            final = child.last_observation
        else:
            final = "(none)"
        final = "\n".join(ln for ln in final.splitlines() if not ln.startswith("Valid actions:"))
        result = res.message or res.error or "(no message)"
        lines = [
            "[SubAgent Results]",
            f"Sub-agent {k} of {n}; goal: {req.goal}",
            f"returned: {'yes' if res.returned else 'no'}" + (" (launch refused)" if res.refused else ""),
            f"environment_success: {'true' if ok else 'false'}",
            f"steps: {res.steps_used}",
            f"Budget used by subagent: {res.steps_used}/{req.max_steps} steps. "
            f"Shared world actions left for the whole task: {self.world.steps_left}.",
            f"result: {result}",
            "final observation:",
            final,
        ]
        return "\n".join(lines), ok

    def _find_child(self, request: LaunchRequest) -> SyncSession | None:
        found = self._children.get(id(request), [])
        for child in found:  # the child that ran on this very world (branch 0 / the live one)
            if child.world is self.world:
                return child
        for child in found:  # a committed fork: its agents were merged into this world
            if self.world.has_agent(child.agent_id):
                return child
        return found[0] if found else None


class TextWorldSyncEnv(Environment):
    """Factory of TextWorld-Sync worlds and sessions (public SERA rows, flat or manifest form)."""

    name = "textworld"
    tools_description = (
        "Text actions in the shared kitchen world, one per reply: <action>look around | inventory | read cookbook | "
        "go to {room} | take {ingredient} | chop/slice/dice/mince {x} | cook {x} in stove/in oven/on grill | "
        'prepare {dish} | eat {dish}</action>; <delegate>{"goal": ...}</delegate> to launch sub-agents; '
        "<finish>message</finish> to return. Only actions in the current valid list are accepted; every "
        "action (even a rejected one) spends one step of the shared global budget."
    )

    def __init__(self, max_depth: int = 3, max_child_steps: int = 20, root_agent_id: str = "0"):
        self.max_depth = max_depth
        self.max_child_steps = max_child_steps
        self.root_agent_id = root_agent_id

    def make_world(self, task: dict[str, Any]) -> SyncWorld:
        return SyncWorld(task, root_agent=self.root_agent_id)

    def root_session(self, world: World, task: dict[str, Any], launch: LaunchHook) -> SyncSession:
        row = normalize_row(task)
        goal = str(row.get("goal") or row.get("task_description") or "")
        if not isinstance(world, SyncWorld):
            raise TypeError(f"a TextWorld-Sync root needs a SyncWorld, got {type(world).__name__}")
        return SyncSession(
            world,
            agent_id=world.root_agent,
            depth=0,
            goal=goal,
            max_steps=int(row.get("max_steps") or 20),
            launch=launch,
            max_depth=self.max_depth,
            is_root=True,
            max_child_steps=self.max_child_steps,
        )

    def child_session(
        self,
        world: World,
        parent: AgentSession,
        request: LaunchRequest,
        agent_id: str,
        launch: LaunchHook,
    ) -> SyncSession:
        if not isinstance(world, SyncWorld):
            raise TypeError(f"a TextWorld-Sync child needs a SyncWorld, got {type(world).__name__}")
        child = SyncSession(
            world,
            agent_id=agent_id,
            depth=parent.depth + 1,
            goal=request.goal,
            context=request.context,
            max_steps=request.max_steps,
            launch=launch,
            max_depth=self.max_depth,
            start_from=world.root_agent,  # SPEC: children start where the root currently stands
            max_child_steps=self.max_child_steps,
        )
        if isinstance(parent, SyncSession):
            parent.register_child(request, child)
        return child
