"""TextWorld-Sync (pure Python) vs real TextWorld cooking games: steps/s and fork() latency, side by side.

What it measures, for both worlds with the same method in one run:

* **steps/s**: world actions with observations, from a random policy (90% a random valid/admissible
  command, 10% an invalid one, which both worlds reject and count). Episodes that end are reset outside
  the timed segments, so only stepping is timed.
* **fork latency**: ``world.fork()`` on a mid-episode world (half the walkthrough / budget done), median of
  several timed batches. For TextWorld-Sync this copies flat Python state; for the real game it is
  ``env.copy()`` (a new Z-machine + state tracker).

TextWorld-Sync runs on EXTREME tasks (one per task family, ``textworld_sync.tasks.generate_tasks``); the
real env on games of the ``extreme`` cooking tier (5 ingredients, 12 rooms; generated once into the cache,
about 2 s each). Targets: TextWorld-Sync fork < 200 us and >= 20,000 steps/s; fork >= 500x faster than
``env.copy()``. Exit status 1 when a target is missed.

What it simplifies: one process, one agent, CPU only, no model and no session/prompt layer.
Run: ``python bench/bench_textworld.py [--quick] [--cache-dir DIR]`` (about 30 s; ``--quick`` ~10 s).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.envs.textworld_sync.tasks import generate_tasks as generate_sync_tasks  # noqa: E402
from common.envs.textworld_sync.world import SyncWorld  # noqa: E402

INVALID = "fly to the moon"


def fork_latency_us(world: Any, n: int, repeats: int) -> float:
    """Median over ``repeats`` batches of the mean ``world.fork()`` time, in microseconds."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            world.fork()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


def steps_per_s(
    fresh: Callable[[], Any],
    valid: Callable[[Any], list[str]],
    act: Callable[[Any, str], Any],
    over: Callable[[Any], bool],
    n_steps: int,
    seed: int,
) -> float:
    """Random-policy steps/s; ``fresh()`` (a reset) runs outside the timed segments."""
    rng = random.Random(seed)
    done, elapsed = 0, 0.0
    world = fresh()
    while done < n_steps:
        if over(world):
            world = fresh()
        t0 = time.perf_counter()
        while done < n_steps and not over(world):
            acts = valid(world)
            act(world, rng.choice(acts) if acts and rng.random() < 0.9 else INVALID)
            done += 1
        elapsed += time.perf_counter() - t0
    return n_steps / elapsed


# ---- TextWorld-Sync -------------------------------------------------------------------------------------


def bench_sync(n_steps: int, n_forks: int, seed: int) -> dict[str, Any]:
    rows = generate_sync_tasks("test", 7, seed=seed, tier="extreme")  # one per family
    sps, forks = [], []
    for k, row in enumerate(rows):
        base = SyncWorld(row)
        sps.append(
            steps_per_s(
                base.fork,
                lambda w: w.valid_actions("0"),
                lambda w, a: w.step("0", a),
                lambda w: w.over,
                n_steps // len(rows),
                seed + k,
            )
        )
        mid = base.fork()
        rng = random.Random(seed + k)
        for _ in range(base.spec.max_steps // 2):
            if mid.over:
                break
            mid.step("0", rng.choice(mid.valid_actions("0")))
        if mid.over:  # fall back to a world that is certainly mid-episode
            mid = base.fork()
            for _ in range(10):
                mid.step("0", "look around")
        forks.append(fork_latency_us(mid, n_forks, 5))
    return {"tasks": len(rows), "steps_per_s": statistics.median(sps), "fork_us": statistics.median(forks)}


# ---- real TextWorld -------------------------------------------------------------------------------------


def bench_real(n_steps: int, n_forks: int, seeds: list[int], cache_dir: str | None) -> dict[str, Any]:
    from common.envs.textworld_cooking.env import TextWorldCookingWorld  # noqa: PLC0415
    from common.envs.textworld_cooking.games import generate_game  # noqa: PLC0415
    from common.envs.textworld_cooking.oracle import oracle_command  # noqa: PLC0415

    sps, forks, gen_s, walk = [], [], [], []
    for k, game_seed in enumerate(seeds):
        t0 = time.perf_counter()
        path = generate_game("extreme", game_seed, cache_dir)
        gen_s.append(time.perf_counter() - t0)
        sps.append(
            steps_per_s(
                lambda p=path: TextWorldCookingWorld(p),
                lambda w: w.admissible_commands,
                lambda w, a: w.act("0", a),
                lambda w: w.over,
                n_steps // len(seeds),
                k,
            )
        )
        mid = TextWorldCookingWorld(path)
        walk.append(len(mid.walkthrough))
        for _ in range(len(mid.walkthrough) // 2):
            mid.act("0", oracle_command(mid))
        forks.append(fork_latency_us(mid, n_forks, 3))
    return {
        "games": len(seeds),
        "walkthrough_len": statistics.mean(walk),
        "generate_s": max(gen_s),
        "steps_per_s": statistics.median(sps),
        "fork_us": statistics.median(forks),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    ap.add_argument(
        "--cache-dir", default=None, help="tw-cooking game cache (default ~/.cache/sera/tw_games)"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    q = args.quick
    t_start = time.perf_counter()

    sync = bench_sync(n_steps=7_000 if q else 70_000, n_forks=500 if q else 2_000, seed=args.seed)
    try:
        real = bench_real(
            n_steps=150 if q else 600, n_forks=4 if q else 8, seeds=[1, 2], cache_dir=args.cache_dir
        )
    except ImportError as e:
        print(f"real TextWorld skipped: {e}")
        real = None

    rows = [
        ("TextWorld-Sync steps/s (extreme, 7 families)", sync["steps_per_s"], "steps/s", ">= 20,000"),
        ("TextWorld-Sync fork() latency", sync["fork_us"], "us", "< 200 us"),
    ]
    if real is not None:
        rows += [
            (f"real TextWorld steps/s (extreme, {real['games']} games)", real["steps_per_s"], "steps/s", ""),
            ("real TextWorld fork() = env.copy() latency", real["fork_us"], "us", ""),
            ("fork speed-up (real / Sync latency)", real["fork_us"] / sync["fork_us"], "x", ">= 500x"),
            ("steps/s speed-up (Sync / real)", sync["steps_per_s"] / real["steps_per_s"], "x", ""),
        ]
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>14}  {'unit':<8}  target")
    print("-" * (width + 42))
    for name, val, unit, tgt in rows:
        print(f"{name:<{width}}  {val:>14,.2f}  {unit:<8}  {tgt}")
    if real is not None:
        print(
            f"(real games: mean walkthrough {real['walkthrough_len']:.0f} commands; "
            f"generation or cache hit took {real['generate_s']:.2f} s at most)"
        )

    failed = []
    if sync["fork_us"] >= 200:
        failed.append("Sync fork >= 200 us")
    if sync["steps_per_s"] < 20_000:
        failed.append("Sync steps/s < 20,000")
    if real is not None and real["fork_us"] / sync["fork_us"] < 500:
        failed.append("fork speed-up < 500x")
    print(
        f"total {time.perf_counter() - t_start:.1f} s; "
        + ("all targets met" if not failed else "MISSED: " + "; ".join(failed))
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
