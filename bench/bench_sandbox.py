"""Micro-benchmarks of the CodeAct sandbox (``common/sandbox.py``): the cost of one cell.

Measures, on one asyncio loop:

* a one-tool-call cell ``print(craft({'a': 1}, ('b', 1)))`` with a trivial Python tool: cells/s and us;
* a full CodeAct step for that cell: parse the reply + run the cell + format the observation
  (target: under 1 ms);
* an empty cell (``pass``) = the fixed overhead of parse/validate/rewrite/compile/trace setup;
* the same one-call code with plain ``exec`` of a precompiled code object (no sandbox) = raw Python;
* a cell awaiting an async tool (``await noop()``);
* a 100k-iteration loop, sandboxed vs plain ``exec`` (the per-iteration cost of tracing and guards).

Simplifies: single process, warm caches, medians of 3 repeats; no agent runtime around the cell.
Run: ``python bench/bench_sandbox.py`` (about 10 s) or ``python bench/bench_sandbox.py --quick``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from common.envs.textcraft.codeact import format_cell_observation, parse_codeact_reply
from common.sandbox import Sandbox

ONE_CALL = "print(craft({'a':1}, ('b',1)))"
LOOP = "total = 0\nfor i in range(100000):\n    total += i"


def craft(ingredients: dict, target: tuple) -> str:
    return f"Successfully crafted {target[1]} {target[0]}(s)"


async def noop() -> str:
    return "ok"


async def per_call_us_async(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            await fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


def per_call_us(fn: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


async def bench(scale: float) -> list[tuple[str, float, str, str]]:
    rows: list[tuple[str, float, str, str]] = []
    sb = Sandbox({"craft": craft, "noop": noop})
    n = max(200, int(20_000 * scale))

    async def one_call() -> None:
        r = await sb.run(ONE_CALL)
        assert r.error is None, r.error

    for _ in range(50):
        await one_call()
    us = await per_call_us_async(one_call, n)
    rows.append(("one-call cell (sandbox.run)", us, "us", ""))
    rows.append(("one-call cells/s", 1e6 / us, "cells/s", ""))

    reply = f"<thought>craft one batch</thought>\n<python>\n{ONE_CALL}\n</python>"
    step_no = [0]

    async def codeact_step() -> None:
        parsed = parse_codeact_reply(reply)
        result = await sb.run(parsed.code)
        step_no[0] += 1
        format_cell_observation(step_no[0], result)

    rows.append(
        (
            "CodeAct step (parse + cell + observation)",
            await per_call_us_async(codeact_step, n),
            "us",
            "< 1000 us",
        )
    )

    async def empty() -> None:
        await sb.run("pass")

    rows.append(("empty cell (fixed overhead)", await per_call_us_async(empty, n), "us", ""))

    plain_ns: dict[str, Any] = {"craft": craft, "print": lambda *a, **k: None}
    code = compile(ONE_CALL, "<plain>", "exec")
    rows.append(
        ("same code, plain exec (precompiled)", per_call_us(lambda: exec(code, plain_ns), n * 5), "us", "")
    )

    async def awaited() -> None:
        r = await sb.run("print(await noop())")
        assert r.error is None, r.error

    rows.append(("cell awaiting an async tool", await per_call_us_async(awaited, n), "us", ""))

    m = max(3, int(20 * scale))
    loop_ns: dict[str, Any] = {}
    loop_code = compile(LOOP, "<plain>", "exec")
    plain_loop = per_call_us(lambda: exec(loop_code, loop_ns), m) / 100_000 * 1e3

    async def loop_cell() -> None:
        r = await sb.run(LOOP)
        assert r.error is None, r.error

    sandboxed_loop = await per_call_us_async(loop_cell, m) / 100_000 * 1e3
    rows.append(("loop iteration, plain exec", plain_loop, "ns", ""))
    rows.append(("loop iteration, sandboxed (trace + guards)", sandboxed_loop, "ns", ""))
    rows.append(("loop slowdown factor", sandboxed_loop / plain_loop, "x", ""))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = parser.parse_args()
    rows = asyncio.run(bench(0.05 if args.quick else 1.0))
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>12}  {'unit':<8}  target")
    print("-" * (width + 40))
    for name, val, unit, target in rows:
        print(f"{name:<{width}}  {val:>12,.2f}  {unit:<8}  {target}")


if __name__ == "__main__":
    main()
