"""What the paper's IPython shell prints for a cell, rewritten for the CodeAct worker (standard library only).

The paper's executor (platoon ``envs/codeact/env.py: IPythonCodeExecutor``) runs each cell with
``InteractiveShellEmbed.run_cell_async`` (IPython 9.4, ``ipython>=9.4,<10`` in SERA's runtime requirements)
inside platoon's ``ShellCapture``, and the model reads what the shell wrote to stdout and stderr. Two of
those texts are produced by IPython's own code, so the worker (which runs plain Python, not IPython) makes
them here, measured against IPython 9.4.0 (``tests/fixtures/ipython94_layout.json``):

* :func:`display_text`: the value of a cell's last expression, as IPython's displayhook prints it:
  ``Out[1]: `` + the value by IPython's pretty printer (``IPython.lib.pretty``: 79 columns, dicts in
  insertion order, sets sorted, strings as one ``repr`` line never split) + a newline; a value whose text
  spans several lines starts on the line after the prompt. The count is always 1: platoon calls
  ``run_cell_async`` without ``store_history``, so the shell's execution count never leaves 1.
* :func:`format_traceback`: an exception the cell raised, as IPython's context-mode traceback (it goes to
  stdout, i.e. to the observation's output slot): a line of 75 dashes, ``NameError`` padded to
  ``Traceback (most recent call last)``, then each frame as ``Cell In[1], line k`` (``, in f(a)`` inside a
  function; ``File <ipython-input-1-...>:k`` in every shell but the process's first, see :func:`cell_label`)
  with up to 2 statements of context either side and ``----> k`` on the failing line, a blank
  line, and ``NameError: name 'x' is not defined``; chained exceptions come first with 1 statement of
  context and IPython's "direct cause" / "During handling" lines. Only the cell's own frames are shown
  (IPython also shows frames of library code, by file path; the worker's tool proxies are not the paper's
  tools); frames repeated more than 3 times (recursion) are collapsed as stack_data does.

:func:`pretty` is IPython's line-breaking algorithm (a greedy Wadler-style printer: a group whose text
does not fit breaks all its separators, outermost groups first) over the same printers for built-in
types; other objects print their ``repr`` (IPython uses ``_repr_pretty_`` where an object has one).

Run: ``pytest tests/test_codeact_layout.py``.
"""

from __future__ import annotations

import ast
import collections
import hashlib
import inspect
import linecache
import textwrap
import types

DISPLAY_COUNT = 1
"""The ``n`` of ``Out[n]:`` and ``Cell In[n]``: the IPython shell's execution count under platoon (see above)."""
WIDTH = 79
"""IPython's ``PlainTextFormatter.max_width``."""
MAX_SEQ_LENGTH = 1000
"""IPython's ``PlainTextFormatter.max_seq_length``: items past it print as ``...``."""
TOP_LINE_WIDTH = 75
"""IPython's traceback width: ``min(75, terminal columns)``; a captured shell has no terminal (80 columns)."""
CONTEXT, CHAINED_CONTEXT = 5, 3
"""IPython's ``context`` for the raised exception and for the exceptions chained before it."""
MAX_LINES_PER_PIECE = 6
"""stack_data's ``max_lines_per_piece``: a context statement longer than this is cut in its middle."""


# --- the pretty printer ------------------------------------------------------------------------------------
class _Group:
    __slots__ = ("depth", "separators", "broken")

    def __init__(self, depth: int):
        self.depth, self.separators, self.broken = depth, collections.deque(), False


class _Text:
    __slots__ = ("parts", "width")

    def __init__(self):
        self.parts: list[str] = []
        self.width = 0

    def emit(self, printer: _Printer, column: int) -> int:
        printer.out.extend(self.parts)
        return column + self.width


class _Separator:
    __slots__ = ("text", "width", "indent", "group")

    def __init__(self, text: str, printer: _Printer):
        self.text, self.width, self.indent = text, len(text), printer.indent
        self.group = printer.groups[-1]
        self.group.separators.append(self)

    def emit(self, printer: _Printer, column: int) -> int:
        self.group.separators.popleft()
        if self.group.broken:
            printer.out.append("\n" + " " * self.indent)
            return self.indent
        if not self.group.separators:
            printer.pending_remove(self.group)
        printer.out.append(self.text)
        return column + self.width


class _Printer:
    """IPython's ``PrettyPrinter`` state machine: text is buffered while it may still need a line break."""

    def __init__(self, width: int = WIDTH, max_items: int = MAX_SEQ_LENGTH):
        self.width, self.max_items = width, max_items
        self.out: list[str] = []
        self.column = 0  # width already written on the current line
        self.buffered = 0  # width of the buffer
        self.buffer: collections.deque = collections.deque()
        self.indent = 0
        root = _Group(0)
        self.groups = [root]
        self.pending: list[list[_Group]] = []  # groups that may still break, by depth
        self._enqueue(root)
        self.active: list[int] = []  # ids of the containers being printed (cycles)

    # queue of groups, outermost first
    def _enqueue(self, group: _Group) -> None:
        while len(self.pending) <= group.depth:
            self.pending.append([])
        self.pending[group.depth].append(group)

    def pending_remove(self, group: _Group) -> None:
        level = self.pending[group.depth] if group.depth < len(self.pending) else []
        if group in level:
            level.remove(group)

    def _next_to_break(self) -> _Group | None:
        for level in self.pending:
            # IPython scans the level from its end but deletes by the scan's position counted from the
            # start; kept as it is, since it decides which group stays queued
            for pos, group in enumerate(reversed(level)):
                if group.separators:
                    del level[pos]
                    group.broken = True
                    return group
            for group in level:
                group.broken = True
            level.clear()
        return None

    def _break(self, group: _Group) -> None:
        while group.separators:
            item = self.buffer.popleft()
            self.column = item.emit(self, self.column)
            self.buffered -= item.width
        while self.buffer and isinstance(self.buffer[0], _Text):
            item = self.buffer.popleft()
            self.column = item.emit(self, self.column)
            self.buffered -= item.width

    def _fit(self) -> None:
        while self.column + self.buffered > self.width:
            group = self._next_to_break()
            if group is None:
                return
            self._break(group)

    # the operations the type printers use
    def text(self, s: str) -> None:
        if not self.buffer:
            self.out.append(s)
            self.column += len(s)
            return
        last = self.buffer[-1]
        if not isinstance(last, _Text):
            last = _Text()
            self.buffer.append(last)
        last.parts.append(s)
        last.width += len(s)
        self.buffered += len(s)
        self._fit()

    def separator(self, s: str = " ") -> None:
        if self.groups[-1].broken:
            self.flush()
            self.out.append("\n" + " " * self.indent)
            self.column, self.buffered = self.indent, 0
        else:
            self.buffer.append(_Separator(s, self))
            self.buffered += len(s)
            self._fit()

    def newline(self) -> None:
        group = self._next_to_break()
        if group is not None:
            self._break(group)
        self.flush()
        self.out.append("\n" + " " * self.indent)
        self.column, self.buffered = self.indent, 0

    def open(self, indent: int = 0, s: str = "") -> None:
        if s:
            self.text(s)
        group = _Group(self.groups[-1].depth + 1)
        self.groups.append(group)
        self._enqueue(group)
        self.indent += indent

    def close(self, dedent: int = 0, s: str = "") -> None:
        self.indent -= dedent
        group = self.groups.pop()
        if not group.separators:
            self.pending_remove(group)
        if s:
            self.text(s)

    def flush(self) -> None:
        for item in self.buffer:
            self.column += item.emit(self, self.column)
        self.buffer.clear()
        self.buffered = 0

    def items(self, seq):
        for i, x in enumerate(seq):
            if self.max_items and i >= self.max_items:
                self.text(",")
                self.separator()
                self.text("...")
                return
            yield i, x

    # values
    def value(self, obj) -> None:
        cycle = id(obj) in self.active
        self.active.append(id(obj))
        self.open()
        try:
            _print_value(self, obj, cycle)
        finally:
            self.close()
            self.active.pop()


def _repr_lines(p: _Printer, obj, cycle: bool) -> None:
    p.open()
    for i, line in enumerate(repr(obj).splitlines()):
        if i:
            p.newline()
        p.text(line)
    p.close()


def _sequence(start: str, end: str):
    def show(p: _Printer, obj, cycle: bool) -> None:
        if cycle:
            p.text(start + "..." + end)
            return
        p.open(len(start), start)
        for i, x in p.items(obj):
            if i:
                p.text(",")
                p.separator()
            p.value(x)
        if len(obj) == 1 and isinstance(obj, tuple):
            p.text(",")
        p.close(len(start), end)

    return show


def _ordered(items) -> list:
    items = list(items)
    for key in (None, str):
        try:
            return sorted(items, key=key)
        except Exception:  # noqa: BLE001 -- unorderable: try the next way, then keep the order
            continue
    return items


def _set(start: str, end: str):
    def show(p: _Printer, obj, cycle: bool) -> None:
        if cycle:
            p.text(start + "..." + end)
        elif not obj:
            p.text(type(obj).__name__ + "()")
        else:
            p.open(len(start), start)
            items = obj if p.max_items and len(obj) >= p.max_items else _ordered(obj)
            for i, x in p.items(items):
                if i:
                    p.text(",")
                    p.separator()
                p.value(x)
            p.close(len(start), end)

    return show


def _mapping(start: str, end: str):
    def show(p: _Printer, obj, cycle: bool) -> None:
        if cycle:
            p.text("{...}")
            return
        p.open(len(start), start)
        for i, key in p.items(obj.keys()):
            if i:
                p.text(",")
                p.separator()
            p.value(key)
            p.text(": ")
            p.value(obj[key])
        p.close(len(start), end)

    return show


class _Raw:
    def __init__(self, text: str):
        self.text = text


class _Call:
    """``name(arg, ..., key=value)`` with IPython's line breaking (``CallExpression``)."""

    def __init__(self, name: str, *args, **kwargs):
        self.name, self.args, self.kwargs = name, args, kwargs


def _call(p: _Printer, obj: _Call, cycle: bool) -> None:
    first = True
    prefix = obj.name + "("
    p.open(len(prefix), prefix)
    for arg in obj.args:
        if not first:
            p.text(",")
            p.separator()
        first = False
        p.value(arg)
    for key, arg in obj.kwargs.items():
        if not first:
            p.text(",")
            p.separator()
        first = False
        p.open(len(key) + 1, key + "=")
        p.value(arg)
        p.close(len(key) + 1)
    p.close(len(prefix), ")")


def _qualified(obj, name: str) -> str:
    mod = getattr(obj, "__module__", None)
    return name if mod in (None, "__builtin__", "builtins", "exceptions") else f"{mod}.{name}"


def _type(p: _Printer, obj, cycle: bool) -> None:
    if [m for m in type(obj).__mro__ if "__repr__" in vars(m)][:1] != [type]:
        _repr_lines(p, obj, cycle)
        return
    name = getattr(obj, "__qualname__", None)
    p.text(_qualified(obj, name if isinstance(name, str) else getattr(obj, "__name__", "<unknown type>")))


def _function(p: _Printer, obj, cycle: bool) -> None:
    name = getattr(obj, "__qualname__", obj.__name__)
    mod = obj.__module__
    if mod and mod not in ("__builtin__", "builtins", "exceptions"):
        name = mod + "." + name
    try:
        name += str(inspect.signature(obj))
    except (ValueError, TypeError):
        pass
    p.text(f"<function {name}>")


def _exception(p: _Printer, obj, cycle: bool) -> None:
    cls = obj.__class__
    p.value(_Call(_qualified(cls, getattr(cls, "__qualname__", cls.__name__)), *getattr(obj, "args", ())))


def _named_call(build):
    def show(p: _Printer, obj, cycle: bool) -> None:
        name = obj.__class__.__name__
        p.value(_Call(name, _Raw("...")) if cycle else build(name, obj))

    return show


_BY_TYPE = {
    int: _repr_lines, float: _repr_lines, str: _repr_lines, bytes: _repr_lines, range: _repr_lines,
    slice: _repr_lines, tuple: _sequence("(", ")"), list: _sequence("[", "]"), dict: _mapping("{", "}"),
    set: _set("{", "}"), frozenset: _set("frozenset({", "})"), type: _type,
    types.FunctionType: _function, types.BuiltinFunctionType: _function, types.MethodType: _repr_lines,
    types.MappingProxyType: _mapping("mappingproxy({", "})"), BaseException: _exception,
    collections.defaultdict: _named_call(lambda n, o: _Call(n, o.default_factory, dict(o))),
    collections.OrderedDict: _named_call(lambda n, o: _Call(n, list(o.items())) if o else _Call(n)),
    collections.deque: _named_call(
        lambda n, o: _Call(n, list(o), maxlen=o.maxlen) if o.maxlen is not None else _Call(n, list(o))
    ),
    collections.Counter: _named_call(lambda n, o: _Call(n, dict(o.most_common())) if o else _Call(n)),
}  # fmt: skip
"""IPython's printers for built-in types (``_type_pprinters`` and the ``collections`` ones by name)."""


def _print_value(p: _Printer, obj, cycle: bool) -> None:
    if isinstance(obj, _Raw):
        p.text(obj.text)
        return
    if isinstance(obj, _Call):
        _call(p, obj, cycle)
        return
    cls = type(obj)
    for base in cls.__mro__:
        show = _BY_TYPE.get(base)
        if show is not None:
            show(p, obj, cycle)
            return
        if base is not object and "__repr__" in vars(base):
            _repr_lines(p, obj, cycle)
            return
    if cls.__repr__ is not object.__repr__:
        _repr_lines(p, obj, cycle)
        return
    p.open(1, "<")
    p.value(cls)
    p.text(f" at 0x{id(obj):x}")
    if cycle:
        p.text(" ...")
    p.close(1, ">")


def pretty(obj, width: int = WIDTH) -> str:
    """``obj`` as IPython's pretty printer writes it.

    >>> pretty({"b": 1, "a": "x" * 3})
    "{'b': 1, 'a': 'xxx'}"
    >>> print(pretty(list(range(30))[:3] + ["y" * 80]))
    [0,
     1,
     2,
     'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy']
    """
    p = _Printer(width)
    p.value(obj)
    p.flush()
    return "".join(p.out)


def display_text(value, count: int = DISPLAY_COUNT) -> str:
    """What IPython's displayhook writes for a cell's last-expression ``value`` (not None).

    >>> display_text("Error: a\\nb")
    "Out[1]: 'Error: a\\\\nb'\\n"
    >>> display_text(list(range(30)))[:12]
    'Out[1]: \\n[0,'
    """
    text = pretty(value)
    return f"Out[{count}]: " + ("\n" if "\n" in text else "") + text + "\n"


# --- tracebacks --------------------------------------------------------------------------------------------
def _line_range(node: ast.AST) -> tuple[int, int]:
    """Half-open line range of a statement, decorators included (as asttokens gives it)."""
    start = node.lineno
    for deco in getattr(node, "decorator_list", ()):
        start = min(start, deco.lineno)
    if isinstance(node, getattr(ast, "match_case", ())):
        return node.pattern.lineno, node.body[-1].end_lineno + 1
    return start, node.end_lineno + 1


def _is_statement_list(value) -> bool:
    kinds = (ast.stmt, ast.ExceptHandler, getattr(ast, "match_case", ast.ExceptHandler))
    return isinstance(value, list) and bool(value) and isinstance(value[0], kinds)


def _split(node: ast.AST, start: int, end: int):
    """stack_data's raw pieces: every (nested) statement's lines, and the lines between them."""
    for _name, body in ast.iter_fields(node):
        if not _is_statement_list(body):
            continue
        by_range: dict[tuple[int, int], ast.AST] = {}
        for child in body:
            by_range.setdefault(_line_range(child), child)
        for rng in sorted(by_range):
            for inner_start, inner_end in _split(by_range[rng], *rng):
                if start < inner_start:
                    yield start, inner_start
                if inner_start < inner_end:
                    yield inner_start, inner_end
                start = inner_end
    yield start, end


def _pieces(tree: ast.Module, lines: list[str]) -> list[range]:
    merged: list[tuple[int, int]] = []
    for start, end in _split(tree, 1, len(lines) + 1):
        if end <= start:
            continue
        if merged and start < merged[-1][1]:  # two statements on one line (``a = 1; b = 2``)
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))

    def blank(i: int) -> bool:
        return 1 <= i <= len(lines) and not lines[i - 1].strip()

    out = []
    for start, end in merged:
        while start < end and blank(start):
            start += 1
        while end > start and blank(end - 1):
            end -= 1
        if start < end:
            out.append(range(start, end))
    return out


def _scope(tree: ast.Module, lineno: int) -> tuple[int, int] | None:
    """Line range of the innermost function or class around the statement running at ``lineno``
    (None: the module)."""
    scopes: list[ast.AST] = []
    node: ast.AST = tree
    while True:
        inner = None
        for _name, body in ast.iter_fields(node):
            if _is_statement_list(body):
                for child in body:
                    lo, hi = _line_range(child)
                    if lo <= lineno < hi:
                        inner = child
                        break
            if inner is not None:
                break
        if inner is None:
            break
        scopes.append(node)
        node = inner
    for outer in reversed(scopes):  # the statement's parents, innermost first
        if isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return _line_range(outer)
        if isinstance(outer, ast.Module):
            return None
    return None


def _arrow(lineno: int) -> str:
    pad = 7 - len(str(lineno))
    if pad >= 2:
        return "-" * (pad - 2) + "> "
    return ">" if pad == 1 else ""


def _frame_lines(source: str, lineno: int, context: int) -> str:
    lines = source.splitlines()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        tree = None
    if tree is not None:
        pieces = _pieces(tree, lines)
        scope = _scope(tree, lineno)
        if scope is not None:
            pieces = [pc for pc in pieces if scope[0] <= pc.start and pc.stop <= scope[1]]
    else:
        pieces = [range(i, i + 1) for i in range(1, len(lines) + 1)]
    executing = next((pc for pc in pieces if lineno in pc), None)
    if executing is None:
        pieces, executing = [range(lineno, lineno + 1)], range(lineno, lineno + 1)
    after = (context - 1) // 2
    before = context - 1 - after
    pos = pieces.index(executing)
    shown: list[int | None] = []  # line numbers; None = a gap
    for pc in pieces[max(0, pos - before) : pos + 1 + after]:
        nums: list[int | None] = list(pc)
        if pc != executing and len(nums) > MAX_LINES_PER_PIECE:
            right = (MAX_LINES_PER_PIECE - 1) // 2
            left = MAX_LINES_PER_PIECE - 1 - right
            nums = nums[:left] + [None] + nums[-right:]
        shown.extend(nums)

    def text(n: int) -> str:
        return lines[n - 1] if 1 <= n <= len(lines) else ""

    real = [n for n in shown if n is not None]
    dedented = textwrap.dedent("\n".join(text(n) for n in real)).splitlines()
    indent = len(text(real[0])) - len(dedented[0]) if real and dedented else 0
    out = []
    for n in shown:
        if n is None:
            out.append("   (...)")  # IPython writes no newline after the gap marker
            continue
        line = text(n)[indent:].rstrip("\n") + "\n"
        out.append((_arrow(n) + str(n) if n == lineno else f"{n:>7}") + " " + line)
    return "".join(out)


def input_name(code: str, count: int = DISPLAY_COUNT) -> str:
    """The file name IPython compiles a cell under: ``<ipython-input-1-`` + the first 12 hex digits of the
    SHA-1 of the cell as run (platoon strips it; IPython's input transform ends it with a newline) + ``>``.

    >>> input_name("print(x2)")
    '<ipython-input-1-223cd8a8d439>'
    """
    digest = hashlib.sha1((code.strip() + "\n").encode("utf-8")).hexdigest()[:12]
    return f"<ipython-input-{count}-{digest}>"


def cell_label(filename: str, lineno: int, *, first_shell: bool = False, count: int = DISPLAY_COUNT) -> str:
    """A cell frame's first line: ``Cell In[1], line k`` in the process's first IPython shell (the one
    ``get_ipython()`` returns: only its compiler knows the cell numbers), ``File <ipython-input-1-...>:k``
    in every other shell. Platoon makes a shell per agent, so every agent but the first of a process reads
    the second form (measured with IPython 9.4.0: a second ``InteractiveShellEmbed``)."""
    return f"Cell In[{count}], line {lineno}" if first_shell else f"File {filename}:{lineno}"


def _frame(tb: types.TracebackType, context: int, label) -> str:
    frame, code = tb.tb_frame, tb.tb_frame.f_code
    source = "".join(linecache.getlines(code.co_filename))
    head = label(code.co_filename, tb.tb_lineno)
    if code.co_name != "<module>":
        try:
            args = inspect.formatargvalues(*inspect.getargvalues(frame), formatvalue=lambda _v: "")
        except Exception:  # noqa: BLE001 -- IPython's fallback text
            args = "(***failed resolving arguments***)"
        head += f", in {getattr(code, 'co_qualname', code.co_name)}{args}"
    return head + "\n" + _frame_lines(source, tb.tb_lineno, context)


def _exception_lines(exc: BaseException, name: str | None) -> list[str]:
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 -- a hostile __str__
        message = "<exception str() failed>"
    lines = [f"{name or type(exc).__name__}: {message}"]
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, (list, tuple)):
        lines.extend(str(n) for n in notes)
    return lines


def _collapse(frames: list[types.TracebackType]) -> list:
    """stack_data's collapse of repeated frames: a frame (code, line) seen more than 3 times among a run of
    such frames is shown at its first, second and last place there; the rest of the run becomes one
    description string ``f at line 2 (18 times)``."""
    keys = [(t.tb_frame.f_code, t.tb_lineno) for t in frames]
    counts = collections.Counter(keys)
    shown = [True] * len(keys)
    i = 0
    while i < len(keys):
        j = i
        common = counts[keys[i]] > 3
        while j < len(keys) and (counts[keys[j]] > 3) == common:
            j += 1
        if common:
            run = keys[i:j]
            marks = [False] * len(run)
            for key in set(run):
                first = run.index(key)
                marks[first] = True
                if key in run[first + 1 :]:
                    marks[run.index(key, first + 1)] = True
                marks[len(run) - 1 - run[::-1].index(key)] = True
            shown[i:j] = marks
        i = j
    out: list = []
    i = 0
    while i < len(frames):
        if shown[i]:
            out.append(frames[i])
            i += 1
            continue
        j = i
        while j < len(frames) and not shown[j]:
            j += 1
        tally = sorted(collections.Counter(keys[i:j]).items(), key=lambda kv: (-kv[1], kv[0][0].co_name))
        out.append(
            ", ".join(
                f"{getattr(code, 'co_qualname', code.co_name)} at line {line} ({n} times)"
                for (code, line), n in tally
            )
        )
        i = j
    return out


def format_traceback(
    exc: BaseException,
    is_cell,
    *,
    name: str | None = None,
    label=None,
) -> str:
    """IPython's traceback of ``exc`` over the frames whose file name passes ``is_cell`` (their source
    comes from :mod:`linecache`); ``name`` replaces the exception's type name (the worker's timer);
    ``label(filename, lineno)`` writes a frame's first line (default: :func:`cell_label` of the first
    shell, ``Cell In[1], line k``).

    The text ends in a newline, as IPython prints it."""
    chain: list[tuple[BaseException, str | None]] = []  # innermost cause first after reversing
    seen: set[int] = set()
    current: BaseException | None = exc
    link: str | None = None
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((current, link))
        if current.__cause__ is not None:
            current, link = (
                current.__cause__,
                "The above exception was the direct cause of the following exception:",
            )
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = (
                current.__context__,
                "During handling of the above exception, another exception occurred:",
            )
        else:
            current = None
    header = label or (lambda f, n: cell_label(f, n, first_shell=True))
    parts = ["-" * TOP_LINE_WIDTH]
    for i, (item, _link) in enumerate(reversed(chain)):
        if i:
            parts.append("\n" + (chain[len(chain) - i][1] or "") + "\n")
        kind = name if item is exc and name else type(item).__name__
        parts.append(kind + "Traceback (most recent call last)".rjust(TOP_LINE_WIDTH - len(kind)))
        frames = []
        tb = item.__traceback__
        while tb is not None:
            if is_cell(tb.tb_frame.f_code.co_filename):
                frames.append(tb)
            tb = tb.tb_next
        context = CONTEXT if item is exc else CHAINED_CONTEXT
        for shown in _collapse(frames):
            if isinstance(shown, str):
                parts.append(f"    [... skipping similar frames: {shown}]\n")
            else:
                parts.append(_frame(shown, context, header))
        parts.extend(_exception_lines(item, kind if item is exc and name else None))
    return "\n".join(parts) + "\n"
