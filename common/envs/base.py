"""The contract every SERA environment implements (SPEC.md §2).

An environment has three parts:

* a **world**: the one shared, live state of a task (TextCraft: the shared inventory; TextWorld-Sync: the
  kitchen, its items and the global action budget). Worlds can be ``fork()``-ed into an isolated deep
  copy (counterfactual branches, test-time selection) and a fork can be ``commit()``-ed back.
* **agent sessions**: one per agent in the recursive tree. A session is an agent's private *view* of the
  world (its Python namespace, its location, its step count) and turns a model reply into an
  observation. Sessions never talk to the model; the runtime (``common/agent``) does that.
* a **launch hook**: when the model delegates (``await launch_subagent(...)`` in TextCraft, a
  ``<delegate>`` block in TextWorld-Sync) the session calls ``launch(request)``. The runtime supplies
  the hook: it writes and freezes a rubric, runs the child, scores it and hands back a
  :class:`ChildResult`. The session formats that result as text for its parent.

The runtime only ever uses the names defined here, so a new environment plugs in by implementing them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LaunchRequest:
    """One delegated subtask, as the parent's reply asked for it."""

    goal: str
    """The child's goal text (TextCraft: ``Craft the following items: 2x a1_i5``)."""
    context: str = ""
    """Extra context the parent passed along (TextCraft ``context=``; TextWorld-Sync unused)."""
    max_steps: int = 20
    """The child's own step budget (children's steps never consume the parent's budget)."""
    targets: dict[str, int] | None = None
    """Structured targets where the environment has them (TextCraft ``{item: count}``)."""


@dataclass
class ChildResult:
    """What the runtime hands back to the parent's session once a child has ended."""

    request: LaunchRequest
    returned: bool
    """True when the child called finish; False on budget exhaustion, error or refusal."""
    message: str = ""
    """The child's finish message (empty when it never finished)."""
    steps_used: int = 0
    error: str | None = None
    """Error text when the child crashed, or the refusal text when the launch was refused."""
    refused: bool = False
    """True when the launch was refused (depth limit); the parent paid its step, nothing else."""
    report: str | None = None
    """When set, the exact text the parent's launch call returns instead of the session's own launch
    report (a Rubric-stage counterfactual launch: the public collector's ``Selected branch: 0; ...``)."""


class LaunchBoundError(RuntimeError):
    """A launch far past the runtime's launch bounds (``max_launches_per_step``): raised INTO the caller
    instead of returning one more refusal, so a CodeAct cell looping on ``launch_subagent`` stops at once
    (an uncaught exception ends the cell) instead of spinning on refusals until its CPU limit. Sessions
    pass it through to the agent's code; it is never a runtime failure."""


LaunchHook = Callable[[LaunchRequest], Awaitable[ChildResult]]
"""``async def launch(request) -> ChildResult`` supplied by the runtime."""


@dataclass
class StepResult:
    """The outcome of one agent step (one model call)."""

    observation: str
    """Text the agent sees next (it becomes the next user message)."""
    done: bool = False
    """The agent halted (finish called, or the environment ended it)."""
    finish_message: str | None = None
    """The message passed to finish, when finish was called this step."""
    error: str | None = None
    """An error that ends the agent (not a recoverable tool error; those live in ``observation``)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Environment-specific extras (parsed action, validity, ...), logged but never shown to the model."""


class World(ABC):
    """The shared, live state of one task."""

    @abstractmethod
    def fork(self) -> World:
        """An isolated deep copy: nothing done to the fork is visible here, and vice versa."""

    @abstractmethod
    def commit(self, branch: World) -> None:
        """Make ``branch``'s state the live state of ``self`` (in place, so existing sessions see it)."""

    @abstractmethod
    def root_success(self) -> bool:
        """The programmatic root success check of SPEC.md (judged on the world only)."""

    @abstractmethod
    def describe(self) -> str:
        """The whole state as text, for logs, viewers and tests. It may hold hidden state, so rubric and
        score prompts never use it (they use :meth:`AgentSession.visible_state`)."""


class AgentSession(ABC):
    """One agent's view of a world. ``step`` is async because a step may await children."""

    agent_id: str
    depth: int
    max_steps: int
    steps_used: int
    finished: bool
    finish_message: str | None
    counterfactual_rollout: bool = False
    """Set by the runtime on every session of a Rubric-stage rollout (``counterfactual_k > 1``): there every
    launch goes through the public ``CounterfactualCollector``, whose texts (e.g. its depth refusal) apply."""
    branch_depth: int = 0
    """The depth of the counterfactual branch this agent runs under (public ``current_branch.depth``), set
    by the runtime: 0 for the root, a branch agent's own depth, an ordinary child's parent's value. The
    collector refuses a launch past the depth limit only when this depth has reached it; any other agent at
    the limit gets the environment's ordinary (step-budget tracker's) refusal."""

    @abstractmethod
    def system_prompt(self) -> str:
        """The system message for this agent."""

    @abstractmethod
    def first_user_message(self) -> str:
        """The first user message: the goal, the current state, what to do next."""

    @abstractmethod
    async def step(self, reply: str) -> StepResult:
        """Apply one model reply. Malformed replies become an explanatory observation, never a crash."""

    @abstractmethod
    def success(self) -> bool:
        """Did this agent achieve its own goal? (Root: ``world.root_success()``; child: its targets.)"""

    def visible_state(self) -> Any:
        """The environment as THIS agent can observe it now, as a JSON-able value: the rubric writer's
        pre-call state (the parent's view) and the scorer's final state (the child's view). Never hidden
        world state (other agents' locations, required preparations). Public shapes: TextCraft
        ``{"inventory": {...}}``, TextWorld ``{"observation", "infos", "location"}``.

        ``None`` (this default) makes the runtime use ``{"observation": <the agent's last observation>}``.
        """
        return None


class Environment(ABC):
    """Factory for worlds and sessions of one benchmark."""

    name: str
    tools_description: str = ""
    """One paragraph naming the tools/actions a child agent has (shown to the rubric writer)."""

    @abstractmethod
    def make_world(self, task: dict[str, Any]) -> World:
        """A fresh live world for one task record."""

    @abstractmethod
    def root_session(self, world: World, task: dict[str, Any], launch: LaunchHook) -> AgentSession:
        """The root agent (depth 0) on ``world``."""

    @abstractmethod
    def child_session(
        self,
        world: World,
        parent: AgentSession,
        request: LaunchRequest,
        agent_id: str,
        launch: LaunchHook,
    ) -> AgentSession:
        """A child agent (depth parent.depth + 1) on ``world`` (the live world or a fork of it)."""
