"""TextWorld-Sync as a SERA environment: the :class:`Environment` factory and the per-agent session.

``TextWorldSyncEnv.make_world(task)`` builds one :class:`SyncWorld` per task; every agent of the recursive
tree gets a :class:`SyncSession` (its view: agent id, depth, goal, own step budget) on that world or on a
fork of it. The session plays the public SERA evaluator's agent loop (``_run_agent`` in
``Evaluation/TextWorld/textworld_parallel/evaluator.py`` of OliverLeeXZ/SERA); the runtime
(``common/agent``) owns the chat history and the model calls. ``await session.step(reply)``:

* parses the reply with the public protocol (``protocol.extract_decision``);
* ``<action>X</action>`` -> one atomic world step (one GLOBAL step), except the inventory look-ups
  (``inventory`` / ``view inventory`` / ``check inventory``), answered from the shared state without a
  world step (an ``[Inventory Lookup]`` block);
* a malformed reply -> the public best-effort fallback (``protocol.extract_action``: the last line, a
  fenced line, ...) is sent to the world like an action, so it costs one shared step (and is applied
  when it happens to be valid);
* ``<delegate>`` -> one :class:`LaunchRequest` per child (own budget ``min(max_steps, 20)``), all launched
  concurrently through the runtime's hook; the observation is a ``[SubAgent Results]`` block (one entry
  per child) and ``[Current Environment Observation]``. At the maximum depth the delegation is rejected
  with a message and no world step;
* ``<finish>`` -> the agent halts with its message.

Every reply is one of the agent's own steps. The observation the model reads is the public turn message
(``[Step i Observation]``, the agent's budget, ``Valid Actions``, ``Score``, ``Task Success``, ``Task
Failure``, ``Done``), rendered from the templates of :mod:`prompts`.

The agent STOPS (``StepResult.done``) as soon as the shared world has ended (task success, failure or
global budget): after its own step that ended it, after a delegation during which it ended, or at its
next reply when another agent ended it. ``session.done`` says so at any time; a runtime that checks it
before each model call (as the public loop checks ``done`` before each call) saves that last call.

Success of a child (``session.success()``, the runtime's programmatic label): the progress its goal text
asks for, judged on the world (dish ids it names eaten, ingredients it names on the counter); a goal
naming neither falls back to "the child called finish". The ``environment_success`` shown to the parent is
the public one: the WHOLE task's success. The root's success is ``world.root_success()``.

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
from common.envs.textworld_sync.prompts import PromptSet, default_prompts, load_prompts
from common.envs.textworld_sync.protocol import (
    Delegation,
    extract_action,
    extract_decision,
    is_inventory_action,
)
from common.envs.textworld_sync.tasks import normalize_row
from common.envs.textworld_sync.world import RULES, SyncWorld

ROOT_MAX_STEPS = 20
"""The root agent's own step budget (public ``EvaluationSettings.max_steps``)."""
CHILD_MAX_STEPS = 20
"""A sub-agent's budget cap (public ``subagent_max_steps``; a delegation may ask for fewer)."""


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
        max_child_steps: int = CHILD_MAX_STEPS,
        prompts: PromptSet | None = None,
        allow_subagents: bool = True,
    ):
        if not isinstance(world, SyncWorld):
            raise TypeError(f"a SyncSession needs a SyncWorld, got {type(world).__name__}")
        world.add_agent(agent_id, start_from)
        self.world = world
        self.agent_id = agent_id
        self.depth = depth
        self.goal = goal
        self.context = context
        """Kept for the runtime's records; never shown to the agent (the public child sees only its goal)."""
        self.max_steps = max_steps
        self.max_depth = max_depth
        self.max_child_steps = max_child_steps
        self.is_root = is_root
        self.launch = launch
        self.prompts = prompts or default_prompts()
        self.allow_subagents = allow_subagents
        self.steps_used = 0
        self.finished = False
        self.finish_message: str | None = None
        self.halted = False
        self.delegation_events = 0
        self.scope = world.parse_goal(goal)
        self.env_observation, self.env_infos = world.observe_with_infos(agent_id)
        """The agent's latest environment observation and public ``infos`` (its own view)."""
        self.last_observation = ""
        self.history: list[dict[str, Any]] = []
        self._children: dict[int, list[SyncSession]] = {}

    # ---- AgentSession ----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """True once this agent has halted or the shared world has ended (no further call is useful)."""
        return self.halted or self.world.over

    @property
    def child_cap(self) -> int:
        """The most steps a child of this agent may get: 20 under the root; under a sub-agent, also at most
        that sub-agent's own budget (public: a child's settings carry its reduced ``subagent_max_steps``)."""
        return self.max_child_steps if self.depth == 0 else min(self.max_child_steps, self.max_steps)

    def system_prompt(self) -> str:
        return self.prompts.system(self.agent_id, self.depth, self.max_depth, self.allow_subagents)

    def first_user_message(self) -> str:
        self.env_observation, self.env_infos = self.world.observe_with_infos(self.agent_id)
        return self.prompts.initial_user(
            self.goal, self.env_observation, self.env_infos, self.max_steps, self.allow_subagents
        )

    def valid_actions(self) -> list[str]:
        return self.world.valid_actions(self.agent_id)

    def visible_state(self) -> dict[str, Any]:
        """What this agent itself last saw (``AgentSession.visible_state``): its latest observation, its
        public ``infos`` and its room. Never another agent's location or a required preparation."""
        return {
            "observation": self.env_observation,
            "infos": dict(self.env_infos),
            "location": self.env_infos.get("agent_location"),
        }

    async def step(self, reply: str) -> StepResult:
        if self.halted:
            return StepResult(
                observation="This agent has already halted.", done=True, info={"kind": "halted"}
            )
        if self.world.over:  # another agent ended the world while this reply was being written
            self.halted = True
            self.env_observation, self.env_infos = self.world.observe_with_infos(self.agent_id)
            return StepResult(
                observation=self._turn(self.env_observation),
                done=True,
                info={"kind": "world_ended", "applied": False},
            )
        index = self.steps_used
        self.steps_used += 1
        decision = extract_decision(reply, default_child_steps=self.max_child_steps)
        info: dict[str, Any] = {"kind": decision.kind, "parse_ok": decision.kind != "error"}
        done, finish_message = False, None
        if decision.kind == "finish":
            self.finished, done = True, True
            self.finish_message = finish_message = decision.message
            text = self.env_observation
        elif decision.kind == "delegate":
            text = await self._delegate(decision.delegations, info)
            done = self.world.over
        else:
            if decision.kind == "error":
                info["error"] = decision.error
            action = decision.action if decision.kind == "action" else extract_action(reply)[0]
            info["action"] = action
            if is_inventory_action(action):
                info.update(kind="inventory_lookup", counted=False)
                self.env_observation, self.env_infos = self.world.observe_with_infos(self.agent_id)
                text = self.prompts.inventory_lookup(str(self.env_infos["inventory"]), self.env_observation)
            else:
                out = self.world.step(self.agent_id, action)
                info.update(
                    accepted=out.accepted, counted=out.counted, reward=out.reward, message=out.message
                )
                self.env_observation, self.env_infos = out.observation, out.infos or {}
                text = out.observation
                done = out.done
        if not done and self.steps_used >= self.max_steps:
            done = True
        obs = self._turn(text, index)
        self.halted = done
        self.last_observation = obs
        self.history.append({"reply": reply, "kind": info["kind"], "observation": obs})
        return StepResult(observation=obs, done=done, finish_message=finish_message, info=info)

    def _turn(self, text: str, index: int | None = None) -> str:
        i = self.steps_used - 1 if index is None else index
        return self.prompts.turn(max(i, 0), text, self.env_infos, self.max_steps, self.allow_subagents)

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
        if not self.allow_subagents or self.depth >= self.max_depth:
            info["rejected"] = True
            self.env_observation, self.env_infos = self.world.observe_with_infos(self.agent_id)
            return self.prompts.delegation_rejected(self.depth, self.max_depth, self.env_observation)
        self.delegation_events += 1
        requests = [
            LaunchRequest(goal=d.goal, max_steps=min(d.max_steps, self.child_cap)) for d in delegations
        ]
        results = await asyncio.gather(*(self.launch(r) for r in requests), return_exceptions=True)
        children, summary = [], []
        for req, res in zip(requests, results, strict=True):
            if isinstance(res, BaseException):
                if not isinstance(res, Exception):
                    raise res
                res = ChildResult(request=req, returned=False, error=f"{type(res).__name__}: {res}")
            children.append(self._child_record(res))
            summary.append({"goal": req.goal, "returned": res.returned, "refused": res.refused})
        info["delegations"] = summary
        self.env_observation, self.env_infos = self.world.observe_with_infos(self.agent_id)
        return self.prompts.delegation_results(children, self.env_observation)

    def _child_record(self, res: ChildResult) -> dict[str, Any]:
        """The public child record (agent_id, returned, environment_success, steps, ...)."""
        req = res.request
        child = self._find_child(req)
        if child is None or (res.error and not res.refused and res.steps_used == 0):
            return {  # public: a crashed child is reported as agent "unknown" with its error
                "agent_id": child.agent_id if child is not None else "unknown",
                "returned": False,
                "environment_success": False,
                "steps": res.steps_used,
                "max_steps": child.max_steps if child is not None else 0,
                "finish_message": ("SubAgent crashed: " if not res.refused else "") + (res.error or ""),
                "final_observation": "",
            }
        final = (
            self.world.observe(child.agent_id)
            if self.world.has_agent(child.agent_id)
            else child.env_observation
        )
        return {
            "agent_id": child.agent_id,
            "returned": res.returned and child.depth > 0,
            "environment_success": self.world.root_success(),
            "steps": res.steps_used or child.steps_used,
            "max_steps": child.max_steps,
            "finish_message": res.message,
            "final_observation": final,
        }

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
    """Factory of TextWorld-Sync worlds and sessions (public SERA rows, flat or manifest form).

    ``rules``: ``public`` (default, the public environment) or ``strict`` (see ``world.py``).
    ``prompts_dir``: a directory of template files replacing the packaged ones (see ``prompts.py``)."""

    name = "textworld"

    def __init__(
        self,
        max_depth: int = 3,
        max_child_steps: int = CHILD_MAX_STEPS,
        root_agent_id: str = "0",
        rules: str = "public",
        prompts_dir: str | None = None,
        allow_subagents: bool = True,
        prompt_set: str = "evaluation",
    ):
        """``prompt_set``: ``evaluation`` (the public evaluation texts, the default) or ``training`` (the
        public training texts: no decomposition and budget paragraphs, no budget lines); see ``prompts.py``."""
        if rules not in RULES:
            raise ValueError(f"unknown TextWorld-Sync rules {rules!r}; use one of {RULES}")
        self.max_depth = max_depth
        self.max_child_steps = max_child_steps
        self.root_agent_id = root_agent_id
        self.rules = rules
        self.prompts = load_prompts(prompts_dir, prompt_set) if prompts_dir else default_prompts(prompt_set)
        self.allow_subagents = allow_subagents

    @property
    def tools_description(self) -> str:  # type: ignore[override]
        """The child's tools as the rubric writer reads them (``templates/tools_description.txt``)."""
        return self.prompts.tools_description

    def make_world(self, task: dict[str, Any]) -> SyncWorld:
        return SyncWorld(task, root_agent=self.root_agent_id, rules=self.rules)

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
            max_steps=int(row.get("max_steps") or ROOT_MAX_STEPS),
            launch=launch,
            max_depth=self.max_depth,
            is_root=True,
            max_child_steps=self.max_child_steps,
            prompts=self.prompts,
            allow_subagents=self.allow_subagents,
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
            max_steps=min(
                request.max_steps,
                parent.child_cap if isinstance(parent, SyncSession) else self.max_child_steps,
            ),
            launch=launch,
            max_depth=self.max_depth,
            start_from=world.root_agent,  # public fork_shared: children start where the root stands
            max_child_steps=self.max_child_steps,
            prompts=self.prompts,
            allow_subagents=self.allow_subagents,
        )
        if isinstance(parent, SyncSession):
            parent.register_child(request, child)
        return child
