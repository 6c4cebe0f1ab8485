"""Real TextWorld cooking games as a SERA environment: one avatar, many agents taking turns on it.

What it does
    The world is ONE real ``tw-cooking`` game (see ``games.py``) played through ``textworld.start``.
    Every agent of the recursive tree (root and children) drives the same avatar with the TextWorld-Sync
    reply protocol: exactly one ``<action>cmd</action>``, ``<delegate>{...}</delegate>`` or
    ``<finish>msg</finish>`` block per reply, parsed by ``common/envs/textworld_sync/protocol.py`` (the
    one parser of that protocol; this module has none of its own). An action is accepted only if it is
    one of the game's admissible commands (case-insensitive); a rejected action gets an explanatory
    observation, never reaches the game, and still costs the agent its step (and one step of the
    optional shared budget ``max_world_steps``). A delegation awaits the runtime's ``launch`` hook once
    per child (siblings concurrently) and shows the parent a ``[SubAgent Results]`` block.
    ``fork()`` copies the game with ``env.copy()`` (0.1-0.5 s, growing with the map: the slow baseline
    the pure-Python TextWorld-Sync simulator is measured against, see ``bench/bench_textworld.py``);
    ``commit(branch)`` adopts the branch's game in place. Root success = the game is won (the meal is
    prepared and eaten).

What it simplifies
    One avatar, so there are no per-agent locations: children start wherever the avatar is. A child's own
    success (used for counterfactual labels) is "finished with a message, the game not lost, and the
    score went up while it ran (or the game is won)": free-text goals on a real game have no exact check.
    TextWorld envs cannot be pickled: move a world between processes with ``to_spec()`` /
    ``TextWorldCookingWorld.from_spec()`` (game path + accepted-command prefix, replayed).

How to run
    ``python -m common.envs.textworld_cooking.oracle --tier medium --seed 1`` plays one game with the
    walkthrough oracle and prints the transcript. Tests: ``pytest tests/test_textworld_cooking.py``.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from pathlib import Path
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
from common.envs.textworld_cooking.games import (
    DEFAULT_GOAL,
    game_metadata,
    quiet_jericho,
    request_infos,
    resolve_game_file,
)
from common.envs.textworld_sync.protocol import parse_reply

# ---------------------------------------------------------------------------------------------------
# Text helpers
# ---------------------------------------------------------------------------------------------------

_PROMPT_TAIL = re.compile(r"\n>[ \t].*\Z|\n>\Z", re.S)
_BLANKS = re.compile(r"\n{3,}")


def clean_feedback(text: str) -> str:
    """Strip the interpreter's ``>`` prompt, the status line after it and runs of blank lines.

    >>> clean_feedback("\\nYou take the knife.\\n\\n\\n\\n>     -= Kitchen =-3/10")
    'You take the knife.'
    """
    text = _PROMPT_TAIL.sub("", text or "")
    return _BLANKS.sub("\n\n", text).strip()


def normalize_command(cmd: str) -> str:
    """Lower-case and collapse whitespace (admissibility is checked on this form)."""
    return " ".join(str(cmd).split()).lower()


def location_of(description: str) -> str:
    """Room name from a TextWorld room description (``-= Kitchen =-`` -> ``Kitchen``)."""
    m = re.search(r"-=\s*(.+?)\s*=-", description or "")
    return m.group(1) if m else "unknown"


# ---------------------------------------------------------------------------------------------------
# The world
# ---------------------------------------------------------------------------------------------------


@dataclass
class ActOutcome:
    """The result of one command on the world."""

    command: str
    """The command as the agent wrote it."""
    accepted: bool
    """False when it was not admissible (or the game/budget was over); the game did not see it."""
    feedback: str
    """The game's cleaned reply, or the explanation of the rejection."""
    score_delta: int = 0
    canonical: str | None = None
    """The admissible command actually sent to the game."""


@dataclass
class _Snapshot:
    """Everything a fork must copy besides the game itself."""

    actions: list[str] = field(default_factory=list)
    rooms: list[str] = field(default_factory=list)
    steps_taken: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    start_room: str = ""


class TextWorldCookingWorld(World):
    """One live tw-cooking game shared by every agent of a task.

    Attributes worth reading: ``game_file``, ``walkthrough`` (the generator's winning command list from
    the start), ``actions`` (accepted commands since reset, in order, forks included), ``rooms`` (the
    avatar's room after each of them; ``start_room`` before the first), ``steps_taken``
    (every command attempted, rejected ones included), ``events`` (the log), ``state`` (the latest
    ``textworld.GameState``).
    """

    def __init__(
        self,
        game_file: str | Path,
        max_world_steps: int | None = None,
        *,
        policy_commands: bool = False,
        _env: Any = None,
        _state: Any = None,
        _snap: _Snapshot | None = None,
    ):
        self.game_file = str(game_file)
        self.max_world_steps = max_world_steps
        self.track_policy = policy_commands
        self._committed_into: TextWorldCookingWorld | None = None
        if _env is None:
            import textworld  # noqa: PLC0415  (optional dependency)

            with quiet_jericho():
                _env = textworld.start(self.game_file, request_infos(policy_commands))
                _state = _env.reset()
        self._env = _env
        self.state = _state
        snap = _snap or _Snapshot()
        self.actions, self.steps_taken, self.events = snap.actions, snap.steps_taken, snap.events
        self.rooms = snap.rooms
        self.start_room = snap.start_room or self.location
        walkthrough = self.state.get("extra.walkthrough") if self.state is not None else None
        self.walkthrough: list[str] = list(
            walkthrough or game_metadata(self.game_file).get("walkthrough", [])
        )

    # ---- cross-process transfer ------------------------------------------------------------------
    def to_spec(self) -> dict[str, Any]:
        """A picklable description of this state: game path + accepted commands (+ budget counters)."""
        return {
            "game_file": self.game_file,
            "actions": list(self.actions),
            "steps_taken": self.steps_taken,
            "max_world_steps": self.max_world_steps,
            "policy_commands": self.track_policy,
        }

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> TextWorldCookingWorld:
        """Rebuild a world from :meth:`to_spec` by replaying the commands on a fresh game."""
        world = cls(
            spec["game_file"], spec.get("max_world_steps"), policy_commands=spec.get("policy_commands", False)
        )
        for cmd in spec.get("actions", []):
            out = world.act("replay", cmd)
            if not out.accepted:
                raise ValueError(f"replay of {spec['game_file']} failed at {cmd!r}: {out.feedback}")
        world.steps_taken = int(spec.get("steps_taken", world.steps_taken))
        world.events.clear()
        return world

    # ---- queries ---------------------------------------------------------------------------------
    def _check_live(self) -> None:
        if self._committed_into is not None:
            raise RuntimeError("this branch was committed into another world; act on that world instead")

    @property
    def admissible_commands(self) -> list[str]:
        return list(self.state.get("admissible_commands") or [])

    @property
    def policy_commands(self) -> list[str]:
        """TextWorld's winning policy from the current state: empty unless the world was built with
        ``policy_commands=True``, and often empty on harder games even then."""
        return list(self.state.get("policy_commands") or [])

    @property
    def won(self) -> bool:
        return bool(self.state.get("won"))

    @property
    def lost(self) -> bool:
        return bool(self.state.get("lost"))

    @property
    def score(self) -> int:
        return int(self.state.get("score") or 0)

    @property
    def max_score(self) -> int:
        return int(self.state.get("max_score") or 0)

    @property
    def location(self) -> str:
        return location_of(self.state.get("description") or "")

    @property
    def budget_left(self) -> int | None:
        """Shared commands left (None = unlimited)."""
        if self.max_world_steps is None:
            return None
        return max(0, self.max_world_steps - self.steps_taken)

    @property
    def over(self) -> bool:
        """No more commands can change anything: won, lost or the shared budget is spent."""
        return self.won or self.lost or self.budget_left == 0

    def status_line(self) -> str:
        left = "unlimited" if self.budget_left is None else str(self.budget_left)
        state = "WON" if self.won else "LOST" if self.lost else "in progress"
        return (
            f"Location: {self.location} | Score: {self.score}/{self.max_score} | Moves: {len(self.actions)}"
            f" | Shared commands left: {left} | Game: {state}"
        )

    def inventory_text(self) -> str:
        return clean_feedback(self.state.get("inventory") or "")

    def description_text(self) -> str:
        return clean_feedback(self.state.get("description") or "")

    # ---- acting ----------------------------------------------------------------------------------
    def act(self, agent_id: str, command: str) -> ActOutcome:
        """Run one command for ``agent_id``: validate, apply, count, log (atomic: no awaits inside)."""
        self._check_live()
        norm = normalize_command(command)
        canonical = {normalize_command(c): c for c in self.admissible_commands}.get(norm)
        if self.budget_left == 0:
            out = ActOutcome(command, False, "The shared command budget is exhausted; no more commands run.")
        elif self.won or self.lost:
            out = ActOutcome(command, False, f"The game is already {'won' if self.won else 'lost'}.")
        elif canonical is None:
            out = ActOutcome(
                command,
                False,
                (
                    f"'{command}' is not an admissible command here, so nothing happened (it still cost a step). "
                    "Use one of the admissible commands listed below, exactly as written."
                ),
            )
        else:
            before = self.score
            self.state, _, _ = self._env.step(canonical)
            self.actions.append(canonical)
            self.rooms.append(self.location)
            out = ActOutcome(
                command, True, clean_feedback(self.state.feedback), self.score - before, canonical
            )
        self.steps_taken += 1
        self.events.append(
            {
                "agent": agent_id,
                "command": command,
                "accepted": out.accepted,
                "score": self.score,
                "won": self.won,
                "lost": self.lost,
            }
        )
        return out

    # ---- World contract ------------------------------------------------------------------------------
    def fork(self) -> TextWorldCookingWorld:
        """An isolated copy through ``env.copy()`` (slow: a new Z-machine plus deep copies of the state
        tracker). The latest ``GameState`` is shared shallowly: textworld builds a new one on every step
        and the fields read here (strings, lists) are never mutated afterwards."""
        self._check_live()
        snap = _Snapshot(
            list(self.actions), list(self.rooms), self.steps_taken, list(self.events), self.start_room
        )
        with quiet_jericho():
            env = self._env.copy()
        return TextWorldCookingWorld(
            self.game_file,
            self.max_world_steps,
            policy_commands=self.track_policy,
            _env=env,
            _state=type(self.state)(self.state),
            _snap=snap,
        )

    def commit(self, branch: World) -> None:
        """Adopt ``branch``'s game in place (no copy); the branch may be read but no longer acted on."""
        if not isinstance(branch, TextWorldCookingWorld):
            raise TypeError(f"cannot commit a {type(branch).__name__} into a TextWorldCookingWorld")
        if branch is self:
            return
        branch._check_live()
        if branch.game_file != self.game_file:
            raise ValueError(f"cannot commit a branch of {branch.game_file} into {self.game_file}")
        self._env, self.state = branch._env, branch.state
        self.actions, self.steps_taken, self.events = (
            list(branch.actions),
            branch.steps_taken,
            list(branch.events),
        )
        self.rooms, self.start_room = list(branch.rooms), branch.start_room
        self.max_world_steps, self.track_policy = branch.max_world_steps, branch.track_policy
        branch._committed_into = self

    def root_success(self) -> bool:
        return self.won

    def describe(self) -> str:
        lines = [
            f"Objective: {self.state.get('objective') or DEFAULT_GOAL}",
            self.status_line(),
            f"Room: {self.description_text()}",
            f"Inventory: {self.inventory_text()}",
            f"Commands accepted so far: {', '.join(self.actions) if self.actions else '(none)'}",
        ]
        return "\n".join(lines)

    def close(self) -> None:
        """Release the interpreter (optional; garbage collection does it too)."""
        if self._committed_into is None and self._env is not None:
            self._env.close()


# ---------------------------------------------------------------------------------------------------
# Prompts (all model-facing text of this environment lives here)
# ---------------------------------------------------------------------------------------------------

SYSTEM_PROMPT = """You are an agent playing a text adventure cooking game. You control the one character \
in the game together with other agents of your team (they act on the same game, one command at a time).

Reply with EXACTLY ONE of these blocks per message (you may think briefly before it):
<action>COMMAND</action>
    Run one game command. It must be one of the admissible commands listed in the observation, written
    exactly as listed (e.g. <action>take red apple from counter</action>). Anything else is rejected and
    still costs you a step.
<delegate>{{"goal": "what the sub-agent must do", "max_steps": 10}}</delegate>
    Hand a self-contained part of the work to a sub-agent that controls the same character.
    Several at once: <delegate>{{"delegations": [{{"goal": "...", "max_steps": 8}}, ...]}}</delegate>
    You will get a [SubAgent Results] block back. Sub-agents' steps do not use your budget.{depth_note}
<finish>MESSAGE</finish>
    Stop, and report what you did and the state you left the game in.

How the game works: read the cookbook in the kitchen (examine cookbook) for the recipe, collect every
ingredient, prepare each one exactly as the directions say (slice/dice/chop with a knife; roast in the oven,
fry on the stove, grill on the BBQ; never cook anything twice), then `prepare meal` in the kitchen and
`eat meal`. Containers and doors may need opening. You have {max_steps} steps; one reply is one step."""

FIRST_MESSAGE = """Your goal: {goal}{context}

{observation}

Reply with exactly one <action>, <delegate> or <finish> block."""


# ---------------------------------------------------------------------------------------------------
# Sessions
# ---------------------------------------------------------------------------------------------------


def format_subagent_results(
    results: list[ChildResult],
    world: TextWorldCookingWorld,
    children: list[TextWorldCookingSession | None] | None = None,
) -> str:
    """One ``[SubAgent Results]`` block per child, in TextWorld-Sync's layout (returned?,
    environment_success, steps, budget line, result text, final observation).

    ``children[k]`` is the session that ran child k (when known): its ``success()`` is the
    ``environment_success``; otherwise a child counts as successful when it returned."""
    blocks = []
    n = len(results)
    for k, res in enumerate(results):
        req = res.request
        child = children[k] if children and k < len(children) else None
        if res.refused:
            ok = False
        elif child is not None:
            ok = child.success()
        else:
            ok = res.returned
        left = world.budget_left
        shared = "" if left is None else f" Shared game commands left for the whole task: {left}."
        final = f"{world.status_line()}\nInventory: {world.inventory_text()}"
        lines = [
            "[SubAgent Results]",
            f"Sub-agent {k + 1} of {n}; goal: {req.goal}",
            f"returned: {'yes' if res.returned else 'no'}" + (" (launch refused)" if res.refused else ""),
            f"environment_success: {'true' if ok else 'false'}",
            f"steps: {res.steps_used}",
            f"Budget used by subagent: {res.steps_used}/{req.max_steps} steps.{shared}",
            f"result: {res.message or res.error or '(no message)'}",
            "final observation:",
            final,
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


class TextWorldCookingSession(AgentSession):
    """One agent (root or child) acting on the shared avatar of a :class:`TextWorldCookingWorld`."""

    def __init__(
        self,
        world: TextWorldCookingWorld,
        goal: str,
        agent_id: str,
        depth: int,
        max_steps: int,
        launch: LaunchHook,
        context: str = "",
        max_depth: int = 3,
    ):
        self.world, self.goal, self.context = world, goal, context
        self.agent_id, self.depth, self.max_steps = agent_id, depth, int(max_steps)
        self.launch, self.max_depth = launch, max_depth
        self.steps_used = 0
        self.finished = False
        self.finish_message: str | None = None
        self.start_score = world.score
        self.history: list[dict[str, Any]] = []
        self.children: dict[int, list[TextWorldCookingSession]] = {}
        """Child sessions created for each LaunchRequest of this agent (keyed by ``id(request)``)."""

    # ---- text ------------------------------------------------------------------------------------
    def system_prompt(self) -> str:
        if self.depth + 1 > self.max_depth:
            note = "\n    (You are at the maximum depth: delegating is refused here.)"
        else:
            note = ""
        return SYSTEM_PROMPT.format(depth_note=note, max_steps=self.max_steps)

    def observation(self, head: str = "") -> str:
        w = self.world
        parts = [head] if head else []
        parts.append(w.status_line())
        parts.append(f"Inventory: {w.inventory_text()}")
        if not w.over:
            parts.append("Admissible commands: " + ", ".join(w.admissible_commands))
        parts.append(f"Your steps: {self.steps_used}/{self.max_steps} used.")
        return "\n".join(parts)

    def first_user_message(self) -> str:
        w = self.world
        head = w.description_text()
        ctx = f"\nContext from your parent: {self.context}" if self.context else ""
        return FIRST_MESSAGE.format(goal=self.goal, context=ctx, observation=self.observation(head))

    # ---- stepping --------------------------------------------------------------------------------
    async def step(self, reply: str) -> StepResult:
        if self.finished:
            return StepResult("You have already finished.", done=True, finish_message=self.finish_message)
        self.steps_used += 1
        parsed = parse_reply(reply, self.world.admissible_commands)
        info: dict[str, Any] = {"kind": parsed.kind}
        done, finish_message = False, None
        if parsed.kind == "action":
            out = self.world.act(self.agent_id, parsed.action)
            info.update(action=parsed.action, accepted=out.accepted, score_delta=out.score_delta)
            head = f"> {parsed.action}\n{out.feedback}"
            if self.world.lost:
                head += "\nThe game is lost; nothing more can be done."
                done = True
            elif self.world.won:
                head += "\nThe game is WON (the meal is eaten). Finish with <finish>...</finish>."
            elif self.world.budget_left == 0:
                head += "\nThe shared command budget is exhausted."
                done = True
        elif parsed.kind == "delegate":
            requests = [
                LaunchRequest(goal=d.goal, context=d.context, max_steps=d.max_steps)
                for d in parsed.delegations
            ]
            results = await asyncio.gather(*(self.launch(r) for r in requests))
            info["children"] = [
                {"goal": r.request.goal, "returned": r.returned, "refused": r.refused, "steps": r.steps_used}
                for r in results
            ]
            children = [self._find_child(r.request) for r in results]
            head = format_subagent_results(list(results), self.world, children) + "\n\n[Your current view]"
            if self.world.lost:
                done = True
        elif parsed.kind == "finish":
            self.finished, self.finish_message = True, parsed.message
            return StepResult(
                f"Finished: {parsed.message}", done=True, finish_message=parsed.message, info=info
            )
        else:
            head = f"Invalid reply: {parsed.error}"
            if "<action>" not in (parsed.error or ""):
                head += "\nReply with exactly one <action>, <delegate> or <finish> block."
            info["error"] = parsed.error
        self.history.append({"reply": reply, **info})
        if not done and self.steps_used >= self.max_steps:
            head += "\nYour step budget is exhausted."
            done = True
        return StepResult(self.observation(head), done=done, finish_message=finish_message, info=info)

    def _find_child(self, request: LaunchRequest) -> TextWorldCookingSession | None:
        """The session that ran ``request``: the one on this world, else the committed branch's one."""
        found = self.children.get(id(request), [])
        for child in found:
            if child.world is self.world:
                return child
        for child in found:
            if child.world._committed_into is self.world:
                return child
        return found[0] if found else None

    def success(self) -> bool:
        if self.depth == 0:
            return self.world.root_success()
        if self.world.won:
            return True
        return (
            self.finished
            and bool((self.finish_message or "").strip())
            and not self.world.lost
            and self.world.score > self.start_score
        )


# ---------------------------------------------------------------------------------------------------
# The environment
# ---------------------------------------------------------------------------------------------------


class TextWorldCookingEnv(Environment):
    """Factory of worlds (one real game per task) and sessions (see the module docstring)."""

    name = "textworld-cooking"
    tools_description = (
        "The agent controls the one character of a real TextWorld cooking game shared with its team. Each "
        "step it sends one admissible game command (<action>take red apple from counter</action>, "
        "<action>go east</action>, <action>slice red apple with knife</action>, <action>cook red apple with "
        'oven</action>, <action>prepare meal</action>, ...), delegates with <delegate>{"goal": ...}</delegate> '
        "or stops with <finish>message</finish>. The task is won when the meal is prepared and eaten."
    )

    def __init__(self, cache_dir: str | None = None, max_depth: int = 3, policy_commands: bool = False):
        self.cache_dir = cache_dir
        """Game cache (None: ``$SERA_TW_GAMES_DIR`` or ``~/.cache/sera/tw_games``)."""
        self.max_depth = max_depth
        """Only used for the prompt's "you cannot delegate" note; the runtime enforces the limit."""
        self.policy_commands = policy_commands
        """Track TextWorld's winning policy (oracle fallback; ~2.5x slower steps on big games)."""

    def make_world(self, task: dict[str, Any]) -> TextWorldCookingWorld:
        path = resolve_game_file(task, self.cache_dir)
        return TextWorldCookingWorld(path, task.get("max_world_steps"), policy_commands=self.policy_commands)

    def root_session(self, world: World, task: dict[str, Any], launch: LaunchHook) -> TextWorldCookingSession:
        assert isinstance(world, TextWorldCookingWorld), type(world)
        goal = str(task.get("goal") or DEFAULT_GOAL)
        return TextWorldCookingSession(
            world, goal, "0", 0, int(task.get("max_steps") or 20), launch, max_depth=self.max_depth
        )

    def child_session(
        self, world: World, parent: AgentSession, request: LaunchRequest, agent_id: str, launch: LaunchHook
    ) -> TextWorldCookingSession:
        assert isinstance(world, TextWorldCookingWorld), type(world)
        child = TextWorldCookingSession(
            world,
            request.goal,
            agent_id,
            parent.depth + 1,
            request.max_steps,
            launch,
            context=request.context,
            max_depth=self.max_depth,
        )
        if isinstance(parent, TextWorldCookingSession):  # so the parent can report the child's success
            parent.children.setdefault(id(request), []).append(child)
        return child
