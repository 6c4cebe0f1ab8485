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

The TRAINING prompt set (``prompt_set="training"``) also plays the public TRAINING runtime
(``Training/runtime/textworld_continuous_policy/env.py: TextWorldEnv`` with platoon's launch coordinator and
``DepthAwareStepBudgetTracker``) instead of the evaluator's loop:

* a malformed reply costs the agent its step but no world step; its turn shows the current observation
  (the public error text is recorded in ``info["error"]``, never shown, as in public);
* an inventory look-up reads ``[Inventory Lookup]\nCurrent shared inventory:`` (``train_inventory_lookup.txt``);
* a delegation asks for ``max_steps`` as written (default 20), NOT capped at 20 (the session sets
  ``uncapped_child_budgets`` so the runtime does not cap it either); its turn is only
  ``[SubAgent Results]`` with one ``- SubAgent i: <launch report>`` line per child (``train_*.txt``): the
  child's finish message, else its error, then ``Budget used by subagent: u/N steps. Total remaining budget
  for the current task is R steps.``; no whole-task verdict, no final or current observation;
* past the depth limit each child's line is the tracker's ``Not enough budget to launch subagent ...``;
* the world's shared budget is 100 whatever the row says, and ordinary children start in the KITCHEN
  (public ``fork_shared`` looks up a phantom ``root`` agent); counterfactual branches start in the
  parent's room (public ``fork_counterfactual``).

The EVALUATION set also rebuilds the first user message from the CURRENT observation before every model
call (``refresh_first_message``; public ``evaluator.py: _run_agent``), the valid actions staying the
initial ones.

Run a scripted episode end to end: ``python -m common.envs.textworld_sync.oracle``.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
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
from common.envs.textworld_sync.prompts import RUNTIME_PROMPTS, PromptSet, default_prompts, load_prompts
from common.envs.textworld_sync.protocol import (
    Delegation,
    extract_action,
    extract_decision,
    is_inventory_action,
)
from common.envs.textworld_sync.tasks import normalize_row
from common.envs.textworld_sync.world import KITCHEN, RULES, SyncWorld
from common.templates import pick, read_template, user_dir

ROOT_MAX_STEPS = 20
"""The root agent's own step budget (public ``EvaluationSettings.max_steps``)."""
CHILD_MAX_STEPS = 20
"""A sub-agent's budget cap (public ``subagent_max_steps``; a delegation may ask for fewer). Evaluation only:
public training passes the requested ``max_steps`` uncapped."""
TRAIN_SHARED_MAX_STEPS = 100
"""The shared world budget of every training world (public ``create_textworld_env``:
``task.misc.setdefault("shared_environment_max_steps", 100)``; the row's own value is never read)."""
TRAIN_INVALID_REPLY = "The model response did not contain a valid TextWorld action block."
"""Public training's error for a reply without a valid block (recorded in ``info``; never shown)."""
"""The runtime's test-time fork-budget refusal text, so that its launch shows as the public pseudo-child."""


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
        start_room: str | None = None,
        fork_budget_text: str | None = None,
    ):
        if not isinstance(world, SyncWorld):
            raise TypeError(f"a SyncSession needs a SyncWorld, got {type(world).__name__}")
        world.add_agent(agent_id, start_from, start_room)
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
        self.training = self.prompts.prompt_set == "training"
        """Play the public training runtime (module docstring) instead of the evaluator's loop."""
        self.allow_subagents = allow_subagents
        self.fork_budget_text = fork_budget_text
        """The runtime's fork-budget refusal text (evaluation: shown as the public pseudo-child)."""
        self.steps_used = 0
        self.finished = False
        self.finish_message: str | None = None
        self.halted = False
        self.delegation_events = 0
        self.scope = world.parse_goal(goal)
        self.env_observation, self.env_infos = world.observe_with_infos(agent_id)
        """The agent's latest environment observation and public ``infos`` (its own view)."""
        self.initial_infos: dict[str, Any] = dict(self.env_infos)
        """The ``infos`` of the first user message (its valid actions stay these, also when refreshed)."""
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

    @property
    def uncapped_child_budgets(self) -> bool:
        """Training: a child gets the ``max_steps`` its parent asked for (public
        ``launch_subagent(max_steps=int(item.get("max_steps", 20)))``, no cap); the runtime reads this."""
        return self.training

    def first_user_message(self) -> str:
        self.env_observation, self.env_infos = self.world.observe_with_infos(self.agent_id)
        self.initial_infos = dict(self.env_infos)
        return self.prompts.initial_user(
            self.goal, self.env_observation, self.initial_infos, self.max_steps, self.allow_subagents
        )

    def refresh_first_message(self) -> str | None:
        """The first user message for the next model call, or None to keep it. Evaluation: rebuilt from
        the CURRENT observation with the INITIAL valid actions (public ``evaluator.py: _run_agent`` passes
        ``observe_async()``'s observation and ``initial_infos`` to ``build_messages`` on every call).
        Training keeps the message of the agent's start (public ``TextWorldAgent.act``)."""
        if self.training:
            return None
        observation, _ = self.world.observe_with_infos(self.agent_id)
        return self.prompts.initial_user(
            self.goal, observation, self.initial_infos, self.max_steps, self.allow_subagents
        )

    def valid_actions(self) -> list[str]:
        return self.world.valid_actions(self.agent_id)

    def visible_state(self) -> dict[str, Any]:
        """The agent's own view of the world now (``AgentSession.visible_state``), in the public shape
        (``rubric_selector.py: coordinator_state``, training ``TextWorldEnv.snapshot``): the game, the agent
        id, its room, its observation and its public ``infos``. Never another agent's location or a required
        preparation."""
        observation, infos = self.world.observe_with_infos(self.agent_id)
        return {
            "game": self.world.spec.game,
            "agent_id": self.agent_id,
            "location": infos.get("agent_location"),
            "observation": observation,
            "infos": infos,
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
            text = decision.message if self.training else self.env_observation  # public training: the output
        elif decision.kind == "delegate":
            text = await self._delegate(decision.delegations, info, index)
            done = self.world.over
        elif decision.kind == "error" and self.training:  # public training: no world step, the observation
            info.update(error=decision.error or TRAIN_INVALID_REPLY, counted=False)
            self.env_observation, self.env_infos = self.world.observe_with_infos(self.agent_id)
            text = self.env_observation
        else:
            if decision.kind == "error":
                info["error"] = decision.error
            action = decision.action if decision.kind == "action" else extract_action(reply)[0]
            info["action"] = action
            if is_inventory_action(action):
                info.update(kind="inventory_lookup", counted=False)
                self.env_observation, self.env_infos = self.world.observe_with_infos(self.agent_id)
                lookup = (
                    self.prompts.train_inventory_lookup if self.training else self.prompts.inventory_lookup
                )
                text = lookup(str(self.env_infos["inventory"]), self.env_observation)
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
    @property
    def depth_refusal(self) -> Callable[[LaunchRequest, int, int], str] | None:
        """Training: a launch the runtime's ``--max-depth`` refuses reads as the step-budget tracker's
        ``Not enough budget to launch subagent for goal ...`` (``train_depth_refusal.txt``), as one this
        session refuses itself; evaluation: None (the runtime's own text)."""
        if not self.training:
            return None
        return lambda request, depth, max_depth: self.prompts.train_depth_refusal(
            request.goal, depth, max_depth
        )

    def counterfactual_depth_refusal(self, request: LaunchRequest | None, depth: int, max_depth: int) -> str:
        """A launch past ``max_depth`` in a Rubric-stage rollout (public ``textworld_two_stage_rollout.py``:
        ``Cannot launch subagent beyond max_subagent_depth={m}.``; ``train_branch_depth_refusal.txt``); the
        runtime asks for it too (``_Rollout.refusal_at_depth``)."""
        return self.prompts.train_branch_depth_refusal(max_depth)

    def register_child(self, request: LaunchRequest, child: SyncSession) -> None:
        """Called by ``child_session``: lets the results block show the child's final observation."""
        self._children.setdefault(id(request), []).append(child)

    async def _delegate(self, delegations: tuple[Delegation, ...], info: dict[str, Any], index: int) -> str:
        if self.training and self.allow_subagents and self.depth >= self.max_depth:
            info["rejected"] = True  # public training: each launch returns the tracker's depth message
            self.env_observation, self.env_infos = self.world.observe_with_infos(self.agent_id)
            # Rubric stage: the public collector refuses first, when the branch this agent runs under has
            # reached the limit (the root, a branch agent); an ordinary child gets the tracker's text
            if self.counterfactual_rollout and self.branch_depth >= self.max_depth:
                refusals = [self.counterfactual_depth_refusal(None, self.depth, self.max_depth)] * len(
                    delegations
                )
            else:
                refusals = [
                    self.prompts.train_depth_refusal(d.goal, self.depth, self.max_depth) for d in delegations
                ]
            return self.prompts.train_delegation_results(refusals)
        if not self.allow_subagents or self.depth >= self.max_depth:
            info["rejected"] = True
            self.env_observation, self.env_infos = self.world.observe_with_infos(self.agent_id)
            return self.prompts.delegation_rejected(self.depth, self.max_depth, self.env_observation)
        self.delegation_events += 1
        requests = [
            LaunchRequest(
                goal=d.goal, max_steps=d.max_steps if self.training else min(d.max_steps, self.child_cap)
            )
            for d in delegations
        ]
        results = await asyncio.gather(*(self.launch(r) for r in requests), return_exceptions=True)
        children, reports, summary = [], [], []
        for k, (req, res) in enumerate(zip(requests, results, strict=True)):
            if isinstance(res, BaseException):
                if not isinstance(res, Exception):
                    raise res
                res = ChildResult(request=req, returned=False, error=f"{type(res).__name__}: {res}")
            if self.training:
                reports.append(self._launch_report(res, remaining=self.max_steps - index))
            else:
                children.append(self._child_record(res, index, k))
            summary.append({"goal": req.goal, "returned": res.returned, "refused": res.refused})
        info["delegations"] = summary
        self.env_observation, self.env_infos = self.world.observe_with_infos(self.agent_id)
        if self.training:
            return self.prompts.train_delegation_results(reports)
        return self.prompts.delegation_results(children, self.env_observation)

    def _launch_report(self, res: ChildResult, remaining: int) -> str:
        """What one public training launch returned to the parent (before the summary strips it):
        a counterfactual group's report or a refusal as is; else the child's finish message, else its
        error (a spent budget: platoon's warning), then the budget line. ``remaining``: the parent's own
        budget left before this step (``DepthAwareStepBudgetTracker.remaining_budget``)."""
        if res.report is not None:
            return res.report
        if res.refused:
            return res.error or ""
        child = self._find_child(res.request)
        budget = child.max_steps if child is not None else res.request.max_steps
        used = res.steps_used or (child.steps_used if child is not None else 0)
        exhausted = self.prompts.train_budget_exhausted if used >= budget else ""
        message = res.message or res.error or exhausted
        return self.prompts.train_launch_report(message, used, budget, remaining)

    def _child_record(self, res: ChildResult, index: int = 0, k: int = 0) -> dict[str, Any]:
        """The public child record (agent_id, returned, environment_success, steps, ...)."""
        req = res.request
        if res.refused and self.fork_budget_text is not None and res.error == self.fork_budget_text:
            # public select_delegated_trajectory: a pseudo-child named after the group (a uuid there; a
            # hash of the parent, step and launch here, so that repeats are exact)
            group = hashlib.sha256(f"{self.agent_id}/{index}/{k}".encode()).hexdigest()[:8]
            return {
                "agent_id": self.prompts.fork_budget_agent(self.agent_id, group),
                "returned": False,
                "environment_success": False,
                "steps": 0,
                "max_steps": req.max_steps,
                "remaining_steps": req.max_steps,
                "finish_message": res.error,
                "final_observation": "",
            }
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
        self.fork_budget_text = read_template(pick("fork_budget.txt", RUNTIME_PROMPTS, user_dir(prompts_dir)))
        """The runtime's fork-budget refusal (the same ``--prompts-dir`` replaces both)."""

    @property
    def training(self) -> bool:
        """The training prompt set, which also plays the public training runtime (module docstring)."""
        return self.prompts.prompt_set == "training"

    @property
    def tools_description(self) -> str:  # type: ignore[override]
        """The child's tools as the rubric writer reads them (``templates/tools_description.txt``)."""
        return self.prompts.tools_description

    def make_world(self, task: dict[str, Any]) -> SyncWorld:
        return SyncWorld(
            task,
            root_agent=self.root_agent_id,
            rules=self.rules,
            max_steps=TRAIN_SHARED_MAX_STEPS if self.training else None,
        )

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
            fork_budget_text=self.fork_budget_text,
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
        if self.training:
            # public training: the requested budget as is; fork_shared puts an ordinary child where the
            # phantom "root" stands (the kitchen), fork_counterfactual a branch where its parent stands
            max_steps = request.max_steps
            branch = isinstance(parent, SyncSession) and world is not parent.world
            start = {"start_from": parent.agent_id} if branch else {"start_room": KITCHEN}
        else:
            cap = parent.child_cap if isinstance(parent, SyncSession) else self.max_child_steps
            max_steps = min(request.max_steps, cap)
            start = {"start_from": world.root_agent}  # public fork_shared: where the root stands
        child = SyncSession(
            world,
            agent_id=agent_id,
            depth=parent.depth + 1,
            goal=request.goal,
            context=request.context,
            max_steps=max_steps,
            launch=launch,
            max_depth=self.max_depth,
            max_child_steps=self.max_child_steps,
            prompts=self.prompts,
            allow_subagents=self.allow_subagents,
            fork_budget_text=self.fork_budget_text,
            **start,
        )
        if isinstance(parent, SyncSession):
            parent.register_child(request, child)
        return child
