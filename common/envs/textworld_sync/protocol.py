"""The TextWorld-Sync reply protocol: parse one model reply into an action, a delegation or a finish.

Two parsers live here:

* :func:`extract_decision` / :func:`extract_action` -- the PUBLIC protocol
  (``Runtime/agents/textworld_protocol.py`` of OliverLeeXZ/SERA), used by TextWorld-Sync sessions. A reply
  is valid when exactly one KIND of block appears (``<action>``, ``<delegate>`` or ``<finish>``; several
  blocks of that kind: the first counts). A ``<delegate>`` holds ``{"goal": ...}`` (optional
  ``max_steps``, default 20) or ``{"delegations": [{...}, ...]}``. Anything else is ``kind="error"``;
  the session then runs :func:`extract_action`'s best-effort fallback as a world action (the public
  evaluator does, which is how a malformed reply spends a shared step).
* :func:`parse_reply` -- the project's stricter, lenient-fallback parser (one block in total,
  ``<think>`` ignored, an unclosed final block accepted), kept for ``textworld_cooking``::

    <action>take carrot</action>
    <delegate>{"goal": "Prepare and eat dish_1 ...", "max_steps": 20}</delegate>
    <delegate>{"delegations": [{"goal": "..."}, {"goal": "...", "max_steps": 12}]}</delegate>
    <finish>Both dishes are prepared and eaten.</finish>

Run the doctest: ``python -m doctest common/envs/textworld_sync/protocol.py``.

>>> parse_reply("I will grab it. <action>take salt</action>").action
'take salt'
>>> parse_reply("Action: take salt", ["take salt", "look around"]).kind
'action'
>>> parse_reply("<action>a</action><finish>b</finish>").kind
'error'
>>> extract_decision("<action>take salt</action><action>look around</action>").action
'take salt'
>>> extract_action("Action: take salt")
('take salt', False)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from common.envs.textworld_sync.world import normalize_action

KINDS = ("action", "delegate", "finish", "error")
_BLOCK_RE = re.compile(r"<(action|delegate|finish)>(.*?)</\1\s*>", re.IGNORECASE | re.DOTALL)
_OPEN_TAIL_RE = re.compile(
    r"<(action|delegate|finish)>((?:(?!<(?:/?)(?:action|delegate|finish)\b).)*)$", re.I | re.S
)
_ANY_TAG_RE = re.compile(r"</?(action|delegate|finish)\s*>", re.IGNORECASE)
_THINK_RE = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)
_PREFIX_RE = re.compile(
    r"^(?:[-*>#]+\s*|\d+[.)]\s*|(?:next\s+)?(?:action|command|act|answer)\s*[:=-]\s*)+", re.I
)
_FENCE_RE = re.compile(r"^```[a-z]*$", re.IGNORECASE)


@dataclass(frozen=True)
class Delegation:
    """One child the reply asks for."""

    goal: str
    max_steps: int = 20
    context: str = ""


@dataclass(frozen=True)
class ParsedReply:
    """The parse of one reply. Exactly one of action / delegations / message is set, or ``error``."""

    kind: str
    """``action`` | ``delegate`` | ``finish`` | ``error``."""
    action: str | None = None
    delegations: tuple[Delegation, ...] = ()
    message: str | None = None
    error: str | None = None
    lenient: bool = False
    """True when the action was recovered by the fallback (no tagged block)."""


def _err(text: str) -> ParsedReply:
    return ParsedReply(kind="error", error=text)


def parse_reply(
    text: Any,
    valid_actions: list[str] | tuple[str, ...] | frozenset[str] | None = None,
    *,
    max_child_steps: int = 20,
    max_delegations: int = 8,
) -> ParsedReply:
    """Parse ``text`` (see the module docstring). Never raises; unknown input gives ``kind="error"``."""
    if not isinstance(text, str):
        return _err(f"The reply must be text, got {type(text).__name__}.")
    body = _THINK_RE.sub(" ", text)
    blocks = [(m.group(1).lower(), m.group(2)) for m in _BLOCK_RE.finditer(body)]
    if not blocks:
        # An unclosed block at the very end (generation cut off) counts only when it is the ONE protocol tag
        # of the reply: a model echoing "reply with one <action>, <delegate> or <finish> block" is not a finish.
        tail = _OPEN_TAIL_RE.search(body)
        if tail and len(_ANY_TAG_RE.findall(body)) == 1:
            blocks = [(tail.group(1).lower(), tail.group(2))]
    if len(blocks) > 1:
        kinds = ", ".join(f"<{k}>" for k, _ in blocks)
        return _err(
            f"Your reply contains {len(blocks)} blocks ({kinds}); it must contain exactly one "
            "<action>, <delegate> or <finish> block."
        )
    if not blocks:
        return _lenient(body, valid_actions)
    kind, content = blocks[0]
    if kind == "action":
        return _parse_action(content)
    if kind == "finish":
        message = content.strip()
        if not message:
            return _err("The <finish> block is empty; write a short summary of what you achieved inside it.")
        return ParsedReply(kind="finish", message=message)
    return _parse_delegate(content, max_child_steps, max_delegations)


def _parse_action(content: str) -> ParsedReply:
    lines = [ln for ln in (_clean_line(x) for x in content.splitlines()) if ln]
    if not lines:
        return _err("The <action> block is empty; put exactly one command from the valid actions inside it.")
    if len(lines) > 1:
        return _err(f"The <action> block holds {len(lines)} commands; put exactly one command inside it.")
    return ParsedReply(kind="action", action=lines[0])


def _clean_line(line: str) -> str:
    line = line.strip()
    if _FENCE_RE.match(line):
        return ""
    line = _PREFIX_RE.sub("", line.strip("`*_ "))
    return normalize_action(line)


def _lenient(body: str, valid_actions: Any) -> ParsedReply:
    hint = "Reply with exactly one block: <action>command</action>, <delegate>{json}</delegate> or <finish>message</finish>."
    if _ANY_TAG_RE.search(body):
        return _err("Your reply has an unmatched or malformed <action>/<delegate>/<finish> tag. " + hint)
    if not valid_actions:
        return _err("Your reply contains no <action>, <delegate> or <finish> block. " + hint)
    valid = {normalize_action(a) for a in valid_actions}
    found: list[str] = []
    for raw in body.splitlines():
        cand = _clean_line(raw)
        if cand in valid and cand not in found:
            found.append(cand)
    if len(found) == 1:
        return ParsedReply(kind="action", action=found[0], lenient=True)
    if len(found) > 1:
        shown = ", ".join(repr(f) for f in found[:4])
        return _err(f"Your reply has no block and names several actions ({shown}); pick one. " + hint)
    return _err("Your reply contains no <action>, <delegate> or <finish> block. " + hint)


def _parse_delegate(content: str, max_child_steps: int, max_delegations: int) -> ParsedReply:
    raw = content.strip()
    if raw.startswith("```"):
        raw = re.sub(r"^```[a-zA-Z]*\s*|\s*```$", "", raw)
    if not raw:
        return _err(
            'The <delegate> block is empty; put JSON like {"goal": "...", "max_steps": 20} inside it.'
        )
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as e:
        msg = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
        return _err(
            f'The <delegate> block is not valid JSON ({msg}); use {{"goal": "...", "max_steps": 20}}.'
        )
    if isinstance(doc, dict) and "delegations" in doc:
        items = doc["delegations"]
    elif isinstance(doc, list):
        items = doc
    else:
        items = [doc]
    if not isinstance(items, list) or not items:
        return _err('"delegations" must be a non-empty list of {"goal": ..., "max_steps": ...} objects.')
    if len(items) > max_delegations:
        return _err(
            f"At most {max_delegations} sub-agents can be launched in one step; you asked for {len(items)}."
        )
    out = []
    for k, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            return _err(f'Delegation {k} must be a JSON object with a "goal".')
        goal = item.get("goal")
        if not isinstance(goal, str) or not goal.strip():
            return _err(f'Delegation {k} needs a non-empty "goal" string describing the sub-task.')
        steps = item.get("max_steps", max_child_steps)
        if isinstance(steps, str) and steps.strip().isdigit():
            steps = int(steps.strip())
        if isinstance(steps, float) and steps.is_integer():
            steps = int(steps)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps <= 0:
            return _err(
                f'Delegation {k}: "max_steps" must be a positive integer (at most {max_child_steps}).'
            )
        context = item.get("context", "")
        if not isinstance(context, str):
            context = json.dumps(context)
        out.append(
            Delegation(goal=goal.strip(), max_steps=min(steps, max_child_steps), context=context.strip())
        )
    return ParsedReply(kind="delegate", delegations=tuple(out))


def format_action(action: str) -> str:
    """The canonical reply for an action (used by oracles)."""
    return f"<action>{action}</action>"


def format_delegate(goals: list[tuple[str, int]]) -> str:
    """The canonical reply for one or several delegations ``[(goal, max_steps), ...]``."""
    items = [{"goal": g, "max_steps": s} for g, s in goals]
    payload = items[0] if len(items) == 1 else {"delegations": items}
    return f"<delegate>{json.dumps(payload)}</delegate>"


def format_finish(message: str) -> str:
    return f"<finish>{message}</finish>"


# ---- the public protocol ---------------------------------------------------------------------------
_PUB_ACTION = re.compile(r"<action>\s*(.*?)\s*</action>", re.IGNORECASE | re.DOTALL)
_PUB_DELEGATE = re.compile(r"<delegate>\s*(.*?)\s*</delegate>", re.IGNORECASE | re.DOTALL)
_PUB_FINISH = re.compile(r"<finish>\s*(.*?)\s*</finish>", re.IGNORECASE | re.DOTALL)
_PUB_FENCE = re.compile(r"```(?:text|bash|shell)?\s*(.*?)```", re.IGNORECASE | re.DOTALL)
_PUB_PREFIX = re.compile(r"^(?:action|command)\s*:\s*", re.IGNORECASE)
INVENTORY_ACTIONS = frozenset({"inventory", "view inventory", "check inventory"})


def is_inventory_action(action: str) -> bool:
    """``inventory`` / ``view inventory`` / ``check inventory`` (any case and spacing): a free look-up."""
    return " ".join(str(action or "").strip().lower().split()) in INVENTORY_ACTIONS


def extract_action(text: Any) -> tuple[str, bool]:
    """The public best-effort action of a reply: ``(action, True)`` for the first ``<action>`` block, else
    ``(last line of the first fenced block | last non-empty line without an "Action:" prefix, False)``."""
    text = str(text or "").strip()
    m = _PUB_ACTION.search(text)
    if m:
        return m.group(1).strip(), True
    fenced = _PUB_FENCE.search(text)
    if fenced:
        lines = fenced.group(1).strip().splitlines()
        return (lines[-1].strip() if lines else ""), False
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if lines:
        return _PUB_PREFIX.sub("", lines[-1]).strip(" `\"'"), False
    return "", False


def extract_decision(text: Any, *, default_child_steps: int = 20) -> ParsedReply:
    """Parse a reply as the public ``extract_decision`` does (see the module docstring). Never raises."""
    text = str(text or "").strip()
    actions, delegates, finishes = (p.findall(text) for p in (_PUB_ACTION, _PUB_DELEGATE, _PUB_FINISH))
    if sum(bool(m) for m in (actions, delegates, finishes)) != 1:
        return _err("response must contain exactly one action, delegate, or finish block")
    if actions:
        action = actions[0].strip()
        return ParsedReply(kind="action", action=action) if action else _err("action block is empty")
    if finishes:
        message = finishes[0].strip()
        return ParsedReply(kind="finish", message=message) if message else _err("finish block is empty")
    try:
        doc = json.loads(delegates[0])
    except (json.JSONDecodeError, RecursionError) as e:
        return _err(
            str(e) if isinstance(e, json.JSONDecodeError) else "delegate payload is nested too deeply"
        )
    items = doc["delegations"] if isinstance(doc, dict) and "delegations" in doc else [doc]
    if not isinstance(items, list) or not items:
        return _err("delegate payload must contain an object or non-empty delegations list")
    out = []
    for item in items:
        if not isinstance(item, dict):
            return _err("every delegation must be a JSON object")
        goal = str(item.get("goal", "") or "").strip()
        if not goal:
            return _err("every delegation must provide a non-empty detailed goal")
        try:
            steps = int(item.get("max_steps", default_child_steps))
        except (TypeError, ValueError, OverflowError):
            return _err("delegation max_steps must be an integer")
        if steps <= 0:
            return _err("delegation max_steps must be positive")
        out.append(Delegation(goal=goal, max_steps=steps))
    return ParsedReply(kind="delegate", delegations=tuple(out))
