"""Prompt building and the context budget (common/policy/context.py) with the SmolLM2 tokenizer.

Also the tokenizer-free estimate the runtime uses for backends without a tokenizer, the paper's caps,
and property tests that a fitted prompt never exceeds its cap.

Run: ``pytest tests/test_policy_context.py`` (the first run converts SmolLM2 to the cache, ~20 s).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.policy.context import (
    OMISSION_NOTE,
    PAPER_CAPS,
    TRUNCATION_MARK,
    build_prompt_ids,
    estimate_tokens,
    fit_messages,
    fit_prompt,
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


# ---- the paper's caps and the tokenizer-free estimate ---------------------------------------------------------
def test_paper_caps_match_the_public_protocol():
    # Evaluation/evaluation_common.py default_protocol and Training/configs/*.yaml
    tc, tw = PAPER_CAPS["textcraft"], PAPER_CAPS["textworld"]
    assert (tc.context_tokens, tc.max_prompt_tokens, tc.train_max_prompt_tokens, tc.max_new_tokens) == (
        10_240,
        9_728,
        9_600,
        512,
    )
    assert (tw.context_tokens, tw.max_prompt_tokens, tw.max_new_tokens) == (13_312, 10_240, 3_072)
    for caps in PAPER_CAPS.values():  # prompt + output fit the server's context
        assert caps.max_prompt_tokens + caps.max_new_tokens <= caps.context_tokens


def test_estimate_is_the_public_formula():
    msgs = [{"role": "system", "content": "abc"}, {"role": "user", "content": "x" * 401}]
    assert estimate_tokens(msgs) == (4 + 1) + (4 + 100) + 2


def test_estimate_fit_drops_oldest_pairs_first():
    msgs = _chat(10, obs_len=200)
    cap = estimate_tokens(msgs) // 2
    kept, n, truncated = fit_prompt(msgs, cap)
    assert truncated and n <= cap and n == estimate_tokens(kept)
    assert kept[2:] == msgs[len(msgs) - (len(kept) - 2) :]  # a suffix of the history survives
    assert OMISSION_NOTE.format(n=len(msgs) - len(kept)) in kept[1]["content"]


# ---- property: a fitted prompt never exceeds its cap ------------------------------------------------------------
ROLES = st.sampled_from(["assistant", "user", "tool"])
chats = st.builds(
    lambda sys, task, rest: [{"role": "system", "content": sys}, {"role": "user", "content": task}] + rest,
    st.text(max_size=300),
    st.text(max_size=600),
    st.lists(st.fixed_dictionaries({"role": ROLES, "content": st.text(max_size=800)}), max_size=12),
)


@settings(max_examples=300, deadline=None)
@given(chats, st.integers(min_value=1, max_value=800))
def test_property_estimate_fit_never_exceeds_the_cap(msgs, cap):
    try:
        kept, n, _ = fit_prompt(msgs, cap)
    except ValueError:
        # only when even empty contents do not fit: 4 per message + 1 per (empty) content + 2
        assert 5 * len(msgs) + 2 > cap or 5 * 2 + 2 > cap
        return
    assert n == estimate_tokens(kept) <= cap
    assert kept[0]["role"] == "system" and kept[1]["role"] == "user"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chats, st.integers(min_value=40, max_value=600))
def test_property_tokenizer_fit_never_exceeds_the_cap(tok, msgs, cap):
    try:
        kept, n, _ = fit_prompt(msgs, cap, tok)
    except ValueError as exc:
        assert "cannot fit" in str(exc)
        return
    assert n == len(render_prompt_ids(tok, kept)) <= cap
