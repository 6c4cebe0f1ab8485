"""Level 2's seconds per step split into rollout / weight sync / train, next to level 1 on the same config.

    python bench/bench_level2.py --model tiny --steps 3                          # CPU: 1 server + 1 trainer
    python bench/bench_level2.py --model tiny --steps 3 --trainers 2 --servers 2
    python bench/bench_level2.py --model smollm2 --steps 4 --single-node 2 --level1   # 2 GPUs vs level 1 on 1

Every row is the median over the optimizer steps after the first (the first pays for start-up: actors,
model loads, the first sync). ``steps/s`` counts optimizer steps over the rounds' wall time (rounds without
an update included). The issue's goal: level 2 on 2 GPUs >= 1.8x level 1 on 1 GPU's steps/s.

What it simplifies: one seed, a small fixed config (teacher-forced oracle replies so that groups have
signal); a measurement, not a sweep.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def config(args, out: str):
    from common.train_config import TrainConfig

    return TrainConfig.make(
        env="textcraft", model=args.model, out=out, steps=args.steps, schedule="execution:1",
        tasks_per_step=args.tasks, rollouts_per_task=args.rollouts, max_steps=3, max_new_tokens=args.new_tokens,
        rubric_max_new_tokens=16, oracle_mix=0.7, score_noise=0.3, difficulty="medium", n_tasks=16,
        max_task_replacements=3, max_idle_rounds=6, dtype=args.dtype,
    )  # fmt: skip


def summary(name: str, history: list[dict], wall: float) -> dict:
    rows = [h for h in history[1:]] or history
    med = {
        k: statistics.median(h.get(k, 0.0) for h in rows)
        for k in ("time/rollout_s", "time/sync_s", "time/train_s")
    }
    steps = sum(1 for h in history if not h.get("train/skipped"))
    step_time = statistics.median(h.get("time/step_s", h["time/rollout_s"] + h["time/train_s"]) for h in rows)
    return {
        "name": name,
        **med,
        "step_s": step_time,
        "steps_per_s": 1.0 / step_time,
        "steps": steps,
        "wall": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--rollouts", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--trainers", type=int, default=1)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--single-node", type=int, default=0)
    ap.add_argument("--weight-sync", default="broadcast")
    ap.add_argument(
        "--server-engine", default="auto", help="auto (vllm on GPUs, hf on CPU), hf, vllm, sglang"
    )
    ap.add_argument(
        "--server-python", default="", help="interpreter of the engine processes (e.g. a vLLM venv)"
    )
    ap.add_argument("--colocate", action="store_true", help="a trainer rank and its engine per GPU")
    ap.add_argument("--sync-check", action="store_true", help="report sync/logprob_gap after every sync")
    ap.add_argument("--level1", action="store_true", help="also run level 1 (one process) on the same config")
    args = ap.parse_args()

    from level2_distributed.config import Level2Config
    from level2_distributed.train import train as train2

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        l2 = Level2Config(trainers=args.trainers, servers=args.servers, single_node=args.single_node,
                          weight_sync=args.weight_sync, server_batch_size=64, server_engine=args.server_engine,
                          server_python=args.server_python, colocate=args.colocate,
                          sync_check=args.sync_check)  # fmt: skip
        t = time.perf_counter()
        h = train2(config(args, f"{tmp}/l2"), l2, progress=False)
        r = l2.resolved()
        results.append(
            summary(f"level 2 ({r.trainers} FSDP + {r.servers} servers)", h, time.perf_counter() - t)
        )
        if args.level1:
            from level1_batched.config import Level1Config
            from level1_batched.train import train as train1

            t = time.perf_counter()
            h = train1(
                config(args, f"{tmp}/l1"), Level1Config(max_tokens_per_microbatch=4096), progress=False
            )
            results.append(summary("level 1 (one process)", h, time.perf_counter() - t))
    print("\n| run | rollout s | sync s | train s | s/step | steps/s | optimizer steps | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['name']} | {r['time/rollout_s']:.2f} | {r['time/sync_s']:.3f} | {r['time/train_s']:.2f} | "
              f"{r['step_s']:.2f} | {r['steps_per_s']:.3f} | {r['steps']} | {r['wall']:.0f} |")  # fmt: skip
    if len(results) == 2:
        print(f"\nlevel 2 / level 1 steps/s: {results[0]['steps_per_s'] / results[1]['steps_per_s']:.2f}x")


if __name__ == "__main__":
    main()
