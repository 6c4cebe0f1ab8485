"""Tests of the TextWorld-Sync reply protocol, including hostile and malformed replies (hypothesis).

Run: ``pytest tests/test_textworld_sync_protocol.py -q``.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.envs.textworld_sync.protocol import (
    KINDS,
    ParsedReply,
    extract_action,
    extract_decision,
    format_action,
    format_delegate,
    format_finish,
    is_inventory_action,
    parse_reply,
)

VALID = ["look around", "inventory", "read cookbook", "go to pantry", "take salt", "dice carrot"]


def test_action_block_with_reasoning_around_it():
    p = parse_reply("The salt is here, so I take it.\n<action> Take   Salt </action>\n", VALID)
    assert p == ParsedReply(kind="action", action="take salt")


def test_action_block_may_hold_any_command_the_world_judges_it():
    p = parse_reply("<action>fly to the moon</action>", VALID)
    assert p.kind == "action" and p.action == "fly to the moon" and not p.lenient


def test_missing_closing_tag_at_the_end_still_counts():
    assert parse_reply("thinking...\n<action>take salt", VALID).action == "take salt"
    assert parse_reply("<finish>all done", VALID).message == "all done"


def test_think_sections_are_ignored():
    p = parse_reply("<think>maybe <action>go to pantry</action>?</think><action>take salt</action>", VALID)
    assert p.kind == "action" and p.action == "take salt"


def test_finish_block():
    assert parse_reply("<finish>Both dishes eaten.</finish>").message == "Both dishes eaten."
    assert parse_reply("<FINISH>ok</FINISH>").kind == "finish"
    empty = parse_reply("<finish>   </finish>")
    assert empty.kind == "error" and "empty" in (empty.error or "")


def test_single_delegation_defaults_to_twenty_steps():
    p = parse_reply('<delegate>{"goal": "Prepare and eat dish_1."}</delegate>')
    assert p.kind == "delegate" and len(p.delegations) == 1
    assert p.delegations[0].goal == "Prepare and eat dish_1." and p.delegations[0].max_steps == 20


def test_several_delegations_and_clamped_budget():
    payload = {
        "delegations": [{"goal": "a", "max_steps": 5}, {"goal": "b", "max_steps": 99, "context": "hi"}]
    }
    p = parse_reply(f"<delegate>\n```json\n{json.dumps(payload)}\n```\n</delegate>")
    assert [(d.goal, d.max_steps, d.context) for d in p.delegations] == [("a", 5, ""), ("b", 20, "hi")]
    assert parse_reply('<delegate>[{"goal": "x", "max_steps": "7"}]</delegate>').delegations[0].max_steps == 7


@pytest.mark.parametrize(
    "reply, needle",
    [
        ("<action>take salt</action><action>go to pantry</action>", "exactly one"),
        ("<action>take salt</action><finish>done</finish>", "exactly one"),
        ("<action></action>", "empty"),
        ("<action>take salt\ngo to pantry</action>", "exactly one command"),
        ("<delegate>{goal: x}</delegate>", "not valid JSON"),
        ("<delegate></delegate>", "empty"),
        ('<delegate>{"goal": ""}</delegate>', "non-empty"),
        ('<delegate>{"goal": 3}</delegate>', "non-empty"),
        ('<delegate>{"delegations": []}</delegate>', "non-empty list"),
        ('<delegate>{"goal": "x", "max_steps": 0}</delegate>', "positive integer"),
        ('<delegate>{"goal": "x", "max_steps": true}</delegate>', "positive integer"),
        ('<delegate>{"goal": "x", "max_steps": 2.5}</delegate>', "positive integer"),
        ('<delegate>["not an object"]</delegate>', "JSON object"),
        (
            "<delegate>" + json.dumps({"delegations": [{"goal": str(i)} for i in range(9)]}) + "</delegate>",
            "At most 8",
        ),
        ("<action>take salt</finish>", "malformed"),
        ("I think I should take the salt.", "no <action>"),
        ("", "no <action>"),
    ],
)
def test_invalid_replies_explain_themselves(reply, needle):
    p = parse_reply(reply, VALID)
    assert p.kind == "error" and needle in (p.error or ""), p


def test_lenient_fallback_recovers_one_valid_action():
    for reply in (
        "take salt",
        "Action: take salt",
        "> take salt.",
        "```\ntake salt\n```",
        "Next action: `take salt`",
    ):
        p = parse_reply(f"I see salt here.\n{reply}", VALID)
        assert p.kind == "action" and p.action == "take salt" and p.lenient, reply


def test_lenient_fallback_refuses_ambiguity_and_unknown_commands():
    assert parse_reply("take salt\ngo to pantry", VALID).kind == "error"
    assert parse_reply("take pepper", VALID).kind == "error"
    assert parse_reply("take salt", None).kind == "error"  # no valid list, no guessing


def test_not_text_is_an_error():
    assert parse_reply(None).kind == "error"  # type: ignore[arg-type]
    assert parse_reply(b"<action>x</action>").kind == "error"  # type: ignore[arg-type]


def test_formatters_round_trip():
    assert parse_reply(format_action("take salt")).action == "take salt"
    assert parse_reply(format_finish("ok")).message == "ok"
    p = parse_reply(format_delegate([("goal a", 10), ("goal b", 20)]))
    assert [(d.goal, d.max_steps) for d in p.delegations] == [("goal a", 10), ("goal b", 20)]


def test_deeply_nested_json_does_not_crash():
    p = parse_reply("<delegate>" + "[" * 100_000 + "]" * 100_000 + "</delegate>")
    assert p.kind == "error"


def _check(p: ParsedReply) -> None:
    assert p.kind in KINDS
    assert (p.kind == "error") == (p.error is not None)
    if p.kind == "action":
        assert p.action and "\n" not in p.action
    if p.kind == "delegate":
        assert p.delegations and all(d.goal and 1 <= d.max_steps <= 20 for d in p.delegations)
    if p.kind == "finish":
        assert p.message


_TAGS = ["<action>", "</action>", "<delegate>", "</delegate>", "<finish>", "</finish>", "<think>", "</think>"]
_PIECES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(_TAGS + VALID + ['{"goal": "g"}', '{"delegations": [', "]}", "```", "\n", "Action: "]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=12).map("".join), st.lists(st.sampled_from(VALID), max_size=4))
def test_never_raises_on_hostile_text(text, valid):
    _check(parse_reply(text, valid))


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda c: (
            st.lists(c, max_size=4)
            | st.dictionaries(
                st.sampled_from(["goal", "max_steps", "delegations", "context", "x"]), c, max_size=4
            )
        ),
        max_leaves=12,
    )
)
def test_never_raises_on_arbitrary_delegate_json(doc):
    _check(parse_reply(f"<delegate>{json.dumps(doc)}</delegate>"))


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=60).filter(lambda s: s.strip() and "<" not in s and ">" not in s))
def test_action_blocks_keep_their_single_line_content(cmd):
    p = parse_reply(f"<action>{cmd}</action>")
    _check(p)


def test_echoed_instruction_with_several_tags_is_not_a_finish():
    # SmolLM2 copies the observation's last line; the trailing "<finish> block." must not end the agent.
    echoed = "Shared steps remaining: 90.\nReply with exactly one <action>, <delegate> or <finish> block."
    r = parse_reply(echoed, ["look around"])
    assert r.kind == "error" and r.message is None


def test_a_single_unclosed_tag_at_the_end_is_still_accepted():
    r = parse_reply("I am done here.\n<finish>Both dishes are eaten", ["look around"])
    assert r.kind == "finish" and r.message == "Both dishes are eaten"


# ---- the public protocol (extract_decision / extract_action), used by TextWorld-Sync sessions --------


@pytest.mark.parametrize(
    "reply, kind, value",
    [
        ("think first\n<action> take salt </action>", "action", "take salt"),
        ("<action>take salt</action> <action>look around</action>", "action", "take salt"),  # first of a kind
        ("<finish>done</finish>", "finish", "done"),
        ("<action>take salt</action><finish>done</finish>", "error", "exactly one"),  # two kinds
        ("no block at all", "error", "exactly one"),
        ("<action>  </action>", "error", "empty"),
        ("<finish></finish>", "error", "empty"),
        ("<delegate>not json</delegate>", "error", "Expecting value"),
        ('<delegate>{"goal": ""}</delegate>', "error", "non-empty detailed goal"),
        ('<delegate>{"goal": "x", "max_steps": 0}</delegate>', "error", "positive"),
        ('<delegate>{"goal": "x", "max_steps": "many"}</delegate>', "error", "integer"),
        ('<delegate>{"delegations": []}</delegate>', "error", "non-empty delegations"),
        ('<delegate>{"delegations": ["x"]}</delegate>', "error", "JSON object"),
    ],
)
def test_public_decision_parser(reply, kind, value):
    d = extract_decision(reply)
    assert d.kind == kind
    got = {"action": d.action, "finish": d.message, "error": d.error}[kind]
    assert value in got, got


def test_public_delegations_keep_their_budget_and_default_to_twenty():
    d = extract_decision(
        '<delegate>{"delegations": [{"goal": "a"}, {"goal": "b", "max_steps": "7"}]}</delegate>'
    )
    assert d.kind == "delegate" and [(x.goal, x.max_steps) for x in d.delegations] == [("a", 20), ("b", 7)]
    many = [{"goal": f"g{k}"} for k in range(12)]  # no cap on the number of children (public)
    assert (
        len(extract_decision(f"<delegate>{json.dumps({'delegations': many})}</delegate>").delegations) == 12
    )


@pytest.mark.parametrize(
    "reply, action, tagged",
    [
        ("<action>take salt</action><finish>x</finish>", "take salt", True),
        ("I will act.\n```text\nlook around\ntake salt\n```", "take salt", False),
        ("Let me see.\nAction: take salt", "take salt", False),
        ('Command: "open door"', "open door", False),
        ("", "", False),
    ],
)
def test_public_fallback_action(reply, action, tagged):
    assert extract_action(reply) == (action, tagged)


def test_inventory_lookup_names():
    assert all(is_inventory_action(a) for a in ("inventory", " View  Inventory ", "CHECK inventory"))
    assert not is_inventory_action("take inventory") and not is_inventory_action("look around")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_public_parser_never_raises(text):
    extract_decision(text)
    extract_action(text)
