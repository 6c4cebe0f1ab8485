"""Prompt building and the context budget (SPEC.md §4 context caps).

``build_prompt_ids(tokenizer, messages, max_prompt_tokens) -> (ids, truncated)`` renders ``messages``
with the tokenizer's chat template plus the generation prompt and tokenises the result (without adding
special tokens twice). When the prompt is longer than ``max_prompt_tokens`` it is shortened, in order:

1. **Drop the oldest turns.** The leading system message(s) and the first user message (the task) are
   always kept. The turns after them are grouped into units - an assistant reply together with the
   user/tool messages that follow it (the observation) - and whole units are dropped oldest first, so the
   chat still alternates assistant/user. The newest unit is never dropped. A note saying how many
   messages were omitted is appended to the first user message.
2. **Hard-truncate message contents from the head** (keeping the tail, i.e. the most recent text):
   the remaining later messages oldest first, then the first user message, then the system message, each
   cut only as far as needed (binary search on the number of characters kept) and prefixed with
   ``[...truncated...]``.

``fit_messages`` does the same and also returns the shortened messages (``openai.OpenAIPolicy`` sends
those when it has a local tokenizer). If even empty contents do not fit (template overhead alone exceeds the budget) a ``ValueError`` is raised.
Simplification: every shortening step re-renders the whole chat and re-tokenises it (exact, and cheap at
agent-chat sizes of tens of messages).

Used by ``hf.HFPolicy`` and ``serve.py``; run the tests with ``pytest tests/test_policy_context.py``.
"""

from __future__ import annotations

from typing import Any

TRUNCATION_MARK = "[...truncated...]\n"
OMISSION_NOTE = "\n\n[{n} earlier messages were omitted to fit the context window.]"


def render_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Chat template + generation prompt, tokenised (the template already holds special tokens)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _split_head(messages: list[dict[str, str]]) -> int:
    """Number of leading messages always kept: system message(s) plus the first user message."""
    i = 0
    while i < len(messages) and messages[i].get("role") == "system":
        i += 1
    if i < len(messages) and messages[i].get("role") == "user":
        i += 1
    return i


def _units(rest: list[dict[str, str]]) -> list[list[dict[str, str]]]:
    """Group later turns into units that each start with an assistant reply (a leading non-assistant
    run forms its own unit)."""
    units: list[list[dict[str, str]]] = []
    for msg in rest:
        if not units or msg.get("role") == "assistant":
            units.append([msg])
        else:
            units[-1].append(msg)
    return units


def _with_note(messages: list[dict[str, str]], head_len: int, omitted: int) -> list[dict[str, str]]:
    if omitted == 0 or head_len == 0:
        return messages
    out = [dict(m) for m in messages]
    target = head_len - 1  # the first user message (or the last system message if there is no user one)
    out[target]["content"] = out[target].get("content", "") + OMISSION_NOTE.format(n=omitted)
    return out


def _cut(messages: list[dict[str, str]], idx: int, content: str, keep: int) -> list[dict[str, str]]:
    """A copy of ``messages`` whose message ``idx`` keeps only the last ``keep`` characters of ``content``."""
    out = [dict(m) for m in messages]
    out[idx]["content"] = (TRUNCATION_MARK + content[len(content) - keep :]) if keep else ""
    return out


def fit_messages(
    tokenizer: Any, messages: list[dict[str, str]], max_prompt_tokens: int | None
) -> tuple[list[dict[str, str]], list[int], bool]:
    """``(shortened messages, their prompt ids, truncated?)`` under ``max_prompt_tokens`` (see module doc)."""
    ids = render_prompt_ids(tokenizer, messages)
    if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:
        return messages, ids, False
    messages = [dict(m) for m in messages]
    head_len = _split_head(messages)
    head, units = messages[:head_len], _units(messages[head_len:])

    # 1. drop whole units, oldest first, never the newest one
    omitted = 0
    current = messages
    while len(units) > 1:
        omitted += len(units.pop(0))
        current = _with_note(head + [m for u in units for m in u], head_len, omitted)
        ids = render_prompt_ids(tokenizer, current)
        if len(ids) <= max_prompt_tokens:
            return current, ids, True

    # 2. cut contents from the head: later messages oldest first, then the first user msg, then system
    order = list(range(head_len, len(current))) + list(range(head_len - 1, -1, -1))
    for idx in order:
        content = current[idx].get("content", "")
        if not content:
            continue
        best = _cut(current, idx, content, 0)
        best_ids = render_prompt_ids(tokenizer, best)
        if len(best_ids) > max_prompt_tokens:  # even emptying it is not enough: empty it, go on
            current = best
            continue
        lo, hi = 0, len(content)  # invariant: keeping lo characters fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            cand = _cut(current, idx, content, mid)
            cand_ids = render_prompt_ids(tokenizer, cand)
            if len(cand_ids) <= max_prompt_tokens:
                lo, best, best_ids = mid, cand, cand_ids
            else:
                hi = mid - 1
        return best, best_ids, True
    raise ValueError(
        f"prompt cannot fit max_prompt_tokens={max_prompt_tokens}: the chat template alone needs "
        f"{len(render_prompt_ids(tokenizer, current))} tokens"
    )


def build_prompt_ids(
    tokenizer: Any, messages: list[dict[str, str]], max_prompt_tokens: int | None
) -> tuple[list[int], bool]:
    """Prompt token ids that fit ``max_prompt_tokens`` and whether anything was dropped or cut."""
    _, ids, truncated = fit_messages(tokenizer, messages, max_prompt_tokens)
    return ids, truncated
