"""Rubric and scoring prompts, and their strict parsers (SPEC.md §3).

Before a child agent runs, the policy writes a *rubric* for the child's subtask in a fresh chat
(:func:`build_rubric_messages`). :func:`parse_rubric` turns the reply into a frozen :class:`Rubric`;
from then on it never changes. When the child has ended, the policy scores it against that rubric in
another fresh chat (:func:`build_score_messages`, greedy), and :func:`parse_score` turns that reply into
a :class:`Score`. Either parser raises its own error type (:class:`RubricParseError`,
:class:`ScoreParseError`) and nothing else; the runtime then drops that child's tokens from training.

The prompts follow the public SERA code (``Runtime/rubric/prompts.py``); their texts are template files
in ``common/agent/prompts/`` (``prompts_dir`` substitutes a user's copies):

* **Rubric request** = system text + a user message holding ONE context block with the sections
  ``[Parent Task]``, ``[Parent Metadata Visible To Rubric Generator]`` (JSON), ``[Parent Trajectory
  Before Delegation]`` (every prompt message of the parent at the delegating step, as ``[Parent Message
  i: role]`` blocks), ``[Parent Step: Delegation Decision]`` (the parent's reply), ``[Observable
  Pre-call Environment]`` (JSON of what the PARENT saw, never hidden world state), ``[Delegated SubAgent
  Task]``, ``[Child Tools]`` (JSON), ``[Child Execution Budget]`` (JSON). The WHOLE block is cut to
  head 1/4 + tail 3/4 of 12,000 characters, then the JSON schema and the constraints follow
  ("give 4 to 8 rubric_items", a strict success gate).
* **Score request** = system text + a user message holding one JSON payload (keys sorted, non-ASCII
  kept) ``{"delegated_task", "final_environment_state", "frozen_rubric", "trajectory"}`` and the answer
  schema ``{success, criterion_scores[{name, score, reason}], final_score, reason}``.

JSON values are written as the public ``_stable_json`` writes them: ``json.dumps(v, ensure_ascii=False,
sort_keys=True)``.

Parsing rules (what "strict but sensible" means here):

* **Finding the JSON** (public ``Runtime/rubric/scoring.py: extract_json_object``). Candidates are tried
  in order: the whole reply, each fenced block (```` ```json ```` or plain ```` ``` ````), the span from
  the first ``{`` to the last ``}``. The FIRST candidate that parses to a JSON object is the answer, whatever
  its keys; when it lacks ``rubric_items`` / ``final_score`` the reply fails (a later object is never
  searched for, and an object followed by more braces in prose is not found). Python's JSON reader
  accepts ``NaN``/``Infinity``; those values are then rejected by the numeric checks below.
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
  ``success=true`` requires s > 0; anything else is a parse failure. ``criterion_scores`` and ``reason``
  never reject a score (the public ``parse_policy_score`` ignores them): the numeric entries of a
  ``criterion_scores`` list (numbers, or objects with a numeric ``score``) are kept, every other entry is
  skipped; a ``reason`` that is not a string is kept as its JSON text (missing = "").

Simplifications (deviations, each in docs/fidelity/rubric_and_protocol.md): the trajectory payload
is environment-agnostic (``raw_response`` / ``observation`` per step, as the public TextWorld adapter;
the public TextCraft adapter splits the reply into ``thought`` / ``code``); long strings inside the
score payload are cut head/tail at :data:`FIELD_CHARS` and the middle steps of a very long trajectory
are replaced by a count, so the scoring prompt stays inside the context cap (the public code sends it
uncut and lets an over-long request fail).

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
from pathlib import Path
from typing import Any

from common.agent.prompts import load_templates, render
from common.agent.tree import Node
from common.policy.context import RUBRIC_MAX_NEW_TOKENS, SCORE_MAX_NEW_TOKENS

# ---- settings (SPEC §3, public rubric_subagent_reward/config.py) --------------------------------------
RUBRIC_SAMPLING: dict[str, Any] = {"temperature": 1.0, "max_tokens": RUBRIC_MAX_NEW_TOKENS}
"""Rubric generation in training: sampled at temperature 1.0, at most 1,024 new tokens."""
SCORE_SAMPLING: dict[str, Any] = {"temperature": 0.0, "max_tokens": SCORE_MAX_NEW_TOKENS}
"""Scoring: greedy, at most 1,024 new tokens."""

PARENT_CONTEXT_CHARS = 12_000
"""The whole rubric context block is cut to head 1/4 + tail 3/4 of this many characters."""
MIN_RUBRIC_ITEMS = 2
"""Accepted items a rubric needs (public ``min_rubric_criteria``); the prompt asks for max(4, this) to 8."""
FIELD_CHARS = 6_000
"""Limit of every string inside the score payload (trajectory fields, final state)."""
TRAJECTORY_CHARS = 24_000
"""Limit of the serialised trajectory in the score payload (middle steps are replaced by a count)."""


def score_budget(max_prompt_tokens: int) -> tuple[int, int]:
    """``(trajectory chars, field chars)`` for a scoring prompt under ``max_prompt_tokens``: the paper's
    caps give the full :data:`TRAJECTORY_CHARS` / :data:`FIELD_CHARS`; small laptop caps shrink both, so
    the prompt cap cuts the trajectory, never the rubric at the payload's head (~3 characters a token
    for JSON, 4,000 characters kept for the rubric, the goal and the instructions).

    >>> score_budget(9_728), score_budget(2_048)
    ((24000, 6000), (2144, 1072))
    """
    traj = max(1_000, min(TRAJECTORY_CHARS, 3 * max_prompt_tokens - 4_000))
    return traj, min(FIELD_CHARS, traj // 2)


RUBRIC_TEMPLATES: dict[str, frozenset[str]] = {
    "rubric_system": frozenset(),
    "rubric_user": frozenset({"context", "min_items"}),
    "rubric_context": frozenset(
        {
            "parent_task",
            "parent_metadata",
            "parent_trajectory",
            "parent_action",
            "environment_state",
            "child_goal",
            "child_tools",
            "execution_budget",
        }
    ),
    "rubric_parent_message": frozenset({"index", "role", "content"}),
    "rubric_truncation": frozenset(),
    "delegated_task": frozenset({"goal", "context"}),
}
"""Rubric-request template files (``common/agent/prompts/NAME.txt``) and the placeholders each may use."""
SCORE_TEMPLATES: dict[str, frozenset[str]] = {
    "score_system": frozenset(),
    "score_user": frozenset({"payload"}),
}
"""Score-request template files and their placeholders."""


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
    """Everything the rubric writer sees: only what the PARENT saw before the child ran (SPEC §3)."""

    parent_task: str
    """The parent agent's own task text."""
    parent_depth: int
    child_depth: int
    fork_step: int
    """The parent's step index at which it delegated."""
    parent_messages: list[dict[str, str]]
    """The parent's exact prompt messages at the delegating step (as sent, after the context cap)."""
    parent_action: str
    """The parent's delegating reply (the launch code or the ``<delegate>`` block)."""
    pre_call_state: Any
    """The environment as the parent saw it before the child runs (JSON-able; never hidden state)."""
    delegated_goal: str
    child_tools: Any
    """The tools the child will have (public: a short JSON string naming them)."""
    child_max_steps: int
    delegated_context: str = ""
    """Extra context the parent passed to the child (TextCraft ``context=``), appended to the goal
    (:func:`delegated_task`)."""
    parent_agent_id: str = ""
    """The parent's node id (metadata)."""
    test_time: bool = False
    """Written for test-time selection: the metadata names the parent ``parent_agent_id`` (public
    ``rubric_selector.py``); in training ``parent_trajectory_id`` (public ``async_pipeline.py``)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Optional extra metadata (environment name, ...), merged into the metadata JSON."""

    def metadata(self) -> dict[str, Any]:
        """The ``[Parent Metadata Visible To Rubric Generator]`` object: the parent's id, both depths and the
        fork step (the training-only ``fork_group_id`` / ``branch_index`` of the public Rubric stage are
        random run ids and are left out)."""
        return {
            "parent_agent_id" if self.test_time else "parent_trajectory_id": self.parent_agent_id,
            "parent_depth": self.parent_depth,
            "child_depth": self.child_depth,
            "fork_step": self.fork_step,
            **self.extra,
        }


# ---- text helpers -------------------------------------------------------------------------------------
def stable_json(value: Any) -> str:
    """JSON as the public prompts write it: keys sorted, non-ASCII kept (``default=str`` for odd values)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def clip_middle(text: str, limit: int = PARENT_CONTEXT_CHARS, marker: str | None = None) -> str:
    """Keep the head 1/4 and the tail 3/4 of ``limit`` characters of a long text.

    Texts of at most ``limit`` characters are returned unchanged. Otherwise exactly ``limit``
    characters of the original are kept (``limit // 4`` from the start, the rest from the end) with a
    marker between them (default: a line naming how many characters were cut).

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


def _clip_strings(value: Any, limit: int = FIELD_CHARS) -> Any:
    """A copy of a JSON-able value whose every string is cut by :func:`clip_middle` to ``limit``."""
    if isinstance(value, str):
        return clip_middle(value, limit)
    if isinstance(value, dict):
        return {k: _clip_strings(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clip_strings(v, limit) for v in value]
    return value


def serialise_trajectory(node: Node, max_chars: int = 16_000) -> str:
    """Readable text of a child's steps (the branch judge's prompt): per step the reply and observation.

    The step transcript is clipped head 1/4 / tail 3/4 to ``max_chars``; the closing status lines
    (finished, finish message, error) are appended unclipped. The environment's own success verdict
    (``node.success``) and any branch label are deliberately NOT included.
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
        status.append(f"Called finish with message: {clip_middle(node.finish_message or '', 2000)}")
    else:
        status.append("Did not call finish.")
    if node.error:
        status.append(f"Ended with an error: {clip_middle(node.error, 2000)}")
    return body + "\n\n--- End of trajectory ---\n" + "\n".join(status)


def trajectory_payload(
    node: Node,
    max_chars: int = TRAJECTORY_CHARS,
    field_chars: int = FIELD_CHARS,
    task_goal: str | None = None,
) -> dict[str, Any]:
    """The child's trajectory as the score payload holds it (public ``serialize_trajectory`` shape):
    ``{task_goal, steps: [{step, raw_response, observation, error}], finish_message, error_message}``.
    ``task_goal`` is the child's whole task text (:func:`delegated_task`: the goal and the parent's context);
    default ``node.goal``.

    No environment verdict (success, reward) is included: the scorer judges from the trajectory and the
    final state. Strings are cut to ``field_chars``; when the whole exceeds ``max_chars`` the middle
    steps are replaced by one ``{"omitted_steps": n}`` entry (the first step and the last ones are kept).
    """
    steps = []
    for step in node.steps:
        error = (
            f"{step.refused_launches} launch(es) refused at the depth limit"
            if step.refused_launches
            else None
        )
        steps.append(
            {
                "step": step.index,
                "raw_response": step.call.text,
                "observation": step.observation,
                "error": error,
            }
        )
    payload = _clip_strings(
        {
            "task_goal": node.goal if task_goal is None else task_goal,
            "steps": steps,
            "finish_message": node.finish_message,
            "error_message": node.error,
        },
        field_chars,
    )
    steps = payload["steps"]
    omitted = 0
    while len(stable_json(payload)) > max_chars and len(steps) - (1 if omitted else 0) > 2:
        del steps[2 if omitted else 1]  # the oldest step after the first one
        omitted += 1
        if omitted == 1:
            steps.insert(1, {"omitted_steps": 1})
        else:
            steps[1]["omitted_steps"] = omitted
    return payload


# ---- prompts --------------------------------------------------------------------------------------------
def delegated_task(goal: str, context: str = "", prompts_dir: str | Path | None = None) -> str:
    """The child's whole task text: the goal, then the context its parent passed (``delegated_task.txt``;
    the goal alone when there is none). Public TextCraft ``launch_subagent`` appends ``Context provided from
    parent agent: ...`` to the child's goal, and that one string is the rubric writer's delegated task, the
    scorer's ``delegated_task`` and ``task_goal``, and the ``[Parent Task]`` of the child's own children.

    >>> delegated_task("Craft 1x a", ""), delegated_task("Craft 1x a", "use the ore").splitlines()[0]
    ('Craft 1x a', 'Craft 1x a')
    """
    if not context:
        return goal
    return render(load_templates(RUBRIC_TEMPLATES, prompts_dir)["delegated_task"], goal=goal, context=context)


def build_rubric_messages(ctx: RubricContext, prompts_dir: str | Path | None = None) -> list[dict[str, str]]:
    """A fresh chat asking the policy to write the rubric for ``ctx.delegated_goal`` (module docstring)."""
    t = load_templates(RUBRIC_TEMPLATES, prompts_dir)
    trajectory = "\n".join(
        render(
            t["rubric_parent_message"],
            index=i,
            role=m.get("role", f"message_{i}"),
            content=m.get("content", ""),
        )
        for i, m in enumerate(ctx.parent_messages)
    )
    goal = delegated_task(ctx.delegated_goal, ctx.delegated_context, prompts_dir)
    context = render(
        t["rubric_context"],
        parent_task=ctx.parent_task,
        parent_metadata=stable_json(ctx.metadata()),
        parent_trajectory=trajectory,
        parent_action=ctx.parent_action,
        environment_state=stable_json(ctx.pre_call_state),
        child_goal=goal,
        child_tools=stable_json(ctx.child_tools),
        execution_budget=stable_json(ctx.child_max_steps),
    )
    user = render(
        t["rubric_user"],
        context=clip_middle(context, PARENT_CONTEXT_CHARS, marker=t["rubric_truncation"]),
        min_items=max(4, MIN_RUBRIC_ITEMS),
    )
    return [{"role": "system", "content": t["rubric_system"]}, {"role": "user", "content": user}]


def build_score_messages(
    rubric: Rubric,
    delegated_goal: str,
    trajectory: dict[str, Any],
    final_state: Any,
    prompts_dir: str | Path | None = None,
    field_chars: int = FIELD_CHARS,
) -> list[dict[str, str]]:
    """A fresh chat asking the policy to score a finished child against its frozen rubric.

    ``trajectory`` is :func:`trajectory_payload`'s output; ``final_state`` is the environment as the
    child saw it when it ended (JSON-able; its strings are cut to ``field_chars``)."""
    t = load_templates(SCORE_TEMPLATES, prompts_dir)
    payload = stable_json(
        {
            "frozen_rubric": rubric.to_dict(),
            "delegated_task": delegated_goal,
            "trajectory": trajectory,
            "final_environment_state": _clip_strings(final_state, field_chars),
        }
    )
    user = render(t["score_user"], payload=payload)
    return [{"role": "system", "content": t["score_system"]}, {"role": "user", "content": user}]


# ---- JSON extraction ------------------------------------------------------------------------------------
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def _loads(text: str) -> Any:
    """``json.loads`` that reports failure as None (bad JSON, huge ints, absurd nesting)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _candidates(text: str):
    """Parsed candidates of ``text``, in the order of the parsing rule (module docstring)."""
    yield _loads(text.strip())
    for m in _FENCE.finditer(text):
        yield _loads(m.group(1).strip())
    first, last = text.find("{"), text.rfind("}")
    if first != -1 and last > first:
        yield _loads(text[first : last + 1])


def find_json_object(text: str) -> dict[str, Any] | None:
    """The first candidate of ``text`` that is a JSON object, whatever its keys (None when there is none).

    >>> find_json_object('Here: {"a": 1} and more {"b": 2}') is None  # first { to last } is not JSON
    True
    >>> find_json_object('```json\\n{"note": 1}\\n```\\n{"final_score": 1}')
    {'note': 1}
    """
    if not isinstance(text, str):
        return None
    return next((obj for obj in _candidates(text) if isinstance(obj, dict)), None)


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
    obj = find_json_object(text)
    if obj is None:
        raise RubricParseError("no JSON object found")
    if "rubric_items" not in obj:
        raise RubricParseError("the first JSON object has no 'rubric_items'")
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


def parse_score(text: str) -> Score:
    """Parse the scorer's reply (rules in the module docstring). Raises ScoreParseError only.

    ``criterion_scores`` and ``reason`` are informational, as in the public ``parse_policy_score`` (which
    ignores them): a criterion without a numeric score never rejects the overall score.

    >>> parse_score('{"success": true, "final_score": 0.6, "criterion_scores": [{"name": "a", "score": "high"}]}')
    Score(success=True, criterion_scores=(), final_score=0.6, reason='')
    """
    obj = find_json_object(text)
    if obj is None:
        raise ScoreParseError("no JSON object found")
    if "final_score" not in obj:
        raise ScoreParseError("the first JSON object has no 'final_score'")
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
    raw = obj.get("criterion_scores")
    scores = []
    for k, c in enumerate(raw if isinstance(raw, list) else []):
        if isinstance(c, dict):
            c = c.get("score")
        try:
            scores.append(_parse_number(c, f"criterion_scores[{k}]"))
        except ScoreParseError:
            continue  # informational only: a criterion the scorer did not score numerically is skipped
    reason = obj.get("reason")
    if reason is None:
        reason = ""
    elif not isinstance(reason, str):
        reason = json.dumps(reason, ensure_ascii=False, default=str)
    s += 0.0  # -0.0 -> 0.0
    return Score(success=success, criterion_scores=tuple(scores), final_score=s, reason=reason.strip())
