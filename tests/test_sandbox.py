"""Tests of the restricted CodeAct interpreter (``common/sandbox.py``).

Normal use (persistence, top-level await, gather, print capture, truncation, concurrency), time
accounting (awaited time is free, nested sandboxes, sync tools count), and a hostile suite: every
escape or resource bomb must come back as an error while the host stays healthy (a follow-up cell
still runs, the tracer is restored, the case finishes fast).

Run: ``python -m pytest tests/test_sandbox.py -q`` (about 10 s).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
import warnings

import pytest

from common.sandbox import CellResult, Sandbox, SandboxLimits

FAST = SandboxLimits(wall_time_s=0.3, max_memory_mb=64)


def run(sb: Sandbox, code: str) -> CellResult:
    return asyncio.run(sb.run(code))


def run_many(sb: Sandbox, *codes: str) -> list[CellResult]:
    async def go() -> list[CellResult]:
        return [await sb.run(c) for c in codes]

    return asyncio.run(go())


def craft(ingredients: dict, target: tuple) -> str:
    return f"Successfully crafted {target[1]} {target[0]}(s)"


async def slow_tool(seconds: float, tag: str = "done") -> str:
    await asyncio.sleep(seconds)
    return tag


def last_line(result: CellResult) -> str:
    assert result.error is not None, result
    return result.error.splitlines()[-1]


# ---- normal use -------------------------------------------------------------------------------------
def test_persistence_print_and_tool_call():
    sb = Sandbox({"craft": craft})
    r1, r2, r3 = run_many(
        sb,
        "x = 2\ndef double(v):\n    return 2 * v",
        "print(double(x), 'and', x + 1, sep='|', end='!\\n')",
        "print(craft({'a': 1}, ('b', 1)))",
    )
    assert r1 == CellResult("", None)
    assert r2.stdout == "4|and|3!\n" and r2.error is None
    assert r3.stdout == "Successfully crafted 1 b(s)\n"
    assert sb.namespace["x"] == 2


def test_ordinary_python_still_behaves_like_python():
    sb = Sandbox({})
    code = """
class Base:
    def __init__(self, v):
        self.v = v
class Child(Base):
    def __init__(self, v):
        super().__init__(v * 10)
a = b = [1]
a += [2]             # in place: b sees it
d = {'k': [0]}
d['k'] += [1]
c = Child(4); c.v += 1
s = 'ab'; s *= 3
print(b, d, c.v, s)
print(f"{3.14159:.2f}|{'x'!r}|{[1, 2]}|{7:>4}", '%05d' % 42, '{}-{k}'.format(1, k=2))
print([i * i for i in range(5) if i % 2], {k: v for k, v in zip('ab', (1, 2))}, (lambda q: q + 1)(1))
first, *rest = [1, 2, 3]
print(first, rest, *rest, 2 in rest, 5 not in rest, sorted(rest, key=lambda v: -v), sum([[1], [2]], []))
def gen():
    try:
        yield 1
        yield 2
    finally:
        print('finally ran')
print(list(gen()))
try:
    1 / 0
except ZeroDivisionError as e:
    print('caught', type(e).__name__)
match {'kind': 'craft', 'n': 2}:
    case {'kind': 'craft', 'n': n}:
        print('matched', n)
print(isinstance([], list), type(3) is int, str(10**20), repr('q'), max([3, 1], key=abs), 2 ** 10, 1 << 4)
"""
    r = run(sb, code)
    assert r.error is None, r.error
    assert r.stdout.splitlines() == [
        "[1, 2] {'k': [0, 1]} 41 ababab",
        "3.14|'x'|[1, 2]|   7 00042 1-2",
        "[1, 9] {'a': 1, 'b': 2} 2",
        "1 [2, 3] 2 3 True True [3, 2] [1, 2]",
        "finally ran",
        "[1, 2]",
        "caught ZeroDivisionError",
        "matched 2",
        "True True 100000000000000000000 'q' 3 1024 16",
    ]


def test_top_level_await_and_gather_of_two_tool_coroutines():
    sb = Sandbox({"slow": slow_tool})
    t0 = time.perf_counter()
    r = run(
        sb,
        "a, b = await asyncio.gather(slow(0.2, 'A'), slow(0.2, 'B'))\nprint(a, b)\nprint(await slow(0, 'C'))",
    )
    elapsed = time.perf_counter() - t0
    assert r.error is None and r.stdout == "A B\nC\n"
    assert elapsed < 0.38, "the two tool coroutines must run concurrently"


def test_cell_defined_coroutines_can_be_gathered():
    sb = Sandbox({"slow": slow_tool})
    r = run(
        sb,
        "import asyncio\nasync def twice(t):\n    x = await slow(0.01, t)\n    return x * 2\n"
        "print(await asyncio.gather(twice('a'), twice('b')))\n"
        "print(await asyncio.wait_for(twice('c'), 5))",
    )
    assert r.error is None and r.stdout == "['aa', 'bb']\ncc\n"


def test_output_is_truncated_with_a_marker():
    sb = Sandbox({}, SandboxLimits(max_output_chars=100))
    r = run(sb, "for i in range(1000):\n    print('line', i)")
    assert r.error is None
    kept, _, marker = r.stdout.partition("\n[... output truncated")
    assert len(kept) <= 100 and kept.startswith("line 0\nline 1\n")
    assert marker, r.stdout


def test_print_of_a_huge_shared_structure_is_abbreviated_fast():
    sb = Sandbox({})
    t0 = time.perf_counter()
    r = run(sb, "z = []\nfor i in range(60):\n    z = [z, z]\nprint(z)")
    assert r.error is None and r.stdout.startswith("[[[") and "..." in r.stdout
    assert time.perf_counter() - t0 < 1.0


def test_errors_are_tracebacks_with_cell_line_numbers():
    sb = Sandbox({"craft": craft})
    r = run(sb, "a = 1\n\nprint(b)")
    assert r.error.splitlines() == [
        "Traceback (most recent call last):",
        '  File "<cell-1>", line 3, in <module>',
        "    print(b)",
        "NameError: name 'b' is not defined",
    ]
    r = run(sb, "def f(v):\n    return 1 / v\nf(0)")
    assert "line 2, in f" in r.error and last_line(r) == "ZeroDivisionError: division by zero"
    r = run(sb, "craft(1)")  # a tool's own exception: host frames are not shown
    assert last_line(r).startswith("TypeError") and "sandbox.py" not in r.error
    r = run(sb, "x = = 1")
    assert last_line(r).startswith("SyntaxError") and "<cell-4>" in r.error


def test_concurrent_cells_of_two_agents_keep_their_own_output():
    a = Sandbox({"slow": slow_tool})
    b = Sandbox({"slow": slow_tool})
    code = "for i in range(3):\n    print(name, i)\n    await slow(0.01)"

    async def go() -> list[CellResult]:
        a.namespace["name"], b.namespace["name"] = "A", "B"
        return await asyncio.gather(a.run(code), b.run(code))

    ra, rb = asyncio.run(go())
    assert ra.stdout == "A 0\nA 1\nA 2\n" and rb.stdout == "B 0\nB 1\nB 2\n"


def test_unawaited_gather_is_cancelled_and_reported():
    sb = Sandbox({"slow": slow_tool})
    r = run(sb, "g = asyncio.gather(slow(0.01))\nprint('no await')")
    assert r.error is None and "never awaited" in r.stdout
    with warnings.catch_warnings():  # the tool coroutine never ran ("never awaited" when collected)
        warnings.simplefilter("ignore", RuntimeWarning)
        sb.namespace.pop("g")
        gc.collect()


def test_real_asyncio_module_as_tool_is_replaced_by_the_proxy():
    sb = Sandbox({"asyncio": asyncio, "craft": craft})
    assert sb.namespace["asyncio"] is not asyncio
    assert "not available" in last_line(run(sb, "asyncio.get_event_loop()"))
    with pytest.raises(ValueError):
        Sandbox({"_hidden": craft})
    with pytest.raises(ValueError):
        Sandbox({"os": sys})


# ---- time accounting --------------------------------------------------------------------------------
def test_time_awaiting_an_async_tool_is_not_counted():
    sb = Sandbox({"slow": slow_tool}, SandboxLimits(wall_time_s=1.0))
    r = run(sb, "print(await slow(3.0, 'finished'))")
    assert r.error is None and r.stdout == "finished\n" and not r.timed_out


def test_nested_sandbox_cells_do_not_count_against_the_parent():
    child = Sandbox({}, SandboxLimits(wall_time_s=1.0))

    async def launch_subagent() -> str:
        res = await child.run(
            "x = 0\nfor i in range(10**9):\n    x += 1\n    if i % 1000 == 0 and busy():\n        break"
        )
        return res.error or "ok"

    t_end = [0.0]

    def busy() -> bool:  # the child's own loop runs ~0.25 s of its own cell time per launch
        return time.perf_counter() > t_end[0]

    child.namespace["busy"] = busy

    async def launch() -> str:
        t_end[0] = time.perf_counter() + 0.25
        return await launch_subagent()

    parent = Sandbox({"launch_subagent": launch}, SandboxLimits(wall_time_s=0.4))
    r = run(parent, "for _ in range(3):\n    print(await launch_subagent())")
    assert r.error is None and r.stdout == "ok\nok\nok\n"


def test_sync_tool_time_counts():
    def busy_tool() -> str:
        time.sleep(0.15)
        return "x"

    sb = Sandbox({"busy_tool": busy_tool}, SandboxLimits(wall_time_s=0.3))
    r = run(sb, "for _ in range(5):\n    busy_tool()")
    assert r.timed_out and "TimeoutError" in last_line(r)


# ---- hostile suite ----------------------------------------------------------------------------------
HOSTILE = [
    ("import os", "SandboxViolation: import of 'os'"),
    ("from os import path", "SandboxViolation: import from 'os'"),
    ("import asyncio\nasyncio.subprocess", "SandboxViolation: asyncio.subprocess"),
    ("from asyncio import subprocess", "SandboxViolation"),
    ("__import__('os')", "SandboxViolation: name '__import__'"),
    ("open('/etc/passwd')", "NameError: name 'open'"),
    ("().__class__.__bases__[0].__subclasses__()", "SandboxViolation: access to attribute '__class__'"),
    ("x = 1\ngetattr(x, '__globals__')", "NameError: name 'getattr'"),
    ("exec('1')", "NameError: name 'exec'"),
    ("eval('1')", "NameError: name 'eval'"),
    ("compile('1', 'f', 'exec')", "NameError: name 'compile'"),
    ("print.__self__", "SandboxViolation"),
    (
        "def g():\n    yield 1\nit = g()\nit.gi_frame.f_back.f_globals",
        "SandboxViolation: access to attribute 'gi_frame'",
    ),
    ("async def c():\n    pass\nc().cr_frame", "SandboxViolation: access to attribute 'cr_frame'"),
    ("try:\n    1/0\nexcept Exception as e:\n    e.__traceback__.tb_frame", "SandboxViolation"),
    ("'{0.__class__.__mro__}'.format(1)", "SandboxViolation: format field"),
    ("f = '{0.__class__}'.format\nf(1)", "SandboxViolation: format field"),
    ("type('X', (), {})", "SandboxViolation: type() can only be called with one argument"),
    ("class M(type):\n    pass", "SandboxViolation: metaclasses"),
    ("class A:\n    def __del__(self):\n        pass", "SandboxViolation: defining '__del__'"),
    ("g = asyncio.gather()\ng.get_loop()", "SandboxViolation: access to attribute 'get_loop'"),
    ("raise SystemExit", "SystemExit"),
    ("raise SystemExit(3)", "SystemExit: 3"),
    ("async def bye():\n    raise SystemExit(5)\nawait asyncio.gather(bye())", "SystemExit: 5"),
    ("'a' * 10**10", "MemoryError"),
    ("[0] * 10**9", "MemoryError"),
    ("s = 'ab'\ns *= 10**10", "MemoryError"),
    ("10**10**8", "MemoryError"),
    ("pow(10, 10**8)", "MemoryError"),
    ("1 << 10**10", "MemoryError"),
    ("list(range(10**10))", "MemoryError"),
    ("f = list\nf(range(10**10))", "MemoryError"),
    ("sorted(range(10**10))", "MemoryError"),
    ("print(*range(10**10))", "MemoryError"),
    ("[*range(10**10)]", "MemoryError"),
    ("'x'.ljust(10**10)", "MemoryError"),
    ("str.rjust('x', 10**10)", "MemoryError"),
    ("'-'.join(['x' * 10**6] * 100)", "MemoryError"),
    ("('ab' * 10**6).replace('a', 'a' * 100)", "MemoryError"),
    ("f'{1:>{10**10}}'", "MemoryError"),
    ("'%10000000000d' % 1", "MemoryError"),
    ("(1).to_bytes(10**10, 'big')", "MemoryError"),
    ("dict.fromkeys(range(10**10))", "MemoryError"),
    ("sum([[0] * 10**6] * 100, [])", "MemoryError"),
    ("z = []\nfor i in range(60):\n    z = [z, z]\nstr(z)", "Error"),  # MemoryError, or the time limit
    ("while True:\n    pass", "TimeoutError"),
    ("while True: pass", "TimeoutError"),
    ("x = 0\nwhile True:\n    x += 1", "TimeoutError"),
    ("print(1.5 in range(10**12))", "TimeoutError"),
    ("list(iter(int, 1))", "TimeoutError"),
    ("any(x < 0 for x in range(10**12))", "TimeoutError"),
    ("try:\n    while True: pass\nexcept BaseException:\n    while True: pass", "TimeoutError"),
    ("try:\n    while True: pass\nfinally:\n    while True: pass", "TimeoutError"),
    ("async def spin():\n    while True: pass\nawait asyncio.gather(spin())", "TimeoutError"),
    ("await asyncio.sleep(100)", "TimeoutError"),
    ("def f():\n    return f()\nf()", "RecursionError: maximum recursion depth (100)"),
    ("f = lambda: f()\nf()", "RecursionError"),
    (
        "def f():\n    try:\n        return f()\n    except BaseException:\n        return f()\nf()",
        "RecursionError",
    ),
    (
        "x = []\nwhile True:\n    x.append('a' * 2_000_000 + str(len(x)))",  # 2 MB a turn: the memory cap, not the clock
        "MemoryError: cell grew the process memory",
    ),
]


@pytest.mark.parametrize("code,expected", HOSTILE, ids=[c for c, _ in HOSTILE])
def test_hostile_cells_become_errors_and_the_host_stays_healthy(code: str, expected: str):
    sb = Sandbox({"craft": craft}, FAST)
    trace_before = sys.gettrace()
    t0 = time.perf_counter()
    r = run(sb, code)
    elapsed = time.perf_counter() - t0
    assert r.error is not None and expected in r.error, (code, r)
    assert r.timed_out == last_line(r).startswith("TimeoutError")
    assert elapsed < FAST.wall_time_s + 0.7, f"took {elapsed:.2f} s"
    assert sys.gettrace() is trace_before
    follow = run(sb, "print('alive', craft({'a': 1}, ('b', 1)))")
    assert follow.error is None and follow.stdout.startswith("alive Successfully"), follow


def test_timeout_is_enforced_within_the_limit_plus_slack():
    sb = Sandbox({}, SandboxLimits(wall_time_s=0.5))
    t0 = time.perf_counter()
    r = run(sb, "while True:\n    pass")
    elapsed = time.perf_counter() - t0
    assert r.timed_out and 0.5 <= elapsed < 0.8
    assert '  File "<cell-1>", line ' in r.error and last_line(r).startswith("TimeoutError: cell exceeded")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # CPython reports it too
def test_an_abort_inside_a_generator_finalizer_is_still_reported():
    sb = Sandbox({}, FAST)
    run(
        sb,
        "def g():\n    try:\n        yield 1\n    finally:\n        while True:\n            pass\nit = g()\nnext(it)",
    )
    r = run(sb, "del it\nprint('after')")  # CPython swallows the abort raised in the finalizer
    assert r.timed_out and "TimeoutError" in last_line(r)
    assert run(sb, "print('alive')").stdout == "alive\n"


def test_cell_generators_finalized_outside_a_cell_cannot_run_code():
    sb = Sandbox({}, FAST)
    run(
        sb,
        "def g():\n    try:\n        yield 1\n    finally:\n        while True:\n            pass\nit = g()\nnext(it)",
    )
    t0 = time.perf_counter()
    sb.namespace.pop("it")  # finalized by the host, with no cell running: the finally body is skipped
    assert time.perf_counter() - t0 < 0.1


def test_docstring_examples():
    import doctest

    from common import sandbox

    result = doctest.testmod(sandbox)
    assert result.attempted > 0 and result.failed == 0
