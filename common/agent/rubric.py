"""Rubric and scoring prompts, and their strict parsers (SPEC.md §3).

Before a child agent runs, the policy writes a *rubric* for the child's subtask in a fresh chat
(:func:`build_rubric_messages`, sampled at temperature 1.0). :func:`parse_rubric` turns the reply into
a frozen :class:`Rubric`; from then on it never changes. When the child has ended, the policy scores
it against that rubric in another fresh chat (:func:`build_score_messages`, greedy), and
:func:`parse_score` turns that reply into a :class:`Score`. Either parser raises its own error type
(:class:`RubricParseError`, :class:`ScoreParseError`) and nothing else; the runtime then drops that
child's tokens from training.

All prompt wording of the rubric writer and the scorer lives in this module.

Parsing rules (what "strict but sensible" means here):

* **Finding the JSON.** Candidates are tried in order: the whole reply, each fenced ```json (or plain
  ```) block, the span from the first ``{`` to the last ``}``, and finally every ``{`` in the text
  decoded with ``json.JSONDecoder.raw_decode`` (so an object followed by trailing prose still parses;
  at most the first 512 ``{`` are tried).
  The first candidate that is a JSON object holding the required key (``rubric_items`` /
  ``final_score``) is used. Python's JSON reader accepts ``NaN``/``Infinity``; those values are then
  rejected by the numeric checks below.
* **Rubric items** (item-level rule). An item is *accepted* when it is an object with a non-empty string
  ``name`` and a ``weight`` that is a JSON number (not a boolean, not a string). Items that are not
  objects, lack a name or lack a numeric weight are *dropped*. The text fields ``description``,
  ``score_0`` and ``score_full`` must be strings when present (missing = ""); an item with a
  non-string text field is dropped too. A numeric weight that is non-finite or negative rejects the
  WHOLE rubric (the writer's weighting is then ambiguous; renormalising around it would silently
  change its meaning). At least 2 items must be accepted and their weights must have a positive sum;
  weights are then renormalised to sum to 1 (computed as ``w / max(w)`` first, so huge finite weights
  do not overflow). No upper limit on the number of items is enforced (the prompt asks for 4-8).
* **Other rubric fields.** ``success_gate`` and ``scoring_procedure``: strings, missing = "".
  ``failure_conditions``: a list of strings (non-string entries dropped), a single string is taken as
  one condition, missing = (). A present field of the wrong type is a parse failure.
* **Score.** ``final_score`` = s must be a JSON number, or a string holding a number (``"0.7"``), and
  finite in [0, 1]. ``success`` must be a JSON boolean or the string ``"true"``/``"false"`` (any case,
  surrounding spaces ignored); numbers such as 0/1 are rejected. ``success=false`` requires s == 0 and
  ``success=true`` requires s > 0; anything else is a parse failure. ``criterion_scores`` is a list of
  finite numbers or of objects with a numeric ``score`` (missing = ()); when ``n_items`` is given its
  length must equal ``n_items``. ``reason`` must be a string when present (missing = "").

Simplifications: prompts are plain text with our own wording (not the paper's); the parent context is
serialised as ``[role]`` blocks before clipping; other long fields (tools, state, action) are clipped
with the same head/tail rule at generous limits so one huge field cannot crowd out the rest.

>>> r = parse_rubric('{"rubric_items": [{"name": "a", "weight": 3}, {"name": "b", "weight": 1}]}')
>>> [i.weight for i in r.items]
[0.75, 0.25]
>>> parse_score('{"success": true, "criterion_scores": [1, 0.5], "final_score": 0.9, "reason": "ok"}').final_score
0.9
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from common.agent.tree import Node

# ---- sampling settings (SPEC §3) -------------------------------------------------------------------
RUBRIC_SAMPLING: dict[str, Any] = {"temperature": 1.0, "max_tokens": 1024}
"""Rubric generation: sampled at temperature 1.0, at most 1024 new tokens."""
SCORE_SAMPLING: dict[str, Any] = {"temperature": 0.0, "max_tokens": 1024}
"""Scoring: greedy, at most 1024 new tokens."""

PARENT_CONTEXT_CHARS = 12_000
"""The serialised parent messages are cut to head 1/4 + tail 3/4 of this many characters."""
FIELD_CHARS = 6_000
"""Safety limit for every other free-text field of the prompts (tools, state, action, final state)."""
TRAJECTORY_CHARS = 16_000
"""Default limit of a serialised child trajectory in the scoring prompt."""


# ---- errors ------------------------------------------------------------------------------------------
class RubricParseError(ValueError):
    """The rubric writer's reply could not be turned into a valid rubric."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"rubric parse failure: {reason}")


class ScoreParseError(ValueError):
    """The scorer's reply could not be turned into a valid score."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"score parse failure: {reason}")


# ---- data ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RubricItem:
    """One weighted criterion of a rubric."""

    name: str
    weight: float
    """Renormalised: the weights of a rubric sum to 1."""
    description: str = ""
    score_0: str = ""
    """What earns 0 on this criterion."""
    score_full: str = ""
    """What earns full marks on this criterion."""


@dataclass(frozen=True)
class Rubric:
    """A parsed, frozen rubric. Immutable: tuples and frozen items only."""

    items: tuple[RubricItem, ...]
    success_gate: str = ""
    failure_conditions: tuple[str, ...] = ()
    scoring_procedure: str = ""

    def __post_init__(self) -> None:
        # Accept lists from callers but store tuples, so the rubric really is immutable.
        object.__setattr__(self, "items", tuple(self.items))
        object.__setattr__(self, "failure_conditions", tuple(self.failure_conditions))

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(i.weight for i in self.items)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON, in the same shape the writer is asked for (stored on ``Node.rubric``)."""
        return {
            "rubric_items": [
                {
                    "name": i.name,
                    "weight": i.weight,
                    "description": i.description,
                    "score_0": i.score_0,
                    "score_full": i.score_full,
                }
                for i in self.items
            ],
            "success_gate": self.success_gate,
            "failure_conditions": list(self.failure_conditions),
            "scoring_procedure": self.scoring_procedure,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rubric:
        """Inverse of :meth:`to_dict`. Stored weights are kept as they are (no second renormalisation,
        so ``from_dict(r.to_dict()) == r``); they must already be valid and sum to 1 within 1e-6."""
        try:
            rubric = _rubric_from_obj(d, renormalise=False)
        except RubricParseError as e:
            raise ValueError(f"invalid stored rubric: {e.reason}") from None
        total = math.fsum(rubric.weights)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"invalid stored rubric: weights sum to {total}, expected 1")
        return rubric


@dataclass(frozen=True)
class Score:
    """A parsed score of one child against its frozen rubric."""

    success: bool
    criterion_scores: tuple[float, ...]
    final_score: float
    """s in [0, 1]; 0 when ``success`` is False, > 0 when it is True."""
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "criterion_scores": list(self.criterion_scores),
            "final_score": self.final_score,
            "reason": self.reason,
        }


@dataclass
class RubricContext:
    """Everything the rubric writer sees: only what existed before the child ran (SPEC §3)."""

    parent_task: str
    """The parent agent's own task text."""
    parent_depth: int
    child_depth: int
    fork_step: int
    """The parent's step index at which it delegated."""
    parent_messages: list[dict[str, str]]
    """The parent's exact prompt messages at the delegating step."""
    parent_action: str
    """The parent's delegating reply (the launch code or the ``<delegate>`` block)."""
    pre_call_state: str
    """The observable environment state before the child runs (``World.describe()``)."""
    delegated_goal: str
    child_tools: str
    """A description of the tools the child will have (e.g. the child's system prompt)."""
    child_max_steps: int
    delegated_context: str = ""
    """Extra context the parent passed to the child (TextCraft ``context=``), if any."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Optional extra metadata (environment name, ...), listed in the metadata block."""


# ---- text helpers -------------------------------------------------------------------------------------
def clip_middle(text: str, limit: int = PARENT_CONTEXT_CHARS, marker: str | None = None) -> str:
    """Keep the head 1/4 and the tail 3/4 of ``limit`` characters of a long text.

    Texts of at most ``limit`` characters are returned unchanged. Otherwise exactly ``limit``
    characters of the original are kept (``limit // 4`` from the start, the rest from the end) with a
    marker line between them naming how many characters were cut.

    >>> clip_middle("abcdefghij", limit=8, marker="~")
    'ab~efghij'
    """
    if limit < 0:
        raise ValueError(f"clip_middle: limit must be >= 0, got {limit}")
    if len(text) <= limit:
        return text
    head_n = limit // 4
    tail_n = limit - head_n
    omitted = len(text) - limit
    if marker is None:
        marker = f"\n[... {omitted} characters omitted ...]\n"
    head = text[:head_n]
    tail = text[len(text) - tail_n :] if tail_n else ""
    return head + marker + tail


def serialise_messages(messages: list[dict[str, str]]) -> str:
    """Chat messages as ``[role]`` blocks (the form the rubric writer reads)."""
    parts = []
    for m in messages:
        role = str(m.get("role", "?"))
        parts.append(f"[{role}]\n{m.get('content', '')}")
    return "\n\n".join(parts)


def serialise_trajectory(node: Node, max_chars: int = TRAJECTORY_CHARS) -> str:
    """Readable text of a child's steps for the scorer: per step the reply and the observation.

    The step transcript is clipped head 1/4 / tail 3/4 to ``max_chars``; the closing status lines
    (finished, finish message, error) are appended unclipped. The environment's own success verdict
    (``node.success``) and any branch label are deliberately NOT included: the scorer must judge
    from the trajectory and the final state alone.
    """
    blocks = []
    for step in node.steps:
        block = f"--- Step {step.index + 1} ---\n[agent reply]\n{step.call.text}\n[observation]\n{step.observation}"
        if step.refused_launches:
            block += f"\n({step.refused_launches} launch(es) refused at the depth limit)"
        blocks.append(block)
    body = "\n\n".join(blocks) if blocks else "(the sub-agent took no steps)"
    body = clip_middle(body, max_chars)
    status = [f"Steps used: {node.steps_used}/{node.max_steps}"]
    if node.finished:
        status.append(f"Called finish with message: {_clip(node.finish_message or '', 2000)}")
    else:
        status.append("Did not call finish.")
    if node.error:
        status.append(f"Ended with an error: {_clip(node.error, 2000)}")
    return body + "\n\n--- End of trajectory ---\n" + "\n".join(status)


def _clip(text: str, limit: int = FIELD_CHARS) -> str:
    return clip_middle(text, limit)


# ---- prompts --------------------------------------------------------------------------------------------
RUBRIC_SYSTEM = """\
You write acceptance rubrics for delegated subtasks in a recursive agent system.

A parent agent has just handed a subtask to a sub-agent. The sub-agent has not started yet. Your rubric \
is frozen the moment you write it and is later used, unchanged, to score the sub-agent's finished work. \
Write it from what the parent needs: what must be true of the shared environment and of the sub-agent's \
report for the parent to continue successfully, and which behaviours would waste the parent's budget or \
damage the shared state.

Answer with ONE JSON object and nothing else:
{
  "rubric_items": [
    {"name": "short criterion name",
     "weight": 0.3,
     "description": "what this criterion checks, in observable terms",
     "score_0": "what earns 0 on it",
     "score_full": "what earns full marks on it"}
  ],
  "success_gate": "the condition that must hold for the subtask to count as a success at all",
  "failure_conditions": ["an outcome that makes the whole subtask a failure", "..."],
  "scoring_procedure": "how to combine the criteria into one final score in [0, 1]"
}

Rules: give 4 to 8 rubric items; weights are non-negative numbers (they are renormalised to sum to 1); \
every criterion must be checkable from the sub-agent's trajectory and the final environment state; do \
not reward effort or verbosity, reward results the parent can use."""

RUBRIC_USER = """\
## Parent task
{parent_task}

## Metadata
- parent depth: {parent_depth}
- sub-agent depth: {child_depth}
- parent step at delegation: {fork_step}
- sub-agent step budget: {child_max_steps}{extra}

## Parent context (the parent's prompt messages at the delegating step)
{parent_context}

## Parent's delegating action
{parent_action}

## Environment state before the sub-agent runs
{pre_call_state}

## Delegated goal
{delegated_goal}{delegated_context}

## Sub-agent's tools
{child_tools}

Write the rubric for this delegated goal now, as one JSON object."""

SCORE_SYSTEM = """\
You score a sub-agent's finished work against a frozen rubric that was written before it started.

Judge only from the trajectory and the final environment state; claims in the sub-agent's messages \
count only when the trajectory or the state confirms them. Give each rubric item a score between 0 and \
1 (in the order listed), then decide:
- if the success gate is not met, or any failure condition holds: "success": false and "final_score": 0;
- otherwise: "success": true and "final_score" = the weighted result of the item scores, a number \
greater than 0 and at most 1.

Answer with ONE JSON object and nothing else:
{"success": true, "criterion_scores": [1.0, 0.5], "final_score": 0.8, "reason": "one or two sentences"}"""

SCORE_USER = """\
## Frozen rubric
{rubric}

## Delegated task
{delegated_goal}

## Sub-agent trajectory
{trajectory}

## Final environment state
{final_state}

Score the sub-agent now, as one JSON object with {n_items} criterion scores."""


def format_rubric(rubric: Rubric) -> str:
    """The frozen rubric as readable text (weights as percentages, items numbered in order)."""
    lines = []
    for k, item in enumerate(rubric.items, start=1):
        lines.append(f"{k}. {item.name} (weight {item.weight:.3f})")
        if item.description:
            lines.append(f"   checks: {item.description}")
        if item.score_0:
            lines.append(f"   0: {item.score_0}")
        if item.score_full:
            lines.append(f"   full: {item.score_full}")
    lines.append(f"Success gate: {rubric.success_gate or '(none given)'}")
    if rubric.failure_conditions:
        lines.append("Failure conditions:")
        lines.extend(f"- {c}" for c in rubric.failure_conditions)
    else:
        lines.append("Failure conditions: (none given)")
    lines.append(f"Scoring procedure: {rubric.scoring_procedure or '(weighted sum of the item scores)'}")
    return "\n".join(lines)


def build_rubric_messages(ctx: RubricContext) -> list[dict[str, str]]:
    """A fresh chat asking the policy to write the rubric for ``ctx.delegated_goal``."""
    extra = "".join(f"\n- {k}: {v}" for k, v in ctx.extra.items())
    delegated_context = (
        f"\n\nContext passed by the parent:\n{_clip(ctx.delegated_context)}" if ctx.delegated_context else ""
    )
    user = RUBRIC_USER.format(
        parent_task=_clip(ctx.parent_task),
        parent_depth=ctx.parent_depth,
        child_depth=ctx.child_depth,
        fork_step=ctx.fork_step,
        child_max_steps=ctx.child_max_steps,
        extra=extra,
        parent_context=clip_middle(serialise_messages(ctx.parent_messages), PARENT_CONTEXT_CHARS),
        parent_action=_clip(ctx.parent_action),
        pre_call_state=_clip(ctx.pre_call_state),
        delegated_goal=_clip(ctx.delegated_goal),
        delegated_context=delegated_context,
        child_tools=_clip(ctx.child_tools),
    )
    return [{"role": "system", "content": RUBRIC_SYSTEM}, {"role": "user", "content": user}]


def build_score_messages(
    rubric: Rubric, delegated_goal: str, child_trajectory: str, final_state: str
) -> list[dict[str, str]]:
    """A fresh chat asking the policy to score a finished child against its frozen rubric.

    ``child_trajectory`` is the output of :func:`serialise_trajectory` (already clipped)."""
    user = SCORE_USER.format(
        rubric=format_rubric(rubric),
        delegated_goal=_clip(delegated_goal),
        trajectory=child_trajectory,
        final_state=_clip(final_state),
        n_items=len(rubric.items),
    )
    return [{"role": "system", "content": SCORE_SYSTEM}, {"role": "user", "content": user}]


# ---- JSON extraction ------------------------------------------------------------------------------------
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\r?\n?(.*?)```", re.DOTALL)
_DECODER = json.JSONDecoder()
_MAX_SCAN_STARTS = 512
"""At most this many ``{`` positions are tried by the raw_decode scan (replies are <= 1024 tokens)."""


def _loads(text: str) -> Any:
    """``json.loads`` that reports failure as None (bad JSON, huge ints, absurd nesting)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _candidates(text: str):
    """JSON objects found in ``text``, in the order of the parsing rule (module docstring)."""
    yield _loads(text.strip())
    for m in _FENCE.finditer(text):
        yield _loads(m.group(1).strip())
    first, last = text.find("{"), text.rfind("}")
    if first != -1 and last > first:
        yield _loads(text[first : last + 1])
    pos = text.find("{")
    for _ in range(_MAX_SCAN_STARTS):  # bounded: pathological texts cannot make parsing quadratic
        if pos == -1:
            break
        try:
            obj, _end = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError):
            obj = None
        yield obj
        pos = text.find("{", pos + 1)


def find_json_object(text: str, required_key: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` that has ``required_key`` (None when there is none)."""
    if not isinstance(text, str):
        return None
    for obj in _candidates(text):
        if isinstance(obj, dict) and required_key in obj:
            return obj
    return None


# ---- rubric parsing --------------------------------------------------------------------------------------
def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _as_float(x: int | float) -> float:
    try:
        return float(x)
    except OverflowError:  # a JSON integer too large for a float
        return math.inf


def _item_from_obj(obj: Any) -> RubricItem | None:
    """An accepted item, or None when the item is dropped. Raises on a numeric invalid weight."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    weight = obj.get("weight")
    if not _is_number(weight):
        return None
    w = _as_float(weight)
    if not math.isfinite(w):
        raise RubricParseError(f"item {name.strip()!r} has a non-finite weight")
    if w < 0:
        raise RubricParseError(f"item {name.strip()!r} has a negative weight {w}")
    texts = {}
    for key in ("description", "score_0", "score_full"):
        value = obj.get(key, "")
        if value is None:
            value = ""
        if not isinstance(value, str):
            return None
        texts[key] = value.strip()
    return RubricItem(name=name.strip(), weight=w, **texts)


def _rubric_from_obj(obj: dict[str, Any], renormalise: bool = True) -> Rubric:
    items_raw = obj.get("rubric_items")
    if not isinstance(items_raw, list):
        raise RubricParseError("'rubric_items' must be a list")
    items = [it for it in (_item_from_obj(o) for o in items_raw) if it is not None]
    if len(items) < 2:
        raise RubricParseError(f"need at least 2 valid rubric items, got {len(items)} of {len(items_raw)}")
    weights = [it.weight for it in items]
    top = max(weights)
    if top <= 0:
        raise RubricParseError("rubric item weights sum to 0")
    if renormalise:
        scaled = [w / top for w in weights]  # in [0, 1]: no overflow when summing
        total = math.fsum(scaled)
        items = [
            RubricItem(it.name, s / total, it.description, it.score_0, it.score_full)
            for it, s in zip(items, scaled, strict=True)
        ]

    def text_field(key: str) -> str:
        value = obj.get(key, "")
        if value is None:
            return ""
        if not isinstance(value, str):
            raise RubricParseError(f"'{key}' must be a string, got {type(value).__name__}")
        return value.strip()

    fc = obj.get("failure_conditions", [])
    if fc is None:
        fc = []
    if isinstance(fc, str):
        fc = [fc]
    if not isinstance(fc, list):
        raise RubricParseError(f"'failure_conditions' must be a list, got {type(fc).__name__}")
    conditions = tuple(c.strip() for c in fc if isinstance(c, str) and c.strip())
    return Rubric(
        items=tuple(items),
        success_gate=text_field("success_gate"),
        failure_conditions=conditions,
        scoring_procedure=text_field("scoring_procedure"),
    )


def parse_rubric(text: str) -> Rubric:
    """Parse the rubric writer's reply (rules in the module docstring). Raises RubricParseError only."""
    obj = find_json_object(text, "rubric_items")
    if obj is None:
        raise RubricParseError("no JSON object with 'rubric_items' found")
    return _rubric_from_obj(obj, renormalise=True)


# ---- score parsing -----------------------------------------------------------------------------------------
def _short(x: Any) -> str:
    """A short description of a bad value for an error message (never the repr of a big structure)."""
    if isinstance(x, str):
        return repr(x[:60])
    if isinstance(x, (bool, int, float)) or x is None:
        return repr(x)[:60]
    return type(x).__name__


def _parse_bool(x: Any) -> bool:
    if isinstance(x, bool):
        return x
    if isinstance(x, str) and x.strip().lower() in ("true", "false"):
        return x.strip().lower() == "true"
    raise ScoreParseError(f"'success' must be true or false, got {_short(x)}")


def _parse_number(x: Any, what: str) -> float:
    if _is_number(x):
        value = _as_float(x)
    elif isinstance(x, str):
        try:
            value = float(x.strip())
        except ValueError:
            raise ScoreParseError(f"{what} is not a number: {_short(x)}") from None
    else:
        raise ScoreParseError(f"{what} is not a number: {_short(x)}")
    if not math.isfinite(value):
        raise ScoreParseError(f"{what} is not finite")
    return value


def parse_score(text: str, n_items: int | None = None) -> Score:
    """Parse the scorer's reply (rules in the module docstring). Raises ScoreParseError only."""
    obj = find_json_object(text, "final_score")
    if obj is None:
        raise ScoreParseError("no JSON object with 'final_score' found")
    s = _parse_number(obj["final_score"], "final_score")
    if not 0.0 <= s <= 1.0:
        raise ScoreParseError(f"final_score {s} is outside [0, 1]")
    if "success" not in obj:
        raise ScoreParseError("'success' is missing")
    success = _parse_bool(obj["success"])
    if not success and s != 0.0:
        raise ScoreParseError(f"success=false requires final_score 0, got {s}")
    if success and s <= 0.0:
        raise ScoreParseError("success=true requires final_score > 0")
    raw = obj.get("criterion_scores", [])
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ScoreParseError(f"'criterion_scores' must be a list, got {type(raw).__name__}")
    scores = []
    for k, c in enumerate(raw):
        if isinstance(c, dict):
            if "score" not in c:
                raise ScoreParseError(f"criterion_scores[{k}] has no 'score'")
            c = c["score"]
        scores.append(_parse_number(c, f"criterion_scores[{k}]"))
    if n_items is not None and len(scores) != n_items:
        raise ScoreParseError(f"expected {n_items} criterion scores, got {len(scores)}")
    reason = obj.get("reason", "")
    if reason is None:
        reason = ""
    if not isinstance(reason, str):
        raise ScoreParseError(f"'reason' must be a string, got {type(reason).__name__}")
    s += 0.0  # -0.0 -> 0.0
    return Score(success=success, criterion_scores=tuple(scores), final_score=s, reason=reason.strip())
