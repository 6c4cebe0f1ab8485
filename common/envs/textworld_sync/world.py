"""TextWorld-Sync's shared world: one multi-dish kitchen that many agents act on at once (SPEC.md §2.2).

:class:`SyncWorld` follows the public SERA composite environment
(``Runtime/environments/textworld/composite_cooking.py`` + ``composite_scorer.py`` of OliverLeeXZ/SERA):
the rules, the observation text and the ``infos`` dict are the public ones; the code is ours. Shared:
the ingredients, one inventory, the prepared counter, the meals, the kitchen gate, the tool cooldowns and
the GLOBAL action budget ``shared_environment_max_steps``. Private per agent: its location.

Rules (``rules="public"``, the default):

* Rooms: the first ``max(4, min(11, numLocations))`` of :data:`ROOMS` (default 6). ``go to R`` reaches
  any other room; ``move north|south|east|west`` goes to pantry / dining room / garden / supermarket
  from anywhere (when that room exists and is not the current one).
* An ingredient lies in the room named by its first ``candidate_source_locations`` entry
  (``kitchen.fridge`` -> kitchen; anything but kitchen/pantry/garden/supermarket -> kitchen).
  Distractors (``numDistractorItems``) exist only as a count: never shown, never takeable.
* Preparation is a set (``{"grilled", "diced"}``). An ingredient starts with the ``raw`` / ``uncut``
  members of its expected set. The valid actions offer, for each ingredient in the shared inventory,
  only its MISSING expected preparations (``dice X``, ``cook X on grill``), in any room, while the tool
  (knife / stove / oven / grill) is not cooling down. So a listed action can never spoil a dish.
  When the actual set equals the expected set the ingredient moves to the prepared counter (raw+uncut
  ingredients right on ``take``).
* ``take X``: X in the agent's room, not collected, not behind the closed gate, inventory not full.
  ``take knife`` is listed in the kitchen and does nothing (as in the public code).
* ``prepare D`` once all of D's ingredients are on the counter; ``eat D`` once prepared (anywhere).
  ``open door`` opens the gate (closed iff ``includeDoors``; it hides the dishes that a
  ``{"from": "gate_1", "to": D}`` dependency names).
* Capacity: ``parallelism.resource_capacity.inventory`` when set, else ``int(limitInventorySize)``
  (0 = unlimited). Cooldown ``c`` (``parallelism.mechanisms.tool_cooldown_steps``): a tool used at global
  step t is unavailable for the next ``c`` global steps.
* ``look around`` / ``read cookbook`` change nothing (the cookbook reveals nothing: recipes live in the
  task text). Every world step counts one global step, valid or not; the world ends on task success,
  on task failure (a wrong preparation, reachable only under ``rules="strict"``) or when the budget is
  spent. After that a step is a no-op that costs nothing (the sessions stop their agents first).
* Score (``composite_scorer``): a dish succeeds when each ingredient is collected with exactly its
  expected set and the meal is prepared and eaten; the task succeeds when every dish does.

``rules="strict"`` (the project's earlier, harder variant, kept as a documented option): cutting and
cooking work only in the kitchen, and the valid actions offer EVERY cut verb and every appliance for a
held ingredient that has not been cut / cooked yet; a preparation the recipe does not ask for is
irreversible and fails the whole task.

Inventory look-ups (``inventory`` / ``view inventory`` / ``check inventory``) are answered by
:meth:`SyncWorld.inventory_text` without a world step (the session does that, as the public evaluator
does); sent to :meth:`SyncWorld.step` directly they count, as in the public coordinator.

``fork()`` copies only the flat mutable state (~10 us); ``commit(branch)`` writes a branch back in place.
Every step runs under one ``threading.Lock`` with nothing awaited inside.

Micro-benchmark: :func:`bench_sync` (``python bench/bench_textworld.py`` runs it beside real TextWorld).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from common.envs.base import World

ROOMS = (
    "kitchen",
    "pantry",
    "garden",
    "supermarket",
    "hallway",
    "dining room",
    "garage",
    "study",
    "basement",
    "attic",
    "courtyard",
)
"""Public room names in order; a task with ``numLocations = n`` uses the first ``max(4, min(11, n))``."""
KITCHEN = "kitchen"
SOURCE_ROOMS = ("kitchen", "pantry", "garden", "supermarket")
"""Rooms an ingredient's source can name; anything else lies in the kitchen (public ``_source_room``)."""
DIRECTIONS = {"north": "pantry", "south": "dining room", "east": "garden", "west": "supermarket"}
"""``move D`` goes to this room from anywhere (public ``_DIRECTIONS``)."""
COOK_TOOL = {"fried": "stove", "roasted": "oven", "grilled": "grill", "baked": "oven", "boiled": "stove"}
"""Cooking state -> the tool that makes it (public ``_COOKING_ACTION``)."""
CUT_VERB = {"chopped": "chop", "sliced": "slice", "diced": "dice", "minced": "mince"}
"""Cutting state -> its verb (public ``_CUTTING_ACTIONS``)."""
TOOLS = ("knife", "stove", "oven", "grill")
COOK_STATES = ("raw", *COOK_TOOL)
CUT_STATES = ("uncut", *CUT_VERB)
BASE = frozenset({"raw", "uncut"})
INVENTORY_ACTIONS = frozenset({"inventory", "view inventory", "check inventory"})
"""Look-ups the sessions answer without a world step (public ``INVENTORY_ACTIONS``)."""
ALWAYS_ACCEPTED = frozenset({"look around"}) | INVENTORY_ACTIONS
"""Accepted by ``step`` even when not listed (public ``_step_locked``)."""
RULES = ("public", "strict")


def normalize_action(text: str) -> str:
    """Lower-case, collapse whitespace, drop surrounding quotes/backticks and a trailing period."""
    return " ".join(str(text).lower().split()).strip(" .!\"'`")


def _norm(text: str) -> str:
    """The public ``_normalise``: strip, lower-case, collapse whitespace."""
    return " ".join(str(text).strip().lower().split())


def cook_phrase(tool: str) -> str:
    """``grill`` -> ``on grill``; ``stove`` / ``oven`` -> ``in stove`` / ``in oven``."""
    return f"{'on' if tool == 'grill' else 'in'} {tool}"


def prep_set(values: Any) -> frozenset[str]:
    """A row's ``preparation`` as a set; ``[]`` means ``{"raw", "uncut"}``. Unknown words are an error.

    >>> sorted(prep_set(["grilled", "diced"])), sorted(prep_set([]))
    (['diced', 'grilled'], ['raw', 'uncut'])
    """
    if isinstance(values, str):
        values = values.split(",")
    if not isinstance(values, (list, tuple, set, frozenset)):
        raise TypeError(f"preparation must be a list of strings, got {type(values).__name__}")
    out = frozenset(str(v).strip().lower() for v in values if str(v).strip())
    unknown = out - set(COOK_STATES) - set(CUT_STATES)
    if unknown:
        raise ValueError(
            f"unknown preparation {sorted(unknown)}; expected words from {COOK_STATES + CUT_STATES}"
        )
    return out or BASE


def parse_preparation(values: Any) -> tuple[str, str]:
    """``["grilled", "diced"]`` -> ``("grilled", "diced")``; missing halves read as raw / uncut.

    Used to validate rows (one cooking and one cutting state at most).

    >>> parse_preparation(["raw", "uncut"]), parse_preparation("sliced")
    (('raw', 'uncut'), ('raw', 'sliced'))
    """
    s = prep_set(values)
    cooks = [v for v in COOK_STATES if v in s]
    cuts = [v for v in CUT_STATES if v in s]
    if len(cooks) > 1:
        raise ValueError(f"preparation {sorted(s)} names two cooking states")
    if len(cuts) > 1:
        raise ValueError(f"preparation {sorted(s)} names two cutting states")
    return (cooks or ["raw"])[0], (cuts or ["uncut"])[0]


@dataclass(frozen=True)
class ItemSpec:
    """One required ingredient (immutable)."""

    name: str
    dish: int
    room: str
    expected: frozenset[str]

    @property
    def initial(self) -> frozenset[str]:
        """What it is when found: the raw/uncut members of its expected set (public)."""
        return self.expected & BASE

    @property
    def work(self) -> int:
        """World actions it needs: take + one per missing preparation."""
        return 1 + len(self.expected - BASE)


@dataclass(frozen=True)
class TaskSpec:
    """Everything immutable about a task, shared by a world and all its forks."""

    task_id: str
    rules: str
    rooms: tuple[str, ...]
    dish_ids: tuple[str, ...]
    dish_index: dict[str, int]
    dish_items: tuple[tuple[int, ...], ...]
    items: tuple[ItemSpec, ...]
    item_index: dict[str, int]
    gated_dishes: frozenset[int]
    gate_initially_open: bool
    capacity: int
    """0 = unlimited."""
    cooldown: int
    max_steps: int
    n_distractors: int
    """Counted only; never shown (public)."""
    nav: dict[str, tuple[str, ...]]
    """Per room: the always-listed actions (look, inventory, cookbook, go to, move), precomputed."""
    items_by_room: dict[str, tuple[int, ...]]
    game: str = "cookingworld_multidish"
    """The row's ``game`` (public ``TaskSpec.game`` / ``misc["textworld_game"]``), shown in the visible state."""

    @property
    def strict(self) -> bool:
        return self.rules == "strict"


def _int(value: Any, default: int) -> int:
    if value is None or value == "":
        return default
    return int(value)


def normalize_row(row: dict[str, Any]) -> dict[str, Any]:
    """The flat public schema of a row (a shallow copy). Manifest rows keep their recipe and parallelism
    under ``generation_properties`` and ``game_params`` as a JSON string; both are lifted here."""
    if not isinstance(row, dict):
        raise TypeError(f"a task row must be a JSON object, got {type(row).__name__}")
    out = dict(row)
    gp = out.get("generation_properties")
    if isinstance(gp, dict):
        for key in (
            "dishes",
            "parallelism",
            "task_family",
            "task_view",
            "task_descriptions",
            "generation",
            "base_game",
        ):
            if key not in out and key in gp:
                out[key] = gp[key]
    params = out.get("game_params")
    if isinstance(params, str):
        out["game_params"] = json.loads(params) if params.strip() else {}
    if "split" not in out and "fold" in out:
        out["split"] = out["fold"]
    return out


def build_spec(task: dict[str, Any], rules: str = "public", max_steps: int | None = None) -> TaskSpec:
    """Turn a public-format task row (flat or manifest form) into the immutable :class:`TaskSpec`.

    ``max_steps``: the shared step budget, replacing the row's ``shared_environment_max_steps`` (public
    training: ``textworld_continuous_policy/env.py: TextWorldEnv.reset`` reads the key from ``task.misc``,
    where ``tasks.py: get_textworld_task`` never puts it, so every training world has 100 steps)."""
    if rules not in RULES:
        raise ValueError(f"unknown rules {rules!r}; use one of {RULES}")
    row = normalize_row(task)
    params = row.get("game_params") or {}
    par = row.get("parallelism") or {}
    dishes = row["dishes"]
    if not isinstance(dishes, list) or not dishes:
        raise ValueError("task has no dishes")
    rooms = ROOMS[: max(4, min(len(ROOMS), _int(params.get("numLocations"), 6)))]
    items: list[ItemSpec] = []
    dish_ids: list[str] = []
    dish_items: list[tuple[int, ...]] = []
    for d, dish in enumerate(dishes):
        dish_id = str(dish["dish_id"]).strip()
        if dish_id in dish_ids:
            raise ValueError(f"duplicate dish_id {dish_id!r}")
        dish_ids.append(dish_id)
        recipe = dish["recipe"]
        if not isinstance(recipe, list) or not recipe:
            raise ValueError(f"dish {dish_id} has an empty recipe")
        idx = []
        for ing in recipe:
            name = _norm(ing["name"])
            if any(it.name == name for it in items):
                raise ValueError(f"ingredient {name!r} appears in two dishes (names must be disjoint)")
            parse_preparation(ing.get("preparation", []))  # at most one cook and one cut
            sources = ing.get("candidate_source_locations") or ["kitchen"]
            room = _norm(sources[0]).split(".", 1)[0]
            idx.append(len(items))
            items.append(
                ItemSpec(
                    name, d, room if room in SOURCE_ROOMS else KITCHEN, prep_set(ing.get("preparation", []))
                )
            )
        dish_items.append(tuple(idx))
    gated = {
        dish_ids.index(str(e.get("to")))
        for e in par.get("dependencies") or []
        if isinstance(e, dict) and str(e.get("from")) == "gate_1" and str(e.get("to")) in dish_ids
    }
    capacity = _int(params.get("limitInventorySize"), 0)
    cap_spec = par.get("resource_capacity")
    if isinstance(cap_spec, dict) and cap_spec.get("inventory"):
        capacity = _int(cap_spec["inventory"], 0)
    cooldown = _int((par.get("mechanisms") or {}).get("tool_cooldown_steps"), 0)
    if max_steps is None:
        max_steps = _int(par.get("shared_environment_max_steps"), 100)
    if capacity < 0 or cooldown < 0 or max_steps <= 0:
        raise ValueError("capacity/cooldown must be >= 0 and shared_environment_max_steps > 0")
    return TaskSpec(
        task_id=str(row.get("task_id", "")),
        rules=rules,
        rooms=tuple(rooms),
        dish_ids=tuple(dish_ids),
        dish_index={d: i for i, d in enumerate(dish_ids)},
        dish_items=tuple(dish_items),
        items=tuple(items),
        item_index={it.name: i for i, it in enumerate(items)},
        gated_dishes=frozenset(gated),
        gate_initially_open=not bool(_int(params.get("includeDoors"), 0)),
        capacity=capacity,
        cooldown=cooldown,
        max_steps=max_steps,
        n_distractors=max(0, _int(params.get("numDistractorItems"), 0)),
        nav={
            loc: (
                "look around",
                "inventory",
                "read cookbook",
                *(f"go to {r}" for r in rooms if r != loc),
                *(f"move {d}" for d, r in DIRECTIONS.items() if r in rooms and r != loc),
            )
            for loc in rooms
        },
        items_by_room={r: tuple(i for i, it in enumerate(items) if it.room == r) for r in rooms},
        game=str(row.get("game") or "cookingworld_multidish"),
    )


@dataclass(slots=True)
class SyncStep:
    """What one ``SyncWorld.step`` returns."""

    accepted: bool
    """The action was valid and was applied."""
    counted: bool
    """It consumed one global step (every step while the world is live)."""
    message: str
    """What happened, for logs (the model sees only ``observation`` and ``infos``, as in public)."""
    observation: str
    """The agent's observation after the step (public text; "" when ``observe=False``)."""
    reward: float
    """1.0 when the task is complete after this step, else 0.0 (public)."""
    done: bool
    """The world has ended (success, failure or budget spent)."""
    success: bool
    failure: str | None = None
    infos: dict[str, Any] | None = None
    """The public ``infos`` dict after the step (None when ``observe=False``)."""


@dataclass(frozen=True)
class ItemView:
    """Read-only snapshot of one ingredient (for oracles and tests; hidden state included)."""

    name: str
    dish_id: str
    room: str
    status: str
    """``source`` (not taken), ``held`` (in the shared inventory) or ``ready`` (on the prepared counter)."""
    actual: frozenset[str]
    expected: frozenset[str]
    gated: bool
    """Behind the kitchen gate (hidden and untakeable while the gate is closed)."""

    @property
    def needed(self) -> tuple[tuple[str, str], ...]:
        """The (action, tool) pairs still missing, in the public listing order (cuts, then cooks)."""
        out = [(f"{v} {self.name}", "knife") for p, v in CUT_VERB.items() if p in self.expected - self.actual]
        out += [
            (f"cook {self.name} {cook_phrase(t)}", t)
            for p, t in COOK_TOOL.items()
            if p in self.expected - self.actual
        ]
        return tuple(out)


@dataclass(frozen=True)
class WorldState:
    """A consistent snapshot of the shared state, taken under the lock."""

    items: tuple[ItemView, ...]
    inventory: tuple[str, ...]
    counter: tuple[str, ...]
    meals: dict[str, str]
    """dish_id -> ``none`` | ``prepared`` | ``eaten``."""
    gate_open: bool
    cooldowns: dict[str, int]
    capacity: int
    steps_used: int
    max_steps: int
    failure: str | None
    success: bool
    done: bool
    locations: dict[str, str]
    agent_steps: dict[str, int]
    strict: bool = False

    @property
    def steps_left(self) -> int:
        return max(0, self.max_steps - self.steps_used)

    @property
    def over(self) -> bool:
        return self.done


@dataclass(frozen=True)
class GoalScope:
    """What a goal text refers to: dish ids and ingredient names found in it, and its verbs."""

    dishes: tuple[int, ...] = ()
    items: tuple[int, ...] = ()
    eat: bool = False
    prepare: bool = False

    @property
    def parsable(self) -> bool:
        return bool(self.dishes or self.items)


_DISH_RE = re.compile(r"\bdish[\s_-]?(\d+)\b")
_EAT_RE = re.compile(r"\beat(s|en|ing)?\b")
_PREPARE_RE = re.compile(r"\bprepar(e|es|ed|ing)\b")


@dataclass
class _Event:
    seq: int
    agent_id: str
    action: str
    accepted: bool
    counted: bool
    message: str
    global_step: int


@dataclass
class _Agent:
    location: str
    steps: int = 0


class SyncWorld(World):
    """The shared TextWorld-Sync world of one task. See the module docstring for the rules.

    Programmatic use (benchmarks, oracles, tests)::

        w = SyncWorld(task)
        out = w.step("0", "take salt")      # SyncStep(accepted, counted, message, observation, reward, done, ...)
        b = w.fork(); b.step("0", "go to pantry"); w.commit(b)
    """

    def __init__(
        self,
        task: dict[str, Any] | TaskSpec,
        root_agent: str = "0",
        rules: str = "public",
        max_steps: int | None = None,
    ):
        """``max_steps``: the shared step budget instead of the row's (see :func:`build_spec`)."""
        spec = task if isinstance(task, TaskSpec) else build_spec(task, rules, max_steps)
        self.spec = spec
        self._lock = threading.Lock()
        self._actual = [it.initial for it in spec.items]
        self._collected = [False] * len(spec.items)
        self._ready = [False] * len(spec.items)
        self._n_ready = [0] * len(spec.dish_ids)
        """Per dish: how many of its ingredients are on the counter."""
        self._inventory: list[int] = []
        self._prepared = [False] * len(spec.dish_ids)
        self._eaten = [False] * len(spec.dish_ids)
        self._gate_open = spec.gate_initially_open
        self._cooldown: dict[str, int] = {}
        self._steps = 0
        self._done = False
        self._success = False
        self._failure: str | None = None
        self._agents: dict[str, _Agent] = {root_agent: _Agent(KITCHEN)}
        self._root = root_agent
        self._events: list[_Event] = []

    # ---- World contract ------------------------------------------------------------------------
    def fork(self) -> SyncWorld:
        """An isolated copy: flat mutable state copied, immutable spec shared (~10 us)."""
        new = SyncWorld.__new__(SyncWorld)
        new.spec = self.spec
        new._lock = threading.Lock()
        with self._lock:
            new._copy_state_from(self)
        return new

    def _copy_state_from(self, src: SyncWorld) -> None:
        self._actual = src._actual[:]  # frozensets: shared safely
        self._collected = src._collected[:]
        self._ready = src._ready[:]
        self._n_ready = src._n_ready[:]
        self._inventory = src._inventory[:]
        self._prepared = src._prepared[:]
        self._eaten = src._eaten[:]
        self._gate_open = src._gate_open
        self._cooldown = dict(src._cooldown)
        self._steps = src._steps
        self._done = src._done
        self._success = src._success
        self._failure = src._failure
        self._agents = {k: _Agent(a.location, a.steps) for k, a in src._agents.items()}
        self._root = src._root
        self._events = src._events[:]  # events are never mutated once logged

    def commit(self, branch: World) -> None:
        """Make ``branch``'s state the live state, in place (existing agent views stay valid; agents only
        known here keep their view, agents only known in the branch are added)."""
        if not isinstance(branch, SyncWorld):
            raise TypeError(f"cannot commit a {type(branch).__name__} into a SyncWorld")
        if branch is self:
            return
        if branch.spec is not self.spec and branch.spec.task_id != self.spec.task_id:
            raise ValueError(
                f"cannot commit a branch of task {branch.spec.task_id!r} into {self.spec.task_id!r}"
            )
        snap = branch.fork()  # consistent copy taken under the branch's lock; no nested locking
        with self._lock:
            mine = self._agents
            self._copy_state_from(snap)
            for k, a in mine.items():  # views only known here stay valid; their discarded actions don't count
                self._agents.setdefault(k, _Agent(a.location, 0))

    def root_success(self) -> bool:
        with self._lock:
            return self._success

    def describe(self) -> str:
        """The shared state every agent can observe (no expected preparations, no agent locations):
        what the public observation and a free inventory look-up show, minus the agent's own room."""
        with self._lock:
            infos = self._infos_locked(None)
            return "\n".join(
                [
                    self._shared_lines_locked(),
                    f"Shared inventory: {infos['inventory']}",
                    f"Score: {infos['score']}",
                    f"Task Success: {infos['tasksuccess']}",
                    f"Task Failure: {infos['taskfailure']}",
                    f"Done: {infos['done']}",
                ]
            )

    # ---- agents --------------------------------------------------------------------------------
    @property
    def root_agent(self) -> str:
        return self._root

    def add_agent(self, agent_id: str, start_from: str | None = None, start_room: str | None = None) -> None:
        """Register an agent view. It starts in ``start_room`` when given, else where ``start_from``
        (default: the root agent) stands now (public ``fork_shared``). Re-registering an existing agent keeps
        its view."""
        with self._lock:
            if agent_id in self._agents:
                return
            if start_room is not None:
                if start_room not in self.spec.rooms:
                    raise ValueError(f"unknown room {start_room!r}; this task has {self.spec.rooms}")
                self._agents[agent_id] = _Agent(start_room)
                return
            ref = self._agents.get(start_from or self._root) or self._agents.get(self._root)
            self._agents[agent_id] = _Agent(ref.location if ref else KITCHEN)

    def has_agent(self, agent_id: str) -> bool:
        return agent_id in self._agents

    def location(self, agent_id: str) -> str:
        with self._lock:
            return self._agent(agent_id).location

    def _agent(self, agent_id: str) -> _Agent:
        a = self._agents.get(agent_id)
        if a is None:
            ref = self._agents.get(self._root)
            a = self._agents[agent_id] = _Agent(ref.location if ref else KITCHEN)
        return a

    # ---- stepping ------------------------------------------------------------------------------
    def step(self, agent_id: str, action: str, observe: bool = True) -> SyncStep:
        """One atomic world action of ``agent_id``: validate, apply, count, score, cool down, observe, log."""
        raw = str(action or "").strip()
        norm = _norm(raw)
        with self._lock:
            agent = self._agent(agent_id)
            if self._done:
                msg = "The shared task has already ended; nothing happens."
                self._log(agent_id, raw, False, False, msg)
                return self._result(agent_id, False, False, msg, observe)
            valid = self._valid_locked(agent)
            accepted = raw in valid or norm in ALWAYS_ACCEPTED
            if accepted:
                msg = self._apply(agent, raw, norm)
            else:
                msg = "Action is not valid in the current composite world state."
            self._steps += 1
            agent.steps += 1
            self._rescore()
            if self._steps >= self.spec.max_steps:
                self._done = True
            if self._cooldown:  # public _advance_tool_cooldowns: entries tick down once per global step
                self._cooldown = {t: r - 1 for t, r in self._cooldown.items() if r > 1}
            self._log(agent_id, raw, accepted, True, msg)
            return self._result(agent_id, accepted, True, msg, observe)

    def _result(self, agent_id: str, accepted: bool, counted: bool, msg: str, observe: bool) -> SyncStep:
        infos = self._infos_locked(agent_id) if observe else None
        obs = self._observation_locked(agent_id) if observe else ""
        return SyncStep(
            accepted, counted, msg, obs, 1.0 if self._success else 0.0, self._done, self._success,
            self._failure, infos,
        )  # fmt: skip

    def _apply(self, agent: _Agent, raw: str, a: str) -> str:
        sp = self.spec
        if a in ("look around", "read cookbook") or a in INVENTORY_ACTIONS:
            return f"You {a}."
        if a == "open door":
            self._gate_open = True
            return "You open the kitchen gate."
        if a.startswith("go to ") or a.startswith("move "):
            dest = a[6:].strip() if a.startswith("go to ") else DIRECTIONS.get(a[5:].strip())
            if dest in sp.rooms:
                agent.location = dest
            return f"You go to the {agent.location}."
        if a.startswith("take "):
            i = sp.item_index.get(a[5:].strip())
            if i is None:
                return f"You take the {a[5:]}; nothing changes."  # `take knife`
            self._collected[i] = True
            if i not in self._inventory:
                self._inventory.append(i)
            if sp.items[i].expected <= BASE:
                self._mark_ready(i)
            return f"You take the {sp.items[i].name}."
        if a.startswith("cook "):
            m = re.match(r"cook (.+?) (?:in|on) (.+)$", a)
            if m:
                self._prepare_item(m.group(1), m.group(2))
            return f"You {a}."
        for verb in CUT_VERB.values():
            if a.startswith(verb + " "):
                self._prepare_item(a[len(verb) + 1 :], verb)
                return f"You {a}."
        if a.startswith("prepare "):
            d = sp.dish_index.get(a[8:].strip())
            if d is not None and self._dish_ready(d):
                self._prepared[d] = True
            return f"You {a}."
        if a.startswith("eat "):
            d = sp.dish_index.get(a[4:].strip())
            if d is not None and self._prepared[d]:
                self._eaten[d] = True
            return f"You {a}."
        return f"You {a}; nothing changes."

    def _prepare_item(self, name: str, how: str) -> None:
        """Apply a cut verb (``dice``) or a cooking tool (``grill``) to ingredient ``name``."""
        sp = self.spec
        tool = "knife" if how in CUT_VERB.values() else how
        if sp.cooldown > 0:  # public _consume_tool: c + 1, ticked down at the end of this very step
            self._cooldown[tool] = sp.cooldown + 1
        i = sp.item_index.get(name.strip())
        if i is None:
            return
        exp, act = sp.items[i].expected, set(self._actual[i])
        if how in CUT_VERB.values():
            made = [p for p, v in CUT_VERB.items() if v == how and (p in exp or sp.strict)]
            for p in made:
                act.discard("uncut")
                act.add(p)
        else:
            made = [p for p, t in COOK_TOOL.items() if t == how and (p in exp or sp.strict)]
            if sp.strict and made:  # one state per tool: the recipe's when it uses this tool, else the first
                made = [p for p in made if p in exp] or made[:1]
            for p in made:
                if sp.strict:
                    act.discard("raw")
                elif "uncut" not in exp:
                    act.discard("uncut")
                act.add(p)
        self._actual[i] = frozenset(act)
        wrong = (self._actual[i] - BASE) - exp
        if wrong:
            self._failure = (
                f"the {name} was made {', '.join(sorted(wrong))} but {sp.dish_ids[sp.items[i].dish]} needs "
                f"it {', '.join(sorted(exp))}"
            )
        elif self._actual[i] == exp:
            self._mark_ready(i)

    def _mark_ready(self, i: int) -> None:
        self._collected[i] = True
        if not self._ready[i]:
            self._ready[i] = True
            self._n_ready[self.spec.items[i].dish] += 1
        if i in self._inventory:
            self._inventory.remove(i)

    def _dish_ready(self, d: int) -> bool:
        return self._n_ready[d] == len(self.spec.dish_items[d])

    def _rescore(self) -> None:
        """The public ``score_task`` verdict: success iff every dish is complete, prepared and eaten;
        failure iff some ingredient carries a preparation its recipe does not ask for."""
        sp = self.spec
        complete = all(
            self._collected[i] and self._actual[i] == sp.items[i].expected for i in range(len(sp.items))
        )
        self._success = complete and all(self._prepared) and all(self._eaten)
        if self._success or self._failure is not None:
            self._done = True

    def _tool_free(self, tool: str) -> bool:
        return self._cooldown.get(tool, 0) <= 0

    def _log(self, agent_id: str, action: str, accepted: bool, counted: bool, message: str) -> None:
        self._events.append(
            _Event(len(self._events) + 1, agent_id, action, accepted, counted, message, self._steps)
        )

    # ---- queries -------------------------------------------------------------------------------
    def score(self) -> dict[str, Any]:
        """The composite verifier's report (per dish and ingredient), as ``composite_scorer`` builds it."""
        with self._lock:
            sp = self.spec
            dishes = []
            for d, dish_id in enumerate(sp.dish_ids):
                ings = []
                for i in sp.dish_items[d]:
                    it = sp.items[i]
                    ok = self._collected[i] and self._actual[i] == it.expected
                    ings.append(
                        {
                            "name": it.name,
                            "collected": self._collected[i],
                            "preparation": sorted(self._actual[i]),
                            "expected": sorted(it.expected),
                            "preparation_matches": self._actual[i] == it.expected,
                            "complete": ok,
                        }
                    )
                complete = all(x["complete"] for x in ings)
                dishes.append(
                    {
                        "dish_id": dish_id,
                        "ingredients": ings,
                        "ingredients_complete": complete,
                        "meal_prepared": self._prepared[d],
                        "meal_eaten": self._eaten[d],
                        "success": complete and self._prepared[d] and self._eaten[d],
                    }
                )
            return {
                "success": self._success,
                "failure": self._failure,
                "score": 1.0 if self._success else 0.0,
                "completed_dishes": sum(x["success"] for x in dishes),
                "total_dishes": len(dishes),
                "steps_used": self._steps,
                "max_steps": sp.max_steps,
                "dishes": dishes,
            }

    @property
    def over(self) -> bool:
        """The world has ended (public ``done``): success, failure or the global budget spent."""
        return self._done

    @property
    def failure(self) -> str | None:
        return self._failure

    @property
    def steps_used(self) -> int:
        return self._steps

    @property
    def steps_left(self) -> int:
        return max(0, self.spec.max_steps - self._steps)

    # ---- goals (for child success and oracles) ---------------------------------------------------
    def parse_goal(self, text: str) -> GoalScope:
        """Find the dish ids (``dish_2``, ``dish 2``) and ingredient names a goal text mentions."""
        sp = self.spec
        low = " ".join(str(text).lower().split())
        dishes = sorted(
            {sp.dish_index[f"dish_{m}"] for m in _DISH_RE.findall(low) if f"dish_{m}" in sp.dish_index}
        )
        found: list[int] = []
        masked = low
        for name in sorted(sp.item_index, key=len, reverse=True):
            pat = re.compile(r"(?<![a-z])" + re.escape(name) + r"(?![a-z])")
            if pat.search(masked):
                found.append(sp.item_index[name])
                masked = pat.sub(" ", masked)
        return GoalScope(
            tuple(dishes), tuple(sorted(found)), bool(_EAT_RE.search(low)), bool(_PREPARE_RE.search(low))
        )

    def goal_success(self, scope: GoalScope) -> bool:
        """Did the world reach what ``scope`` asks? Dishes + "eat" -> eaten; ingredients -> on the counter
        with their expected preparation; dishes + "prepare" (no eat, no ingredient) -> prepared; dishes
        only -> eaten. A wrongly prepared in-scope ingredient is never success."""
        with self._lock:
            sp = self.spec
            members = set(scope.items)
            for d in scope.dishes:
                members.update(sp.dish_items[d])
            if any((self._actual[i] - BASE) - sp.items[i].expected for i in members):
                return False
            if scope.dishes and (scope.eat or not (scope.items or scope.prepare)):
                return all(self._eaten[d] for d in scope.dishes)
            if scope.items:
                return all(self._ready[i] for i in scope.items)
            if scope.dishes:
                return all(self._prepared[d] for d in scope.dishes)
            return False

    # ---- observations --------------------------------------------------------------------------
    def valid_actions(self, agent_id: str) -> list[str]:
        with self._lock:
            return self._valid_locked(self._agent(agent_id))

    def _valid_locked(self, agent: _Agent) -> list[str]:
        """The public ``_valid_actions`` (strict rules: every cut/cook, kitchen only)."""
        sp = self.spec
        loc = agent.location
        out = list(sp.nav[loc])
        if not self._gate_open:
            out.append("open door")
        if loc == KITCHEN:
            out.append("take knife")
        if not sp.capacity or len(self._inventory) < sp.capacity:
            for i in sp.items_by_room[loc]:
                if not self._collected[i] and (self._gate_open or sp.items[i].dish not in sp.gated_dishes):
                    out.append(f"take {sp.items[i].name}")
        for i in self._inventory:
            it, act = sp.items[i], self._actual[i]
            if sp.strict:
                if loc != KITCHEN:
                    continue
                if not act & set(CUT_VERB) and self._tool_free("knife"):
                    out += [f"{v} {it.name}" for v in CUT_VERB.values()]
                if not act & set(COOK_TOOL):
                    out += [f"cook {it.name} {cook_phrase(t)}" for t in TOOLS[1:] if self._tool_free(t)]
                continue
            for p, v in CUT_VERB.items():
                if p in it.expected and p not in act and self._tool_free("knife"):
                    out.append(f"{v} {it.name}")
            for p, t in COOK_TOOL.items():
                if p in it.expected and p not in act and self._tool_free(t):
                    out.append(f"cook {it.name} {cook_phrase(t)}")
        for d, dish_id in enumerate(sp.dish_ids):
            if not self._prepared[d]:
                if self._dish_ready(d):
                    out.append(f"prepare {dish_id}")
        for d, dish_id in enumerate(sp.dish_ids):
            if self._prepared[d] and not self._eaten[d]:
                out.append(f"eat {dish_id}")
        return out

    def observe(self, agent_id: str) -> str:
        """The agent's observation text (public ``_observation``)."""
        with self._lock:
            return self._observation_locked(agent_id)

    def infos(self, agent_id: str) -> dict[str, Any]:
        """The public ``infos`` dict of an agent (validActions, inventory, score, tasksuccess, ...)."""
        with self._lock:
            return self._infos_locked(agent_id)

    def observe_with_infos(self, agent_id: str) -> tuple[str, dict[str, Any]]:
        """``(observation, infos)`` read under one lock acquisition (public ``observe``)."""
        with self._lock:
            return self._observation_locked(agent_id), self._infos_locked(agent_id)

    def inventory_text(self) -> str:
        """The shared inventory as the public ``infos["inventory"]`` shows it."""
        with self._lock:
            return self._inventory_str()

    def _inventory_str(self) -> str:
        return ", ".join(self.spec.items[i].name for i in self._inventory) or "(empty)"

    def _infos_locked(self, agent_id: str | None) -> dict[str, Any]:
        sp = self.spec
        agent = self._agent(agent_id) if agent_id is not None else None
        return {
            "validActions": self._valid_locked(agent) if agent is not None else [],
            "inventory": self._inventory_str(),
            "score": 1.0 if self._success else 0.0,
            "tasksuccess": self._success,
            "taskfailure": self._failure is not None,
            "done": self._done,
            "steps": self._steps,
            "remaining_shared_steps": max(sp.max_steps - self._steps, 0),
            "agent_location": agent.location if agent is not None else None,
            "completed_dishes": sum(
                self._eaten[d] and self._prepared[d] and self._dish_complete(d)
                for d in range(len(sp.dish_ids))
            ),
            "total_dishes": len(sp.dish_ids),
        }

    def _dish_complete(self, d: int) -> bool:
        sp = self.spec
        return all(self._collected[i] and self._actual[i] == sp.items[i].expected for i in sp.dish_items[d])

    def _observation_locked(self, agent_id: str) -> str:
        sp = self.spec
        loc = self._agent(agent_id).location
        visible = [
            sp.items[i].name
            for i in sp.items_by_room[loc]
            if not self._collected[i] and (self._gate_open or sp.items[i].dish not in sp.gated_dishes)
        ]
        return (
            f"You are in the {loc}.\n"
            f"Visible objects: {', '.join(visible) if visible else '(none)'}\n"
            + self._shared_lines_locked()
            + "\nValid Actions are listed below."
        )

    def _shared_lines_locked(self) -> str:
        sp = self.spec
        gate = "open" if self._gate_open else "closed"
        cooldowns = ", ".join(f"{t}:{r}" for t, r in sorted(self._cooldown.items())) or "none"
        counter = sorted(sp.items[i].name for i in range(len(sp.items)) if self._ready[i])
        progress = [
            f"{dish_id}: {self._n_ready[d]}/{len(sp.dish_items[d])} ingredients "
            f"prepared, meal_prepared={self._prepared[d]}, meal_eaten={self._eaten[d]}"
            for d, dish_id in enumerate(sp.dish_ids)
        ]
        return (
            f"Shared kitchen gate: {gate}.\n"
            f"Shared tool cooldowns: {cooldowns}.\n"
            f"Shared prepared counter: {', '.join(counter) if counter else '(empty)'}\n"
            "Dish progress:\n- " + "\n- ".join(progress) + "\n"
            f"Shared steps remaining: {max(sp.max_steps - self._steps, 0)}"
        )

    # ---- snapshots -----------------------------------------------------------------------------
    def state(self) -> WorldState:
        """A consistent read-only snapshot (taken under the lock), hidden state included."""
        with self._lock:
            sp = self.spec
            items = tuple(
                ItemView(
                    name=it.name,
                    dish_id=sp.dish_ids[it.dish],
                    room=it.room,
                    status="ready" if self._ready[i] else ("held" if self._collected[i] else "source"),
                    actual=self._actual[i],
                    expected=it.expected,
                    gated=it.dish in sp.gated_dishes,
                )
                for i, it in enumerate(sp.items)
            )
            return WorldState(
                items=items,
                inventory=tuple(sp.items[i].name for i in self._inventory),
                counter=tuple(sp.items[i].name for i in range(len(sp.items)) if self._ready[i]),
                meals={
                    d: ("eaten" if self._eaten[k] else "prepared" if self._prepared[k] else "none")
                    for k, d in enumerate(sp.dish_ids)
                },
                gate_open=self._gate_open,
                cooldowns={t: self._cooldown.get(t, 0) for t in TOOLS},
                capacity=sp.capacity,
                steps_used=self._steps,
                max_steps=sp.max_steps,
                failure=self._failure,
                success=self._success,
                done=self._done,
                locations={k: a.location for k, a in self._agents.items()},
                agent_steps={k: a.steps for k, a in self._agents.items()},
                strict=sp.strict,
            )

    def events(self) -> list[dict[str, Any]]:
        """The event log (every step attempt, in order), as plain dicts."""
        with self._lock:
            return [
                {
                    "seq": e.seq,
                    "agent_id": e.agent_id,
                    "action": e.action,
                    "accepted": e.accepted,
                    "counted": e.counted,
                    "message": e.message,
                    "global_step": e.global_step,
                }
                for e in self._events
            ]

    def check_invariants(self) -> None:
        """Raise AssertionError if the shared state is inconsistent (used by the concurrency tests)."""
        with self._lock:
            sp = self.spec
            inv = self._inventory
            assert len(set(inv)) == len(inv), "duplicate inventory entries"
            assert not sp.capacity or len(inv) <= sp.capacity, "inventory over capacity"
            held = {i for i in range(len(sp.items)) if self._collected[i] and not self._ready[i]}
            assert set(inv) == held, "inventory/status"
            for i, it in enumerate(sp.items):
                if self._ready[i]:
                    assert self._actual[i] == it.expected, f"{it.name} ready but wrong"
                if not self._collected[i]:
                    assert self._actual[i] == it.initial, f"{it.name} changed at source"
            for d in range(len(sp.dish_ids)):
                assert self._n_ready[d] == sum(self._ready[i] for i in sp.dish_items[d]), "ready count"
                if self._prepared[d]:
                    assert self._dish_ready(d), "meal without ingredients"
                if self._eaten[d]:
                    assert self._prepared[d], "eaten before prepared"
            assert 0 <= self._steps <= sp.max_steps, "global steps out of range"
            counted = sum(e.counted for e in self._events)
            assert counted == self._steps, f"{counted} counted events != {self._steps} global steps"
            assert sum(a.steps for a in self._agents.values()) == self._steps, "per-agent steps"
            assert all(0 < c <= sp.cooldown for c in self._cooldown.values()), "cooldown out of range"
            if not sp.strict:
                assert self._failure is None, "a listed action failed the task under the public rules"


def bench_sync(
    task: dict[str, Any], n_steps: int = 20_000, n_forks: int = 2_000, seed: int = 0
) -> dict[str, float]:
    """Micro-benchmark: random valid/invalid actions (observations included) and fork() latency.

    Returns ``{"steps_per_s", "fork_us", "commit_us"}``. The world is reset whenever it ends."""
    rng = random.Random(seed)
    base = SyncWorld(task)
    w = base.fork()
    t0 = time.perf_counter()
    for _ in range(n_steps):
        if w.over:
            w = base.fork()
        acts = w.valid_actions("0")
        w.step("0", rng.choice(acts) if rng.random() < 0.9 else "fly to the moon")
    steps_per_s = n_steps / (time.perf_counter() - t0)
    mid = base.fork()
    for _ in range(min(40, mid.spec.max_steps - 1)):
        mid.step("0", "look around")
    t0 = time.perf_counter()
    for _ in range(n_forks):
        mid.fork()
    fork_us = (time.perf_counter() - t0) / n_forks * 1e6
    b = mid.fork()
    t0 = time.perf_counter()
    for _ in range(n_forks):
        mid.commit(b)
    commit_us = (time.perf_counter() - t0) / n_forks * 1e6
    return {"steps_per_s": steps_per_s, "fork_us": fork_us, "commit_us": commit_us}
