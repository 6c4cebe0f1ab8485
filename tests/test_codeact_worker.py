"""The CodeAct worker process (``common/codeact``): real Python semantics, and containment of hostile cells.

* Semantics the paper's models rely on: last-expression echo, standard-library imports, full asyncio,
  persistent namespace, tracebacks with cell line numbers, tool errors as exceptions in the cell.
* Tools run in the trainer: ``await launch_subagent`` / ``asyncio.gather`` of two run concurrently while
  the worker waits (and that time is not the cell's); cells of agents on one world take turns.
* Static checks before a cell runs (unawaited launch, task introspection) and the loop detector.
* Hostile cells: interpreter escapes and resource bombs (``HOSTILE``, first written for the in-process
  interpreter removed in issue #24) plus process-level attacks (segfault, os._exit,
  fork, C-level busy loops, 10 GB allocations, 100 MB prints, sockets, /etc/passwd, closing fds, signals
  to the trainer, threads, protocol floods) end within the time limit + grace, the trainer process is
  untouched, and the next cell works (in a new worker when the old one died).
* The worker's two modes: the tests marked ``MODES`` run with the plain mode and with the fixed-order mode
  (``ordered=True``: each cell segment served inline; ``tests/test_codeact_ordered.py``).

Run: ``python -m pytest tests/test_codeact_worker.py -q`` (about 45 s on 2 cores; Linux only).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from common.codeact import CodeActWorker, WorkerLimits, check_cell, stuck_in_loop
from common.codeact.worker import decode, encode

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the worker needs Linux")

FAST = WorkerLimits(wall_time_s=0.3, cpu_time_s=1.0, grace_s=0.7, memory_mb=512)
CONTAINED_S = FAST.wall_time_s + FAST.grace_s + 3.0
"""Seconds a hostile cell plus the worker's restart may take: the kill deadline and a margin for a loaded
2-core machine (a cell never killed would take its whole loop: minutes to forever)."""
MODES = pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
"""Run a test with both modes of the worker (the hostile cases must be contained by each)."""


def craft(ingredients, target):
    if not isinstance(ingredients, dict):
        raise TypeError(f"ingredients must be a dict, got {type(ingredients).__name__}")
    return f"Successfully crafted {target[1]} {target[0]}(s)"


async def slow(seconds, tag="done"):
    await asyncio.sleep(seconds)
    return tag


def worker(limits: WorkerLimits = FAST, ordered: bool = False, **tools) -> CodeActWorker:
    return CodeActWorker({"craft": craft, **tools}, {"launch_subagent": slow}, limits, ordered=ordered)


def run(w: CodeActWorker, *codes: str):
    async def go():
        return [await w.run(c) for c in codes]

    out = asyncio.run(go())
    return out[0] if len(codes) == 1 else out


def failure(r) -> str | None:
    """Why a cell failed: the trainer's or compiler's message, else the exception it raised (whose
    IPython-layout traceback is in its stdout), else None."""
    return r.error if r.error is not None else r.exception


# ---- semantics ------------------------------------------------------------------------------------
@MODES
def test_ordinary_python_behaves_like_python(ordered):
    w = worker(ordered=ordered)
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
print(craft({'a': 1}, ('b', 1)), sep='|', end='!\\n')
"""
    r = run(w, code)
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
        "Successfully crafted 1 b(s)!",
    ]
    w.close()


@MODES
def test_last_expression_echo_and_persistence(ordered):
    w = worker(ordered=ordered)
    # IPython 9.4 under platoon (measured): ``Out[1]: `` + IPython's pretty printer; the count stays 1 (no
    # store_history) and a trailing ``;`` does not hide the value (IPython looks for it in the history)
    r = run(w, "x = 20", "x + 1", "print('a')\nx * 2", "x;", "None", "{'b': 1, 'a': [1, 2]}", "_")
    assert [c.stdout for c in r] == [
        "",
        "Out[1]: 21\n",
        "a\nOut[1]: 40\n",
        "Out[1]: 20\n",
        "",
        "Out[1]: {'b': 1, 'a': [1, 2]}\n",
        "Out[1]: {'b': 1, 'a': [1, 2]}\n",
    ]
    assert all(c.error is None and c.exception is None for c in r)
    long = run(w, "{f'item_{i}': i for i in range(30)}").stdout
    assert (
        long.startswith("Out[1]: \n{'item_0': 0,\n 'item_1': 1,") and long.count("\n") == 31
    )  # IPython's layout
    # a long string with newlines is ONE repr line (pprint split it into a parenthesised concatenation)
    error = "Error: All 1 recipe(s) failed for plank. Errors:\nRecipe 1: Target count 3 is not divisible by 4"
    assert run(w, f"{error!r}").stdout == f"Out[1]: {error!r}\n"
    w.close()


@MODES
def test_standard_library_and_full_asyncio(ordered):
    w = worker(WorkerLimits(wall_time_s=5), ordered=ordered)
    code = """
import json, re, math, itertools, functools, collections, heapq, fractions, statistics, datetime, random, dataclasses
import asyncio
async def job(i):
    await asyncio.sleep(0.01)
    return i * i
t = asyncio.create_task(job(3))
q = asyncio.Queue(); await q.put(1)
ev = asyncio.Event(); ev.set(); await ev.wait()
try:
    async with asyncio.timeout(0.01):
        await asyncio.sleep(1)
except TimeoutError:
    timed_out = True
done = [await f for f in asyncio.as_completed([job(1), job(2)])]
print(json.dumps({"t": await t, "q": await q.get(), "timed_out": timed_out, "done": sorted(done)}))
math.comb(5, 2), str(fractions.Fraction(1, 3)), collections.Counter("aab").most_common(1)
"""
    r = run(w, code)
    assert r.error is None, r.error
    assert (
        r.stdout
        == '{"t": 9, "q": 1, "timed_out": true, "done": [1, 4]}\n' + "Out[1]: (10, '1/3', [('a', 2)])\n"
    )
    w.close()


@MODES
def test_tracebacks_show_cell_lines_and_tool_errors_are_catchable(ordered):
    w = worker(ordered=ordered)
    # IPython's layout, written to stdout after what the cell printed (public: output = the traceback,
    # error = ''), as an agent's shell writes it (File <ipython-input-1-<sha1 of the cell>>:k: the count
    # never leaves 1, the cell's own file for a function defined earlier); blank lines hidden
    r = run(w, "a = 1\nprint('before')\n\nprint(b)")
    assert r.error is None and r.stderr == "" and r.exception == "NameError: name 'b' is not defined"
    assert r.stdout == (
        "before\n" + "-" * 75 + "\nNameError" + " " * 33 + "Traceback (most recent call last)\n"
        "File <ipython-input-1-233b93ae05ac>:4\n      1 a = 1\n      2 print('before')\n----> 4 print(b)\n\n"
        "NameError: name 'b' is not defined\n"
    )
    r = run(w, "def f(n):\n    return n / 0", "x = 1\nf(x)")[1]
    assert r.stdout.endswith(
        "File <ipython-input-1-865df23cf628>:2\n      1 x = 1\n----> 2 f(x)\n\n"
        "File <ipython-input-1-fc2c6ae83e7c>:2, in f(n)\n      1 def f(n):\n"
        "----> 2     return n / 0\n\nZeroDivisionError: division by zero\n"
    ), r.stdout
    r = run(w, "try:\n    craft(1, ('b', 1))\nexcept TypeError as e:\n    print('caught', e)")
    assert r.error is None and r.stdout == "caught ingredients must be a dict, got int\n"
    r = run(w, "craft({'a': object()}, ('b', 1))")  # not plain data: refused in the worker, never sent
    assert "TypeError: craft(): only plain data" in r.exception and "Traceback" in r.stdout
    # stderr is its own slot (public ``error=cap_stderr``); stdout keeps only what went to stdout
    r = run(w, "import sys\nprint('out')\nprint('careful', file=sys.stderr)\nsys.stderr.write('!')")
    assert (r.stdout, r.stderr, r.error, r.exception) == ("out\nOut[1]: 1\n", "careful\n!", None, None), r
    assert run(w, "print(craft({'a': 1}, ('b', 2)))").stdout == "Successfully crafted 2 b(s)\n"
    w.close()


@MODES
def test_gather_of_two_launches_runs_both_while_the_worker_waits(ordered):
    w = worker(ordered=ordered)  # wall limit 0.3 s; each launch takes 0.5 s of the trainer's time
    t0 = time.perf_counter()
    r = run(w, "a, b = await asyncio.gather(launch_subagent(0.5, 'A'), launch_subagent(0.5, 'B'))\n[a, b]")
    elapsed = time.perf_counter() - t0
    assert r.error is None and r.stdout == "Out[1]: ['A', 'B']\n" and not r.timed_out
    assert elapsed < 0.9, f"the two launches must run concurrently ({elapsed:.2f} s)"
    r = run(w, "print(await launch_subagent(0.5, 'C'))")
    assert r.stdout == "C\n" and r.error is None
    w.close()


@MODES
def test_cell_defined_coroutines_that_launch_can_be_gathered(ordered):
    w = worker(ordered=ordered)
    r = run(
        w,
        "async def twice(t):\n    x = await launch_subagent(0.01, t)\n    return x * 2\n"
        "print(await asyncio.gather(twice('a'), twice('b')))\n"
        "print(await asyncio.wait_for(twice('c'), 5))",
    )
    assert r.error is None and r.stdout == "['aa', 'bb']\ncc\n", r
    w.close()


@MODES
def test_concurrent_cells_of_two_agents_keep_their_own_output(ordered):
    a, b = worker(ordered=ordered), worker(ordered=ordered)
    code = "for i in range(3):\n    print(name, i)\n    await launch_subagent(0.01)"

    async def go():
        await a.run("name = 'A'")
        await b.run("name = 'B'")
        return await asyncio.gather(a.run(code), b.run(code))

    ra, rb = asyncio.run(go())
    assert ra.stdout == "A 0\nA 1\nA 2\n" and rb.stdout == "B 0\nB 1\nB 2\n", (ra, rb)
    with pytest.raises(ValueError, match="must be an identifier"):
        CodeActWorker({"_hidden": craft})
    a.close()
    b.close()


def test_unawaited_launch_is_rejected_before_the_cell_and_aliases_are_closed_unrun():
    for code in (
        "launch_subagent({'a': 1})",
        "x = [launch_subagent(t) for t in ts]",
        "def f():\n    return launch_subagent(1)",
    ):
        assert check_cell(code).kind == "unawaited", code
    for code in (
        "await launch_subagent({'a': 1})",
        "r = await asyncio.gather(launch_subagent(1), launch_subagent(2))",
        "t = asyncio.create_task(launch_subagent(1))",
        "async def f():\n    return await launch_subagent(1)",
    ):
        assert check_cell(code).kind is None, code
    assert check_cell("await asyncio.gather(*asyncio.all_tasks())").kind == "introspection"
    assert check_cell("print(1").kind == "syntax" and check_cell("  \n").kind == "empty"
    calls = []

    async def launch(*args):
        calls.append(args)
        return "ran"

    w = CodeActWorker({}, {"launch_subagent": launch}, FAST)
    r = run(w, "f = launch_subagent\nc = f(1)\nprint('end')")
    assert r.stdout == "end\n" and r.unawaited_launches == 1 and not calls
    w.close()


def test_loop_detector_is_the_public_rule():
    assert not stuck_in_loop(["a", "a", "a"])
    assert stuck_in_loop(["a", "a", "a", "a"])
    assert stuck_in_loop(["x", "a", "b", "a", "b", "a", "b", "a", "b"])
    assert stuck_in_loop(["a", "b", "c"] * 4) and not stuck_in_loop(["a", "b", "c", "d"] * 4)
    assert stuck_in_loop(["", "", "", ""])  # four malformed replies in a row
    assert not stuck_in_loop(["a", "a", "a", "b"])


def test_cells_of_agents_on_one_world_take_turns():
    log: list[str] = []

    def note(tag: str) -> None:
        log.append(tag)

    async def nap() -> None:
        await asyncio.sleep(0.05)

    class World:
        pass

    world = World()
    a = CodeActWorker({"note": note}, {"nap": nap}, FAST, turn_key=world)
    b = CodeActWorker({"note": note}, {"nap": nap}, FAST, turn_key=world)

    async def go(code_a: str, code_b: str) -> None:
        await asyncio.gather(a.run(code_a), b.run(code_b))

    asyncio.run(go("for _ in range(20): note('A')", "for _ in range(20): note('B')"))
    assert "".join(log) in ("A" * 20 + "B" * 20, "B" * 20 + "A" * 20)  # no interleaving inside a cell
    log.clear()
    asyncio.run(go("note('A')\nawait nap()\nnote('A')", "note('B')"))
    assert "".join(log) in ("ABA", "BAA")  # an await that blocks hands the turn over
    a.close()
    b.close()


@MODES
def test_a_cell_that_ends_with_a_launch_in_flight_lets_the_child_on_its_world_run(ordered):
    """A cell that ends (here by an error) while a launch it started is still running: the trainer waits for
    the child, and the child's own cells on the same world must get the turn. Before the fix the finished
    cell kept the world's turn while waiting, and the child waited for it forever (seen in the warm-started
    quick start, issue #23.4)."""

    class World:
        pass

    world, ran = World(), []
    child = CodeActWorker({"note": ran.append}, {}, FAST, turn_key=world, ordered=ordered)

    async def launch_subagent(task):
        return (await child.run(f"note({task!r})")).stdout

    parent = CodeActWorker({}, {"launch_subagent": launch_subagent}, FAST, turn_key=world, ordered=ordered)
    code = "import asyncio\nt = asyncio.ensure_future(launch_subagent('x'))\nawait asyncio.sleep(0)\nraise ValueError('boom')"

    async def go():
        return await asyncio.wait_for(parent.run(code), 20)  # a deadlock fails here, not by hanging the suite

    r = asyncio.run(go())
    assert "ValueError: boom" in r.exception and ran == ["x"]
    assert asyncio.run(go()).exception and ran == ["x", "x"]  # and the world's turn is free for the next cell
    parent.close()
    child.close()


def test_plain_data_encoding_round_trip_and_refusals():
    value = {"a": (1, [2.5, None, True]), 3: {"k": ("x",)}}
    assert decode(encode(value)) == value
    with pytest.raises(TypeError):
        encode({1, 2})
    for bad in ({"t": 1}, {"x": []}, {"d": [[[], 1]]}, {"d": [1]}):
        with pytest.raises(ValueError):
            decode(bad)


@MODES
def test_a_cancelled_caller_kills_the_worker_and_the_next_cell_restarts_it(ordered):
    w = worker(WorkerLimits(wall_time_s=5), ordered=ordered)
    # ordered: the event loop waits while the cell's code runs, so a caller can only be cancelled while
    # the cell awaits a launch
    code = "await launch_subagent(3)" if ordered else "import time\ntime.sleep(3)"

    async def go():
        task = asyncio.ensure_future(w.run(code))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await w.run("print('fresh')")

    r = asyncio.run(go())
    assert r.stdout == "fresh\n" and w.restarts == 1
    w.close()


# ---- hostile cells --------------------------------------------------------------------------------
HOSTILE = [
    "import os",
    "from os import path",
    "import asyncio\nasyncio.subprocess",
    "from asyncio import subprocess",
    "__import__('os')",
    "open('/etc/passwd')",
    "().__class__.__bases__[0].__subclasses__()",
    "x = 1\ngetattr(x, '__globals__')",
    "exec('1')",
    "eval('1')",
    "compile('1', 'f', 'exec')",
    "print.__self__",
    "def g():\n    yield 1\nit = g()\nit.gi_frame.f_back.f_globals",
    "async def c():\n    pass\nc().cr_frame",
    "try:\n    1/0\nexcept Exception as e:\n    e.__traceback__.tb_frame",
    "'{0.__class__.__mro__}'.format(1)",
    "f = '{0.__class__}'.format\nf(1)",
    "type('X', (), {})",
    "class M(type):\n    pass",
    "class A:\n    def __del__(self):\n        pass",
    "g = asyncio.gather()\ng.get_loop()",
    "raise SystemExit",
    "raise SystemExit(3)",
    "async def bye():\n    raise SystemExit(5)\nawait asyncio.gather(bye())",
    "'a' * 10**10",
    "[0] * 10**9",
    "s = 'ab'\ns *= 10**10",
    "10**10**8",
    "pow(10, 10**8)",
    "1 << 10**10",
    "list(range(10**10))",
    "f = list\nf(range(10**10))",
    "sorted(range(10**10))",
    "print(*range(10**10))",
    "[*range(10**10)]",
    "'x'.ljust(10**10)",
    "str.rjust('x', 10**10)",
    "'-'.join(['x' * 10**6] * 100)",
    "('ab' * 10**6).replace('a', 'a' * 100)",
    "f'{1:>{10**10}}'",
    "'%10000000000d' % 1",
    "(1).to_bytes(10**10, 'big')",
    "dict.fromkeys(range(10**10))",
    "sum([[0] * 10**6] * 100, [])",
    "z = []\nfor i in range(60):\n    z = [z, z]\nstr(z)",
    "while True:\n    pass",
    "while True: pass",
    "x = 0\nwhile True:\n    x += 1",
    "print(1.5 in range(10**12))",
    "list(iter(int, 1))",
    "any(x < 0 for x in range(10**12))",
    "try:\n    while True: pass\nexcept BaseException:\n    while True: pass",
    "try:\n    while True: pass\nfinally:\n    while True: pass",
    "async def spin():\n    while True: pass\nawait asyncio.gather(spin())",
    "await asyncio.sleep(100)",
    "def f():\n    return f()\nf()",
    "f = lambda: f()\nf()",
    "def f():\n    try:\n        return f()\n    except BaseException:\n        return f()\nf()",
    "x = []\nwhile True:\n    x.append('a' * 2_000_000 + str(len(x)))",
    "def g():\n    try:\n        yield 1\n    finally:\n        while True:\n            pass\nit = g()\nnext(it)\ndel it",
]
"""Interpreter escapes and resource bombs, first written for the in-process interpreter (removed in issue
#24, with ``tests/test_sandbox.py``). Real Python allows many of them (imports, ``eval``, frames); what
the worker must guarantee for each is bounded time, a healthy trainer and a working next cell."""

PROCESS_LEVEL = [
    # (code, what the error must contain, whether the worker must have been replaced)
    ("import os\nos._exit(3)", "exited with status 3", True),
    ("import os\nos.closerange(0, 1000)", "WorkerError", True),
    ("import hashlib\nhashlib.pbkdf2_hmac('sha256', b'p', b's', 10**9)", "TimeoutError", True),  # C: killed
    ("try:\n    while True: pass\nexcept BaseException:\n    while True: pass", "TimeoutError", False),
    ("import time\ntime.sleep(100)", "TimeoutError", False),
    ("b = bytearray(10 * 1024**3)", "MemoryError", False),
    ("x = [0] * (10**10)", "MemoryError", False),
    ("import os\nwhile True:\n    os.fork()", "PermissionError: starting processes", False),
    (
        "import subprocess\nsubprocess.run(['sh', '-c', 'echo hi'])",
        "PermissionError: starting processes",
        False,
    ),
    ("import multiprocessing\nmultiprocessing.Process(target=print).start()", "PermissionError", False),
    (
        "import socket\nsocket.socket(socket.AF_INET).connect(('1.1.1.1', 80))",
        "PermissionError: network",
        False,
    ),
    ("import urllib.request\nurllib.request.urlopen('http://example.com')", "Error", False),
    ("open('/etc/passwd').read()", "PermissionError: reading '/etc/passwd'", False),
    ("open('/tmp/x', 'w').write('x')", "PermissionError: writing files", False),
    ("import os\nos.listdir('/')", "PermissionError: listing '/'", False),
    ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "PermissionError: sending signals", False),
    ("import os, signal\nos.killpg(0, signal.SIGKILL)", "PermissionError: sending signals", False),
    ("import os\nos.pidfd_open(1)", "AttributeError", False),
    ("import threading\nthreading.Thread(target=print).start()", "PermissionError: starting threads", False),
    ("import ctypes", "ImportError", False),
    ("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", "PermissionError", False),
    ("import gc\ngc.get_objects()", "PermissionError", False),
    ("import sys\nsys.exit(0)", "SystemExit", False),
    (
        "import os\nfor fd in range(3, 30):\n    try:\n        os.write(fd, b'x' * 5_000_000)\n    except OSError:\n        pass",
        "WorkerError",
        True,
    ),  # fmt: skip
]


def _contained(w: CodeActWorker, code: str, limit: float) -> object:
    parent_pid, trace = os.getpid(), sys.gettrace()
    t0 = time.perf_counter()
    r = run(w, code)
    elapsed = time.perf_counter() - t0
    assert elapsed < limit, f"took {elapsed:.2f} s"
    assert os.getpid() == parent_pid and sys.gettrace() is trace
    follow = run(w, "print('alive', craft({'a': 1}, ('b', 1)))")
    assert follow.error is None and follow.stdout == "alive Successfully crafted 1 b(s)\n", follow
    return r


@pytest.mark.parametrize("code,expected,restarted", PROCESS_LEVEL, ids=[c for c, _, _ in PROCESS_LEVEL])
@MODES
def test_process_level_attacks_are_contained(code: str, expected: str, restarted: bool, ordered: bool):
    w = worker(ordered=ordered)
    run(w, "pass")  # started (the start-up time is not the cell's)
    r = _contained(w, code, CONTAINED_S)
    assert failure(r) is not None and expected in failure(r), (code, r)
    assert r.restarted == restarted and w.restarts == int(restarted), (code, r)
    w.close()


@MODES
def test_a_segfault_is_reported_and_the_trainer_survives(ordered):
    w = worker(WorkerLimits(wall_time_s=8, memory_mb=1024), ordered=ordered)
    run(w, "pass")
    code = "import sys\nsys.setrecursionlimit(10**7)\na = []\nfor _ in range(300000):\n    a = [a]\nrepr(a)"
    r = _contained(w, code, 12)
    assert r.restarted and "SIGSEGV" in r.error, r
    w.close()


@MODES
def test_huge_output_is_capped(ordered):
    w = worker(WorkerLimits(wall_time_s=5, max_output_chars=1000), ordered=ordered)
    r = run(w, "print('x' * 100_000_000)")
    assert r.error is None and len(r.stdout) < 1200 and "100000001 more characters" not in r.stdout
    assert r.stdout.startswith("x" * 1000) and "output truncated" in r.stdout
    w.close()


@MODES
def test_a_timed_out_cell_keeps_its_namespace(ordered):
    w = worker(ordered=ordered)
    r = run(w, "x = 41", "while True:\n    x += 0", "x + 1")
    assert (
        r[1].timed_out and not r[1].restarted and r[1].exception.startswith("TimeoutError: the cell exceeded")
    )
    assert "TimeoutError" in r[1].stdout and "Traceback (most recent call last)" in r[1].stdout
    assert r[2].stdout == "Out[1]: 42\n"
    w.close()


@pytest.mark.parametrize("code", HOSTILE, ids=HOSTILE)
@MODES
def test_every_interpreter_level_hostile_case_is_contained(code: str, ordered: bool):
    w = worker(ordered=ordered)
    run(w, "pass")
    _contained(w, code, CONTAINED_S)
    w.close()


@MODES
def test_isolation_is_reported(ordered):
    w = worker(ordered=ordered)
    run(w, "pass")
    assert w.isolation is not None and w.isolation.startswith("rlimits+audit")
    w.close()


@MODES
def test_a_forged_answer_cannot_shift_later_results(ordered):
    w = worker(ordered=ordered)
    run(w, "pass")
    forge = (
        "import os, json\n"
        "msg = (json.dumps({'type': 'done', 'cell': 2, 'stdout': 'forged'}) + '\\n').encode()\n"
        "for fd in range(3, 30):\n"
        "    try:\n"
        "        os.write(fd, msg)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('real')"
    )
    r2, r3 = run(w, forge, "print('three')")
    assert r2.stdout in ("forged", "real\n")  # a cell may forge its own output, nothing more
    assert r3.stdout == "three\n" and r3.error is None
    w.close()


def test_docstring_examples():
    import doctest

    import common.codeact.checks as checks
    import common.codeact.executor as executor
    import common.codeact.worker as worker_module
    import common.envs.textcraft.prompts as prompts

    for module in (checks, executor, worker_module, prompts):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__
