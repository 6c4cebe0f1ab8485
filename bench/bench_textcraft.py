"""Micro-benchmarks of TextCraft-Synth: fork latency, raw tool calls/s, CodeAct steps/s, oracle episodes/s.

Targets (SPEC §2 "cheap fork is a performance goal"): ``fork()`` < 50 us for a typical inventory, one
CodeAct step with one craft call < 1 ms (parse + worker cell + observation).

What it simplifies: single process, CPU only, no model; the "typical inventory" is that of a generated
hard task (base items + distractors) after its gold crafts ran (so it also holds intermediates).
Run: ``python bench/bench_textcraft.py [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.envs.base import ChildResult, LaunchRequest  # noqa: E402
from common.envs.textcraft.env import TextCraftEnv  # noqa: E402
from common.envs.textcraft.oracle import oracle_reply, run_episode  # noqa: E402
from common.envs.textcraft.tasks import generate_tasks  # noqa: E402
from common.envs.textcraft.world import TextCraftWorld  # noqa: E402


def per_call_us(fn: Callable[[], object], n: int, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean time per call, in microseconds."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


async def no_launch(request: LaunchRequest) -> ChildResult:
    return ChildResult(request=request, returned=True, message="ok", steps_used=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    args = ap.parse_args()
    scale = 0.1 if args.quick else 1.0
    rows: list[tuple[str, float, str, str]] = []

    task = generate_tasks("train", 4, seed=0, difficulty="hard")[0]
    env = TextCraftEnv(max_steps=10**9)
    world = env.make_world(task)
    for st in task["misc"]["gold_trajectory"][: len(task["misc"]["gold_trajectory"]) // 2]:
        world.craft(st["ingredients"], (st["target"][0], st["result_count"]))
    n_items = len(world.inventory)

    fork_us = per_call_us(world.fork, int(200_000 * scale))
    rows.append((f"fork() ({n_items} inventory entries)", fork_us, "us", "< 50 us"))
    big = TextCraftWorld(world.book, {i: 5 for i in world.book.items[:300]}, world.targets)
    rows.append(("fork() (300 inventory entries)", per_call_us(big.fork, int(50_000 * scale)), "us", ""))
    rows.append(
        ("commit(branch)", per_call_us(lambda: world.commit(world.fork()), int(100_000 * scale)), "us", "")
    )

    # Raw tool calls: a craft that succeeds (an abundant tier-1 item) and a get_info.
    book = world.book
    item = next(i for i in book.items if book.tier(i) == 1)
    rec = book.recipe(item)
    raw = TextCraftWorld(book, {k: 10**12 for k in rec.ingredients}, {item: 1})
    ings = dict(rec.ingredients)
    target = (item, rec.result_count)
    craft_us = per_call_us(lambda: raw.craft(ings, target), int(200_000 * scale))
    rows.append(("world.craft (success)", 1e6 / craft_us, "calls/s", ""))
    info_us = per_call_us(lambda: raw.get_info([item]), int(200_000 * scale))
    rows.append(("world.get_info (1 item)", 1e6 / info_us, "calls/s", ""))

    async def codeact() -> None:
        sess = env.root_session(TextCraftWorld(book, dict(raw.inventory), {item: 1}), task, no_launch)
        reply = f"<thought>craft one batch</thought>\n<python>\nout = craft({ings!r}, {target!r})\n</python>"
        loop_reply = (
            "<thought>many crafts</thought>\n<python>\n"
            f"for _ in range(1000):\n    craft({ings!r}, {target!r})\n</python>"
        )
        count = iter(range(10**9))

        def numbered(r: str) -> str:  # distinct cells: the loop detector finishes an agent after 4 equal ones
            return r.replace("\n</python>", f"\n# {next(count)}\n</python>")

        for _ in range(20):  # warm-up
            await sess.step(numbered(reply))
        n = int(5_000 * scale)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                res = await sess.step(numbered(reply))
            times.append((time.perf_counter() - t0) / n * 1e6)
        assert "Error" not in res.observation and not res.done, res.observation
        step_us = statistics.median(times)
        rows.append(("CodeAct step, 1 craft call", step_us, "us", "< 1000 us"))
        rows.append(("CodeAct steps/s, 1 craft call", 1e6 / step_us, "steps/s", ""))
        m = max(3, int(30 * scale))
        t0 = time.perf_counter()
        for _ in range(m):
            await sess.step(numbered(loop_reply))
        per = (time.perf_counter() - t0) / (m * 1000) * 1e6
        rows.append(("craft calls/s inside one cell", 1e6 / per, "calls/s", ""))

        tasks = generate_tasks("val", max(8, int(80 * scale)), seed=0)
        ep_env = TextCraftEnv()
        for delegate in (False, True):
            t0 = time.perf_counter()
            outs = [
                await run_episode(ep_env, t, lambda s, d=delegate: oracle_reply(s, delegate=d)) for t in tasks
            ]
            dt = time.perf_counter() - t0
            ok = sum(o.success for o in outs)
            rows.append(
                (
                    f"oracle episodes/s (delegate={delegate}, {ok}/{len(outs)} solved)",
                    len(outs) / dt,
                    "episodes/s",
                    "",
                )
            )

    asyncio.run(codeact())

    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>12}  {'unit':<10}  target")
    print("-" * (width + 46))
    for name, val, unit, tgt in rows:
        verdict = ""
        if tgt:  # "< N unit": lower is better
            verdict = "  ok" if val < float(tgt.split()[1]) else "  MISSED"
        print(f"{name:<{width}}  {val:>12,.2f}  {unit:<10}  {tgt}{verdict}")


if __name__ == "__main__":
    main()
