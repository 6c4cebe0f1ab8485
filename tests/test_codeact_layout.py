"""The worker's echo and traceback texts are IPython 9.4's, byte for byte (audit 2026-12-04 rows 4 and 9).

``tests/fixtures/ipython94_layout.json`` was recorded with IPython 9.4.0 (SERA pins ``ipython>=9.4,<10``)
running each cell as platoon's ``IPythonCodeExecutor.run`` does (``InteractiveShellEmbed`` with history
off, ``run_cell_async(code)`` inside platoon's ``ShellCapture``); it holds the captured stdout before
platoon's ``Out[`` strip. Here the same cells run in plain Python and :mod:`common.codeact.ipython_layout`
formats them; the worker uses the same functions (``tests/test_codeact_worker.py`` checks the wiring).

Run: ``pytest tests/test_codeact_layout.py -q``.
"""

from __future__ import annotations

import ast
import asyncio
import collections
import json
import linecache
from pathlib import Path

import pytest

from common.codeact.ipython_layout import cell_label, display_text, format_traceback, input_name, pretty
from common.envs.textcraft.codeact import shown_output

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "ipython94_layout.json").read_text())


@pytest.mark.parametrize("case", FIXTURE["echo"], ids=range(len(FIXTURE["echo"])))
def test_last_expression_values_print_as_ipython_does(case):
    value = eval(case["expr"], {"collections": collections})
    expected = case["stdout"]
    if value is None:  # IPython shows nothing for None (the worker does not call display_text then)
        assert expected == ""
        return
    if "0x" in expected:  # an address: only the shape can match
        pytest.skip("object address")
    assert display_text(value) == expected


def sera_strip(stdout: str) -> str:
    """The ``Out[`` strip of SERA's vendored platoon (``Runtime/vendor/platoon/envs/codeact/env.py``,
    ``IPythonCodeExecutor.run``, imported by SERA's training and evaluation alike), retyped here as the
    reference: ``split(":", 1)[1].lstrip()`` of a capture that starts with ``Out[``."""
    return stdout.split(":", 1)[1].lstrip() if stdout.startswith("Out[") else stdout


@pytest.mark.parametrize("case", FIXTURE["echo"], ids=range(len(FIXTURE["echo"])))
def test_echoes_are_shown_as_seras_platoon_shows_them(case):
    """Every echo a real IPython 9.4.0 wrote (the fixture) reaches the observation as SERA's vendored platoon
    passes it on: the project's chain (the worker's ``display_text``, then ``shown_output``) equals SERA's
    strip of IPython's own capture; the prompt goes, every colon of the value stays (audit 2026-12-06 N1:
    the project had followed another platoon revision, ``"".join(split(":")[1:])``, which drops them all)."""
    if not case["stdout"] or "0x" in case["stdout"]:
        pytest.skip("None (nothing shown) or an object address")
    value = eval(case["expr"], {"collections": collections})
    expected = sera_strip(case["stdout"])
    assert shown_output(display_text(value)) == expected
    assert not expected.startswith((" ", "\n")) and expected.count(":") == case["stdout"].count(":") - 1


def test_echo_strip_examples():
    assert shown_output("Out[1]: {'log': 3}\n") == "{'log': 3}\n"
    assert shown_output("Out[1]: \n['a: 1',\n 'b: 2']\n") == "['a: 1',\n 'b: 2']\n"  # multi-line: column 0
    assert shown_output("made\nOut[1]: {'log': 3}\n") == "made\nOut[1]: {'log': 3}\n"  # not first: kept
    assert shown_output("Out[1]: 'done'\n") == "'done'\n"  # finish()'s echoed value (audit row 23)


def _run_cells(cells, first_shell=False):
    """Run cells in one namespace as the worker does; yield the traceback text of each (or "")."""
    ns: dict = {"__name__": "__main__", "asyncio": asyncio}
    names: dict[str, str] = {}

    def label(filename, lineno):
        return cell_label(names[filename], lineno, first_shell=first_shell)

    for k, code in enumerate(cells):
        name = f"<cell-layout-{k}>"
        names[name] = input_name(code)
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        try:
            obj = compile(code, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            if obj.co_flags & 0x80:
                asyncio.run(eval(obj, ns))
            else:
                exec(obj, ns)
        except BaseException as e:  # noqa: BLE001
            yield format_traceback(e, lambda f: f.startswith("<cell-layout-"), label=label)
        else:
            yield ""


def test_tracebacks_are_ipythons_context_layout():
    """Frames, 2 statements of context each side (1 for chained exceptions), ``----> k``, dedent, blank
    lines hidden, long context statements cut with ``(...)``, chained causes, notes, repeated frames
    collapsed. Recorded in a second shell of the process, as every platoon agent but the first of a process
    runs: frames read ``File <ipython-input-1-<sha1 of the cell>>:k``. The one recorded cell with a frame
    outside the cell (IPython shows its file) is not here."""
    cases = FIXTURE["tracebacks"]
    got = list(_run_cells([c["cell"] for c in cases]))
    for case, text in zip(cases, got, strict=True):
        assert text == case["stdout"], case["cell"]


def test_pretty_keeps_long_strings_on_one_line():
    s = "Error: All 1 recipe(s) failed for plank. Errors:\nRecipe 1: Target count 3 is not divisible by 4"
    assert pretty(s) == repr(s)
    assert pretty({"k": s}) == "{'k': " + repr(s) + "}"
    cyc: list = [1]
    cyc.append(cyc)
    assert pretty(cyc) == "[1, [...]]"


def test_the_first_shell_of_a_process_labels_frames_cell_in_1():
    """The audit's measurement (one shell): ``Cell In[1], line 1``, the same for every cell."""
    text = list(_run_cells(["x = 1", "print(undefined_name)"], first_shell=True))[1]
    assert text == (
        "-" * 75 + "\nNameError                                 Traceback (most recent call last)\n"
        "Cell In[1], line 1\n----> 1 print(undefined_name)\n\nNameError: name 'undefined_name' is not defined\n"
    )
