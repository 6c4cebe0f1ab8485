"""CodeAct cost: the worker process and its fixed-order mode, side by side (target: one-call step <= 1 ms).

Measures, for ``TextCraftEnv(executor="worker")`` (default: an isolated process per agent, tools over a
pipe) and ``TextCraftEnv(executor="worker-ordered")`` (the same workers, each cell segment served inline on
the event loop: siblings act in one fixed order):

* a full CodeAct step with one tool call, ``session.step(reply)`` = parse the reply, check the cell,
  run it (one ``craft`` round trip to the trainer for the worker), format the observation: median and
  90th percentile;
* an empty cell (``pass``): the fixed cost per cell;
* a cell with 20 tool calls (each one is a pipe round trip for the worker);
* a 100k-iteration Python loop (per iteration: the worker runs plain CPython);
* starting a session until its first cell can run (the worker is forked from a warm zygote; spares
  are isolated in advance);
* a step that gathers two ``launch_subagent`` calls (echo hook: the round trip, not a child's work);
* two sessions on different worlds each running a 1M-iteration loop cell at once (gathered): wall time.
  The plain mode runs both cells in parallel; the fixed-order mode runs one after the other (its cost:
  no two cells run at once in one trainer).

Below the table, a reference: the same one-call code and loop as plain ``exec`` in this process (what
the code costs without a worker). The in-process interpreter's column (removed in issue #24) stays in
``bench/RESULTS.md``.

Simplifies: one asyncio loop, a 3-recipe world, no model; medians over many repeats on a shared machine
(run it twice; the spread between runs is the noise).
Run: ``python bench/bench_codeact.py`` (about 30 s) or ``python bench/bench_codeact.py --quick``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from common.envs.textcraft.env import TextCraftEnv, echo_launch_hook

TABLE = {
    "recipes": {
        "plank": {"ingredients": {"log": 1}, "result_count": 4},
        "stick": {"ingredients": {"plank": 2}, "result_count": 4},
        "torch": {"ingredients": {"stick": 1, "coal": 1}, "result_count": 1},
    }
}
TASK = {
    "id": "bench",
    "goal": "Craft the following items: 1x torch",
    "misc": {
        "target_items": {"torch": 1},
        "initial_inventory": {"log": 10**6, "coal": 10**6},
        "recipes": TABLE,
    },
}
ONE_CALL = 'print(craft({"log": 1}, ("plank", 4)))'
TWENTY_CALLS = 'for _ in range(20):\n    craft({"log": 1}, ("plank", 4))'
LOOP = "total = 0\nfor i in range(100000):\n    total += i"
BIG_LOOP = "total = 0\nfor i in range(1000000):\n    total += i"
GATHER = 'r = await asyncio.gather(launch_subagent({"stick": 4}), launch_subagent({"plank": 4}))'


_N = [0]


def reply(code: str) -> str:
    """A reply running ``code``; a counter comment keeps the loop detector (4 equal cells) quiet."""
    _N[0] += 1
    return f"<thought>bench</thought>\n<python>\n{code}\n# {_N[0]}\n</python>"


async def timings(fn: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


async def bench_executor(executor: str, scale: float) -> dict[str, tuple[float, str]]:
    env = TextCraftEnv(executor=executor, max_steps=10**9)
    rows: dict[str, tuple[float, str]] = {}

    def session():
        return env.root_session(env.make_world(TASK), TASK, echo_launch_hook)

    s = session()
    steps = [0]

    async def step(code: str) -> Any:
        steps[0] += 1
        r = await s.step(reply(code))
        assert not r.done and r.info.get("cell_error") is None, r
        return r

    for _ in range(20):  # warm up (and start the worker)
        await step(ONE_CALL)
    n = max(50, int(2000 * scale))
    one = await timings(lambda: step(ONE_CALL), n)
    rows["one-call CodeAct step, median"] = (statistics.median(one) * 1e6, "us")
    rows["one-call CodeAct step, p90"] = (q(one, 0.9) * 1e6, "us")
    rows["empty cell step (pass), median"] = (statistics.median(await timings(lambda: step("pass"), n)) * 1e6, "us")  # fmt: skip
    m = max(20, n // 10)
    rows["20-call cell step, median"] = (statistics.median(await timings(lambda: step(TWENTY_CALLS), m)) * 1e6, "us")  # fmt: skip
    loop = await timings(lambda: step(LOOP), max(5, int(30 * scale)))
    rows["loop iteration (100k-iteration cell)"] = (statistics.median(loop) / 100_000 * 1e9, "ns")
    rows["gather of two launches (echo), median"] = (statistics.median(await timings(lambda: step(GATHER), m)) * 1e6, "us")  # fmt: skip
    s.close()

    async def start() -> None:
        fresh = session()
        await fresh.step(reply("pass"))
        fresh.close()

    rows["session start + first cell, median"] = (statistics.median(await timings(start, max(10, int(100 * scale)))) * 1e3, "ms")  # fmt: skip

    pair = [session(), session()]  # two worlds: the plain mode may run their cells at once
    for p in pair:
        await p.step(reply("pass"))

    async def both() -> None:
        results = await asyncio.gather(*(p.step(reply(BIG_LOOP)) for p in pair))
        assert all(r.info.get("cell_error") is None for r in results), results

    rows["two 1M-loop cells at once (two worlds), wall"] = (statistics.median(await timings(both, max(3, int(10 * scale)))) * 1e3, "ms")  # fmt: skip
    for p in pair:
        p.close()
    return rows


def plain_exec(scale: float) -> dict[str, float]:
    """The same code as plain ``exec`` of a precompiled code object in this process: no worker at all."""
    ns: dict[str, Any] = {"craft": lambda ingredients, target: "ok", "print": lambda *a, **k: None}
    one, loop = compile(ONE_CALL, "<plain>", "exec"), compile(LOOP, "<plain>", "exec")
    n = max(1000, int(100_000 * scale))
    t0 = time.perf_counter()
    for _ in range(n):
        exec(one, ns)
    one_us = (time.perf_counter() - t0) / n * 1e6
    m = max(3, int(30 * scale))
    t0 = time.perf_counter()
    for _ in range(m):
        exec(loop, ns)
    return {"one_call_us": one_us, "loop_ns": (time.perf_counter() - t0) / m / 100_000 * 1e9}


EXECUTORS = {"worker": "worker", "worker-ordered": "ordered"}


async def main_async(scale: float) -> None:
    rows = {name: await bench_executor(name, scale) for name in EXECUTORS}
    first = rows["worker"]
    width = max(len(k) for k in first)
    print(f"{'measure':<{width}}  " + "  ".join(f"{h:>10}" for h in EXECUTORS.values()) + "  unit   target")
    print("-" * (width + 12 * len(EXECUTORS) + 20))
    for key, (_, unit) in first.items():
        target = "<= 1000 us" if key.startswith("one-call CodeAct step, median") else ""
        values = "  ".join(f"{rows[name][key][0]:>10,.1f}" for name in EXECUTORS)
        print(f"{key:<{width}}  {values}  {unit:<5}  {target}")
    plain = plain_exec(scale)
    print(
        f"reference, plain exec in this process: one-call code {plain['one_call_us']:,.2f} us, "
        f"loop iteration {plain['loop_ns']:,.1f} ns"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = parser.parse_args()
    asyncio.run(main_async(0.05 if args.quick else 1.0))


if __name__ == "__main__":
    main()
