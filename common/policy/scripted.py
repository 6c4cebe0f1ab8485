"""Scripted policies: text without a model, for tests, smoke runs and baselines (never trainable).

* :class:`ReplayPolicy` replays raw replies from a JSON list (one global queue) or a JSON object
  ``{"act": [...], "rubric": [...], "score": [...]}`` (one queue per role; a role missing from the object
  falls back to a ``"*"`` queue when present). Exhausting a queue raises :class:`ReplayExhaustedError`.
* :class:`RandomPolicy` (seeded): for ``act`` it picks a random VALID action when the session offers
  ``valid_actions()`` (TextWorld-Sync), else a random scripted reply in the session's protocol
  (CodeAct cells that inspect the inventory, try a craft or finish, for sessions whose system prompt
  asks for ``<python>``; ``<action>look around</action>``-style replies otherwise). For ``rubric`` and
  ``score`` it writes a random but VALID rubric / score JSON.
* :class:`OraclePolicy` wraps ``reply_fn(session) -> str`` (the environments' oracles,
  ``common.envs.*.oracle.oracle_reply``) for ``act``; for ``rubric`` it writes a fixed 4-item rubric
  and for ``score`` a score whose success is ``request.meta["child_success"]`` when given, else
  ``request.session.success()``, else True.

Every Completion has ``finish_reason="scripted"`` and empty token fields. Simplification: the rubric and
score texts are deterministic templates, not judgements of the trajectory.

Run the tests: ``pytest tests/test_policy_scripted.py``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.policy.base import Completion, GenerationRequest, Policy

ReplyFn = Callable[[Any], str]

_N_ITEMS_RE = re.compile(r"with (\d+) criterion scores")
_TARGET_RE = re.compile(r"(\d+)x ([A-Za-z0-9_]+)")


class ReplayExhaustedError(RuntimeError):
    """A replay queue ran out of replies."""


def _scripted(text: str) -> Completion:
    return Completion(text=text, finish_reason="scripted")


# ---------------------------------------------------------------------------- rubric / score templates
ORACLE_RUBRIC_ITEMS = (
    ("goal_completed", 0.5, "The delegated goal is fully achieved in the final state."),
    ("valid_actions", 0.2, "The sub-agent used valid actions/tool calls without repeated errors."),
    ("efficiency", 0.15, "The sub-agent used few steps and no wasted resources."),
    ("clear_report", 0.15, "The finish message states truthfully what was done."),
)


def rubric_json(goal: str = "", weights: list[float] | None = None) -> str:
    """A valid rubric JSON (SPEC.md §3) with the four template items (optionally other weights)."""
    items = []
    for k, (name, w, desc) in enumerate(ORACLE_RUBRIC_ITEMS):
        items.append(
            {
                "name": name,
                "weight": weights[k] if weights else w,
                "description": desc,
                "score_0": "not at all",
                "score_full": "completely",
            }
        )
    obj = {
        "rubric_items": items,
        "success_gate": f"The delegated goal is achieved: {goal}".strip()
        if goal
        else "The goal is achieved.",
        "failure_conditions": ["The sub-agent crashed or never finished.", "The goal is not achieved."],
        "scoring_procedure": "Score each item in [0, 1]; final_score = weighted sum, 0 when the gate fails.",
    }
    return json.dumps(obj)


def score_json(success: bool, n_items: int = len(ORACLE_RUBRIC_ITEMS), value: float = 1.0) -> str:
    """A valid score JSON: success -> every criterion ``value`` and final ``value`` (> 0); else all 0."""
    s = float(value) if success else 0.0
    if success and s <= 0.0:
        s = 1.0
    obj = {
        "success": bool(success),
        "criterion_scores": [s] * n_items,
        "final_score": s,
        "reason": "The goal was achieved." if success else "The goal was not achieved.",
    }
    return json.dumps(obj)


def _n_items(request: GenerationRequest) -> int:
    n = request.meta.get("n_items")
    if isinstance(n, int) and n > 0:
        return n
    for m in reversed(request.messages):
        hit = _N_ITEMS_RE.search(m.get("content", ""))
        if hit:
            return int(hit.group(1))
    return len(ORACLE_RUBRIC_ITEMS)


def _child_success(request: GenerationRequest) -> bool:
    val = request.meta.get("child_success")
    if val is not None:
        return bool(val)
    success = getattr(request.session, "success", None)
    if callable(success):
        return bool(success())
    return True


def _goal_of(request: GenerationRequest) -> str:
    return str(request.meta.get("goal", "")) or str(getattr(request.session, "goal", "") or "")


# ---------------------------------------------------------------------------- policies
class ReplayPolicy(Policy):
    """Replays raw replies in order (see the module docstring)."""

    name = "replay"

    def __init__(self, replies: list[str] | dict[str, list[str]] | str | Path):
        if isinstance(replies, (str, Path)):
            path = Path(replies)
            try:
                replies = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError as exc:
                raise FileNotFoundError(f"replay file not found: {path}") from exc
            except json.JSONDecodeError as exc:
                raise ValueError(f"replay file {path} is not valid JSON: {exc}") from exc
            self.source = str(path)
        else:
            self.source = "<memory>"
        if isinstance(replies, list):
            self.queues: dict[str, list[str]] = {"*": [str(r) for r in replies]}
        elif isinstance(replies, dict):
            self.queues = {}
            for role, lst in replies.items():
                if not isinstance(lst, list):
                    raise ValueError(f"replay queue {role!r} must be a list of strings")
                self.queues[str(role)] = [str(r) for r in lst]
        else:
            raise ValueError("replay replies must be a JSON list or an object of lists per role")
        self.positions = {k: 0 for k in self.queues}

    def _queue_for(self, role: str) -> str:
        if role in self.queues:
            return role
        if "*" in self.queues:
            return "*"
        raise ReplayExhaustedError(f"replay {self.source} has no replies for role {role!r}")

    async def generate(self, request: GenerationRequest) -> Completion:
        key = self._queue_for(request.role)
        pos = self.positions[key]
        queue = self.queues[key]
        if pos >= len(queue):
            which = "global queue" if key == "*" else f"queue for role {key!r}"
            raise ReplayExhaustedError(
                f"replay {self.source}: {which} exhausted after {len(queue)} replies "
                f"(request role={request.role!r}, meta={request.meta})"
            )
        self.positions[key] = pos + 1
        return _scripted(queue[pos])

    def remaining(self, role: str = "*") -> int:
        key = self._queue_for(role)
        return len(self.queues[key]) - self.positions[key]


class RandomPolicy(Policy):
    """Seeded random valid actions (see the module docstring)."""

    name = "random"

    def __init__(self, seed: int = 0, finish_prob: float = 0.05):
        self.rng = random.Random(seed)
        self.finish_prob = float(finish_prob)

    def _act(self, session: Any) -> str:
        rng = self.rng
        valid = getattr(session, "valid_actions", None)
        if callable(valid):
            actions = list(valid())
            if actions and rng.random() >= self.finish_prob:
                return f"<action>{rng.choice(actions)}</action>"
            return "<finish>Random policy gives up.</finish>"
        system = ""
        if session is not None and callable(getattr(session, "system_prompt", None)):
            system = session.system_prompt()
        if "<python>" in system:
            return self._codeact(session)
        if rng.random() < self.finish_prob:
            return "<finish>Random policy gives up.</finish>"
        return f"<action>{rng.choice(['look around', 'inventory', 'read cookbook', 'look'])}</action>"

    def _codeact(self, session: Any) -> str:
        rng = self.rng
        goal = str(getattr(session, "goal", "") or "")
        targets = _TARGET_RE.findall(goal)
        r = rng.random()
        if r < self.finish_prob:
            code = 'finish("Random policy gives up.")'
        elif r < 0.4:
            code = "print(view_inventory())"
        elif r < 0.7 and targets:
            code = f"print(get_info([{json.dumps(rng.choice(targets)[1])}]))"
        elif targets:
            n, item = rng.choice(targets)
            code = f"print(craft({{}}, ({json.dumps(item)}, {int(n)})))"
        else:
            code = "print(view_inventory())"
        return f"<thought>Random step.</thought>\n<python>\n{code}\n</python>"

    async def generate(self, request: GenerationRequest) -> Completion:
        if request.role == "rubric":
            weights = [self.rng.uniform(0.1, 1.0) for _ in ORACLE_RUBRIC_ITEMS]
            return _scripted(rubric_json(_goal_of(request), weights))
        if request.role == "score":
            success = self.rng.random() < 0.5
            return _scripted(score_json(success, _n_items(request), self.rng.uniform(0.1, 1.0)))
        return _scripted(self._act(request.session))


class OraclePolicy(Policy):
    """``reply_fn(session)`` for acting, template rubric/score JSON for the other roles."""

    name = "oracle"

    def __init__(self, reply_fn: ReplyFn):
        self.reply_fn = reply_fn

    async def generate(self, request: GenerationRequest) -> Completion:
        if request.role == "rubric":
            return _scripted(rubric_json(_goal_of(request)))
        if request.role == "score":
            return _scripted(score_json(_child_success(request), _n_items(request)))
        if request.session is None:
            raise ValueError("OraclePolicy needs request.session for role 'act'")
        return _scripted(self.reply_fn(request.session))
