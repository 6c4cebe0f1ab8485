"""A restricted, in-process Python interpreter for model-written CodeAct cells: the opt-in fast path.

The default CodeAct executor is the isolated worker process (``common/codeact``: real Python, any
standard-library import, full asyncio, last-expression echo, rlimits and namespaces). This interpreter is
kept as ``TextCraftEnv(executor="inprocess")``: it is about 2x faster per one-call step and 5-7x per
tool-heavy cell (no pipe round trips; ``bench/bench_codeact.py``), needs no ``fork``, and serves scripted
policies and platforms without worker processes. It is NOT the paper's Python (no imports but a safe
asyncio subset, no echo) and not an isolation boundary (see below and ``docs/fidelity/codeact.md``).

The TextCraft agent answers with Python (``<python>...</python>``); every agent has one :class:`Sandbox`
whose namespace persists across its cells. ``await Sandbox.run(code)`` executes one cell and returns a
:class:`CellResult` (captured ``print`` output and a readable error). Cells may ``await`` async tools
(``await launch_subagent(...)``, ``await asyncio.gather(...)``) because the cell is compiled with
``ast.PyCF_ALLOW_TOP_LEVEL_AWAIT``; many agents' cells can interleave on one asyncio loop.

How it guards the host (in-process; a subprocess per cell would cost milliseconds per step):

1. **Static check** (``ast``): only ``import asyncio`` / ``from asyncio import gather, sleep, wait_for``;
   no name starting with ``__``; no attribute starting with ``_`` (except ``__init__``, ``__name__``,
   ``__qualname__``, ``__doc__``, ``__module__``) and no frame/code/loop attributes
   (``gi_frame``, ``cr_frame``, ``f_globals``, ``tb_frame``, ``get_loop``, ...); no dunder method
   definitions except ``__init__``; no ``class ...(metaclass=...)``; no ``except*``.
2. **Restricted builtins**: no ``open``, ``exec``, ``eval``, ``compile``, ``__import__`` (a safe one that
   only yields the sandboxed asyncio), ``globals``/``locals``/``vars``, ``getattr``/``setattr``/``delattr``,
   ``input``, ``breakpoint``, ``help``, ``memoryview``, ``bytearray``; ``type`` only with one argument.
   ``asyncio`` is a proxy exposing ``gather``, ``sleep``, ``wait_for`` and ``TimeoutError`` only.
3. **Allocation guards** (an AST rewrite): ``+ * ** << %`` and their augmented forms, every call (so
   aliases such as ``f = list`` are caught too), f-strings, ``in`` and ``*unpacking`` go through guard
   functions that refuse results larger than ``max_sequence_len`` elements (``'a'*10**10``,
   ``[0]*10**9``, ``list(range(10**10))``, ``'x'.ljust(10**10)``, ``f'{1:>{10**10}}'``, ...) or ints larger
   than ``max_int_bits`` (``10**10**8``, ``1 << 10**10``), and make lazy iteration over huge ranges
   interruptible. Converting a huge or exponentially shared structure to text is refused (``str``/
   ``repr``/``format``) or abbreviated (``print``).
4. **Time, recursion and memory** (``sys.settrace`` while the cell's code runs, plus a check inserted at
   every loop iteration and function entry): the cell's own execution time (``wall_time_s``; time spent
   *awaiting* tools or sub-agents is not counted), nesting depth of cell frames
   (``max_recursion_depth``) and growth of the process RSS during the cell (``max_memory_mb``, read
   from ``/proc/self/statm`` every 5 ms of cell time and after large allocations). These aborts cannot
   be caught by the cell's own ``try``/``except``.
5. **Output capture**: the namespace has its own ``print`` writing to the running cell's buffer (capped
   at ``max_output_chars`` with a marker line); ``sys.stdout`` is never swapped, so concurrent cells of
   different agents do not mix. Exceptions (``SystemExit`` included) become ``CellResult.error`` with the
   cell line numbers; ``KeyboardInterrupt`` and the cancellation of the caller's task propagate.

What it does NOT protect against (it is a guard against accidents and the common escapes, not a
security boundary like a container or a separate process):

* C code that runs for a long time without returning to Python cannot be interrupted (the checks run
  between bytecode lines): e.g. sorting a 10M-element list, comparing or hashing exponentially shared
  nested structures (``a = [a, a]`` 60 times, then ``a == b``). Hashing a tuple nested ~10**5 deep
  crashes CPython 3.11 itself (C stack overflow); nothing here prevents building one.
* The memory guard measures the whole process between checks: an allocation burst of a few hundred MB
  in C between two checks lands before it is noticed, and memory that other threads allocate while a
  cell runs is attributed to that cell (other agents' cells and tools, which run between the cell's
  slices, are not). Memory the cell keeps in its namespace stays allocated after the abort. Without
  ``/proc`` (non-Linux) the memory guard is off.
* Objects the tools return are reachable through their public attributes: tools must return plain
  data (str, int, dict, list), as the TextCraft tools do. Tools run unguarded, as host code.
* Only the names listed above are blocked; a determined adversary with knowledge of CPython internals
  may find an escape this does not anticipate. Run untrusted models in a container as well.

Run the tests with ``python -m pytest tests/test_sandbox.py -q`` and the benchmark with
``python bench/bench_sandbox.py``.
"""

from __future__ import annotations

import _string  # the CPython helper behind str.format field-name parsing
import ast
import asyncio
import builtins
import functools
import inspect
import itertools
import math
import operator
import os
import re
import reprlib
import string
import sys
import threading
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

__all__ = ["CellResult", "Sandbox", "SandboxLimits", "SandboxViolation", "ALLOWED_ASYNCIO"]


@dataclass
class SandboxLimits:
    """Per-cell resource limits of a :class:`Sandbox`."""

    wall_time_s: float = 2.0
    """Seconds of the cell's own execution (its code, and sync tools it calls). Time spent awaiting
    external coroutines (a sub-agent launch that takes minutes, ``asyncio.gather`` of launches) is NOT
    counted; ``asyncio.sleep`` inside the cell is."""
    max_output_chars: int = 8000
    """Characters of ``print`` output kept per cell; the rest is dropped and a marker line added."""
    max_memory_mb: int = 256
    """Allowed growth of the process RSS while the cell runs, in MiB (approximate, see module doc)."""
    max_recursion_depth: int = 100
    """Maximum nesting of the cell's own Python frames (functions defined in cells)."""
    max_sequence_len: int = 10_000_000
    """Largest str/bytes/list/tuple/set (elements or characters) a guarded operation may create."""
    max_int_bits: int = 100_000
    """Largest int (in bits) a guarded ``* ** <<`` may create; keeps big-int arithmetic fast."""


@dataclass
class CellResult:
    """What one cell produced."""

    stdout: str
    """Captured ``print`` output (the sandbox has no separate stderr; errors go to ``error``)."""
    error: str | None
    """None on success; else a traceback-style message with the cell's line numbers, ending in a line
    such as ``NameError: name 'x' is not defined`` or ``TimeoutError: cell exceeded ...``."""
    timed_out: bool = False
    """True when the cell was stopped by the time limit."""
    restarted: bool = False
    """True when the cell's process died or was killed (CodeAct worker only): its namespace is gone."""
    unawaited_launches: int = 0
    """Launch coroutines the cell created but never awaited (closed unrun; CodeAct worker only)."""
    syntax_error: tuple[str, str] | None = None
    """``(source line, message)`` when the cell did not compile (CodeAct worker only)."""


class SandboxViolation(Exception):
    """The cell tried something the sandbox does not allow (reported as ``SandboxViolation: ...``)."""


class _Abort(BaseException):
    """Stops a cell (time, memory, recursion limits). A BaseException the cell cannot swallow: every
    ``except`` handler of cell code re-raises it first, and ``finally`` bodies are skipped once a cell
    is aborted."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


ALLOWED_ASYNCIO = ("gather", "sleep", "wait_for", "TimeoutError")
"""The attributes of the sandboxed ``asyncio``."""

_CELL_PREFIX = "<cell-"
_MEM_INTERVAL_S = 0.005  # RSS is read at most this often (of cell time), plus after big allocations
_BIG_RESULT = 1_000_000  # results at least this long trigger an immediate memory check
_INT_TEXT_BITS = 14_000  # ~4200 decimal digits: CPython's default int->str limit is 4300 digits
_TEXT_BUDGET = 2_000_000  # characters str()/repr()/format() may produce (~1M objects walked at most)
_PRINT_BUDGET = 100_000  # print() shows at most max_output_chars; bigger objects get an abbreviated repr
_INT_PARSE_CHARS = 5_000  # longest str accepted by int(); keeps int() within the same limits
_POWMOD_COST = 1e9  # 3-argument pow: refuse when exponent bits * (modulus digits)^2 exceeds this
_MAX_TB_FRAMES = 6
_INF = float("inf")

_BLOCKED_ATTR_PREFIXES = ("_", "gi_", "cr_", "ag_", "f_", "tb_", "co_", "func_", "im_")
_BLOCKED_ATTRS = frozenset(
    {"get_loop", "get_coro", "get_stack", "print_stack", "add_done_callback", "remove_done_callback"}
)
_ALLOWED_DUNDERS = frozenset({"__init__", "__name__", "__qualname__", "__doc__", "__module__"})
"""``super().__init__(...)`` and ``type(e).__name__`` are common and harmless (strings and a method)."""
_UNAVAILABLE = frozenset(
    {
        "open", "exec", "eval", "compile", "globals", "locals", "vars", "getattr", "setattr", "delattr",
        "hasattr", "input", "breakpoint", "help", "memoryview", "bytearray", "bytes", "dir", "exit",
        "quit", "id", "property", "__import__",
    }
)  # fmt: skip


def _attr_blocked(name: str) -> bool:
    if name in _ALLOWED_DUNDERS:
        return False
    return name.startswith(_BLOCKED_ATTR_PREFIXES) or name in _BLOCKED_ATTRS


# ---------------------------------------------------------------------------------------------------
# 1. Static check
# ---------------------------------------------------------------------------------------------------


class _Validator(ast.NodeVisitor):
    """Finds the first construct the sandbox refuses; ``problem = (line, message)``."""

    def __init__(self) -> None:
        self.problem: tuple[int, str] | None = None

    def _fail(self, node: ast.AST, message: str) -> None:
        if self.problem is None:
            self.problem = (getattr(node, "lineno", 1), message)

    def _ident(self, node: ast.AST, name: str | None, what: str) -> None:
        if name and name.startswith("__"):
            self._fail(node, f"{what} {name!r} is not allowed (names starting with '__' are reserved)")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name != "asyncio":
                self._fail(
                    node, f"import of {alias.name!r} is not allowed (only `import asyncio` is available)"
                )
            self._ident(node, alias.asname, "name")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        if module != "asyncio":
            self._fail(node, f"import from {module!r} is not allowed (only asyncio is available)")
            return
        for alias in node.names:
            if alias.name not in ALLOWED_ASYNCIO:
                self._fail(
                    node,
                    f"'from asyncio import {alias.name}' is not allowed "
                    f"(available: {', '.join(ALLOWED_ASYNCIO)})",
                )
            self._ident(node, alias.asname, "name")

    def visit_Name(self, node: ast.Name) -> None:
        self._ident(node, node.id, "name")

    def visit_Constant(self, node: ast.Constant) -> None:
        """Nothing to check (and skips NodeVisitor's slow legacy ``visit_Num``/``visit_Str`` dispatch)."""

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.generic_visit(node)  # inner attributes first: report the first offence in reading order
        if _attr_blocked(node.attr):
            self._fail(node, f"access to attribute {node.attr!r} is not allowed")

    def _visit_def(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name.startswith("__") and node.name != "__init__":
            self._fail(
                node, f"defining {node.name!r} is not allowed (the only dunder method allowed is __init__)"
            )
        self.generic_visit(node)

    visit_FunctionDef = _visit_def
    visit_AsyncFunctionDef = _visit_def

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._ident(node, node.name, "class name")
        if node.keywords:
            self._fail(node, "class keyword arguments (such as metaclass=...) are not allowed")
        self.generic_visit(node)

    def visit_arg(self, node: ast.arg) -> None:
        self._ident(node, node.arg, "argument name")
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        self._ident(node, node.arg, "keyword argument")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            self._ident(node, name, "name")

    visit_Nonlocal = visit_Global

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        self._ident(node, node.name, "name")
        self.generic_visit(node)

    def visit_TryStar(self, node: ast.AST) -> None:
        self._fail(node, "except* is not supported in the sandbox")

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for attr in node.kwd_attrs:
            if _attr_blocked(attr):
                self._fail(node, f"matching on attribute {attr!r} is not allowed")
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        self._ident(node, node.name, "name")
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        self._ident(node, node.name, "name")

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        self._ident(node, node.rest, "name")
        self.generic_visit(node)


# ---------------------------------------------------------------------------------------------------
# 2. AST rewrite: route operations through guards, add checks at loops / function entries / handlers
# ---------------------------------------------------------------------------------------------------

_BINOP_GUARDS = {ast.Add: "__sb_add__", ast.Mult: "__sb_mul__", ast.Pow: "__sb_pow__", ast.LShift: "__sb_lshift__", ast.Mod: "__sb_mod__"}  # fmt: skip
_AUGOP_GUARDS = {ast.Add: "__sb_iadd__", ast.Mult: "__sb_imul__", ast.Pow: "__sb_pow__", ast.LShift: "__sb_lshift__", ast.Mod: "__sb_mod__"}  # fmt: skip


def _load(name: str) -> ast.Name:
    return ast.Name(id=name, ctx=ast.Load())


def _call(fn: str, *args: ast.expr) -> ast.Call:
    return ast.Call(func=_load(fn), args=list(args), keywords=[])


_LOCATION = ("lineno", "col_offset", "end_lineno", "end_col_offset")


def _at(new: Any, ref: ast.AST) -> Any:
    """Give ``new`` and the nodes created with it (those without a location) ``ref``'s location.
    Original nodes inside ``new`` already have theirs; the rewrite is bottom-up, so nodes created
    below them were located when they were made. (Cheaper than ``ast.fix_missing_locations``.)"""
    loc = [getattr(ref, a, None) for a in _LOCATION]
    if loc[0] is None:
        loc = [1, 0, 1, 0]
    todo = [new]
    while todo:
        node = todo.pop()
        if "lineno" in node._attributes:
            if hasattr(node, "lineno") and node is not new:
                continue
            for a, v in zip(_LOCATION, loc, strict=True):
                if getattr(node, a, None) is None:
                    setattr(node, a, v)
        todo.extend(ast.iter_child_nodes(node))
    return new


def _has_starred(target: ast.expr) -> bool:
    if isinstance(target, ast.Starred):
        return True
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_has_starred(e) for e in target.elts)
    return False


class _Transformer(ast.NodeTransformer):
    """Rewrites validated cell code; the helper names it inserts (``__sb_*__``) live in the builtins and
    cannot be written by the cell (names starting with '__' are refused)."""

    def __init__(self) -> None:
        self._n_tmp = 0

    def _tmp(self) -> str:
        self._n_tmp += 1
        return f"__sb_t{self._n_tmp}__"

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        return node

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return node

    @staticmethod
    def _tick() -> ast.stmt:
        return ast.Expr(_call("__sb_tick__"))  # located by the caller

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        fn = _BINOP_GUARDS.get(type(node.op))
        if fn is None:
            return node
        return _at(_call(fn, node.left, node.right), node)

    def _index(self, index: ast.expr) -> ast.expr:
        if isinstance(index, ast.Slice):
            parts = [
                p if p is not None else ast.Constant(None) for p in (index.lower, index.upper, index.step)
            ]
            return _call("__sb_slice__", *parts)
        if isinstance(index, ast.Tuple) and any(isinstance(e, ast.Slice) for e in index.elts):
            return ast.Tuple(elts=[self._index(e) for e in index.elts], ctx=ast.Load())
        return index

    def visit_AugAssign(self, node: ast.AugAssign) -> Any:
        self.generic_visit(node)
        fn = _AUGOP_GUARDS.get(type(node.op))
        if fn is None:
            return node
        target = node.target
        if isinstance(target, ast.Name):
            new = ast.Assign(
                targets=[ast.Name(id=target.id, ctx=ast.Store())],
                value=_call(fn, _load(target.id), node.value),
            )
            return _at(new, node)
        obj = self._tmp()
        stmts: list[ast.stmt] = [ast.Assign(targets=[ast.Name(id=obj, ctx=ast.Store())], value=target.value)]
        temps = [obj]
        if isinstance(target, ast.Attribute):
            store: ast.expr = ast.Attribute(value=_load(obj), attr=target.attr, ctx=ast.Store())
            load: ast.expr = ast.Attribute(value=_load(obj), attr=target.attr, ctx=ast.Load())
        else:  # ast.Subscript
            key = self._tmp()
            temps.append(key)
            stmts.append(
                ast.Assign(targets=[ast.Name(id=key, ctx=ast.Store())], value=self._index(target.slice))
            )
            store = ast.Subscript(value=_load(obj), slice=_load(key), ctx=ast.Store())
            load = ast.Subscript(value=_load(obj), slice=_load(key), ctx=ast.Load())
        stmts.append(ast.Assign(targets=[store], value=_call(fn, load, node.value)))
        stmts.append(ast.Delete(targets=[ast.Name(id=t, ctx=ast.Del()) for t in temps]))
        return [_at(s, node) for s in stmts]

    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            return node  # zero-argument super() needs to be called from the method's own frame
        new = ast.Call(func=_load("__sb_call__"), args=[node.func, *node.args], keywords=node.keywords)
        return _at(new, node)

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        self.generic_visit(node)
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            new: ast.expr = _call("__sb_contains__", node.left, node.comparators[0])
            if isinstance(node.ops[0], ast.NotIn):
                new = ast.UnaryOp(op=ast.Not(), operand=new)
            return _at(new, node)
        return node

    def visit_Starred(self, node: ast.Starred) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.ctx, ast.Load):
            node.value = _at(_call("__sb_star__", node.value), node)
        return node

    def visit_Assign(self, node: ast.Assign) -> ast.stmt:
        self.generic_visit(node)
        if any(_has_starred(t) for t in node.targets):
            node.value = _at(_call("__sb_star__", node.value), node)
        return node

    def visit_FormattedValue(self, node: ast.FormattedValue) -> ast.expr:
        self.generic_visit(node)
        spec = node.format_spec if node.format_spec is not None else ast.Constant(None)
        value = _call("__sb_fmt__", node.value, ast.Constant(node.conversion), spec)
        return _at(ast.FormattedValue(value=value, conversion=-1, format_spec=None), node)

    def _loop(self, node: Any) -> Any:
        self.generic_visit(node)
        node.body.insert(0, _at(self._tick(), node))
        return node

    visit_While = _loop
    visit_For = _loop
    visit_AsyncFor = _loop
    visit_FunctionDef = _loop
    visit_AsyncFunctionDef = _loop

    def visit_Lambda(self, node: ast.Lambda) -> ast.expr:
        self.generic_visit(node)
        node.body = _at(ast.BoolOp(op=ast.And(), values=[_call("__sb_tick__"), node.body]), node.body)
        return node

    def visit_comprehension(self, node: ast.comprehension) -> ast.comprehension:
        self.generic_visit(node)
        node.ifs.insert(0, _at(_call("__sb_tick__"), node.iter))
        return node

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> ast.ExceptHandler:
        self.generic_visit(node)
        node.body.insert(0, _at(ast.Expr(_call("__sb_exc_guard__")), node))
        return node

    def visit_Try(self, node: ast.Try) -> ast.Try:
        self.generic_visit(node)
        if node.finalbody:
            node.finalbody = [_at(ast.If(test=_call("__sb_fin_ok__"), body=node.finalbody, orelse=[]), node)]
        return node


# ---------------------------------------------------------------------------------------------------
# 3. Execution accounting: a per-thread stack of running cells (time, depth, memory) and the tracer
# ---------------------------------------------------------------------------------------------------

try:
    _PAGE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):
    _PAGE = 4096
_statm = {"pid": -1, "fd": -1}


def _rss() -> int:
    """Resident set size of this process in bytes (0 where /proc is unavailable)."""
    pid = os.getpid()
    if _statm["pid"] != pid:  # first use, or we are a forked child: reopen our own statm
        try:
            _statm["fd"] = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            _statm["fd"] = -1
        _statm["pid"] = pid
    fd = _statm["fd"]
    if fd < 0:
        return 0
    try:
        return int(os.pread(fd, 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class _CellState:
    """Accounting of one running cell. Time accrues only while the cell is on top of the stack."""

    def __init__(self, sandbox: Sandbox, limits: SandboxLimits):
        self.owner = sandbox
        self.limit = float(limits.wall_time_s)
        self.max_depth = limits.max_recursion_depth
        self.mem_limit = limits.max_memory_mb * 1024 * 1024
        self.used = 0.0
        self.slice_start = 0.0
        self.deadline = _INF
        self.next_mem = 0.0
        self.next_check = _INF
        self.mem_base = 0
        self.mem_grown = 0
        self.depth = 0
        self.aborted: _Abort | None = None
        self.out: list[str] = []
        self.n_out = 0
        self.cap = limits.max_output_chars
        self.truncated = False
        self.spawned: list[asyncio.Future[Any]] = []
        self.trace_call = self._trace_call  # bound once: settrace and f_trace reuse the same objects
        self.trace_line = self._trace_line

    # --- stack transitions -------------------------------------------------------------------------
    def resume(self, now: float) -> None:
        self.slice_start = now
        self.deadline = now + self.limit - self.used
        self.mem_base = _rss()
        self.next_mem = now + _MEM_INTERVAL_S
        self.next_check = -_INF if self.aborted is not None else min(self.deadline, self.next_mem)

    def pause(self, now: float) -> None:
        self.used += now - self.slice_start
        self.mem_grown += _rss() - self.mem_base
        self.deadline = self.next_check = _INF

    # --- checks ----------------------------------------------------------------------------------------
    def abort(self, kind: str, message: str) -> _Abort:
        if self.aborted is None:
            self.aborted = _Abort(kind, message)
        self.next_check = -_INF
        return self.aborted

    def check(self) -> None:
        """Time and memory check (called when ``perf_counter() > next_check``)."""
        if self.aborted is not None:
            raise self.aborted
        now = perf_counter()
        if now > self.deadline:
            raise self.abort(
                "timeout",
                f"TimeoutError: cell exceeded its {self.limit:g} s execution-time limit "
                "(time spent awaiting tools and sub-agents is not counted)",
            )
        if now >= self.next_mem:
            self.check_memory()
            self.next_mem = now + _MEM_INTERVAL_S
        self.next_check = min(self.deadline, self.next_mem)

    def check_memory(self) -> None:
        if self.deadline == _INF:  # not running (paused): nothing to attribute
            return
        grown = self.mem_grown + _rss() - self.mem_base
        if grown > self.mem_limit:
            raise self.abort(
                "memory",
                f"MemoryError: cell grew the process memory by {grown / 2**20:.0f} MB "
                f"(limit {self.mem_limit / 2**20:.0f} MB)",
            )

    def _trace_call(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename.startswith(_CELL_PREFIX):
            self.depth += 1
            if self.depth > self.max_depth:
                raise self.abort(
                    "recursion",
                    f"RecursionError: maximum recursion depth ({self.max_depth}) exceeded in cell code",
                )
            if perf_counter() > self.next_check:
                self.check()
            return self.trace_line
        return None

    def _trace_line(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            if perf_counter() > self.next_check:
                self.check()
        elif event == "return":
            self.depth -= 1
        return self.trace_line

    # --- output ------------------------------------------------------------------------------------
    def write(self, text: str) -> None:
        room = self.cap - self.n_out
        if len(text) <= room:
            self.out.append(text)
            self.n_out += len(text)
            return
        if room > 0:
            self.out.append(text[:room])
            self.n_out = self.cap
        self.truncated = True


_ctx = threading.local()


def _stack() -> list[_CellState | None]:
    try:
        return _ctx.stack
    except AttributeError:
        _ctx.stack = []
        _ctx.host_trace = None
        return _ctx.stack


def _current() -> _CellState | None:
    stack = _stack()
    return stack[-1] if stack else None


def _push(entry: _CellState | None) -> None:
    """Enter a slice of cell code (``entry`` = its state) or of host code awaited by a cell (None)."""
    stack = _stack()
    now = perf_counter()
    if not stack:
        _ctx.host_trace = sys.gettrace()
    elif stack[-1] is not None:
        stack[-1].pause(now)
    stack.append(entry)
    if entry is None:
        sys.settrace(_ctx.host_trace)
    else:
        entry.resume(now)
        sys.settrace(entry.trace_call)


def _pop() -> None:
    stack = _ctx.stack
    entry = stack.pop()
    now = perf_counter()
    if entry is not None:
        entry.pause(now)
    if not stack:
        sys.settrace(_ctx.host_trace)
        _ctx.host_trace = None
    elif stack[-1] is None:
        sys.settrace(_ctx.host_trace)
    else:
        stack[-1].resume(now)
        sys.settrace(stack[-1].trace_call)  # re-arms a tracer an abort may have removed


def _drive(coro: Any, entry: _CellState | None, contain: bool = False) -> Any:
    """Generator behind ``await``: steps ``coro`` one slice at a time inside ``_push(entry)``/``_pop``,
    so the cell's clock runs only while its own code runs and stops while it is suspended.
    ``contain``: cell coroutines run as asyncio tasks must not raise SystemExit (asyncio would re-raise
    it out of the event loop); it becomes an abort of the cell instead."""
    value: Any = None
    exc: BaseException | None = None
    while True:
        _push(entry)
        try:
            if exc is None and entry is not None and entry.aborted is not None:
                exc = entry.aborted
            yielded = coro.send(value) if exc is None else coro.throw(exc)
        except StopIteration as stop:
            return stop.value
        except SystemExit as e:
            if not contain:
                raise
            text = "SystemExit" + (f": {e.code}" if e.code is not None else "")
            raise _Abort("exit", text).with_traceback(e.__traceback__) from None
        finally:
            _pop()
        value = exc = None
        try:
            value = yield yielded
        except GeneratorExit:
            _push(entry)
            try:
                coro.close()
            finally:
                _pop()
            raise
        except BaseException as e:  # forwarded into the coroutine (cancellation, errors from the loop)
            exc = e


class _Driven:
    """Awaitable running cell code (``entry`` = its state) or host code a cell awaits (``entry`` None)."""

    __slots__ = ("_coro", "_entry", "_contain")

    def __init__(self, coro: Any, entry: _CellState | None, contain: bool = False):
        self._coro = coro
        self._entry = entry
        self._contain = contain

    def __await__(self) -> Any:
        aw = self._coro if inspect.iscoroutine(self._coro) else self._coro.__await__()
        return _drive(aw, self._entry, self._contain)


# ---------------------------------------------------------------------------------------------------
# 4. Text conversion with a size budget
# ---------------------------------------------------------------------------------------------------

_END = object()
_CONTAINERS = (list, tuple, set, frozenset, dict, BaseException)
_DIGITS = re.compile(r"\d+")
_PERCENT = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def _text_cost(obj: Any, budget: int, tick: Callable[[], Any] | None = None) -> int:
    """Rough number of characters ``repr(obj)`` would produce, counting shared sub-structures each time
    they appear (as repr does); stops as soon as ``budget`` is exceeded. Iterative (no recursion); calls
    ``tick()`` every 4096 objects so that a long walk stays interruptible."""
    cost = 0
    nodes = 0
    stack: list[tuple[Any, int]] = [(iter((obj,)), 0)]
    on_path: set[int] = set()
    while stack:
        child = next(stack[-1][0], _END)
        if child is _END:
            on_path.discard(stack.pop()[1])
            continue
        cost += 2
        nodes += 1
        if tick is not None and not nodes & 4095:
            tick()
        if isinstance(child, (str, bytes)):
            cost += len(child)
        elif isinstance(child, int):
            bits = child.bit_length()
            if bits > _INT_TEXT_BITS:
                return budget + 1
            cost += bits // 3
        elif isinstance(child, _CONTAINERS):
            key = id(child)
            if key in on_path:  # a cycle: repr prints [...] there
                continue
            on_path.add(key)
            if isinstance(child, dict):
                it = itertools.chain.from_iterable(child.items())
            elif isinstance(child, BaseException):
                it = iter(child.args)
            else:
                it = iter(child)
            stack.append((it, key))
        if cost > budget:
            return cost
    return cost


class _ShortRepr(reprlib.Repr):
    """Abbreviated repr used by ``print`` for objects too large to print in full."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 4
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdict = 40
        self.maxstring = self.maxother = 400
        self.maxlong = 200

    def repr1(self, x: Any, level: int) -> str:
        if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > _INT_TEXT_BITS:
            return f"<int with {x.bit_length()} bits>"
        if isinstance(x, BaseException):
            return f"{type(x).__name__}{self.repr_tuple(x.args, level)}"
        if isinstance(x, str) and len(x) > self.maxstring:
            return repr(x[: self.maxstring]) + f"...(+{len(x) - self.maxstring} chars)"
        return super().repr1(x, level)


_short_repr = _ShortRepr()


class _SafeFormatter(string.Formatter):
    """``str.format`` without access to blocked attributes and with width/size checks."""

    def __init__(self, guards: _Guards):
        super().__init__()
        self._g = guards

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        _first, rest = _string.formatter_field_name_split(field_name)
        for is_attr, key in rest:
            if is_attr and _attr_blocked(str(key)):
                raise SandboxViolation(
                    f"format field {field_name!r}: access to attribute {key!r} is not allowed"
                )
        return super().get_field(field_name, args, kwargs)

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion == "s":
            return self._g.text(value, False)
        if conversion == "r":
            return self._g.text(value, True)
        if conversion == "a":
            self._g.check_text(value)
            return ascii(value)
        return super().convert_field(value, conversion)

    def format_field(self, value: Any, format_spec: str) -> Any:
        return self._g.safe_format(value, format_spec)


# ---------------------------------------------------------------------------------------------------
# 5. Guards: the restricted builtins of one sandbox
# ---------------------------------------------------------------------------------------------------

_BuiltinMethod = types.BuiltinMethodType
_MethodDescriptor = types.MethodDescriptorType
_SEQUENCES = (str, bytes, bytearray, list, tuple)
_NOT_HUGE = (str, int, float, bool, type(None))
_CONSUMING_METHODS = frozenset(
    {
        "extend", "update", "union", "intersection", "difference", "symmetric_difference",
        "intersection_update", "difference_update", "symmetric_difference_update", "issubset",
        "issuperset", "isdisjoint", "fromkeys",
    }
)  # fmt: skip
_GUARDED_METHODS = frozenset(
    {"ljust", "rjust", "center", "zfill", "expandtabs", "replace", "join", "format", "format_map",
     "translate", "to_bytes", "from_bytes", "sort", "index", "count"}
) | _CONSUMING_METHODS  # fmt: skip


class _AsyncioProxy:
    """What cell code sees as ``asyncio``: gather, sleep, wait_for, TimeoutError; nothing else."""

    __slots__ = ALLOWED_ASYNCIO

    def __getattr__(self, name: str) -> Any:
        raise SandboxViolation(
            f"asyncio.{name} is not available in the sandbox (available: {', '.join(ALLOWED_ASYNCIO)})"
        )

    def __repr__(self) -> str:
        return "<module 'asyncio' (sandboxed)>"


class _Guards:
    """Guard functions and restricted builtins bound to one :class:`Sandbox`."""

    def __init__(self, sandbox: Sandbox):
        self.sb = sandbox
        limits = sandbox.limits
        self.max_len = int(limits.max_sequence_len)
        self.max_bits = int(limits.max_int_bits)
        self.formatter = _SafeFormatter(self)
        self.table: dict[int, tuple[Any, Callable[..., Any]]] = {}
        for obj, guard in (
            (list, self.g_list),
            (tuple, self.g_tuple),
            (set, self.g_set),
            (frozenset, self.g_frozenset),
            (dict, self.g_dict),
            (str, self.g_str),
            (int, self.g_int),
            (type, self.g_type),
            (bytes, self.g_bytes),
            (bytearray, self.g_bytearray),
            (map, self.g_map),
            (filter, self.g_filter),
            (zip, self.g_zip),
            (enumerate, self.g_enumerate),
            (reversed, self.g_reversed),
        ):
            self.table[id(obj)] = (obj, guard)

    # --- sizes ---------------------------------------------------------------------------------------
    def size(self, obj: Any) -> int | None:
        """len(obj), a number above the limit if len overflows, or None when obj has no length."""
        if isinstance(obj, _NOT_HUGE):
            return None
        try:
            return len(obj)
        except OverflowError:
            return self.max_len + 1
        except TypeError:
            return None

    def too_big(self, what: str, n: Any) -> MemoryError:
        return MemoryError(f"{what} would have {n:,} elements; the sandbox limit is {self.max_len:,}")

    def int_too_big(self, what: str) -> MemoryError:
        return MemoryError(f"{what} would exceed the sandbox limit of {self.max_bits:,} bits for integers")

    def check_iter(self, obj: Any, what: str) -> None:
        n = self.size(obj)
        if n is not None and n > self.max_len:
            raise self.too_big(what, n)

    def is_huge(self, obj: Any) -> bool:
        n = self.size(obj)
        return n is not None and n > self.max_len

    def big_result(self, n: int) -> None:
        if n >= _BIG_RESULT:
            st = self.sb._state
            if st is not None:
                st.check_memory()

    def ticking(self, it: Any) -> Any:
        """Re-yield ``it`` with a time/memory check every 1024 items (interruptible C-level loops)."""
        tick = self.tick
        for i, v in enumerate(it):
            if not i & 1023:
                tick()
            yield v

    def wrapfn(self, f: Any) -> Any:
        """Callables handed to C code (map, sorted key=...) still go through :meth:`call`."""
        if f is None:
            return f
        entry = self.table.get(id(f))
        if (entry is not None and entry[0] is f) or type(f) in (_BuiltinMethod, _MethodDescriptor):
            return functools.partial(self.call, f)
        return f

    # --- the call hook (every call in cell code) -----------------------------------------------------
    def call(self, f: Any, /, *args: Any, **kwargs: Any) -> Any:
        entry = self.table.get(id(f))
        if entry is not None and entry[0] is f:
            return entry[1](*args, **kwargs)
        tf = type(f)
        if tf is _BuiltinMethod:
            name = f.__name__
            if name in _GUARDED_METHODS:
                return self.method(f, f.__self__, name, True, args, kwargs)
        elif tf is _MethodDescriptor:
            name = f.__name__
            if name in _GUARDED_METHODS and args:
                return self.method(f, args[0], name, False, args[1:], kwargs)
        return f(*args, **kwargs)

    def method(self, f: Any, obj: Any, name: str, bound: bool, rest: tuple, kwargs: dict) -> Any:
        def invoke(*r: Any, **k: Any) -> Any:
            return f(*r, **k) if bound else f(obj, *r, **k)

        text = isinstance(obj, (str, bytes, bytearray))
        if name in ("ljust", "rjust", "center", "zfill") and text and rest:
            if isinstance(rest[0], int) and rest[0] > self.max_len:
                raise self.too_big(f"{type(obj).__name__}.{name}()", rest[0])
        elif name == "expandtabs" and text:
            tab = rest[0] if rest else kwargs.get("tabsize", 8)
            if isinstance(tab, int):
                n = len(obj) + obj.count("\t" if isinstance(obj, str) else b"\t") * max(tab, 0)
                if n > self.max_len:
                    raise self.too_big(f"{type(obj).__name__}.expandtabs()", n)
        elif name == "replace" and text and len(rest) >= 2:
            old, new = rest[0], rest[1]
            count = rest[2] if len(rest) > 2 else kwargs.get("count", -1)
            if isinstance(old, type(obj)) and isinstance(new, type(obj)) and isinstance(count, int):
                occ = obj.count(old) if old else len(obj) + 1
                if count >= 0:
                    occ = min(occ, count)
                n = len(obj) + occ * (len(new) - len(old))
                if n > self.max_len:
                    raise self.too_big(f"{type(obj).__name__}.replace()", n)
        elif name == "join" and text and rest and not kwargs:
            items = rest[0]
            self.check_iter(items, f"{type(obj).__name__}.join()")
            if type(items) not in (list, tuple):
                items = list(items)
            n = len(obj) * max(len(items) - 1, 0) + sum(len(x) for x in items if isinstance(x, (str, bytes)))
            if n > self.max_len:
                raise self.too_big(f"{type(obj).__name__}.join()", n)
            result = invoke(items)
            self.big_result(n)
            return result
        elif name == "format" and isinstance(obj, str):
            return self.formatter.vformat(obj, rest, kwargs)
        elif name == "format_map" and isinstance(obj, str) and len(rest) == 1:
            return self.formatter.vformat(obj, (), rest[0])
        elif name == "translate" and isinstance(obj, str) and rest and isinstance(rest[0], dict):
            widest = max((len(v) for v in rest[0].values() if isinstance(v, str)), default=1)
            if len(obj) * max(widest, 1) > self.max_len:
                raise self.too_big("str.translate()", len(obj) * widest)
        elif name == "to_bytes" and isinstance(obj, int):
            length = rest[0] if rest else kwargs.get("length", 1)
            if isinstance(length, int) and length > self.max_len:
                raise self.too_big("int.to_bytes()", length)
        elif name == "from_bytes" and isinstance(obj, type) and issubclass(obj, int):
            data = rest[0] if rest else kwargs.get("bytes")
            n = self.size(data)
            if n is not None and n * 8 > self.max_bits:
                raise self.int_too_big("int.from_bytes()")
        elif name == "sort" and isinstance(obj, list) and "key" in kwargs:
            kwargs = {**kwargs, "key": self.wrapfn(kwargs["key"])}
        elif name in ("index", "count") and isinstance(obj, range) and rest:
            x = rest[0]
            if type(x) not in (int, bool) and self.is_huge(obj):  # range scans linearly for non-ints
                if name == "count" and len(rest) == 1:
                    return sum(1 for v in self.ticking(obj) if v == x)
                if name == "index" and len(rest) == 1:
                    for i, v in enumerate(self.ticking(obj)):
                        if v == x:
                            return i
                    raise ValueError(f"{x!r} is not in range")
                raise self.too_big(f"range.{name}()", ">" + str(self.max_len))
        elif name in _CONSUMING_METHODS:
            for a in rest:
                self.check_iter(a, f"{type(obj).__name__}.{name}()")
        return invoke(*rest, **kwargs)

    # --- operators -----------------------------------------------------------------------------------
    def add(self, a: Any, b: Any) -> Any:
        ta = type(a)
        if ta is int or ta is float:
            return a + b
        if isinstance(a, _SEQUENCES):
            nb = self.size(b)
            if nb is not None:
                n = len(a) + nb
                if n > self.max_len:
                    raise self.too_big("+", n)
                result = a + b
                self.big_result(n)
                return result
        return a + b

    def iadd(self, a: Any, b: Any) -> Any:
        ta = type(a)
        if ta is int or ta is float:
            return a + b
        if isinstance(a, _SEQUENCES):
            nb = self.size(b)
            if nb is not None and len(a) + nb > self.max_len:
                raise self.too_big("+=", len(a) + nb)
        return operator.iadd(a, b)

    def _mul_check(self, a: Any, b: Any, what: str) -> int:
        if isinstance(a, int) and isinstance(b, int):
            if a.bit_length() + b.bit_length() > self.max_bits:
                raise self.int_too_big(what)
            return 0
        if isinstance(b, int) and isinstance(a, _SEQUENCES):
            n = len(a) * b
        elif isinstance(a, int) and isinstance(b, _SEQUENCES):
            n = len(b) * a
        else:
            return 0
        if n > self.max_len:
            raise self.too_big(what, n)
        return n

    def mul(self, a: Any, b: Any) -> Any:
        if type(a) is float or type(b) is float:
            return a * b
        n = self._mul_check(a, b, "*")
        result = a * b
        self.big_result(n)
        return result

    def imul(self, a: Any, b: Any) -> Any:
        if type(a) is float or type(b) is float:
            return a * b
        n = self._mul_check(a, b, "*=")
        result = operator.imul(a, b)
        self.big_result(n)
        return result

    def pow(self, a: Any, b: Any, mod: Any = None) -> Any:
        if isinstance(a, int) and isinstance(b, int):
            if mod is not None:
                if isinstance(mod, int) and b > 0:
                    digits = mod.bit_length() / 30 + 1
                    if b.bit_length() * digits * digits > _POWMOD_COST:
                        raise MemoryError("pow(a, b, m) with such large numbers is too slow for the sandbox")
                return builtins.pow(a, b, mod)
            if b > 0 and abs(a) > 1 and (b > self.max_bits or math.log2(abs(a)) * b > self.max_bits):
                raise self.int_too_big("**")
        if mod is not None:
            return builtins.pow(a, b, mod)
        return a**b

    def lshift(self, a: Any, b: Any) -> Any:
        if isinstance(a, int) and isinstance(b, int) and a and b > 0 and a.bit_length() + b > self.max_bits:
            raise self.int_too_big("<<")
        return a << b

    def mod(self, a: Any, b: Any) -> Any:
        if isinstance(a, (str, bytes)):
            fmt = a if isinstance(a, str) else a.decode("latin-1")
            star = False
            for m in _PERCENT.finditer(fmt):
                for group in m.groups():
                    if group == "*":
                        star = True
                    elif group and (len(group) > 9 or int(group) > self.max_len):
                        raise MemoryError(f"%-format width/precision {group} is too large for the sandbox")
            if star:
                for v in b if isinstance(b, tuple) else (b,):
                    if isinstance(v, int) and v > self.max_len:
                        raise MemoryError(f"%-format width {v} is too large for the sandbox")
            self.check_text(b)
        return a % b

    def star(self, value: Any) -> Any:
        self.check_iter(value, "*-unpacking")
        return value

    def contains(self, item: Any, container: Any) -> bool:
        if type(container) is range and type(item) not in (int, bool) and self.is_huge(container):
            return any(v == item for v in self.ticking(container))
        return item in container

    # --- text ----------------------------------------------------------------------------------------
    def check_text(self, obj: Any) -> None:
        if type(obj) in (str, float, bool, type(None)):
            return
        budget = min(self.max_len, _TEXT_BUDGET)
        if _text_cost(obj, budget, self.tick) > budget:
            raise MemoryError(
                "object is too large to convert to text in the sandbox "
                f"(more than {budget:,} characters, or an int over {_INT_TEXT_BITS} bits)"
            )

    def text(self, obj: Any, use_repr: bool) -> str:
        if type(obj) is str:
            return repr(obj) if use_repr else obj
        self.check_text(obj)
        return repr(obj) if use_repr else str(obj)

    def check_spec(self, spec: Any) -> None:
        if isinstance(spec, str):
            for d in _DIGITS.findall(spec):
                if len(d) > 9 or int(d) > self.max_len:
                    raise MemoryError(f"format width/precision {d} is too large for the sandbox")

    def safe_format(self, value: Any, spec: Any = "") -> str:
        if spec:
            self.check_spec(spec)
        t = type(value)
        if t is not str and t is not float:
            self.check_text(value)
        return format(value, spec)

    def fmt(self, value: Any, conversion: int, spec: Any) -> str:
        """One f-string field ``{value!conversion:spec}``."""
        if conversion == -1 and spec is None and type(value) is str:
            return value
        if conversion == 115:  # !s
            value = self.text(value, False)
        elif conversion == 114:  # !r
            value = self.text(value, True)
        elif conversion == 97:  # !a
            self.check_text(value)
            value = ascii(value)
        return self.safe_format(value, "" if spec is None else spec)

    def print_text(self, obj: Any) -> str:
        if type(obj) is str:
            return obj
        if _text_cost(obj, _PRINT_BUDGET, self.tick) <= _PRINT_BUDGET:
            return str(obj)
        return _short_repr.repr(obj)

    # --- checks inserted by the rewrite --------------------------------------------------------------
    def tick(self) -> bool:
        st = self.sb._state
        if st is None or st.aborted is not None or perf_counter() > st.next_check:
            self._tick_slow(st)
        return True

    def _tick_slow(self, st: _CellState | None) -> None:
        top = _current()
        if st is None or top is not st:
            raise _Abort("outside", "SandboxError: cell code ran outside of its cell")
        st.check()

    def exc_guard(self) -> None:
        """First statement of every ``except`` handler in cell code: aborts cannot be swallowed."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (_Abort, asyncio.CancelledError, GeneratorExit, KeyboardInterrupt)):
            raise exc
        top = _current()
        if top is None or top.owner is not self.sb:
            raise _Abort("outside", "SandboxError: cell code ran outside of its cell")
        if top.aborted is not None:
            raise top.aborted

    def fin_ok(self) -> bool:
        """Guard of every ``finally`` body: skipped once the cell is aborted or outside a cell."""
        top = _current()
        return top is not None and top.owner is self.sb and top.aborted is None

    # --- restricted builtins -------------------------------------------------------------------------
    def g_list(self, *args: Any) -> list:
        if args:
            self.check_iter(args[0], "list()")
        return list(*args)

    def g_tuple(self, *args: Any) -> tuple:
        if args:
            self.check_iter(args[0], "tuple()")
        return tuple(*args)

    def g_set(self, *args: Any) -> set:
        if args:
            self.check_iter(args[0], "set()")
        return set(*args)

    def g_frozenset(self, *args: Any) -> frozenset:
        if args:
            self.check_iter(args[0], "frozenset()")
        return frozenset(*args)

    def g_dict(self, *args: Any, **kwargs: Any) -> dict:
        if args:
            self.check_iter(args[0], "dict()")
        return dict(*args, **kwargs)

    def g_str(self, *args: Any, **kwargs: Any) -> str:
        if len(args) == 1 and not kwargs:
            return self.text(args[0], False)
        if "object" in kwargs:
            self.check_text(kwargs["object"])
        return str(*args, **kwargs)

    def g_repr(self, obj: Any) -> str:
        return self.text(obj, True)

    def g_ascii(self, obj: Any) -> str:
        self.check_text(obj)
        return ascii(obj)

    def g_format(self, value: Any, format_spec: str = "") -> str:
        return self.safe_format(value, format_spec)

    def g_int(self, *args: Any, **kwargs: Any) -> int:
        if args and isinstance(args[0], (str, bytes, bytearray)) and len(args[0]) > _INT_PARSE_CHARS:
            raise ValueError(f"int() of a string longer than {_INT_PARSE_CHARS} characters is not allowed")
        return int(*args, **kwargs)

    def g_type(self, *args: Any, **kwargs: Any) -> type:
        if len(args) != 1 or kwargs:
            raise SandboxViolation("type() can only be called with one argument in the sandbox")
        return type(args[0])

    def _g_bytes_like(self, cls: type, args: tuple, kwargs: dict) -> Any:
        if args:
            if isinstance(args[0], int):
                if args[0] > self.max_len:
                    raise self.too_big(f"{cls.__name__}()", args[0])
            else:
                self.check_iter(args[0], f"{cls.__name__}()")
        return cls(*args, **kwargs)

    def g_bytes(self, *args: Any, **kwargs: Any) -> bytes:
        return self._g_bytes_like(bytes, args, kwargs)

    def g_bytearray(self, *args: Any, **kwargs: Any) -> bytearray:
        return self._g_bytes_like(bytearray, args, kwargs)

    def g_map(self, fn: Any, *iterables: Any) -> Any:
        result = map(self.wrapfn(fn), *iterables)
        return self.ticking(result) if any(self.is_huge(i) for i in iterables) else result

    def g_filter(self, fn: Any, iterable: Any) -> Any:
        result = filter(self.wrapfn(fn), iterable)
        return self.ticking(result) if self.is_huge(iterable) else result

    def g_zip(self, *iterables: Any, **kwargs: Any) -> Any:
        result = zip(*iterables, **kwargs)  # noqa: B905 (strict= passes through kwargs)
        return self.ticking(result) if any(self.is_huge(i) for i in iterables) else result

    def g_enumerate(self, iterable: Any, start: int = 0) -> Any:
        result = enumerate(iterable, start)
        return self.ticking(result) if self.is_huge(iterable) else result

    def g_reversed(self, seq: Any) -> Any:
        result = reversed(seq)
        return self.ticking(result) if self.is_huge(seq) else result

    def g_iter(self, obj: Any, *sentinel: Any) -> Any:
        if sentinel:
            return self._call_until(obj, sentinel[0])
        result = iter(obj)
        return self.ticking(result) if self.is_huge(obj) else result

    def _call_until(self, fn: Any, sentinel: Any) -> Any:
        call, tick = self.call, self.tick
        while True:
            tick()
            value = call(fn)
            if value == sentinel:
                return
            yield value

    def g_sorted(self, iterable: Any, /, *, key: Any = None, reverse: bool = False) -> list:
        self.check_iter(iterable, "sorted()")
        return sorted(iterable, key=self.wrapfn(key), reverse=reverse)

    def g_sum(self, iterable: Any, /, start: Any = 0) -> Any:
        self.check_iter(iterable, "sum()")
        if isinstance(start, (int, float, complex)):
            return sum(iterable, start)
        total = start
        for i, x in enumerate(iterable):  # sequences: guarded concatenation, interruptible
            if not i & 1023:
                self.tick()
            total = self.add(total, x)
        return total

    def _minmax(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if len(args) == 1:
            self.check_iter(args[0], f"{fn.__name__}()")
        if "key" in kwargs:
            kwargs = {**kwargs, "key": self.wrapfn(kwargs["key"])}
        return fn(*args, **kwargs)

    def g_min(self, *args: Any, **kwargs: Any) -> Any:
        return self._minmax(min, args, kwargs)

    def g_max(self, *args: Any, **kwargs: Any) -> Any:
        return self._minmax(max, args, kwargs)

    def g_any(self, iterable: Any) -> bool:
        return any(self.ticking(iterable) if self.is_huge(iterable) else iterable)

    def g_all(self, iterable: Any) -> bool:
        return all(self.ticking(iterable) if self.is_huge(iterable) else iterable)

    def g_round(self, number: Any, ndigits: Any = None) -> Any:
        if ndigits is None:
            return round(number)
        if isinstance(number, int) and isinstance(ndigits, int) and ndigits < -(self.max_bits // 3):
            raise self.int_too_big("round()")
        return round(number, ndigits)

    def g_print(
        self, *args: Any, sep: Any = " ", end: Any = "\n", file: Any = None, flush: bool = False
    ) -> None:
        if file is not None:
            raise SandboxViolation("print(file=...) is not supported in the sandbox")
        sep = " " if sep is None else sep
        end = "\n" if end is None else end
        if not isinstance(sep, str) or not isinstance(end, str):
            raise TypeError("print(): sep and end must be None or a string")
        st = self.sb._state
        if st is None or st.truncated:
            return
        st.write(sep.join([self.print_text(a) for a in args]) + end)

    def g_import(
        self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if name == "asyncio" and level == 0:
            return self.sb._asyncio
        raise SandboxViolation(f"import of {name!r} is not allowed (only `import asyncio` is available)")

    def g_build_class(self, func: Any, name: str, /, *bases: Any, **kwargs: Any) -> type:
        if kwargs:
            raise SandboxViolation("class keyword arguments (such as metaclass=...) are not allowed")
        for base in bases:
            if isinstance(base, type) and issubclass(base, type):
                raise SandboxViolation("metaclasses (subclasses of type) are not allowed in the sandbox")
        return builtins.__build_class__(func, name, *bases)

    # --- asyncio proxy -------------------------------------------------------------------------------
    def adopt(self, aw: Any) -> Any:
        """Awaitables handed to asyncio: cell coroutines keep running under the cell's accounting."""
        if isinstance(aw, types.CoroutineType) and aw.cr_code.co_filename.startswith(_CELL_PREFIX):
            st = self.sb._state
            if st is None:
                raise SandboxViolation("asyncio used outside of a running cell")
            return _Driven(aw, st, contain=True)
        return aw

    def a_gather(self, *aws: Any, return_exceptions: bool = False) -> Any:
        fut = asyncio.gather(*[self.adopt(a) for a in aws], return_exceptions=return_exceptions)
        st = self.sb._state
        if st is not None:
            st.spawned.append(fut)
        return fut

    def a_wait_for(self, aw: Any, timeout: Any) -> Any:
        return asyncio.wait_for(self.adopt(aw), timeout)

    async def a_sleep(self, delay: Any, result: Any = None) -> Any:
        delay = float(delay)
        if not math.isfinite(delay):
            raise ValueError("asyncio.sleep() needs a finite number of seconds")
        st = self.sb._state
        if st is not None and delay > 0:
            st.used += delay  # sleeping is the cell's own time
            if st.used > st.limit:
                raise st.abort(
                    "timeout", f"TimeoutError: asyncio.sleep() would exceed the cell's {st.limit:g} s limit"
                )
        return await asyncio.sleep(delay, result)

    def builtins(self) -> dict[str, Any]:
        safe = {
            name: getattr(builtins, name)
            for name in (
                "abs", "all", "any", "bin", "bool", "callable", "chr", "classmethod", "complex", "dict",
                "divmod", "enumerate", "filter", "float", "frozenset", "hash", "hex", "int", "isinstance",
                "issubclass", "len", "list", "map", "next", "object", "oct", "ord", "range", "reversed",
                "set", "slice", "staticmethod", "str", "super", "tuple", "type", "zip", "NotImplemented",
                "Ellipsis", "BaseException", "Exception", "ArithmeticError", "AssertionError",
                "AttributeError", "IndexError", "KeyError", "LookupError", "NameError",
                "NotImplementedError", "OverflowError", "RecursionError", "RuntimeError", "StopIteration",
                "StopAsyncIteration", "SystemExit", "TimeoutError", "TypeError", "UnboundLocalError",
                "ValueError", "ZeroDivisionError", "MemoryError", "UnicodeError", "Warning",
            )
        }  # fmt: skip
        safe.update(
            print=self.g_print,
            repr=self.g_repr,
            ascii=self.g_ascii,
            format=self.g_format,
            sorted=self.g_sorted,
            sum=self.g_sum,
            min=self.g_min,
            max=self.g_max,
            any=self.g_any,
            all=self.g_all,
            pow=self.pow,
            round=self.g_round,
            iter=self.g_iter,
            __import__=self.g_import,
            __build_class__=self.g_build_class,
            __sb_call__=self.call,
            __sb_add__=self.add,
            __sb_iadd__=self.iadd,
            __sb_mul__=self.mul,
            __sb_imul__=self.imul,
            __sb_pow__=self.pow,
            __sb_lshift__=self.lshift,
            __sb_mod__=self.mod,
            __sb_star__=self.star,
            __sb_contains__=self.contains,
            __sb_fmt__=self.fmt,
            __sb_tick__=self.tick,
            __sb_exc_guard__=self.exc_guard,
            __sb_fin_ok__=self.fin_ok,
            __sb_slice__=slice,
        )
        return safe


# ---------------------------------------------------------------------------------------------------
# 6. The sandbox
# ---------------------------------------------------------------------------------------------------


def _wrap_tool(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Expose a tool as a plain function (no public attributes reach the host object); a returned
    coroutine is awaited outside the cell's clock and tracer."""

    def tool(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if type(result) in _NOT_HUGE or type(result) in (list, dict, tuple):
            return result
        if inspect.isawaitable(result):
            return _Driven(result, None)
        return result

    tool.__name__ = tool.__qualname__ = getattr(fn, "__name__", "tool")
    tool.__doc__ = getattr(fn, "__doc__", None)
    return tool


class Sandbox:
    """One agent's persistent, restricted Python namespace. ``await run(code)`` executes one cell.

    >>> import asyncio
    >>> sb = Sandbox({"double": lambda x: 2 * x})
    >>> asyncio.run(sb.run("y = double(21)\\nprint(y)")).stdout
    '42\\n'
    >>> asyncio.run(sb.run("import os")).error.splitlines()[-1]
    "SandboxViolation: import of 'os' is not allowed (only `import asyncio` is available)"
    """

    def __init__(self, tools: dict[str, Callable[..., Any]], limits: SandboxLimits | None = None):
        self.limits = limits or SandboxLimits()
        self._state: _CellState | None = None
        self._cells = 0
        self._busy = False
        self._sources: dict[str, list[str]] = {}
        self._guards = _Guards(self)
        proxy = _AsyncioProxy()
        proxy.gather = self._guards.a_gather
        proxy.sleep = self._guards.a_sleep
        proxy.wait_for = self._guards.a_wait_for
        proxy.TimeoutError = TimeoutError
        self._asyncio = proxy
        self.namespace: dict[str, Any] = {
            "__builtins__": self._guards.builtins(),
            "__name__": "__sandbox__",
            "asyncio": proxy,
        }
        """The cell's persistent globals (read it; do not write into it while a cell runs)."""
        for name, fn in tools.items():
            if not name.isidentifier() or name.startswith("_"):
                raise ValueError(f"tool name {name!r} must be an identifier not starting with '_'")
            if fn is asyncio:
                continue  # the sandboxed proxy stands in for the real module
            if isinstance(fn, types.ModuleType) or not callable(fn):
                raise ValueError(
                    f"tool {name!r} must be a callable (modules and other objects are not exposed)"
                )
            self.namespace[name] = _wrap_tool(fn)

    async def run(self, code: str) -> CellResult:
        """Execute one cell in the persistent namespace; never raises for anything the cell does."""
        if self._busy:
            return CellResult("", "SandboxError: another cell is still running in this sandbox")
        self._busy = True
        try:
            return await self._run(code)
        finally:
            self._busy = False

    # --- internals -------------------------------------------------------------------------------------
    def _compile(self, code: str, filename: str) -> tuple[types.CodeType | None, str | None]:
        if not isinstance(code, str):
            return None, f"SandboxError: cell code must be a str, got {type(code).__name__}"
        lines = code.splitlines()
        self._sources[filename] = lines
        try:
            tree = ast.parse(code, filename=filename, mode="exec")
            checker = _Validator()
            checker.visit(tree)
            if checker.problem is not None:
                line, message = checker.problem
                src = lines[line - 1].strip() if 0 < line <= len(lines) else ""
                where = f'  File "{filename}", line {line}\n' + (f"    {src}\n" if src else "")
                return None, f"{where}SandboxViolation: {message}"
            tree = _Transformer().visit(tree)
            flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
            try:
                return compile(tree, filename, "exec", flags=flags, dont_inherit=True), None
            except (TypeError, ValueError):  # a rewritten node without a location: fill them all
                tree = ast.fix_missing_locations(tree)
                return compile(tree, filename, "exec", flags=flags, dont_inherit=True), None
        except SyntaxError as e:
            return None, "".join(_format_syntax_error(e)).rstrip()
        except (RecursionError, MemoryError, ValueError, OverflowError) as e:
            return None, f"SyntaxError: the cell could not be compiled ({type(e).__name__}: {e})"
        except Exception as e:  # a bug of the rewrite must not take the agent down
            return None, f"SandboxError: internal error while compiling the cell ({type(e).__name__}: {e})"

    async def _run(self, code: str) -> CellResult:
        self._cells += 1
        filename = f"{_CELL_PREFIX}{self._cells}>"
        codeobj, error = self._compile(code, filename)
        if codeobj is None:
            return CellResult("", error)
        state = _CellState(self, self.limits)
        self._state = state
        error = None
        timed_out = False
        try:
            if codeobj.co_flags & inspect.CO_COROUTINE:
                await _Driven(eval(codeobj, self.namespace), state)  # noqa: S307 (validated cell code)
            else:
                _push(state)
                try:
                    exec(codeobj, self.namespace)  # noqa: S102 (validated cell code)
                finally:
                    _pop()
        except _Abort as e:
            error = self._format_error(e)
            timed_out = e.kind == "timeout"
        except asyncio.CancelledError as e:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                self._end(state)
                raise
            error = self._format_error(e)
        except (Exception, SystemExit, GeneratorExit) as e:
            error = self._format_error(e)
        if error is None and state.aborted is not None:  # swallowed by CPython (e.g. in a finalizer)
            error = self._format_error(state.aborted)
            timed_out = state.aborted.kind == "timeout"
        notes = self._end(state)
        stdout = "".join(state.out)
        if state.truncated:
            stdout += f"\n[... output truncated: only the first {state.cap} characters are shown ...]\n"
        if notes:
            stdout += "".join(notes)
        return CellResult(stdout=stdout, error=error, timed_out=timed_out)

    def _end(self, state: _CellState) -> list[str]:
        notes = []
        if state.aborted is None:
            state.aborted = _Abort("ended", "SandboxError: the cell has already finished")
        for fut in state.spawned:
            if not fut.done():
                fut.cancel()
                notes.append("[Warning] an asyncio.gather(...) was never awaited, so it was cancelled.\n")
        if self._state is state:
            self._state = None
        return notes[:1]

    def _format_error(self, exc: BaseException) -> str:
        frames = []
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_filename.startswith(_CELL_PREFIX):
                frames.append((code.co_filename, tb.tb_lineno, code.co_name))
            tb = tb.tb_next
        lines = []
        if frames:
            lines.append("Traceback (most recent call last):")
            if len(frames) > _MAX_TB_FRAMES:
                skipped = len(frames) - _MAX_TB_FRAMES
                frames = frames[:2] + [None] + frames[-(_MAX_TB_FRAMES - 2) :]  # type: ignore[list-item]
            for fr in frames:
                if fr is None:
                    lines.append(f"  [... {skipped} more frames ...]")
                    continue
                filename, lineno, name = fr
                lines.append(f'  File "{filename}", line {lineno}, in {name}')
                src = self._sources.get(filename, [])
                if 0 < lineno <= len(src) and src[lineno - 1].strip():
                    lines.append(f"    {src[lineno - 1].strip()}")
        lines.append(self._exception_line(exc))
        return "\n".join(lines)

    def _exception_line(self, exc: BaseException) -> str:
        if isinstance(exc, _Abort):
            return exc.message
        name = type(exc).__name__
        try:
            self._guards.check_text(exc)
            message = str(exc)
        except (MemoryError, ValueError):
            message = _short_repr.repr(exc.args)
        if len(message) > 2000:
            message = message[:2000] + " ...(truncated)"
        if isinstance(exc, NameError) and getattr(exc, "name", None) in _UNAVAILABLE:
            message += f" ({exc.name} is not available in the sandbox)"
        return f"{name}: {message}" if message else name


def _format_syntax_error(e: SyntaxError) -> list[str]:
    return traceback.format_exception_only(type(e), e)
