"""Seconds per level-0 optimizer step on CPU with SmolLM2, split into rollout / scoring / training, and
peak RSS (target: under 8 GB for the default CPU run).

    python bench/bench_level0.py                  # `sera train` defaults + --oracle-mix 0.5, 3 steps, TextCraft
    python bench/bench_level0.py --env textworld --steps 3

Runs ``level0_single_process.train.train`` with the default TrainConfig (SmolLM2-135M, 1 task x 2
rollouts, 3 steps per agent, 64 new tokens) in a temp directory and prints one row per step. Half of the
replies are teacher-forced oracle replies (``--oracle-mix 0.5``) so every stage has datums to train on;
``--oracle-mix 0`` is the pure-RL default of ``sera train`` (SmolLM2 then has no signal and never trains). Scoring
(rubric + score calls) happens inside the rollout, so it is shown both on its own and within rollout.
"""

from __future__ import annotations

import argparse
import tempfile

from common.train_config import TrainConfig
from level0_single_process.train import train


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", default="textcraft")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--schedule", default="execution:1,delegation:1,rubric:1")
    ap.add_argument("--oracle-mix", type=float, default=0.5, help="teacher-forced oracle share (0 = pure RL)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cfg = TrainConfig(env=args.env, steps=args.steps, out=f"{d}/run", schedule=args.schedule,
                          oracle_mix=args.oracle_mix, score_noise=0.3)
        history = train(cfg, progress=False)
    print(
        f"\n{'step':>4} {'stage':>10} {'rollout s':>10} {'(scoring s)':>12} {'train s':>8} {'total s':>8} "
        f"{'tok/s':>7} {'peak RSS GB':>12}"
    )
    for h in history:
        total = h["time/rollout_s"] + h["time/train_s"]
        print(
            f"{h['step']:>4} {h['stage']:>10} {h['time/rollout_s']:>10.1f} {h['time/scoring_s']:>12.1f} "
            f"{h['time/train_s']:>8.1f} {total:>8.1f} {h['tokens_per_s']:>7.1f} {h['mem/peak_rss_gb']:>12.2f}"
        )
    peak = max(h["mem/peak_rss_gb"] for h in history)
    print(f"peak RSS {peak:.2f} GB -> target < 8 GB {'met' if peak < 8 else 'MISSED'}")


if __name__ == "__main__":
    main()
