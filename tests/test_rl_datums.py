"""Datum builders (common/rl/datums.py): which tokens each stage trains, and role enforcement.

Run: pytest tests/test_rl_datums.py   (real-tokenizer datum tests live in test_rl_spans.py)
"""

from __future__ import annotations

import pytest

from common.rl.datums import CallTokens, Datum, delegation_datum, execution_datums, rubric_datum
from common.rl.spans import reply_launch_spans


class CharTokenizer:
    """Toy tokenizer: one token per character (id = code point)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def char_call(text: str, role: str = "act", **kw) -> CallTokens:
    ids = [ord(c) for c in text]
    return CallTokens(role, [1, 2, 3], ids, [-0.1 * (i + 1) for i in range(len(ids))], text=text, **kw)


REPLY = "<thought>go</thought><python>a = 1\nr = await launch_subagent({'x': 1})\nprint(r)</python>"


def test_execution_datums_train_every_act_token():
    calls = [
        char_call("<python>craft()</python>"),
        char_call("{}", role="rubric"),
        char_call("{}", role="score"),
    ]
    calls.append(char_call(REPLY))
    ds = execution_datums(calls, advantage=-0.25, depth=2, trajectory_id="n7")
    assert len(ds) == 2
    assert [d.traj_start for d in ds] == [True, False]
    for d, call in zip(ds, [calls[0], calls[3]], strict=True):
        assert d.output_ids == call.output_ids and d.loss_mask == [1] * len(call.output_ids)
        assert d.behaviour_logprobs == call.logprobs and d.prompt_ids == call.prompt_ids
        assert (d.advantage, d.depth, d.trajectory_id, d.stage) == (-0.25, 2, "n7", "execution")


def test_delegation_datum_masks_launch_and_truncates():
    call = char_call(REPLY)
    r = delegation_datum(call, advantage=0.5, depth=1, trajectory_id="n1", tokenizer=CharTokenizer())
    assert r.status == "ok"
    (s, e) = reply_launch_spans(REPLY)[0]
    d = r.datum
    assert len(d.output_ids) == e  # cut right after the last trained token
    assert d.loss_mask == [0] * s + [1] * (e - s)
    assert "".join(chr(i) for i, m in zip(d.output_ids, d.loss_mask, strict=True) if m) == (
        "r = await launch_subagent({'x': 1})"
    )
    assert d.behaviour_logprobs == call.logprobs[:e] and d.stage == "delegation"


def test_delegation_datum_uses_recorded_offsets_and_reports_problems():
    offsets = [(i, i + 1) for i in range(len(REPLY))]
    call = char_call(REPLY, token_offsets=offsets)
    assert delegation_datum(call, 0.1, 0, "r").status == "ok"  # no tokenizer needed

    assert delegation_datum(char_call("<python>craft()</python>"), 0.1, 0, "r").status == "no_launch"

    broken = char_call(REPLY, token_offsets=offsets[:-5])  # offsets for fewer tokens than the output
    assert delegation_datum(broken, 0.1, 0, "r").status == "unaligned"

    holes = list(offsets)
    holes[40] = None  # an unknown token inside the launch statement
    assert delegation_datum(char_call(REPLY, token_offsets=holes), 0.1, 0, "r").status == "unaligned"

    with pytest.raises(ValueError, match="tokenizer"):
        delegation_datum(char_call(REPLY), 0.1, 0, "r")


def test_delegation_datum_text_mismatch_is_unaligned():
    call = char_call(REPLY)
    call.text = REPLY.replace("a = 1", "b = 22")  # the recorded text disagrees before the launch
    assert delegation_datum(call, 0.1, 0, "r", tokenizer=CharTokenizer()).status == "unaligned"
    # a trimmed stop string after the launch is fine
    call = char_call(REPLY)
    call.text = REPLY.removesuffix("</python>")
    assert delegation_datum(call, 0.1, 0, "r", tokenizer=CharTokenizer()).status == "ok"


def test_delegate_block_datum():
    reply = '<thought>split</thought>\n<delegate>{"goal": "cook dish_1"}</delegate>'
    r = delegation_datum(char_call(reply), 1.0, 0, "r", tokenizer=CharTokenizer())
    assert r.status == "ok"
    d = r.datum
    assert "".join(chr(i) for i, m in zip(d.output_ids, d.loss_mask, strict=True) if m) == (
        '<delegate>{"goal": "cook dish_1"}</delegate>'
    )


def test_rubric_datum_and_role_enforcement():
    d = rubric_datum(
        char_call('{"rubric_items": []}', role="rubric"), advantage=-0.2, depth=0, trajectory_id="g"
    )
    assert d.loss_mask == [1] * len(d.output_ids) and d.stage == "rubric" and d.traj_start
    score = char_call('{"final_score": 1}', role="score")
    with pytest.raises(ValueError, match="never trained"):
        rubric_datum(score, 0.0, 0, "g")
    with pytest.raises(ValueError, match="never trained"):
        delegation_datum(score, 0.0, 0, "g", tokenizer=CharTokenizer())
    with pytest.raises(ValueError):
        rubric_datum(char_call("x"), 0.0, 0, "g")  # an act call is not a rubric
    with pytest.raises(ValueError):
        delegation_datum(char_call("x", role="rubric"), 0.0, 0, "g")


def test_length_checks():
    with pytest.raises(ValueError, match="log-prob"):
        execution_datums([CallTokens("act", [1], [2, 3], [-1.0])], 0.0, 0, "n")
    with pytest.raises(ValueError):
        Datum([1], [2, 3], [-1.0, -1.0], [1], 0.0, 0, "n", True, "execution")
