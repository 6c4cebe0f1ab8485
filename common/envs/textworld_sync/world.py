"""TextWorld-Sync's shared world: one multi-dish kitchen that many agents act on at once (SPEC.md §2.2).

:class:`SyncWorld` is a pure-Python coordinator. It holds everything the agents share -- the ingredients
(dish, room/container, expected and actual preparation, collected?), the shared inventory with its
capacity, the prepared counter, meal_prepared / meal_eaten per dish, the kitchen gate, the tool cooldowns
(knife, stove, oven, grill), the GLOBAL action budget ``shared_environment_max_steps`` and an event log --
plus a small private view per agent (its location and its own count of world actions). Children start
where the root currently stands.

Every world action runs atomically under one ``threading.Lock`` (safe from threads and from asyncio
tasks: nothing inside the critical section awaits or blocks): validate against the agent's current
valid-action list, apply, count the global step, score, advance cooldowns, observe, log. A rejected
action still costs one global step; ``inventory`` costs none.

Rules (documented choices where the public rows are silent):

* Preparation = one cooking state (``raw`` = not cooked, ``fried`` = stove, ``roasted`` = oven,
  ``grilled`` = grill) and one cutting state (``uncut`` = not cut, ``chopped|sliced|diced|minced`` =
  knife). A row's ``preparation`` list such as ``["grilled", "diced"]`` or ``["raw", "uncut"]`` is read
  as that pair; a missing half defaults to ``raw`` / ``uncut``. An ingredient can be cut once and cooked
  once; any cut or cook that the recipe does not ask for ruins it (irreversible) and the whole task
  fails at once. Cutting and cooking happen in the kitchen, on an ingredient in the shared inventory.
* ``take X`` needs the agent in X's room, X visible (dishes behind a closed gate are hidden) and a free
  inventory slot. An ingredient whose preparation is complete (raw+uncut ones immediately on ``take``)
  moves from the inventory to the shared prepared counter, freeing its slot.
* ``prepare D`` once every ingredient of D is on the counter; ``eat D`` once D is prepared (both work
  anywhere, as in the public runtime). ``open door`` opens the kitchen gate from anywhere.
* Capacity: ``parallelism.resource_capacity.inventory`` when present, else 1 when
  ``game_params.limitInventorySize`` is set (a flag, as the public runtime reads it), else unlimited.
* Cooldown ``c``: a tool used at global step t is unavailable for the next ``c`` global steps (any
  agent's, rejected ones included).
* Item location = the room of the first ``candidate_source_locations`` entry (``kitchen.fridge`` ->
  the kitchen's fridge). ``numDistractorItems`` spoiled look-alikes (``rotten carrot``) are scattered
  over the rooms; they are visible, never takeable. ``go to {room}`` reaches any room; ``move
  north|east|west|south`` walks between the kitchen and its four neighbours.
* Root success: no ingredient ruined, every ingredient collected with exactly its expected
  preparation, every dish prepared and eaten. Anything less (half the dishes, an uneaten meal) is 0.
  The world ends on success, on failure, or when the global budget is spent.

``fork()`` copies only the flat mutable state (lists and small dicts; the immutable task spec is
shared), ~10 us; ``commit(branch)`` writes a branch's state back in place so existing agent views stay
valid.

What it simplifies (vs. TextWorld's cooking games): no parser or object graph -- a fixed action grammar
over flat state; rooms are a hub around the kitchen; containers are labels; one cook and one cut per
ingredient; distractors cannot be picked up.

Run the self-check / micro-benchmark: ``python -m common.envs.textworld_sync.world [tasks.jsonl]``.
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
    "living room",
    "backyard",
    "corridor",
    "bedroom",
    "bathroom",
    "shed",
    "driveway",
)
"""Room names in order; a task with ``numLocations = n`` uses the first n (at least 4)."""
KITCHEN = 0
_NEIGHBOURS = (("north", 1), ("east", 2), ("west", 3), ("south", 4))
"""``move {dir}`` from the kitchen reaches room index i; the opposite direction walks back."""
_OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}

COOK_STATES = ("raw", "fried", "roasted", "grilled")
CUT_STATES = ("uncut", "chopped", "sliced", "diced", "minced")
TOOLS = ("knife", "stove", "oven", "grill")
_KNIFE = 0
COOK_PHRASE = {"stove": "in stove", "oven": "in oven", "grill": "on grill"}
"""``cook X in stove`` fries, ``in oven`` roasts, ``on grill`` grills."""
COOK_RESULT = {"stove": "fried", "oven": "roasted", "grill": "grilled"}
TOOL_FOR_COOK = {v: k for k, v in COOK_RESULT.items()}
CUT_VERBS = {"chop": "chopped", "slice": "sliced", "dice": "diced", "mince": "minced"}
VERB_FOR_CUT = {v: k for k, v in CUT_VERBS.items()}
_COOK_SUFFIX = {f" {p}": t for t, p in COOK_PHRASE.items()}
SPOILED = ("rotten", "expired", "rancid", "mouldy")

# item status codes
AT_SOURCE, HELD, READY, RUINED = 0, 1, 2, 3
# meal status codes
NO_MEAL, PREPARED, EATEN = 0, 1, 2

FREE_ACTIONS = frozenset({"inventory"})
"""Actions that cost no global step (inventory lookups)."""


def normalize_action(text: str) -> str:
    """Lower-case, collapse whitespace, drop surrounding quotes/backticks and a trailing period."""
    return " ".join(str(text).lower().split()).strip(" .!\"'`")


def parse_preparation(values: Any) -> tuple[str, str]:
    """``["grilled", "diced"]`` -> ``("grilled", "diced")``; missing halves default to raw / uncut.

    >>> parse_preparation(["raw", "uncut"]), parse_preparation("sliced")
    (('raw', 'uncut'), ('raw', 'sliced'))
    """
    if isinstance(values, str):
        values = [v for v in values.split(",")]
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"preparation must be a list of strings, got {type(values).__name__}")
    cook, cut = None, None
    for raw in values:
        v = str(raw).strip().lower()
        if not v:
            continue
        if v in COOK_STATES:
            if cook not in (None, v):
                raise ValueError(f"preparation {list(values)} names two cooking states")
            cook = v
        elif v in CUT_STATES:
            if cut not in (None, v):
                raise ValueError(f"preparation {list(values)} names two cutting states")
            cut = v
        else:
            raise ValueError(f"unknown preparation {v!r}; expected one of {COOK_STATES + CUT_STATES}")
    return cook or "raw", cut or "uncut"


@dataclass(frozen=True)
class ItemSpec:
    """One required ingredient (immutable)."""

    name: str
    dish: int
    room: int
    container: str
    cook: str
    cut: str

    @property
    def preparation(self) -> tuple[str, str]:
        return (self.cook, self.cut)

    @property
    def work(self) -> int:
        """World actions it needs: take + one per non-trivial preparation."""
        return 1 + (self.cook != "raw") + (self.cut != "uncut")


@dataclass(frozen=True)
class TaskSpec:
    """Everything immutable about a task, shared by a world and all its forks."""

    task_id: str
    rooms: tuple[str, ...]
    room_index: dict[str, int]
    moves: tuple[tuple[tuple[str, int], ...], ...]
    """Per room: the (direction, destination) pairs of ``move``."""
    dish_ids: tuple[str, ...]
    dish_index: dict[str, int]
    dish_items: tuple[tuple[int, ...], ...]
    items: tuple[ItemSpec, ...]
    item_index: dict[str, int]
    gated_dishes: frozenset[int]
    gate_initially_open: bool
    capacity: int
    cooldown: int
    max_steps: int
    distractors: tuple[tuple[str, int], ...]
    """(name, room) of each visible, untakeable distractor."""
    cookbook: str


def _int(value: Any, default: int) -> int:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return int(value)
    return int(value)


def build_spec(task: dict[str, Any]) -> TaskSpec:
    """Turn a public-format task row (flat or manifest form) into the immutable :class:`TaskSpec`."""
    from common.envs.textworld_sync.tasks import normalize_row  # local: tasks imports this module

    row = normalize_row(task)
    params = row.get("game_params") or {}
    par = row.get("parallelism") or {}
    dishes = row["dishes"]
    if not isinstance(dishes, list) or not dishes:
        raise ValueError("task has no dishes")
    n_loc = max(4, min(len(ROOMS), _int(params.get("numLocations"), 6)))
    rooms = list(ROOMS[:n_loc])

    def room_of(source: str) -> tuple[int, str]:
        room, _, container = str(source).strip().lower().partition(".")
        if room not in rooms:
            rooms.append(room)
        return rooms.index(room), container

    items: list[ItemSpec] = []
    dish_ids: list[str] = []
    dish_items: list[tuple[int, ...]] = []
    for d, dish in enumerate(dishes):
        dish_id = str(dish["dish_id"]).strip().lower()
        if dish_id in dish_ids:
            raise ValueError(f"duplicate dish_id {dish_id!r}")
        dish_ids.append(dish_id)
        idx = []
        recipe = dish["recipe"]
        if not isinstance(recipe, list) or not recipe:
            raise ValueError(f"dish {dish_id} has an empty recipe")
        for ing in recipe:
            name = " ".join(str(ing["name"]).lower().split())
            if any(it.name == name for it in items):
                raise ValueError(f"ingredient {name!r} appears in two dishes (names must be disjoint)")
            cook, cut = parse_preparation(ing.get("preparation", []))
            sources = ing.get("candidate_source_locations") or ["kitchen"]
            room, container = room_of(sources[0])
            idx.append(len(items))
            items.append(ItemSpec(name, d, room, container, cook, cut))
        dish_items.append(tuple(idx))

    gated = set()
    for edge in par.get("dependencies") or []:
        if isinstance(edge, dict) and str(edge.get("from", "")).startswith("gate"):
            to = str(edge.get("to", "")).strip().lower()
            if to in dish_ids:
                gated.add(dish_ids.index(to))
    include_doors = bool(_int(params.get("includeDoors"), 0)) or bool(gated)

    cap_spec = par.get("resource_capacity")
    capacity = 0
    if isinstance(cap_spec, dict) and cap_spec.get("inventory"):
        capacity = _int(cap_spec["inventory"], 0)
    elif _int(params.get("limitInventorySize"), 0):
        capacity = 1
    mech = par.get("mechanisms") or {}
    cooldown = _int(mech.get("tool_cooldown_steps"), 0)
    max_steps = _int(par.get("shared_environment_max_steps"), 100)
    if capacity < 0 or cooldown < 0 or max_steps <= 0:
        raise ValueError("capacity/cooldown must be >= 0 and shared_environment_max_steps > 0")

    rng = random.Random(f"{row.get('task_id', '')}:{row.get('seed', 0)}")
    pool = [f"{adj} {it.name}" for adj in SPOILED for it in items]
    rng.shuffle(pool)
    n_distract = min(len(pool), max(0, _int(params.get("numDistractorItems"), 0)))
    distractors = tuple((name, rng.randrange(len(rooms))) for name in pool[:n_distract])

    moves = []
    for r in range(len(rooms)):
        if r == KITCHEN:
            moves.append(tuple((d, i) for d, i in _NEIGHBOURS if i < len(rooms)))
        else:
            moves.append(tuple((_OPPOSITE[d], KITCHEN) for d, i in _NEIGHBOURS if i == r))
    lines = ["The cookbook (shared recipes):"]
    for d, dish_id in enumerate(dish_ids):
        lines.append(f"Dish {dish_id}:")
        for i in dish_items[d]:
            it = items[i]
            lines.append(f"- {it.name} ({it.cook}, {it.cut})")
    lines.append("Cut with chop/slice/dice/mince; cook: stove = fried, oven = roasted, grill = grilled.")
    lines.append("raw = do not cook it; uncut = do not cut it. Then prepare and eat each dish.")
    return TaskSpec(
        task_id=str(row.get("task_id", "")),
        rooms=tuple(rooms),
        room_index={r: i for i, r in enumerate(rooms)},
        moves=tuple(moves),
        dish_ids=tuple(dish_ids),
        dish_index={d: i for i, d in enumerate(dish_ids)},
        dish_items=tuple(dish_items),
        items=tuple(items),
        item_index={it.name: i for i, it in enumerate(items)},
        gated_dishes=frozenset(gated),
        gate_initially_open=not include_doors,
        capacity=capacity,
        cooldown=cooldown,
        max_steps=max_steps,
        distractors=distractors,
        cookbook="\n".join(lines),
    )


@dataclass(slots=True)
class SyncStep:
    """What one ``SyncWorld.step`` returns."""

    accepted: bool
    """The action was in the agent's valid-action list and was applied."""
    counted: bool
    """It consumed one global step (every action except ``inventory`` while the world is live)."""
    message: str
    """The immediate feedback line ("You take the carrot.", or why it was rejected)."""
    observation: str
    """The agent's full observation after the step ("" when ``observe=False``)."""
    reward: float
    """1.0 on the step that completed the whole task, else 0.0."""
    done: bool
    """The world has ended (success, failure or budget spent)."""
    success: bool
    failure: str | None = None


@dataclass(frozen=True)
class ItemView:
    """Read-only snapshot of one ingredient (for oracles, describe(), tests)."""

    name: str
    dish_id: str
    room: str
    container: str
    status: str
    """``source`` (not taken), ``held`` (in the shared inventory), ``ready`` (on the prepared counter) or
    ``ruined``."""
    cook: str
    cut: str
    expected_cook: str
    expected_cut: str
    gated: bool
    """Behind the kitchen gate (hidden and untakeable while the gate is closed)."""


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
    locations: dict[str, str]
    agent_steps: dict[str, int]

    @property
    def steps_left(self) -> int:
        return max(0, self.max_steps - self.steps_used)

    @property
    def over(self) -> bool:
        return self.success or self.failure is not None or self.steps_used >= self.max_steps


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
    location: int
    steps: int = 0


class SyncWorld(World):
    """The shared TextWorld-Sync world of one task. See the module docstring for the rules.

    Programmatic use (benchmarks, oracles, tests)::

        w = SyncWorld(task)
        out = w.step("0", "take salt")      # SyncStep(accepted, counted, message, observation, reward, done, ...)
        b = w.fork(); b.step("0", "go to pantry"); w.commit(b)
    """

    def __init__(self, task: dict[str, Any] | TaskSpec, root_agent: str = "0"):
        spec = task if isinstance(task, TaskSpec) else build_spec(task)
        self.spec = spec
        self._lock = threading.Lock()
        n = len(spec.items)
        self._cook = ["raw"] * n
        self._cut = ["uncut"] * n
        self._status = [AT_SOURCE] * n
        self._inventory: list[int] = []
        self._counter: list[int] = []
        self._meal = [NO_MEAL] * len(spec.dish_ids)
        self._gate_open = spec.gate_initially_open
        self._cooldown = [0, 0, 0, 0]
        self._steps = 0
        self._n_eaten = 0
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
        self._cook = src._cook[:]
        self._cut = src._cut[:]
        self._status = src._status[:]
        self._inventory = src._inventory[:]
        self._counter = src._counter[:]
        self._meal = src._meal[:]
        self._gate_open = src._gate_open
        self._cooldown = src._cooldown[:]
        self._steps = src._steps
        self._n_eaten = src._n_eaten
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
            return self._success_locked()

    def describe(self) -> str:
        """The observable shared state (agent-independent), for rubric and scoring prompts."""
        with self._lock:
            sp = self.spec
            lines = [f"TextWorld-Sync task {sp.task_id}"]
            lines.append(
                "Agents: "
                + ", ".join(
                    f"{k} in the {sp.rooms[a.location]} ({a.steps} actions)" for k, a in self._agents.items()
                )
            )
            lines.append(self._gate_line())
            lines.append(self._cooldown_line())
            lines.append(self._inventory_line())
            lines.append(self._counter_line())
            lines.append("Ingredients:")
            for i, it in enumerate(sp.items):
                st = ("not taken", "in inventory", "ready", "RUINED")[self._status[i]]
                gated = " [behind the gate]" if (it.dish in sp.gated_dishes and not self._gate_open) else ""
                lines.append(
                    f"- {it.name} ({sp.dish_ids[it.dish]}, {sp.rooms[it.room]}{gated}): {st}; "
                    f"now {self._cook[i]}, {self._cut[i]}; needs {it.cook}, {it.cut}"
                )
            lines.extend(self._progress_lines())
            lines.append(self._budget_line())
            lines.append(self._status_line())
            return "\n".join(lines)

    # ---- agents --------------------------------------------------------------------------------
    @property
    def root_agent(self) -> str:
        return self._root

    def add_agent(self, agent_id: str, start_from: str | None = None) -> None:
        """Register an agent view. It starts where ``start_from`` (default: the root agent) stands now.
        Re-registering an existing agent keeps its view."""
        with self._lock:
            if agent_id in self._agents:
                return
            ref = self._agents.get(start_from or self._root) or self._agents.get(self._root)
            self._agents[agent_id] = _Agent(ref.location if ref else KITCHEN)

    def has_agent(self, agent_id: str) -> bool:
        return agent_id in self._agents

    def location(self, agent_id: str) -> str:
        with self._lock:
            return self.spec.rooms[self._agent(agent_id).location]

    def _agent(self, agent_id: str) -> _Agent:
        a = self._agents.get(agent_id)
        if a is None:
            ref = self._agents.get(self._root)
            a = self._agents[agent_id] = _Agent(ref.location if ref else KITCHEN)
        return a

    # ---- stepping ------------------------------------------------------------------------------
    def step(self, agent_id: str, action: str, observe: bool = True) -> SyncStep:
        """One atomic world action of ``agent_id``: validate, apply, count, score, cool down, observe, log."""
        norm = normalize_action(action)
        with self._lock:
            agent = self._agent(agent_id)
            if norm in FREE_ACTIONS:
                msg = (
                    self._inventory_line()
                    + "\n"
                    + self._counter_line()
                    + "\n(Inventory lookups cost no shared step.)"
                )
                self._log(agent_id, norm, True, False, msg)
                obs = self._observe_locked(agent_id, msg) if observe else ""
                over = self._over_locked()
                return SyncStep(
                    True, False, msg, obs, 0.0, over, over and self._success_locked(), self._failure
                )
            if self._over_locked():
                msg = f"The shared task has already ended ({self._end_reason()}); nothing happens."
                self._log(agent_id, norm, False, False, msg)
                obs = self._observe_locked(agent_id, msg) if observe else ""
                return SyncStep(False, False, msg, obs, 0.0, True, self._success_locked(), self._failure)
            verdict = self._check(agent, norm)
            if isinstance(verdict, str):
                accepted = False
                msg = f"Rejected: '{norm}' is not a valid action right now ({verdict}). It still cost one shared step."
            else:
                accepted = True
                msg = self._apply(agent, verdict)
            self._steps += 1
            agent.steps += 1
            success = self._failure is None and self._n_eaten == len(self._meal)
            if success and accepted and verdict[0] == "eat":
                msg += " Every dish has been prepared and eaten: the shared task is complete!"
            elif self._steps >= self.spec.max_steps and not success and self._failure is None:
                msg += " The shared action budget is now spent: the task has ended unfinished."
            cd = self._cooldown
            for t in range(4):
                if cd[t]:
                    cd[t] -= 1
            self._log(agent_id, norm, accepted, True, msg)
            obs = self._observe_locked(agent_id, msg) if observe else ""
            done = success or self._failure is not None or self._steps >= self.spec.max_steps
            reward = 1.0 if (success and accepted and verdict[0] == "eat") else 0.0
            return SyncStep(accepted, True, msg, obs, reward, done, success, self._failure)

    def _check(self, agent: _Agent, a: str) -> tuple[str, Any] | str:
        """The parsed operation if ``a`` is in the agent's valid-action list, else the reason it is not.
        Must agree exactly with :meth:`_valid_locked` (tested)."""
        sp = self.spec
        loc = agent.location
        if a == "look around" or a == "read cookbook":
            return (a, None)
        if a.startswith("go to "):
            r = sp.room_index.get(a[6:])
            if r is None:
                return f"there is no room called '{a[6:]}'"
            if r == loc:
                return f"you are already in the {a[6:]}"
            return ("go", r)
        if a.startswith("move "):
            for d, r in sp.moves[loc]:
                if a[5:] == d:
                    return ("go", r)
            return f"you cannot move {a[5:]} from the {sp.rooms[loc]}"
        if a == "open door":
            return ("open", None) if not self._gate_open else "the gate is already open"
        if a.startswith("take "):
            i = sp.item_index.get(a[5:])
            if i is None:
                if any(name == a[5:] for name, _ in sp.distractors):
                    return f"the {a[5:]} is spoiled and not part of any recipe"
                return f"there is no ingredient called '{a[5:]}'"
            it = sp.items[i]
            if self._status[i] != AT_SOURCE:
                return f"the {it.name} has already been taken"
            if it.room != loc:
                return f"the {it.name} is not here"
            if it.dish in sp.gated_dishes and not self._gate_open:
                return f"the {it.name} is behind the closed kitchen gate"
            if sp.capacity and len(self._inventory) >= sp.capacity:
                return f"the shared inventory is full ({sp.capacity}/{sp.capacity})"
            return ("take", i)
        if a.startswith("cook "):
            for suffix, tool in _COOK_SUFFIX.items():
                if a.endswith(suffix):
                    i = sp.item_index.get(a[5 : -len(suffix)])
                    if i is None:
                        return f"there is no ingredient called '{a[5 : -len(suffix)]}'"
                    reason = self._prep_reason(i, loc)
                    if reason:
                        return reason
                    if self._cook[i] != "raw":
                        return f"the {sp.items[i].name} is already {self._cook[i]}"
                    t = TOOLS.index(tool)
                    if self._cooldown[t]:
                        return f"the {tool} is cooling down ({self._cooldown[t]} more step(s))"
                    return ("cook", (i, t))
            return "cook needs 'in stove', 'in oven' or 'on grill'"
        if a.startswith("prepare "):
            d = sp.dish_index.get(a[8:])
            if d is None:
                return f"there is no dish called '{a[8:]}'"
            if self._meal[d] != NO_MEAL:
                return f"{a[8:]} has already been prepared"
            if any(self._status[i] != READY for i in sp.dish_items[d]):
                return f"not every ingredient of {a[8:]} is on the prepared counter"
            return ("prepare", d)
        if a.startswith("eat "):
            d = sp.dish_index.get(a[4:])
            if d is None:
                return f"there is no dish called '{a[4:]}'"
            if self._meal[d] != PREPARED:
                return f"{a[4:]} has " + (
                    "already been eaten" if self._meal[d] == EATEN else "not been prepared"
                )
            return ("eat", d)
        verb, _, rest = a.partition(" ")
        if verb in CUT_VERBS and rest:
            i = sp.item_index.get(rest)
            if i is None:
                return f"there is no ingredient called '{rest}'"
            reason = self._prep_reason(i, loc)
            if reason:
                return reason
            if self._cut[i] != "uncut":
                return f"the {rest} is already {self._cut[i]}"
            if self._cooldown[_KNIFE]:
                return f"the knife is cooling down ({self._cooldown[_KNIFE]} more step(s))"
            return ("cut", (i, verb))
        return "unknown command"

    def _prep_reason(self, i: int, loc: int) -> str | None:
        if self._status[i] != HELD:
            return f"the {self.spec.items[i].name} is not in the shared inventory"
        if loc != KITCHEN:
            return "the knife, stove, oven and grill are in the kitchen"
        return None

    def _apply(self, agent: _Agent, op: tuple[str, Any]) -> str:
        kind, arg = op
        sp = self.spec
        if kind == "look around":
            return "You look around."
        if kind == "read cookbook":
            return sp.cookbook
        if kind == "go":
            agent.location = arg
            return f"You go to the {sp.rooms[arg]}."
        if kind == "open":
            self._gate_open = True
            return "You open the kitchen gate. Everything behind it is now reachable."
        if kind == "take":
            self._status[arg] = HELD
            self._inventory.append(arg)
            name = sp.items[arg].name
            if self._complete(arg):
                return (
                    f"You take the {name}. It needs no preparation and goes straight to the prepared counter."
                )
            return f"You take the {name} into the shared inventory."
        if kind == "prepare":
            self._meal[arg] = PREPARED
            return f"You prepare {sp.dish_ids[arg]}."
        if kind == "eat":
            self._meal[arg] = EATEN
            self._n_eaten += 1
            return f"You eat {sp.dish_ids[arg]}."
        i, how = arg
        it = sp.items[i]
        if kind == "cut":
            self._cut[i] = CUT_VERBS[how]
            self._cooldown[_KNIFE] = sp.cooldown + 1 if sp.cooldown else 0
            text = f"You {how} the {it.name}."
            wrong = self._cut[i] != it.cut
        else:  # cook
            tool = TOOLS[how]
            self._cook[i] = COOK_RESULT[tool]
            self._cooldown[how] = sp.cooldown + 1 if sp.cooldown else 0
            text = f"You cook the {it.name} {COOK_PHRASE[tool]}: it is now {self._cook[i]}."
            wrong = self._cook[i] != it.cook
        if wrong:
            self._status[i] = RUINED
            self._failure = (
                f"the {it.name} was made {self._cook[i]}, {self._cut[i]} but {sp.dish_ids[it.dish]} needs it "
                f"{it.cook}, {it.cut}"
            )
            return (
                text
                + f" That is not what the recipe asks for: the {it.name} is ruined and the task has failed."
            )
        if self._complete(i):
            return text + f" The {it.name} is ready and goes to the prepared counter."
        return text

    def _complete(self, i: int) -> bool:
        it = self.spec.items[i]
        if self._cook[i] == it.cook and self._cut[i] == it.cut:
            self._status[i] = READY
            self._inventory.remove(i)
            self._counter.append(i)
            return True
        return False

    def _log(self, agent_id: str, action: str, accepted: bool, counted: bool, message: str) -> None:
        self._events.append(
            _Event(len(self._events) + 1, agent_id, action, accepted, counted, message, self._steps)
        )

    # ---- scoring -------------------------------------------------------------------------------
    def _success_locked(self) -> bool:
        if self._failure is not None:
            return False
        sp = self.spec
        for i, it in enumerate(sp.items):
            if self._status[i] != READY or self._cook[i] != it.cook or self._cut[i] != it.cut:
                return False
        return all(m == EATEN for m in self._meal)

    def score(self) -> dict[str, Any]:
        """The composite verifier's full report (per dish and ingredient)."""
        with self._lock:
            sp = self.spec
            dishes = []
            for d, dish_id in enumerate(sp.dish_ids):
                ings = []
                for i in sp.dish_items[d]:
                    it = sp.items[i]
                    ok = self._status[i] == READY and self._cook[i] == it.cook and self._cut[i] == it.cut
                    ings.append(
                        {
                            "name": it.name,
                            "collected": self._status[i] != AT_SOURCE,
                            "preparation": [self._cook[i], self._cut[i]],
                            "expected": [it.cook, it.cut],
                            "ruined": self._status[i] == RUINED,
                            "complete": ok,
                        }
                    )
                complete = all(x["complete"] for x in ings)
                dishes.append(
                    {
                        "dish_id": dish_id,
                        "ingredients": ings,
                        "ingredients_complete": complete,
                        "meal_prepared": self._meal[d] >= PREPARED,
                        "meal_eaten": self._meal[d] == EATEN,
                        "success": complete and self._meal[d] == EATEN,
                    }
                )
            return {
                "success": self._success_locked(),
                "failure": self._failure,
                "completed_dishes": sum(x["success"] for x in dishes),
                "total_dishes": len(dishes),
                "steps_used": self._steps,
                "max_steps": sp.max_steps,
                "dishes": dishes,
            }

    def _over_locked(self) -> bool:
        # success <=> no failure and every dish eaten (eating needs every ingredient ready, i.e. exact)
        return (
            self._failure is not None
            or self._steps >= self.spec.max_steps
            or self._n_eaten == len(self._meal)
        )

    def _end_reason(self) -> str:
        if self._failure is not None:
            return f"failed: {self._failure}"
        if self._n_eaten == len(self._meal):
            return "every dish is done"
        return "the shared action budget is spent"

    @property
    def over(self) -> bool:
        with self._lock:
            return self._over_locked()

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
        with the right preparation; dishes + "prepare" (no eat, no ingredient) -> prepared; dishes only ->
        eaten. A ruined in-scope ingredient is never success."""
        with self._lock:
            sp = self.spec
            members = set(scope.items)
            for d in scope.dishes:
                members.update(sp.dish_items[d])
            if any(self._status[i] == RUINED for i in members):
                return False
            if scope.dishes and (scope.eat or not (scope.items or scope.prepare)):
                return all(self._meal[d] == EATEN for d in scope.dishes)
            if scope.items:
                return all(self._status[i] == READY for i in scope.items)
            if scope.dishes:
                return all(self._meal[d] >= PREPARED for d in scope.dishes)
            return False

    # ---- observations --------------------------------------------------------------------------
    def valid_actions(self, agent_id: str) -> list[str]:
        with self._lock:
            return self._valid_locked(self._agent(agent_id))

    def _valid_locked(self, agent: _Agent) -> list[str]:
        if self._over_locked():
            return ["inventory"]
        sp = self.spec
        loc = agent.location
        out = ["look around", "inventory", "read cookbook"]
        out += [f"go to {r}" for j, r in enumerate(sp.rooms) if j != loc]
        out += [f"move {d}" for d, _ in sp.moves[loc]]
        if not self._gate_open:
            out.append("open door")
        room_free = not sp.capacity or len(self._inventory) < sp.capacity
        if room_free:
            for i, it in enumerate(sp.items):
                if (
                    self._status[i] == AT_SOURCE
                    and it.room == loc
                    and (self._gate_open or it.dish not in sp.gated_dishes)
                ):
                    out.append(f"take {it.name}")
        if loc == KITCHEN:
            cd = self._cooldown
            for i in self._inventory:
                if self._status[i] != HELD:
                    continue
                name = sp.items[i].name
                if self._cut[i] == "uncut" and not cd[_KNIFE]:
                    out += [f"{v} {name}" for v in CUT_VERBS]
                if self._cook[i] == "raw":
                    out += [f"cook {name} {COOK_PHRASE[t]}" for k, t in enumerate(TOOLS) if k and not cd[k]]
        for d, dish_id in enumerate(sp.dish_ids):
            if self._meal[d] == NO_MEAL and all(self._status[i] == READY for i in sp.dish_items[d]):
                out.append(f"prepare {dish_id}")
            elif self._meal[d] == PREPARED:
                out.append(f"eat {dish_id}")
        return out

    def observe(self, agent_id: str, message: str = "") -> str:
        with self._lock:
            return self._observe_locked(agent_id, message)

    def _observe_locked(self, agent_id: str, message: str) -> str:
        sp = self.spec
        agent = self._agent(agent_id)
        loc = agent.location
        visible = []
        for i, it in enumerate(sp.items):
            if (
                self._status[i] == AT_SOURCE
                and it.room == loc
                and (self._gate_open or it.dish not in sp.gated_dishes)
            ):
                visible.append(f"{it.name} ({it.container})" if it.container else it.name)
        visible += [name for name, r in sp.distractors if r == loc]
        parts = [message] if message else []
        parts += [
            f"You are in the {sp.rooms[loc]}.",
            "Visible objects: " + (", ".join(visible) if visible else "(none)"),
            self._gate_line(),
            self._cooldown_line(),
            self._inventory_line(),
            self._counter_line(),
            *self._progress_lines(),
            self._budget_line(),
        ]
        if self._over_locked():
            parts.append(self._status_line())
        parts.append("Valid actions: " + " | ".join(self._valid_locked(agent)))
        return "\n".join(parts)

    def _gate_line(self) -> str:
        return "Kitchen gate: " + ("open" if self._gate_open else "closed (use 'open door')")

    def _cooldown_line(self) -> str:
        cd = self._cooldown
        return "Tool cooldowns: " + ", ".join(
            f"{t} " + (f"busy {cd[k]} step(s)" if cd[k] else "ready") for k, t in enumerate(TOOLS)
        )

    def _inventory_line(self) -> str:
        sp = self.spec
        cap = str(sp.capacity) if sp.capacity else "unlimited"
        held = [
            f"{sp.items[i].name} [{self._cook[i]}, {self._cut[i]}"
            + ("; RUINED]" if self._status[i] == RUINED else "]")
            for i in self._inventory
        ]
        return f"Shared inventory ({len(self._inventory)}/{cap}): " + (", ".join(held) if held else "(empty)")

    def _counter_line(self) -> str:
        names = [self.spec.items[i].name for i in self._counter]
        return f"Prepared counter ({len(names)}): " + (", ".join(names) if names else "(empty)")

    def _progress_lines(self) -> list[str]:
        sp = self.spec
        lines = ["Dish progress:"]
        for d, dish_id in enumerate(sp.dish_ids):
            items = sp.dish_items[d]
            ready = sum(self._status[i] == READY for i in items)
            m = self._meal[d]
            lines.append(
                f"- {dish_id}: {ready}/{len(items)} ingredients ready, meal prepared: {'yes' if m else 'no'}, "
                f"eaten: {'yes' if m == EATEN else 'no'}"
            )
        return lines

    def _budget_line(self) -> str:
        return f"Shared steps remaining: {max(0, self.spec.max_steps - self._steps)}/{self.spec.max_steps}"

    def _status_line(self) -> str:
        if self._success_locked():
            return "Task status: complete (every dish prepared and eaten)."
        if self._failure is not None:
            return f"Task status: FAILED ({self._failure})."
        if self._steps >= self.spec.max_steps:
            return "Task status: ended unfinished (shared budget spent)."
        return "Task status: in progress."

    # ---- snapshots -----------------------------------------------------------------------------
    def state(self) -> WorldState:
        """A consistent read-only snapshot (taken under the lock)."""
        with self._lock:
            sp = self.spec
            items = tuple(
                ItemView(
                    name=it.name,
                    dish_id=sp.dish_ids[it.dish],
                    room=sp.rooms[it.room],
                    container=it.container,
                    status=("source", "held", "ready", "ruined")[self._status[i]],
                    cook=self._cook[i],
                    cut=self._cut[i],
                    expected_cook=it.cook,
                    expected_cut=it.cut,
                    gated=it.dish in sp.gated_dishes,
                )
                for i, it in enumerate(sp.items)
            )
            return WorldState(
                items=items,
                inventory=tuple(sp.items[i].name for i in self._inventory),
                counter=tuple(sp.items[i].name for i in self._counter),
                meals={d: ("none", "prepared", "eaten")[self._meal[k]] for k, d in enumerate(sp.dish_ids)},
                gate_open=self._gate_open,
                cooldowns={t: self._cooldown[k] for k, t in enumerate(TOOLS)},
                capacity=sp.capacity,
                steps_used=self._steps,
                max_steps=sp.max_steps,
                failure=self._failure,
                success=self._success_locked(),
                locations={k: sp.rooms[a.location] for k, a in self._agents.items()},
                agent_steps={k: a.steps for k, a in self._agents.items()},
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
            assert set(inv) == {i for i, s in enumerate(self._status) if s in (HELD, RUINED)}, (
                "inventory/status"
            )
            assert set(self._counter) == {i for i, s in enumerate(self._status) if s == READY}, (
                "counter/status"
            )
            assert len(set(self._counter)) == len(self._counter), "duplicate counter entries"
            for i, it in enumerate(sp.items):
                if self._status[i] == READY:
                    assert (self._cook[i], self._cut[i]) == (it.cook, it.cut), f"{it.name} ready but wrong"
                if self._status[i] == AT_SOURCE:
                    assert (self._cook[i], self._cut[i]) == ("raw", "uncut"), f"{it.name} changed at source"
            for d in range(len(sp.dish_ids)):
                if self._meal[d] != NO_MEAL:
                    assert all(self._status[i] == READY for i in sp.dish_items[d]), "meal without ingredients"
            assert self._n_eaten == sum(m == EATEN for m in self._meal), "eaten counter"
            assert 0 <= self._steps <= sp.max_steps, "global steps out of range"
            counted = sum(e.counted for e in self._events)
            assert counted == self._steps, f"{counted} counted events != {self._steps} global steps"
            assert sum(a.steps for a in self._agents.values()) == self._steps, "per-agent steps"
            assert all(0 <= c <= sp.cooldown for c in self._cooldown), "cooldown out of range"
            n_ruined = sum(s == RUINED for s in self._status)
            assert n_ruined == (0 if self._failure is None else 1), "ruined items must match the failure"


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
    # fork latency on a mid-episode world with a populated event log
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


if __name__ == "__main__":  # pragma: no cover - manual check
    import sys
    from pathlib import Path

    from common.envs.textworld_sync.tasks import generate_tasks, load_tasks

    rows = load_tasks(sys.argv[1]) if len(sys.argv) > 1 and Path(sys.argv[1]).exists() else None
    rows = rows or generate_tasks("test", 1, seed=0, family="hierarchical", tier="extreme")
    print(json.dumps(bench_sync(rows[-1]), indent=2))
