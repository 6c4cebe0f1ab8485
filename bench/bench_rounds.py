"""Level-1 RL rounds side by side: the old path vs the fast path (issue #21), or synchronous rounds vs one
round ahead (``--compare staleness``, issue #42).

    python bench/bench_rounds.py --model runs/learning/sft/model --rounds 2     # one H200, vLLM installed
    python bench/bench_rounds.py --model DIR --paths after,after_mp            # only the engine-process question
    python bench/bench_rounds.py --model tiny-dir --rounds 1 --tasks 1 --rollouts 2 --max-new-tokens 16  # CPU
    python bench/bench_rounds.py --compare staleness --model tiny --steps 6    # CPU: --max-staleness 0 vs 1
    python bench/bench_rounds.py --compare staleness --model runs/learning/sft/model --steps 12 \
        --tasks 8 --rollouts 8 -- --engine vllm --env textcraft     # one H200, 8 x 8, the warm start

``--compare staleness`` runs ``sera train --level 1`` (``python -m level1_batched.train``) once per
``--max-staleness`` value, one process after the other (each alone on the device), with the same tasks,
seeds and settings (arguments after ``--`` go to every run), and reads each run's metrics.jsonl. The first
round (start-up, compilation, and no round ahead yet) is left out of every number. Per run: mean and p90
round seconds (all rounds and Execution rounds), generated tokens per wall second of the rounds, train
tokens per second of the steps, the trainer's wait for rollouts, the off-policy gap, the GPU busy fraction
(nvidia-smi's utilization sampled every 0.2 s over the rounds; "n/a" on a CPU), and the learning signal
per optimizer step (``reward/exec_mean``, ``loss/abs_log_ratio``); then the ratios.

The default comparison (``--compare paths``):

One process, one vLLM engine, the same tasks and seeds for both paths, the level-1 functions the loop uses
(``collect_groups_in_flight``, ``build_stage_batch``, ``train_on_shard``, ``sync_weights``):

* **before** (main d8414b2's defaults): the engine's queue path (each batch of requests runs to completion
  in ``LLM.generate``: a wave ends with its slowest sequence), an fp32 model trained by the reference packed
  path (dense block mask, 2048-token rows);
* **after**: continuous batching (every request joins vLLM's running batch at the next scheduler step),
  bf16 compute with fp32 master weights, the fast trainer (varlen attention, chunked head, 32K-token rows,
  no activation checkpointing), the engine core in this process;
* **after_mp** (the defaults on CUDA now): the same with vLLM's engine core in a process of its own
  (``--engine-process``: its model loop no longer shares this process's GIL with the rollouts). It needs a
  second engine, started beside the first (both at ``gpu_memory_utilization`` 0.3).

Per path it runs ``--rounds`` RAO rounds and ``--rounds`` SERA Rubric-stage rounds (K counterfactual
branches, rubric writing and scoring: the most expensive stage) and prints seconds per round (rollout,
train, sync) and the ratios. Both paths share the engine, so the engine's bf16 weights are the same kind in
both (today's path ran its engine in the trainer's fp32: slower still). Start-up is not counted here; the
engines' start-up seconds are printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.agent.judge import make_judge  # noqa: E402
from common.envs import env_spec  # noqa: E402
from common.policy.models import load_model  # noqa: E402
from common.rl.batch import build_stage_batch  # noqa: E402
from common.run.data import TaskSampler, task_pool  # noqa: E402
from common.run.optim import make_optimizer  # noqa: E402
from common.run.rollout import make_env_with_prompts  # noqa: E402
from common.run.setup import method_and_schedule, train_policy  # noqa: E402
from common.train_config import TrainConfig  # noqa: E402
from level1_batched.config import Level1Config  # noqa: E402
from level1_batched.efficiency import apply_efficiency  # noqa: E402
from level1_batched.rollouts import collect_groups_in_flight  # noqa: E402
from level1_batched.train import train_on_shard  # noqa: E402
from level1_batched.vllm_engine import make_rollout_engine, sync_weights  # noqa: E402


def run_round(cfg, stage, rnd, model, optimizer, engine, l1, env) -> dict[str, float]:
    """One level-1 round (rollouts, batch, one optimizer step, weight sync); seconds of each part."""
    preset, _ = method_and_schedule(cfg)
    sampler = TaskSampler(task_pool(cfg.env, cfg.tasks, cfg.n_tasks, cfg.seed, cfg.difficulty), cfg.seed, rnd)
    policy = train_policy(cfg, model, None, max_batch_size=l1.max_batch_size, engine=engine)
    t0 = time.perf_counter()
    groups, _ = collect_groups_in_flight(
        cfg, stage, rnd, sampler, env, policy, make_judge(cfg.judge, policy), preset
    )
    t1 = time.perf_counter()
    batch = build_stage_batch(
        stage, groups, preset.execution_reward, zero_variance=env_spec(cfg.env).zero_variance,
        tokenizer=engine.tokenizer,
    )  # fmt: skip
    n_tokens = float(sum(d.num_trained_tokens for d in batch.datums))
    m = train_on_shard(model, optimizer, batch.datums, batch.weights, n_tokens, cfg, l1) if n_tokens else {}
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    t_sync = sync_weights(engine, model, rnd + 1)
    return {
        "rollout_s": t1 - t0,
        "train_s": t2 - t1,
        "sync_s": t_sync,
        "round_s": time.perf_counter() - t0,
        "datums": len(batch.datums),
        "train_tokens": m.get("train/packed_tokens", 0.0),
        "gen_tokens": float(
            sum(len(s.call.output_ids) for g in groups for t in g for n in t.nodes.values() for s in n.steps)
        ),  # fmt: skip
    }


class GpuBusy:
    """Samples nvidia-smi's utilization.gpu every ``period_s`` while ``counting()`` is true; ``fraction()`` is
    the mean (0-1), None without nvidia-smi (a CPU run)."""

    def __init__(self, counting, period_s: float = 0.2) -> None:
        self.samples: list[float] = []
        self.counting, self.period_s = counting, period_s
        self.stop = threading.Event()
        self.smi = shutil.which("nvidia-smi")
        self.thread = threading.Thread(target=self._run, daemon=True)
        if self.smi:
            self.thread.start()

    def _run(self) -> None:
        query = [self.smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "--id=0"]
        while not self.stop.wait(self.period_s):
            if self.counting():
                out = subprocess.run(query, capture_output=True, text=True).stdout.strip()
                if out:
                    self.samples.append(float(out.splitlines()[0]) / 100)

    def fraction(self) -> float | None:
        self.stop.set()
        if self.smi:
            self.thread.join()
        return sum(self.samples) / len(self.samples) if self.samples else None


def percentile(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank).

    >>> percentile([1.0, 2.0, 3.0, 4.0, 10.0], 0.9)
    10.0
    """
    xs = sorted(xs)
    return xs[max(0, math.ceil(q * len(xs)) - 1)] if xs else float("nan")


def summarize(rows: list[dict], busy: float | None) -> dict[str, float | None]:
    """The bench's numbers of one run from its metrics rows (round 0 left out)."""
    rounds = [r for r in rows if "time/round_s" in r and r["round"] > 0]
    if not rounds:
        raise SystemExit("a run logged no round after its first: raise --steps")
    execution = [r["time/round_s"] for r in rounds if r["stage"] == "execution"]
    gen = sum(r["tokens_per_s"] * r["time/rollout_s"] for r in rounds)  # tokens generated
    steps = [r for r in rounds if not r["train/skipped"]]
    nan = float("nan")
    return {
        "rounds": len(rounds),
        "round_mean_s": sum(r["time/round_s"] for r in rounds) / len(rounds),
        "round_p90_s": percentile([r["time/round_s"] for r in rounds], 0.9),
        "exec_mean_s": sum(execution) / len(execution) if execution else nan,
        "exec_p90_s": percentile(execution, 0.9),
        "gen_tok_per_s": gen / sum(r["time/round_s"] for r in rounds),
        "train_tok_per_s": sum(r.get("train/packed_tokens", 0.0) for r in steps)
        / max(sum(r["time/train_s"] for r in steps), 1e-9),
        "wait_s": sum(r.get("time/rollout_wait_s", r["time/rollout_s"]) for r in rounds) / len(rounds),
        "gap_mean": sum(r.get("offpolicy/gap_mean", 0.0) for r in rounds) / len(rounds),
        "gpu_busy": busy,
        "exec_reward_per_step": sum(r["reward/exec_mean"] for r in steps) / len(steps) if steps else nan,
        "abs_log_ratio": sum(r.get("loss/abs_log_ratio", nan) for r in steps) / len(steps) if steps else nan,
    }


def compare_staleness(args, train_args: list[str]) -> None:
    """``--max-staleness`` 0 and 1 (``--staleness``) side by side: one ``sera train --level 1`` process each."""
    root = Path(args.out)
    results = {}
    for n in [int(x) for x in args.staleness.split(",")]:
        out = root / f"staleness{n}"
        command = [
            sys.executable, "-m", "level1_batched.train", "--model", args.model, "--out", str(out), "--overwrite",
            "--steps", str(args.steps), "--tasks-per-step", str(args.tasks), "--rollouts-per-task",
            str(args.rollouts), "--max-steps", str(args.max_steps), "--max-new-tokens", str(args.max_new_tokens),
            "--max-staleness", str(n), *train_args,
        ]  # fmt: skip
        print("$", " ".join(command), flush=True)
        metrics = out / "metrics.jsonl"

        def counting(metrics=metrics) -> bool:  # after the first round: start-up and compilation left out
            return metrics.exists() and metrics.stat().st_size > 0

        busy = GpuBusy(counting)
        t0 = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        fraction = busy.fraction()
        if proc.returncode not in (0, 3):
            raise SystemExit(f"--max-staleness {n}: the run failed (exit {proc.returncode})")
        rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        results[n] = summarize([r for r in rows if "time/round_s" in r], fraction)
        print(f"max-staleness {n}: {time.perf_counter() - t0:.0f} s in all", flush=True)
    keys = list(next(iter(results.values())))
    print("\n| --max-staleness | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for n, m in results.items():
        cells = ["n/a" if v is None else f"{v:.4g}" for v in m.values()]
        print(f"| {n} | " + " | ".join(cells) + " |")
    if {0, 1} <= set(results):
        a, b = results[0], results[1]
        print(f"N=1 vs N=0: round {a['round_mean_s'] / b['round_mean_s']:.2f}x faster (mean), "
              f"Execution round {a['exec_mean_s'] / b['exec_mean_s']:.2f}x, "
              f"generated tok/s {b['gen_tok_per_s'] / a['gen_tok_per_s']:.2f}x")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a model directory (e.g. the SFT warm start)")
    ap.add_argument("--compare", choices=("paths", "staleness"), default="paths")
    ap.add_argument("--rounds", type=int, default=2, help="paths: rounds per method")
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=320)
    ap.add_argument("--max-batch-size", type=int, default=256)
    ap.add_argument("--paths", default="before,after,after_mp")
    ap.add_argument("--staleness", default="0,1", help="staleness: the --max-staleness values, in this order")
    ap.add_argument("--steps", type=int, default=6, help="staleness: optimizer steps per run")
    ap.add_argument("--out", default="/tmp/bench_rounds", help="staleness: the runs' directory")
    argv = sys.argv[1:]
    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.compare == "staleness":
        compare_staleness(args, train_args)
        return
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    base = TrainConfig.make(
        env="textcraft", model=args.model, tasks_per_step=args.tasks, rollouts_per_task=args.rollouts,
        max_steps=args.max_steps, max_new_tokens=args.max_new_tokens, rubric_max_new_tokens=384,
        score_max_new_tokens=128, difficulty="easy", n_tasks=256, lr=1e-5, dtype="float32",
        codeact_executor="worker-ordered",  # the same siblings order for every path
        max_batch_size=args.max_batch_size,
    )  # fmt: skip
    engines: dict[bool, object] = {}  # engine_process -> engine (before and after share the in-process one)
    env = make_env_with_prompts(base.env, None, base.codeact_executor)
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for path in args.paths.split(","):
        if path not in ("before", "after", "after_mp"):
            raise SystemExit(f"unknown path {path!r}: use before, after, after_mp")
        fast, mp = path != "before", path == "after_mp"
        dtype = "bfloat16" if fast and cuda else "float32"
        l1 = Level1Config(engine="vllm", fast_trainer=fast).resolved(cuda)
        model, tokenizer = load_model(args.model, dtype=dtype, device=device)
        if mp not in engines:  # started from plain weights
            t_start = time.perf_counter()
            engines[mp] = make_rollout_engine("vllm", model.to(torch.bfloat16) if cuda else model, tokenizer,
                                              max_batch_size=args.max_batch_size, engine_process=mp)  # fmt: skip
            print(f"engine (engine_process={mp}) started in {time.perf_counter() - t_start:.1f} s", flush=True)
            model = model.to(getattr(torch, dtype))
        engine = engines[mp]
        stepper = engine.stepper
        engine.stepper = stepper if fast else None  # before: the queue's run-to-completion batches
        if fast:
            apply_efficiency(model, checkpoint_fraction=l1.checkpoint_fraction)
        optimizer = make_optimizer(model, replace(base.optim, dtype=dtype))
        sync_weights(engine, model, 0)
        results[path] = {}
        for method, stage in (("rao", "execution"), ("sera", "rubric")):
            cfg = replace(base, method=method, optim=replace(base.optim, dtype=dtype))
            rows = []
            for r in range(args.rounds):
                rows.append(run_round(cfg, stage, r, model, optimizer, engine, l1, env))
                print(f"{path:6s} {method:4s} round {r}: " + " ".join(f"{k}={v:.3g}" for k, v in rows[-1].items()),
                      flush=True)  # fmt: skip
            results[path][method] = rows
        engine.stepper = stepper
        del model, optimizer
    print("\n| path | method | round s | rollout s | train s | train tok/s | generated tok/s |")
    print("|---|---|---|---|---|---|---|")
    mean = {}
    for path, by in results.items():
        for method, rows in by.items():
            n = len(rows)
            m = {k: sum(r[k] for r in rows) / n for k in rows[0]}
            mean[(path, method)] = m
            print(f"| {path} | {method} | {m['round_s']:.1f} | {m['rollout_s']:.1f} | {m['train_s']:.1f} | "
                  f"{m['train_tokens'] / max(m['train_s'], 1e-9):,.0f} | {m['gen_tokens'] / max(m['rollout_s'], 1e-9):,.0f} |")  # fmt: skip
    for old, new in (("before", "after"), ("after", "after_mp"), ("before", "after_mp")):
        if {old, new} <= set(results):
            for method in ("rao", "sera"):
                b, a = mean[(old, method)], mean[(new, method)]
                print(f"{method}: {new} vs {old}: round {b['round_s'] / a['round_s']:.2f}x faster, rollout "
                      f"{b['rollout_s'] / a['rollout_s']:.2f}x, train {b['train_s'] / max(a['train_s'], 1e-9):.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
