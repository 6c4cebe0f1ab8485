"""CodeAct reply parsing and cell-observation text for TextCraft-Synth (SPEC.md §2.1).

The model answers ``<thought>...</thought><python>...</python>``. :func:`parse_codeact_reply` extracts
the thought and the code; it never raises, whatever the text. It tolerates what samplers and models
commonly produce:

* a missing ``</python>`` (generation stopped at the stop string ``</python>``) or ``</thought>``;
* a Markdown fence inside the block (```` ```python ... ``` ````), and code indented as a whole;
* upper-case tags, and a ``<python>`` mentioned inside a closed thought (the block after the thought
  wins).

Only the first ``<python>`` block is run; a bare Markdown fence without the tags is NOT run (the
error says so), so the reply format stays the one the system prompt teaches.
:func:`format_cell_observation` turns a :class:`~common.codeact.CellResult` into the next observation
with the template ``templates/textcraft_observation.txt`` (platoon's layout: ``[Cell i Output]``, the output or
``(No output)``, ``Error: ...`` right after it, then the next line); :func:`cell_slots` says what fills the
output and error slots (stdout with a raised exception's traceback; stderr).

Run the tests with ``python -m pytest tests/test_codeact_parse.py -q``.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from ...codeact import CellResult
from .prompts import TextCraftPrompts, load_prompts

_THOUGHT_OPEN = re.compile(r"<thought\s*>", re.IGNORECASE)
_THOUGHT_CLOSE = re.compile(r"</thought\s*>", re.IGNORECASE)
_PY_OPEN = re.compile(r"<python\s*>", re.IGNORECASE)
_PY_CLOSE = re.compile(r"</python\s*>", re.IGNORECASE)
_FENCE_OPEN = re.compile(r"^\s*```[\w+.-]*\s*$")
_FENCE_CLOSE = re.compile(r"^\s*```\s*$")
_BARE_FENCE = re.compile(r"```(?:python|py)\b", re.IGNORECASE)

FORMAT_HINT = "Reply with <thought>your reasoning</thought> followed by <python>the code to run</python>."


@dataclass
class ParsedReply:
    """One model reply, split into its parts."""

    thought: str | None
    """Text of the ``<thought>`` block (stripped), or None when there is none."""
    code: str | None
    """The ``<python>`` block's code, ready to run (fences removed, dedented), or None."""
    error: str | None
    """Why no code could be taken from the reply (tells the model the expected format); None if ok."""
    code_span: tuple[int, int] | None = None
    """Character offsets ``(start, end)`` of the raw block content in the reply (between the tags)."""
    thought_raw: str | None = None
    """The text between ``<thought>`` and ``</thought>`` as written (not stripped); None when the thought is
    not closed. Past turns are rebuilt from it, as platoon's ``extract_code_and_thought`` keeps it."""


def _clean_code(raw: str) -> str:
    lines = raw.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if lines and _FENCE_OPEN.match(lines[0]):
        lines.pop(0)
        while lines and not lines[-1].strip():
            lines.pop()
        if lines and _FENCE_CLOSE.match(lines[-1]):
            lines.pop()
    elif lines and _FENCE_CLOSE.match(lines[-1]):
        lines.pop()
    return textwrap.dedent("\n".join(lines)).strip("\n")


def parse_codeact_reply(text: str) -> ParsedReply:
    """Split a CodeAct reply into thought and code; malformed replies get an explanatory ``error``.

    >>> r = parse_codeact_reply("<thought>craft sticks</thought>\\n<python>\\nprint(craft({'log': 1}, ('stick', 4)))")
    >>> r.thought, r.code, r.error
    ('craft sticks', "print(craft({'log': 1}, ('stick', 4)))", None)
    >>> parse_codeact_reply("I will craft.").error.startswith("no <python>")
    True
    """
    if not isinstance(text, str):
        return ParsedReply(None, None, f"the reply is not text ({type(text).__name__}). {FORMAT_HINT}")
    thought = thought_raw = None
    search_from = 0
    t_open = _THOUGHT_OPEN.search(text)
    if t_open is not None:
        t_close = _THOUGHT_CLOSE.search(text, t_open.end())
        if t_close is not None:
            # "<thought> ... <python>...</python> ... </thought>" with no block after the thought:
            # the block inside is the code, and the thought ends where it starts.
            inside = _PY_OPEN.search(text, t_open.end(), t_close.start())
            if inside is not None and _PY_OPEN.search(text, t_close.end()) is None:
                t_close = None
        if t_close is not None:
            thought_raw = text[t_open.end() : t_close.start()]
            thought = thought_raw.strip()
            search_from = t_close.end()
        else:
            py = _PY_OPEN.search(text, t_open.end())
            search_from = py.start() if py is not None else len(text)
            thought = text[t_open.end() : search_from].strip()
    py_open = _PY_OPEN.search(text, search_from)
    if py_open is None:
        hint = " A Markdown ```python fence alone is not run." if _BARE_FENCE.search(text) else ""
        return ParsedReply(
            thought, None, f"no <python>...</python> code block found.{hint} {FORMAT_HINT}", None, thought_raw
        )
    start = py_open.end()
    py_close = _PY_CLOSE.search(text, start)
    end = py_close.start() if py_close is not None else len(text)
    code = _clean_code(text[start:end])
    if not code.strip():
        return ParsedReply(
            thought, None, f"the <python> block is empty. {FORMAT_HINT}", (start, end), thought_raw
        )
    return ParsedReply(thought, code, None, (start, end), thought_raw)


def shown_output(stdout: str) -> str:
    """The cell's stdout as SERA's vendored platoon (``Runtime/vendor/platoon/envs/codeact/env.py:
    IPythonCodeExecutor.run``, the file both its training and its evaluation import) hands it to the
    observation: when the capture starts with ``Out[`` (the last expression's value was the first thing
    written), it keeps ``stdout.split(":", 1)[1].lstrip()``: the ``Out[N]:`` prompt goes, with the blank
    after it (and the newline IPython puts before a multi-line value); every later colon stays. (Other
    platoon revisions join ``split(":")[1:]``, dropping every colon; SERA's copy replaced that.) A capture
    that starts with ``Out[`` but has no colon at all is kept as it is (the public line would raise).

    >>> shown_output("Out[1]: {'plank': 4}\\n"), shown_output("hi\\nOut[1]: {'plank': 4}\\n")
    ("{'plank': 4}\\n", "hi\\nOut[1]: {'plank': 4}\\n")
    >>> shown_output("Out[3]: \\n['a: 1',\\n 'b: 2']\\n")
    "['a: 1',\\n 'b: 2']\\n"
    """
    if not stdout.startswith("Out[") or ":" not in stdout:
        return stdout
    return stdout.split(":", 1)[1].lstrip()


def cell_slots(result: CellResult) -> tuple[str, str]:
    """``(output, error)``: the observation's two slots for a cell that ran (platoon's ``CodeActStep``
    ``output=stdout, error=stderr``): the output as shown (:func:`shown_output`; a raised exception's
    traceback is in it), and what the cell wrote to stderr, or the trainer's message when the worker did
    not finish the cell."""
    return shown_output(result.stdout), result.stderr + (result.error or "")


def format_cell_observation(index: int, result: CellResult, prompts: TextCraftPrompts | None = None) -> str:
    """The observation after a cell (``textcraft_observation.txt``): ``[Cell index Output]``, the output (or
    ``(No output)``), the error slot as ``Error: ...`` right after it, then the next line. ``index`` is the
    step's index from 0.

    >>> print(format_cell_observation(2, CellResult(stdout="", error=None, stderr="careful\\n")))
    [Cell 2 Output]
    (No output)Error: careful
    <BLANKLINE>
    Write your next step.
    """
    output, error = cell_slots(result)
    return (prompts or load_prompts()).observation(index, output, error)
