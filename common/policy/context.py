"""Prompt building and the context budget (SPEC.md §4 context caps): one definition of the caps.

:data:`PAPER_CAPS` holds the paper's token caps per environment, taken from the public code
(``Evaluation/evaluation_common.py: default_protocol`` and ``Training/configs/*.yaml``): TextCraft a
10,240-token context with a 9,728-token prompt cap at evaluation (9,600 in training) and 512 output tokens;
TextWorld a 13,312-token context, 10,240 prompt tokens and 3,072 output tokens.

``fit_prompt(messages, max_prompt_tokens, tokenizer=None) -> (messages, n_tokens, truncated)`` is what the
runtime calls before EVERY model call, whatever the backend: with a tokenizer the prompt is measured
exactly (chat template + generation prompt), without one it is estimated like the public TextWorld
evaluator does (:func:`estimate_tokens`: 4 tokens per message + ~4 characters per token + 2). When the
prompt is longer than the cap it is shortened, in order:

1. **Drop the oldest turns.** The leading system message(s) and the first user message (the task) are
   always kept. The turns after them are grouped into units - an assistant reply together with the
   user/tool messages that follow it (the observation) - and whole units are dropped oldest first, so the
   chat still alternates assistant/user. The newest unit is never dropped. A note saying how many
   messages were omitted is appended to the first user message.
2. **Hard-truncate message contents from the head** (keeping the tail, i.e. the most recent text):
   the remaining later messages oldest first, then the first user message, then the system message, each
   cut only as far as needed (binary search on the number of characters kept) and prefixed with
   ``[...truncated...]``.

``fit_messages(tokenizer, ...)`` / ``build_prompt_ids(tokenizer, ...)`` are the tokenizer forms (the hf
backend and ``serve.py`` use them on ids). If even empty contents do not fit (template overhead alone
exceeds the budget) a ``ValueError`` is raised. Simplification: every shortening step re-measures the
whole chat (exact, and cheap at agent-chat sizes of tens of messages).

Run the tests with ``pytest tests/test_policy_context.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TRUNCATION_MARK = "[...truncated...]\n"
OMISSION_NOTE = "\n\n[{n} earlier messages were omitted to fit the context window.]"


# ---- the paper's caps (one definition) ----------------------------------------------------------------
@dataclass(frozen=True)
class ContextCaps:
    """Token caps of one environment in the paper's runs."""

    context_tokens: int
    """The inference server's context length (prompt + output)."""
    max_prompt_tokens: int
    """Prompt cap at evaluation (older turns are dropped to fit)."""
    train_max_prompt_tokens: int
    """Prompt cap in training rollouts."""
    max_new_tokens: int
    """Output cap of one agent step."""


PAPER_CAPS: dict[str, ContextCaps] = {
    "textcraft": ContextCaps(
        context_tokens=10_240, max_prompt_tokens=9_728, train_max_prompt_tokens=9_600, max_new_tokens=512
    ),
    "textworld": ContextCaps(
        context_tokens=13_312, max_prompt_tokens=10_240, train_max_prompt_tokens=10_240, max_new_tokens=3_072
    ),
}
"""Per environment; the real-TextWorld cooking env uses the TextWorld caps."""
PAPER_CAPS["textworld-cooking"] = PAPER_CAPS["textworld"]

RUBRIC_MAX_NEW_TOKENS = 1_024
"""Output cap of a rubric-generation call (training and test time)."""
SCORE_MAX_NEW_TOKENS = 1_024
"""Output cap of a scoring call in training (``rubric_subagent_reward/config.py``)."""
SELECTION_SCORE_MAX_NEW_TOKENS = 512
"""Output cap of a scoring call in test-time selection (``rubric_selector.py``)."""


# ---- measuring ------------------------------------------------------------------------------------------
def render_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Chat template + generation prompt, tokenised (the template already holds special tokens)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def estimate_tokens(messages: list[dict[str, str]]) -> int:
    """Token estimate without a tokenizer, as the public TextWorld evaluator makes it:
    4 per message plus max(1, characters // 4) per content, plus 2.

    >>> estimate_tokens([{"role": "user", "content": "x" * 40}])
    16
    """
    return sum(4 + max(1, len(str(m.get("content", ""))) // 4) for m in messages) + 2


# ---- shortening ------------------------------------------------------------------------------------------
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


def _fit(
    count: Callable[[list[dict[str, str]]], int], messages: list[dict[str, str]], cap: int | None
) -> tuple[list[dict[str, str]], int, bool]:
    """``(shortened messages, their size, truncated?)`` with ``count(messages) <= cap`` (module doc)."""
    n = count(messages)
    if cap is None or n <= cap:
        return messages, n, False
    messages = [dict(m) for m in messages]
    head_len = _split_head(messages)
    head, units = messages[:head_len], _units(messages[head_len:])

    # 1. drop whole units, oldest first, never the newest one
    omitted = 0
    current = messages
    while len(units) > 1:
        omitted += len(units.pop(0))
        current = _with_note(head + [m for u in units for m in u], head_len, omitted)
        n = count(current)
        if n <= cap:
            return current, n, True

    # 2. cut contents from the head: later messages oldest first, then the first user msg, then system
    order = list(range(head_len, len(current))) + list(range(head_len - 1, -1, -1))
    for idx in order:
        content = current[idx].get("content", "")
        if not content:
            continue
        best = _cut(current, idx, content, 0)
        best_n = count(best)
        if best_n > cap:  # even emptying it is not enough: empty it, go on
            current = best
            continue
        lo, hi = 0, len(content)  # invariant: keeping lo characters fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            cand = _cut(current, idx, content, mid)
            cand_n = count(cand)
            if cand_n <= cap:
                lo, best, best_n = mid, cand, cand_n
            else:
                hi = mid - 1
        return best, best_n, True
    raise ValueError(
        f"prompt cannot fit max_prompt_tokens={cap}: the chat template alone needs {count(current)} tokens"
    )


def fit_prompt(
    messages: list[dict[str, str]], max_prompt_tokens: int | None, tokenizer: Any = None
) -> tuple[list[dict[str, str]], int, bool]:
    """``(messages to send, their token count, truncated?)`` under ``max_prompt_tokens``.

    Measured with ``tokenizer``'s chat template when one is given, else with :func:`estimate_tokens`.
    The runtime calls this once before every model call, so every backend honours the cap.

    >>> chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    >>> chat += [{"role": "assistant", "content": "a" * 400}, {"role": "user", "content": "o" * 400}] * 3
    >>> kept, n, cut = fit_prompt(chat, 250)
    >>> len(kept), n <= 250, cut
    (4, True, True)
    """
    if tokenizer is None:
        return _fit(estimate_tokens, messages, max_prompt_tokens)
    return _fit(lambda m: len(render_prompt_ids(tokenizer, m)), messages, max_prompt_tokens)


def fit_messages(
    tokenizer: Any, messages: list[dict[str, str]], max_prompt_tokens: int | None
) -> tuple[list[dict[str, str]], list[int], bool]:
    """``(shortened messages, their prompt ids, truncated?)`` under ``max_prompt_tokens`` (see module doc)."""
    ids = render_prompt_ids(tokenizer, messages)
    if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:  # the common case: one render
        return messages, ids, False
    kept, _, truncated = fit_prompt(messages, max_prompt_tokens, tokenizer)
    return kept, render_prompt_ids(tokenizer, kept), truncated


def build_prompt_ids(
    tokenizer: Any, messages: list[dict[str, str]], max_prompt_tokens: int | None
) -> tuple[list[int], bool]:
    """Prompt token ids that fit ``max_prompt_tokens`` and whether anything was dropped or cut."""
    _, ids, truncated = fit_messages(tokenizer, messages, max_prompt_tokens)
    return ids, truncated
