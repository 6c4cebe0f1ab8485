"""Level 0 vs level 1 on the same work, side by side in one run: loss+backward and rollout throughput.

    python bench/bench_level1.py                                  # tiny model, 208 datums, 16 rollouts
    python bench/bench_level1.py --model smollm2 --repeat 4 --tasks 2 --rollouts 4
    python bench/bench_level1.py --skip-rollouts --limits 2048 4096 8192 16384

1. Loss + backward: the recorded fixture's datums (all three stages, 15 real datums of 0.9K-2.3K tokens)
   repeated ``--repeat`` times. Level 0's ``accumulate_gradients`` (one full forward per datum, logits over
   every position) vs level 1's ``accumulate_gradients_packed`` at each ``--limits`` micro-batch size
   (packed rows, logits only where an output token is predicted). Same model, gradients zeroed between
   runs; the gradient norms must agree (printed as a relative difference).
2. Rollouts: ``--tasks`` x ``--rollouts`` TextCraft root rollouts of the model itself (no oracle mix, so
   every step is a real sampled generation), level-0 style (HFPolicy ``max_batch_size=1``, one tree at a
   time) vs level 1 (``max_batch_size=32``, all trees in flight). Generated tokens per second.

Simplifications: one process, one device (``--device``, ``--dtype``), the CPU threads given by ``--threads``; numbers compare the two
tiers on one machine, they are not absolute claims. On a CPU, packed rows pay the attention of the whole
row (the block-diagonal mask is dense for sdpa), so very long rows get slower: see the limit sweep.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.agent.runtime import programmatic_judge  # noqa: E402
from common.envs import make_env  # noqa: E402
from common.policy.hf import HFPolicy  # noqa: E402
from common.policy.models import load_model  # noqa: E402
from common.rl.datums import Datum  # noqa: E402
from common.run.data import hash_seed, task_pool  # noqa: E402
from common.run.rollout import stage_runtime_config  # noqa: E402
from common.train_config import TrainConfig  # noqa: E402
from level0_single_process.train import accumulate_gradients  # noqa: E402
from level1_batched.packing import accumulate_gradients_packed  # noqa: E402
from level1_batched.rollouts import rollout_in_flight  # noqa: E402


def fixture_batch(repeat: int) -> tuple[list[Datum], list[float]]:
    fx = json.loads((ROOT / "tests" / "fixtures" / "rl_fixture.json").read_text())
    datums, weights = [], []
    for st in fx["stages"].values():
        datums += [Datum(**d) for d in st["datums"]]
        weights += st["weights"]
    return datums * repeat, weights * repeat


def timed_grads(model, fn) -> tuple[float, float]:
    """Seconds of ``fn()`` and the gradient norm it leaves."""
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return seconds, math.sqrt(
        sum(float(p.grad.pow(2).sum()) for p in model.parameters() if p.grad is not None)
    )


def bench_loss(model, repeat: int, limits: list[int]) -> None:
    datums, weights = fixture_batch(repeat)
    tokens = sum(len(d.prompt_ids) + len(d.output_ids) for d in datums)
    print(
        f"\n## loss + backward: {len(datums)} datums, {tokens:,} tokens, {torch.get_num_threads()} CPU threads"
    )
    model.train()
    accumulate_gradients_packed(model, datums[:2], weights[:2], 4096)  # warm-up
    print(f"{'variant':<34} {'seconds':>8} {'tokens/s':>9} {'speed-up':>9} {'grad-norm rel diff':>19}")
    if model.device.type == "cpu":  # level 0 is a CPU tier (its loss tensors live on the CPU)
        t0, n0 = timed_grads(model, lambda: accumulate_gradients(model, datums, weights))
        print(
            f"{'level 0 (one datum per forward)':<34} {t0:>8.2f} {tokens / t0:>9.0f} {1.0:>8.2f}x {0.0:>19.1e}"
        )
    else:  # the baseline is level 1 with one datum per row
        t0, n0 = timed_grads(model, lambda: accumulate_gradients_packed(model, datums, weights, 1))
    for limit in limits:
        t1, n1 = timed_grads(
            model, lambda lim=limit: accumulate_gradients_packed(model, datums, weights, lim)
        )
        name = f"level 1 packed, {limit} tokens/row"
        print(f"{name:<34} {t1:>8.2f} {tokens / t1:>9.0f} {t0 / t1:>8.2f}x {abs(n1 - n0) / n0:>19.1e}")
    model.eval()


def run_rollouts(policy, jobs, env, in_flight: bool) -> tuple[float, int, int]:
    """(seconds, generated tokens, model calls) of all ``jobs`` (``(task, one RuntimeConfig per rollout)``)."""
    t0 = time.perf_counter()
    if in_flight:
        groups = asyncio.run(rollout_in_flight(jobs, env, policy, programmatic_judge))
    else:  # level 0: one tree at a time
        groups = [
            [
                asyncio.run(rollout_in_flight([(task, [r])], env, policy, programmatic_judge))[0][0]
                for r in rcfgs
            ]
            for task, rcfgs in jobs
        ]
    seconds = time.perf_counter() - t0
    steps = [s for g in groups for t in g for n in t.nodes.values() for s in n.steps]
    return seconds, sum(len(s.call.output_ids) for s in steps), len(steps)


def bench_rollouts(model, tok, args) -> None:
    cfg = TrainConfig.make(
        env="textcraft", model=args.model, max_steps=args.max_steps, max_new_tokens=args.new_tokens
    )
    env = make_env("textcraft")
    tasks = task_pool(cfg.env, cfg.tasks, cfg.n_tasks, cfg.seed, cfg.difficulty)[: args.tasks]
    jobs = [
        (
            t,
            [
                stage_runtime_config(cfg.env, cfg.rollout, "execution", True, hash_seed(0, i, r))
                for r in range(args.rollouts)
            ],
        )
        for i, t in enumerate(tasks)
    ]
    print(
        f"\n## rollouts: {args.tasks} tasks x {args.rollouts} rollouts, {args.max_steps} steps/agent, "
        f"{args.new_tokens} new tokens/step, temperature 1"
    )
    print(f"{'variant':<44} {'seconds':>8} {'calls':>6} {'tokens':>7} {'tokens/s':>9} {'speed-up':>9}")
    base = None
    for name, batch, in_flight in (
        ("level 0: max_batch_size=1, one tree at a time", 1, False),
        ("level 1: max_batch_size=32, all in flight", 32, True),
    ):
        policy = HFPolicy(model, tok, max_batch_size=batch, seed=0)
        run_rollouts(policy, jobs[:1], env, in_flight)  # warm-up
        sec, gen, calls = run_rollouts(policy, jobs, env, in_flight)
        base = base or gen / sec
        print(f"{name:<44} {sec:>8.2f} {calls:>6} {gen:>7} {gen / sec:>9.1f} {gen / sec / base:>8.2f}x")


def make_model(args):
    """``--model`` as load_model understands it, or with ``--shape L,H,HEADS`` a random-init Llama of that
    shape (SmolLM2-135M-like compute without its weights: ``--shape 30,576,8``)."""
    from common.policy.models import build_tiny_model

    if args.shape:
        layers, hidden, heads = (int(x) for x in args.shape.split(","))
        model, tok = build_tiny_model(0, num_layers=layers, hidden_size=hidden, num_heads=heads)
        name = f"random Llama {layers} layers x {hidden} hidden"
    else:
        model, tok = load_model(args.model, dtype="float32", seed=0)
        name = args.model
    model = model.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
    n = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"model {name}: {n:.1f}M parameters, {args.dtype}, {args.device}")
    return model, tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--shape", default=None, help="L,H,HEADS: a random-init Llama of that shape instead")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeat", type=int, default=16, help="fixture copies (15 datums each)")
    ap.add_argument(
        "--limits", type=int, nargs="+", default=[1, 2048, 4096, 8192], help="tokens per packed row"
    )
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--skip-loss", action="store_true")
    ap.add_argument("--skip-rollouts", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = make_model(args)
    if not args.skip_loss:
        bench_loss(model, args.repeat, args.limits)
    if not args.skip_rollouts:
        bench_rollouts(model, tok, args)


if __name__ == "__main__":
    main()
