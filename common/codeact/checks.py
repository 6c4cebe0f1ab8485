"""Checks made on a CodeAct cell BEFORE it runs, and the loop detector applied between steps.

Both follow the paper's executor and agent (public SERA code, ``Runtime/vendor/platoon/envs/codeact/env.py``
and ``agents/codeact/agent.py``); the rules are theirs, the code is ours:

* :func:`check_cell`, in the paper's order: a syntax error; an empty cell; ``asyncio.all_tasks()`` /
  ``asyncio.current_task()`` (awaiting them can make a cell wait for itself); a call of an async tool
  (``launch_subagent``) that is neither inside an ``await`` expression nor inside an argument of
  ``gather`` / ``wait`` / ``wait_for`` / ``create_task`` / ``as_completed``. A rejected cell runs not at
  all, so a forgotten ``await`` has no side effect (and no sub-agent is started).
* :func:`stuck_in_loop`: the last ``threshold * p`` cells (stripped code; an unparsable reply counts as
  the empty cell) repeat a pattern of period ``p <= window`` ``threshold`` times. The paper's agent then
  acts ``finish('Stuck in a loop, terminating early.')`` instead of calling the model.

Run: ``pytest tests/test_codeact_worker.py -q -k "check or loop"``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

LOOP_THRESHOLD = 4
"""Repetitions of a pattern that count as a loop (public ``stuck_in_loop_threshold``)."""
LOOP_WINDOW = 3
"""Longest pattern period checked (public ``stuck_in_loop_window``)."""
ASYNC_TOOLS = ("launch_subagent",)
"""Tools whose calls must be awaited (the TextCraft subset of the public ``ASYNC_FUNCTIONS``)."""
_GATHER_LIKE = frozenset({"gather", "wait", "wait_for", "create_task", "as_completed"})
_INTROSPECTION = frozenset({"all_tasks", "current_task"})


@dataclass(frozen=True)
class StaticCheck:
    """Why a cell must not run (``kind`` None: it may run)."""

    kind: str | None
    """None, ``"syntax"``, ``"empty"``, ``"introspection"`` or ``"unawaited"``."""
    names: tuple[str, ...] = ()
    """The offending function names, one per offence (introspection / unawaited)."""
    line: str = ""
    """The source line of a syntax error."""
    message: str = ""
    """The parser's message of a syntax error."""


class _Unawaited(ast.NodeVisitor):
    def __init__(self, names: Iterable[str]):
        self.names = frozenset(names)
        self.found: list[str] = []
        self.in_await = False
        self.in_gather = False

    def visit_Constant(self, node: ast.Constant) -> None:
        """Nothing to check (and skips NodeVisitor's slow legacy dispatch)."""

    def visit_Await(self, node: ast.Await) -> None:
        old, self.in_await = self.in_await, True
        self.generic_visit(node)
        self.in_await = old

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _GATHER_LIKE:
            old, self.in_gather = self.in_gather, True
            self.generic_visit(node)
            self.in_gather = old
            return
        name = (
            func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        )
        if name in self.names and not (self.in_await or self.in_gather):
            self.found.append(name)
        self.generic_visit(node)


class _Introspection(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[str] = []

    def visit_Constant(self, node: ast.Constant) -> None:
        """Nothing to check."""

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = None
        if isinstance(func, ast.Name):
            name = func.id
        elif (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "asyncio"
        ):
            name = func.attr
        if name in _INTROSPECTION:
            self.found.append(name)
        self.generic_visit(node)


def check_cell(code: str, async_tools: Sequence[str] = ASYNC_TOOLS, parse: bool = True) -> StaticCheck:
    """Decide whether ``code`` may run. With ``parse=False`` a cell that names none of the checked
    functions is not parsed here (the worker compiles it anyway and reports a syntax error itself).

    >>> check_cell("x = launch_subagent({'a': 1})").kind
    'unawaited'
    >>> check_cell("r = await asyncio.gather(launch_subagent({'a': 1}), launch_subagent({'b': 1}))").kind is None
    True
    >>> check_cell("print(1").kind
    'syntax'
    """
    code = code.strip()
    if not code:
        return StaticCheck("empty")
    if not parse and not any(name in code for name in (*async_tools, *_INTROSPECTION)):
        return StaticCheck(None)
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return StaticCheck("syntax", line=(e.text or "").rstrip(), message=str(e.msg))
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, absurd nesting
        return StaticCheck("syntax", message=f"{type(e).__name__}: {e}")
    intro = _Introspection()
    intro.visit(tree)
    if intro.found:
        return StaticCheck("introspection", names=tuple(intro.found))
    unawaited = _Unawaited(async_tools)
    unawaited.visit(tree)
    if unawaited.found:
        return StaticCheck("unawaited", names=tuple(unawaited.found))
    return StaticCheck(None)


def stuck_in_loop(codes: Sequence[str], threshold: int = LOOP_THRESHOLD, window: int = LOOP_WINDOW) -> bool:
    """True when the recent cells repeat a short pattern ``threshold`` times (the public rule).

    >>> stuck_in_loop(["a", "b", "a", "b", "a", "b", "a", "b"])
    True
    >>> stuck_in_loop(["a", "a", "a"]), stuck_in_loop(["x", "a", "a", "a", "a"])
    (False, True)
    """
    if len(codes) < threshold:
        return False
    cells = [c.strip() for c in codes]
    max_period = min(window, len(cells) // threshold)
    for period in range(1, max_period + 1):
        segment = cells[-period * threshold :]
        if all(segment[i] == segment[i % period] for i in range(len(segment))):
            return True
    return False
