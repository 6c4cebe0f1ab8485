"""TextCraft-Synth as a SERA environment: :class:`TextCraftEnv` makes worlds and CodeAct agent sessions.

One session = one agent (root or child) with its own persistent Python: a
:class:`~common.codeact.CodeActWorker` process (real Python, standard-library imports, full asyncio,
last-expression echo, isolated; see ``common/codeact``; ``executor="worker-ordered"`` serves its cells in
one fixed order). Its tools run HERE, on the SHARED world (or on
the fork the runtime gave the child), when the cell calls them:

* ``craft`` / ``get_info`` / ``view_inventory`` -- :class:`TextCraftWorld` methods;
* ``finish(message)`` -- ends the agent after the current cell;
* ``await launch_subagent(targets, context="")`` -- validates the arguments (clear ``Error: ...``
  strings for a non-dict, an empty dict or a count that is not a positive int), builds a
  :class:`LaunchRequest` (``goal="Craft the following items: ..."``), awaits the runtime's ``launch`` hook
  and returns the child's report (its finish message, ``Budget used by subagent: u/N steps.`` and the
  parent's own remaining steps), or the depth-limit refusal. Several launches may be gathered.

Past replies appear in the agent's later prompts rebuilt from their parsed parts (``assistant_turn``:
``<thought>t</thought>`` and ``<python>code</python>`` on two lines), as platoon's prompt builder does.

``step(reply)`` = one model call, as the paper's CodeAct environment: parse
``<thought>...</thought><python>...</python>``; check the cell before it runs (syntax, empty,
``asyncio.all_tasks``/``current_task``, a ``launch_subagent(...)`` that is not awaited: the cell is
rejected with an error and has no effect); run it; the observation is ``[Cell i Output]`` + output +
``Error: ...`` (templates in ``templates/``), the slots filled as the paper's IPython executor fills them:
the output is the cell's stdout (its ``Out[1]: ...`` value line, and the traceback of an exception it
raised), the error is what it wrote to stderr or a check's message; ``StepResult.info`` carries both
(``cell_output``, ``cell_error``). A malformed reply is the empty cell. The agent halts when
it calls finish or runs out of steps. The **loop detector** (the paper's agent): when the last cells
repeat a pattern of period <= 3 four times, the agent is finished with "Stuck in a loop, terminating
early." on its next step (which the session takes at once, without a model call).

Success: the root succeeds iff ``world.root_success()`` (finish with a non-empty message and every target
crafted on top of the initial inventory); a child succeeds iff it called finish with a non-empty message
and each of its targets rose by the required count since the child started (same rule, child's targets).

``visible_state()`` is what the rubric writer and scorer may see of the world: ``{"inventory": ...}``.
``echo_launch_hook`` is a test double for the injection point: it "runs" nothing and echoes the goal.

Simplifies: the step budget per agent comes from the environment (20, SPEC §5), not from the record's
``max_steps`` (public records say 75); pass ``max_steps=None`` to use the record's value. The prompt states
the budget the session enforces.
Run: ``pytest tests/test_textcraft_env.py -q``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...codeact import CodeActWorker, WorkerLimits, check_cell, check_executor, stuck_in_loop
from ..base import (
    AgentSession,
    ChildResult,
    Environment,
    LaunchBoundError,
    LaunchHook,
    LaunchRequest,
    StepResult,
    World,
)
from .codeact import cell_slots, parse_codeact_reply
from .prompts import TextCraftPrompts, load_prompts
from .tasks import DEFAULT_MAX_STEPS, book_for_task, goal_text, parse_goal_targets
from .world import TextCraftWorld


@dataclass
class LaunchRecord:
    """One ``launch_subagent`` call of a session (kept for logs, delegation rewards and tests)."""

    step: int
    """The parent's step (1-based) during which the launch happened."""
    request: LaunchRequest | None
    """None when the arguments were invalid (the hook was never called)."""
    result: ChildResult | None = None
    error: str | None = None
    """The argument error returned to the model, when the arguments were invalid."""


async def echo_launch_hook(request: LaunchRequest) -> ChildResult:
    """Test double for the runtime's launch hook: runs no child, reports the goal back as finished."""
    return ChildResult(request=request, returned=True, message=f"(echo) {request.goal}", steps_used=1)


class TextCraftSession(AgentSession):
    """One CodeAct agent over a :class:`TextCraftWorld`."""

    score_state_needs_finish = True
    """The Execution-stage scorer sees the child's final inventory only when the child called ``finish`` with
    a message, else ``{}`` (public ``adapters/textcraft.py: final_state_from_trajectory``; read by
    ``common/agent/runtime.py: _Rollout.final_state``)."""

    def __init__(
        self,
        world: TextCraftWorld,
        *,
        goal: str,
        targets: Mapping[str, int],
        agent_id: str,
        depth: int,
        launch: LaunchHook,
        max_steps: int = DEFAULT_MAX_STEPS,
        child_max_steps: int = DEFAULT_MAX_STEPS,
        context: str = "",
        is_root: bool = False,
        executor: str = "worker",
        worker_limits: WorkerLimits | None = None,
        prompts: TextCraftPrompts | None = None,
    ):
        self.world = world
        self.goal = goal
        self.targets: dict[str, int] = dict(targets)
        self.agent_id = agent_id
        self.depth = depth
        self.launch = launch
        self.max_steps = max_steps
        self.child_max_steps = child_max_steps
        self.context = context
        self.is_root = is_root
        self.prompts = prompts or load_prompts()
        self.steps_used = 0
        self.finished = False
        self.finish_message: str | None = None
        self.start_inventory: dict[str, int] = world.initial_inventory if is_root else dict(world.inventory)
        """Counts at this agent's start; its targets are net gains over these."""
        self.halted = False
        """True once a step returned done (finish, budget, loop, or a runtime error)."""
        self.success_at_halt: bool | None = None
        """:meth:`success` judged at the moment the agent halted."""
        self.cell_index = 0
        """Cells that actually ran (rejected and malformed replies do not count)."""
        self.codes: list[str] = []
        """Every step's code, stripped ("" for a malformed reply): the loop detector's input."""
        self.launches: list[LaunchRecord] = []
        self.tool_calls: Counter[str] = Counter()
        self._hook_error: str | None = None
        check_executor(executor)
        self.executor = CodeActWorker(
            self._sync_tools(),
            {"launch_subagent": self._launch},
            worker_limits,
            turn_key=world,
            ordered=executor == "worker-ordered",
        )

    # --- tools (run here, in the trainer, on the shared world) ------------------------------------------
    def _sync_tools(self) -> dict[str, Any]:
        world, calls = self.world, self.tool_calls

        def craft(ingredients: Any = None, target: Any = None) -> str:
            calls["craft"] += 1
            return world.craft(ingredients, target)

        def get_info(items: Any = None) -> list[dict[str, Any]] | str:
            calls["get_info"] += 1
            return world.get_info(items)

        def view_inventory() -> dict[str, int]:
            calls["view_inventory"] += 1
            return world.view_inventory()

        def finish(message: Any = None) -> str:
            calls["finish"] += 1
            msg = "" if message is None else message if isinstance(message, str) else str(message)
            self._record_finish(msg)
            return self.prompts.finish_recorded(msg)

        return {"craft": craft, "get_info": get_info, "view_inventory": view_inventory, "finish": finish}

    def _record_finish(self, msg: str) -> None:
        if not self.finished:
            self.finished = True
            self.finish_message = msg
            if self.is_root:
                self.world.root_finish_message = msg

    def _validate_targets(self, targets: Any, context: Any) -> str | None:
        """The arguments no child is run for (a ledgered deviation, docs/fidelity/codeact.md): not a dict,
        an empty dict, an item name that is not a string, or a count that is not a positive int (booleans
        included). Public platoon builds a goal string from ANY dict and runs a child; for these cases that
        goal names no target (the child then inherits its parent's targets) or a zero target (a free
        success), so they are refused here with an error. Unknown and base items are NOT refused: a child
        runs for them as in the public code and fails on its own (it cannot craft them)."""
        if not isinstance(targets, dict) or not targets:
            return (
                "Error: targets must be a non-empty dict {item_name: count}, e.g. "
                'launch_subagent({"a1_i4": 2})'
            )
        for item, n in targets.items():
            if not isinstance(item, str) or not item:
                return f"Error: target item names must be non-empty strings, got {item!r}"
            if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
                return f"Error: count for {item} must be a positive int, got {n!r}"
        if not isinstance(context, str):
            return f"Error: context must be a string, got {type(context).__name__}"
        return None

    async def _launch(self, targets: Any = None, context: Any = "") -> str:
        self.tool_calls["launch_subagent"] += 1
        error = self._validate_targets(targets, context)
        if error is not None:
            self.launches.append(LaunchRecord(step=self.steps_used, request=None, error=error))
            return error
        request = LaunchRequest(
            goal=goal_text(targets),
            context=context,
            max_steps=self.child_max_steps,
            targets=dict(targets),
        )
        record = LaunchRecord(step=self.steps_used, request=request)
        self.launches.append(record)
        try:
            result = await self.launch(request)
        except LaunchBoundError:  # a loop far past the launch bound: the cell gets the exception
            raise
        except Exception as e:  # a runtime bug, not the model's: surfaces as this step's error
            self._hook_error = f"launch hook failed: {type(e).__name__}: {e}"
            return "Error: the sub-agent could not be started (internal error)."
        record.result = result
        if result.refused:
            return result.error or "Launch refused."
        if result.report is not None:  # a counterfactual group: "Selected branch: 0; ..." (runtime)
            return result.report
        text = result.message if result.returned else self.prompts.child_did_not_finish(result.error)
        budget = result.request.max_steps if result.request is not None else request.max_steps
        # The parent's own steps left, counting the current step as not yet taken (the public depth-aware
        # tracker counts the trajectory's recorded steps; the step whose cell is running is recorded after it).
        remaining = self.max_steps - (self.steps_used - 1)
        return self.prompts.launch_report(text, result.steps_used, budget, remaining)

    # --- AgentSession -------------------------------------------------------------------------------
    def system_prompt(self) -> str:
        return self.prompts.system(self.max_steps)

    def first_user_message(self) -> str:
        return self.prompts.first_user_message(self.goal, self.max_steps, self.context)

    def assistant_turn(self, reply: str) -> str:
        """How ``reply`` appears in this agent's later prompts: rebuilt from its parsed thought and code
        (platoon's ``_format_action_for_history``), not the raw text."""
        parsed = parse_codeact_reply(reply)
        return self.prompts.assistant_turn(parsed.thought_raw, parsed.code)

    def depth_refusal(self, request: LaunchRequest, depth: int, max_depth: int) -> str:
        """What ``await launch_subagent(...)`` returns when the runtime refuses the launch at the depth limit."""
        return self.prompts.depth_refusal(self.prompts.goal(request.goal, request.context), depth, max_depth)

    def visible_state(self) -> dict[str, Any]:
        """What a rubric writer or scorer may see of the world now (the public payload)."""
        return {"inventory": dict(sorted(self.world.view_inventory().items()))}

    @property
    def steps_left(self) -> int:
        return self.max_steps - self.steps_used

    async def _run_cell(self, index: int, code: str, info: dict[str, Any]) -> str:
        """Check, run and describe one cell (the observation text). ``info`` gets the two slots of the
        observation: ``cell_output`` (the output as the model reads it, a raised exception's traceback
        included) and ``cell_error`` (the error slot: a check's or the compiler's message, or what the
        cell wrote to stderr), as platoon's ``CodeActStep.output`` / ``.error``."""
        check = check_cell(code, parse=False)
        if check.kind is not None:
            info["rejected"] = check.kind
            error = {
                "syntax": lambda: self.prompts.syntax_error(check.line, check.message),
                "empty": self.prompts.empty_cell,
                "introspection": lambda: self.prompts.introspection(check.names),
                "unawaited": lambda: self.prompts.unawaited(check.names),
            }[check.kind]()
            return self._observation(index, "", error, info)
        self.cell_index += 1
        info["cell_index"] = self.cell_index
        result = await self.executor.run(code)
        info["timed_out"] = result.timed_out
        info["exception"] = result.exception
        info["worker_restarted"] = result.restarted
        if result.syntax_error is not None:  # rejected by the worker's compiler: the paper's message
            info["rejected"] = "syntax"
            return self._observation(index, "", self.prompts.syntax_error(*result.syntax_error), info)
        output, error = cell_slots(result)
        if result.unawaited_launches:
            output += self.prompts.unawaited_runtime(result.unawaited_launches) + "\n"
        return self._observation(index, output, error, info)

    def _observation(self, index: int, output: str, error: str, info: dict[str, Any]) -> str:
        info["cell_output"], info["cell_error"] = output, error
        return self.prompts.observation(index, output, error)

    async def step(self, reply: str) -> StepResult:
        if self.halted or self.finished or self.steps_used >= self.max_steps:
            return StepResult(
                observation="This agent has already stopped.",
                done=True,
                error="step() called after the agent halted",
            )
        self.steps_used += 1
        index = self.steps_used - 1  # the paper numbers cells by step, from 0
        parsed = parse_codeact_reply(reply)
        code = parsed.code or ""
        self.codes.append(code.strip())
        info: dict[str, Any] = {"step": self.steps_used, "parse_error": parsed.error, "cell_index": None}
        n_launch = len(self.launches)
        calls_before = sum(self.tool_calls.values())
        observation = await self._run_cell(index, code, info)
        info["tool_calls"] = sum(self.tool_calls.values()) - calls_before
        info["launches"] = [
            {
                "targets": r.request.targets if r.request else None,
                "error": r.error,
                "refused": bool(r.result and r.result.refused),
                "returned": bool(r.result and r.result.returned),
            }
            for r in self.launches[n_launch:]
        ]
        if self._hook_error is not None:
            err, self._hook_error = self._hook_error, None
            return self._halt(StepResult(observation=observation, done=True, error=err, info=info))
        if self.finished:
            return self._halt(
                StepResult(observation=observation, done=True, finish_message=self.finish_message, info=info)
            )
        if self.steps_used >= self.max_steps:
            return self._halt(StepResult(observation=observation, done=True, info=info))
        if stuck_in_loop(self.codes):
            # The paper's agent answers its next turn with finish('Stuck in a loop, ...') instead of
            # calling the model; that step counts. Taken here at once (no model call is wasted).
            message = self.prompts.loop_finish_message
            self.steps_used += 1
            self.codes.append(f"finish({message!r})")
            self.tool_calls["finish"] += 1
            self._record_finish(message)
            info["loop_detected"] = True
            return self._halt(
                StepResult(observation=observation, done=True, finish_message=message, info=info)
            )
        return StepResult(observation=observation, info=info)

    def success(self) -> bool:
        """Judged when the agent halts (later agents may consume a child's products: that does not undo
        the child's success); live before that."""
        if self.success_at_halt is not None:
            return self.success_at_halt
        return self._judge()

    def _judge(self) -> bool:
        if self.is_root:
            return self.world.root_success()
        msg = self.finish_message
        if not self.finished or not msg or not msg.strip():
            return False
        return self.world.targets_met(self.targets, self.start_inventory)

    def _halt(self, result: StepResult) -> StepResult:
        self.halted = True
        self.success_at_halt = self._judge()
        result.info["success"] = self.success_at_halt
        self.close()
        return result

    def close(self) -> None:
        """Stop this agent's worker process (done when it halts; idempotent)."""
        self.executor.close()


class TextCraftEnv(Environment):
    """Factory of TextCraft-Synth worlds and sessions."""

    name = "textcraft"

    def __init__(
        self,
        max_steps: int | None = DEFAULT_MAX_STEPS,
        task_dir: str | Path | None = None,
        executor: str = "worker",
        worker_limits: WorkerLimits | None = None,
        prompts_dir: str | Path | None = None,
    ):
        """``max_steps``: every agent's step budget (None: the record's ``max_steps``); ``task_dir``: base
        for relative ``misc.recipes_path`` (records from :func:`load_tasks` are already absolute);
        ``executor``: ``"worker"`` (default: an isolated process per agent), ``"worker-ordered"`` (the
        same workers, each cell segment served inline on the event loop: parallel siblings act on the
        shared world in one fixed order, so a run repeats exactly); ``worker_limits``: the workers' limits;
        ``prompts_dir``: templates that replace the packaged ones (``--prompts DIR``)."""
        check_executor(executor)
        self.max_steps = max_steps
        self.task_dir = task_dir
        self.executor = executor
        self.worker_limits = worker_limits
        self.prompts = load_prompts(prompts_dir)

    @property
    def tools_description(self) -> str:  # type: ignore[override]
        """Shown to the rubric writer as the child's tools (``textcraft_tools_description.txt``)."""
        return self.prompts.tools_description

    def _session_options(self) -> dict[str, Any]:
        return {
            "executor": self.executor,
            "worker_limits": self.worker_limits,
            "prompts": self.prompts,
        }

    def make_world(self, task: dict[str, Any]) -> TextCraftWorld:
        misc = task["misc"]
        book = book_for_task(task, self.task_dir)
        return TextCraftWorld(book, misc.get("initial_inventory") or {}, misc["target_items"])

    def _budget(self, task: Mapping[str, Any] | None) -> int:
        """The root's budget: the record's ``max_steps`` (the runtime passes the run's limit there), capped
        by this environment's per-agent cap (the paper caps every agent at 20 though its rows say 75)."""
        record = (task or {}).get("max_steps")
        if self.max_steps is None:
            return int(record or DEFAULT_MAX_STEPS)
        return min(self.max_steps, int(record)) if record else self.max_steps

    def root_session(self, world: World, task: dict[str, Any], launch: LaunchHook) -> TextCraftSession:
        if not isinstance(world, TextCraftWorld):
            raise TypeError(f"TextCraftEnv needs a TextCraftWorld, got {type(world).__name__}")
        budget = self._budget(task)
        return TextCraftSession(
            world,
            goal=task.get("goal") or goal_text(world.targets),
            targets=world.targets,
            agent_id=str(task.get("id", "root")),
            depth=0,
            launch=launch,
            max_steps=budget,
            child_max_steps=self.max_steps or DEFAULT_MAX_STEPS,
            is_root=True,
            **self._session_options(),
        )

    def child_session(
        self,
        world: World,
        parent: AgentSession,
        request: LaunchRequest,
        agent_id: str,
        launch: LaunchHook,
    ) -> TextCraftSession:
        if not isinstance(world, TextCraftWorld):
            raise TypeError(f"TextCraftEnv needs a TextCraftWorld, got {type(world).__name__}")
        targets = request.targets or parse_goal_targets(request.goal)
        if not targets:
            raise ValueError(f"launch request names no targets: {request.goal!r}")
        return TextCraftSession(
            world,
            goal=request.goal,
            targets=targets,
            agent_id=agent_id,
            depth=parent.depth + 1,
            launch=launch,
            max_steps=request.max_steps,
            child_max_steps=self.max_steps or DEFAULT_MAX_STEPS,
            context=request.context,
            is_root=False,
            **self._session_options(),
        )
