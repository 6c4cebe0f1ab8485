"""Tests of CodeAct reply parsing and cell observations (``common/envs/textcraft/codeact.py``).

Worked cases (missing closing tags, fences, indentation, upper-case tags, a block mentioned inside the
thought, no block, an empty block) and hypothesis properties: the parser never raises, and what it
returns is consistent (code xor error; the code span lies inside the reply).

Run: ``python -m pytest tests/test_codeact_parse.py -q``.
"""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.codeact import CellResult
from common.envs.textcraft import codeact
from common.envs.textcraft.codeact import ParsedReply, format_cell_observation, parse_codeact_reply

CODE = "inv = view_inventory()\nprint(craft({'log': 1}, ('stick', 4)))"


@pytest.mark.parametrize(
    "reply,thought,code",
    [
        (f"<thought>make sticks</thought>\n<python>\n{CODE}\n</python>", "make sticks", CODE),
        (f"<thought>make sticks</thought>\n<python>\n{CODE}\n", "make sticks", CODE),  # stopped at </python>
        (f"<thought>t</thought><python>```python\n{CODE}\n```</python>", "t", CODE),
        (f"<thought>t</thought><python>\n```\n{CODE}\n```\n</python>", "t", CODE),
        (
            "<thought>t</thought><python>\n    x = 1\n    if x:\n        print(x)\n</python>",
            "t",
            "x = 1\nif x:\n    print(x)",
        ),
        (f"<THOUGHT>t</THOUGHT>\n<Python>\n{CODE}\n</PYTHON>", "t", CODE),
        (f"<python>\n{CODE}\n</python>", None, CODE),  # no thought
        (
            f"<thought>I will write <python> tags</thought>\n<python>{CODE}</python>",
            "I will write <python> tags",
            CODE,
        ),
        (f"<thought>unclosed thought\n<python>\n{CODE}\n</python>", "unclosed thought", CODE),
        (f"<thought>t</thought><python>{CODE}</python>\n<python>print('second')</python>", "t", CODE),
        (
            f"<thought>t <python>\n{CODE}\n</python> more</thought>",
            "t",
            CODE,
        ),  # the block sits in the thought
    ],
)
def test_worked_replies(reply: str, thought: str | None, code: str):
    parsed = parse_codeact_reply(reply)
    assert parsed.error is None
    assert parsed.thought == thought
    assert parsed.code == code
    start, end = parsed.code_span
    assert code.splitlines()[0].strip() in reply[start:end]


def test_no_block_explains_the_format():
    parsed = parse_codeact_reply("I think I should craft sticks first.")
    assert parsed.code is None and parsed.thought is None
    assert "<python>" in parsed.error and "<thought>" in parsed.error


def test_bare_markdown_fence_is_not_run_and_says_so():
    parsed = parse_codeact_reply(f"<thought>t</thought>\n```python\n{CODE}\n```")
    assert parsed.code is None and parsed.thought == "t"
    assert "fence alone is not run" in parsed.error


@pytest.mark.parametrize(
    "reply", ["<thought>t</thought><python></python>", "<python>\n```python\n```\n</python>"]
)
def test_empty_block_is_an_error(reply: str):
    parsed = parse_codeact_reply(reply)
    assert parsed.code is None and "empty" in parsed.error


def test_non_text_reply_is_an_error_not_a_crash():
    assert parse_codeact_reply(None).error  # type: ignore[arg-type]


FRAGMENTS = [
    "<thought>", "</thought>", "<python>", "</python>", "<PYTHON>", "```python\n", "```", "\n", "    ",
    "print(1)", "x = 1", "<thought >", "</python >", "<", ">", "/", "\t",
]  # fmt: skip


def _check_consistent(text: str, parsed: ParsedReply) -> None:
    assert isinstance(parsed, ParsedReply)
    assert (parsed.code is None) != (parsed.error is None)
    if parsed.code is not None:
        assert parsed.code.strip()
    if parsed.code_span is not None:
        start, end = parsed.code_span
        assert 0 <= start <= end <= len(text)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_never_raises_on_arbitrary_text(text: str):
    _check_consistent(text, parse_codeact_reply(text))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=12))
def test_parse_never_raises_on_tag_soup(parts: list[str]):
    text = "".join(parts)
    _check_consistent(text, parse_codeact_reply(text))


def test_cell_observation_layout_is_the_public_one():
    """platoon's ``user-observation`` (trim_blocks): ``[Cell i Output]``, the output as printed or ``(No
    output)``, ``Error: ...`` right after it (no separator of its own), then the template's last line.
    The output slot is stdout (a raised exception's traceback included); the error slot is stderr."""
    last = "Write your next step."
    ok = format_cell_observation(3, CellResult(stdout="Successfully crafted 4 stick(s)\n", error=None))
    assert ok == "[Cell 3 Output]\nSuccessfully crafted 4 stick(s)\n\n" + last
    tb = (
        "-" * 75
        + "\nNameError   Traceback (most recent call last)\n...\nNameError: name 'x' is not defined\n"
    )
    raised = format_cell_observation(4, CellResult(stdout=tb, error=None, exception="NameError: ..."))
    assert raised == "[Cell 4 Output]\n" + tb + "\n" + last
    err = format_cell_observation(4, CellResult(stdout="", error=None, stderr="warning\n"))
    assert err == "[Cell 4 Output]\n(No output)Error: warning\n\n" + last
    both = format_cell_observation(
        5, CellResult(stdout="partial\n", error="TimeoutError: ...", timed_out=True)
    )
    assert both == "[Cell 5 Output]\npartial\nError: TimeoutError: ...\n" + last
    nothing = format_cell_observation(0, CellResult(stdout="", error=None))
    assert nothing == "[Cell 0 Output]\n(No output)\n" + last
    blank = format_cell_observation(0, CellResult(stdout="  \n", error=None))  # printed blanks are output
    assert blank == "[Cell 0 Output]\n  \n\n" + last


def test_docstring_examples():
    result = doctest.testmod(codeact, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
