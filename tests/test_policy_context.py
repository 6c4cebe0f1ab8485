"""Prompt building and the context budget (common/policy/context.py) with the SmolLM2 tokenizer.

Run: ``pytest tests/test_policy_context.py`` (the first run converts SmolLM2 to the cache, ~20 s).
"""

from __future__ import annotations

import pytest

from common.policy.context import (
    OMISSION_NOTE,
    TRUNCATION_MARK,
    build_prompt_ids,
    fit_messages,
    render_prompt_ids,
)
from common.policy.models import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2")


def _chat(n_turns: int, obs_len: int = 40) -> list[dict[str, str]]:
    msgs = [
        {"role": "system", "content": "SYSTEM PROMPT: you are an agent."},
        {"role": "user", "content": "TASK: craft 3x a1_i5."},
    ]
    for i in range(n_turns):
        msgs.append({"role": "assistant", "content": f"REPLY{i} " + "think " * 10})
        msgs.append({"role": "user", "content": f"OBS{i} " + "x " * obs_len})
    return msgs


def test_render_uses_chat_template_and_generation_prompt(tok):
    ids = render_prompt_ids(tok, [{"role": "user", "content": "hi"}])
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    ids2, truncated = build_prompt_ids(tok, [{"role": "user", "content": "hi"}], 10_000)
    assert ids2 == ids and not truncated


def test_drops_oldest_pairs_keeps_system_and_first_user(tok):
    msgs = _chat(10)
    full = len(render_prompt_ids(tok, msgs))
    budget = full // 2
    kept, ids, truncated = fit_messages(tok, msgs, budget)
    assert truncated and len(ids) <= budget
    assert kept[0]["content"] == msgs[0]["content"]
    assert kept[1]["content"].startswith(msgs[1]["content"])
    dropped = len(msgs) - len(kept)
    assert dropped > 0 and dropped % 2 == 0  # whole assistant+user pairs
    assert OMISSION_NOTE.format(n=dropped) in kept[1]["content"]
    assert kept[-1] == msgs[-1] and kept[-2] == msgs[-2]  # the newest turns survive
    assert kept[2]["role"] == "assistant"  # the chat still alternates
    # oldest first: what is kept is a suffix of the history
    assert kept[2:] == msgs[len(msgs) - (len(kept) - 2) :]
    text = tok.decode(ids)
    assert "REPLY0" not in text and "REPLY9" in text and "SYSTEM PROMPT" in text


def test_hard_truncates_head_of_remaining_content(tok):
    msgs = _chat(3, obs_len=50)
    msgs[-1]["content"] = "OBSLAST " + " ".join(f"w{i}" for i in range(400)) + " THE_END"
    budget = 120
    kept, ids, truncated = fit_messages(tok, msgs, budget)
    assert truncated and len(ids) <= budget
    assert len(ids) >= budget - 8  # cut only as far as needed
    assert kept[0]["content"] == msgs[0]["content"]
    assert kept[1]["content"].startswith(msgs[1]["content"])
    assert kept[-1]["content"].startswith(TRUNCATION_MARK)
    assert kept[-1]["content"].endswith("THE_END")  # the head is cut, the tail kept
    assert "OBSLAST" not in kept[-1]["content"]


def test_truncates_first_user_when_it_alone_is_too_long(tok):
    msgs = [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "START " + "y " * 500 + "TASK_END"},
    ]
    kept, ids, truncated = fit_messages(tok, msgs, 60)
    assert truncated and len(ids) <= 60
    assert kept[0]["content"] == "SYS"
    assert kept[1]["content"].endswith("TASK_END")


def test_impossible_budget_raises(tok):
    with pytest.raises(ValueError, match="cannot fit"):
        build_prompt_ids(tok, _chat(1), 3)
