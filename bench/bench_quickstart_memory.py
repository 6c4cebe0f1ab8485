"""Where the quick start's memory goes (issue #38.7): the two phases of a level-0 round, measured apart.

    python bench/bench_quickstart_memory.py --part training    # 2 optimizer steps x 2 datums of ~2.3K tokens
    python bench/bench_quickstart_memory.py --part compare     # training with the optimizer state in RAM vs on disk
    python bench/bench_quickstart_memory.py --part rollouts    # 8 agents x 2 turns through HFPolicy
    MALLOC_MMAP_THRESHOLD_=1048576 python bench/bench_quickstart_memory.py --part rollouts   # glibc's knob

``training`` runs level 0's own pieces (``lean_training``, ``datum_logprobs``, ``clip_and_step``,
``release_memory``) on SmolLM2 with the shipped warm start, in the quick start's dtype; ``--plain`` leaves out
activation checkpointing and the gradient hooks (the code before issue #38.7). ``rollouts`` runs agents whose
prompts are the recorded quick-start act prompt (tests/fixtures/warmstart_calls.json) of different lengths,
sampling through continuous batching. ``compare`` runs ``training`` twice, each in a fresh process, with
``--optimizer-state memory`` and ``disk`` (the CPU default since issue #38.7's fourth pass), and prints the two
peaks and step times side by side. Each line prints the resident set now and the process's peak so far
(``ru_maxrss``, what ``/usr/bin/time -v`` reports). Results: bench/RESULTS.md, "The quick start's cost".
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

T0 = time.time()


def report(tag: str) -> None:
    import psutil

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    rss = psutil.Process().memory_info().rss / 1e9
    print(f"{time.time() - T0:6.0f} s  {tag:44s} RSS {rss:5.2f} GB  peak {peak:5.2f} GB", flush=True)


def training(plain: bool, datums: int, prompt_tokens: int, optimizer_state: str = "auto") -> None:
    import tempfile

    from common.memory import release_memory
    from common.policy.models import load_model
    from common.policy.warmstart import resolve_init
    from common.run.optim import make_optimizer, place_optimizer_state
    from common.train_config import TrainConfig
    from level0_single_process.train import datum_logprobs, lean_training

    cfg = TrainConfig()
    init = resolve_init(cfg.init_adapter, cfg.model, cfg.env, cfg.seed)
    model, tok = load_model(cfg.model, dtype=cfg.optim.dtype, adapter=init.adapter)
    opt = make_optimizer(model, cfg.optim)
    if not plain:
        lean_training(model, opt)
    state_dir = Path(tempfile.mkdtemp(prefix="sera-bench-optimizer-state-"))
    place_optimizer_state(opt, optimizer_state, state_dir / "optimizer_state", "cpu")
    release_memory()
    report(f"loaded ({cfg.optim.dtype}) + optimizer (state {'on disk' if opt.offload_dir else 'in RAM'})")
    calls = json.loads((ROOT / "tests/fixtures/warmstart_calls.json").read_text())
    text = tok.apply_chat_template(calls["act_messages"], tokenize=False, add_generation_prompt=True)
    prompt = (tok(text, add_special_tokens=False)["input_ids"] * 3)[:prompt_tokens]
    reply = (tok(calls["act_text"], add_special_tokens=False)["input_ids"] * 2)[:256]

    class Datum:
        prompt_ids, output_ids = prompt, reply

    for step in range(2):
        model.train()
        opt.zero_grad()
        for i in range(datums):
            (-datum_logprobs(model, Datum).sum()).backward()
            opt.accumulate_model_grads()
            report(f"step {step} datum {i} ({len(prompt) + len(reply)} tokens)")
        t = time.perf_counter()
        opt.clip_and_step(1.0)
        print(f"step {step}: clip_and_step {time.perf_counter() - t:.2f} s", flush=True)
        model.eval()
        release_memory()
        report(f"step {step} done (AdamW moments exist from here)")
    opt.close()
    state_dir.rmdir()


def compare(datums: int, prompt_tokens: int) -> None:
    """``training`` with the optimizer state in RAM and on disk, each in a fresh process; the peaks and the
    optimizer steps' times side by side."""
    import re
    import subprocess

    rows = {}
    for where in ("memory", "disk"):
        cmd = [sys.executable, __file__, "--part", "training", "--optimizer-state", where]
        cmd += ["--datums", str(datums), "--prompt-tokens", str(prompt_tokens)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        print(out, end="", flush=True)
        peak = max(float(x) for x in re.findall(r"peak\s+([\d.]+) GB", out))
        between = float(re.findall(r"step 1 done.*RSS\s+([\d.]+) GB", out)[-1])
        steps = [float(x) for x in re.findall(r"clip_and_step ([\d.]+) s", out)]
        rows[where] = (peak, between, steps)
    print("\n| optimizer state | peak RSS GB | RSS after step 2 GB | clip_and_step s (step 1, 2) |")
    print("|---|---|---|---|")
    for where, (peak, between, steps) in rows.items():
        print(f"| {where} | {peak:.2f} | {between:.2f} | {', '.join(f'{x:.2f}' for x in steps)} |")
    (pm, bm, _), (pd, bd, _) = rows["memory"], rows["disk"]
    print(f"\ndisk / memory: peak {pd / pm:.2f}x, resident between steps {bd / bm:.2f}x")


def rollouts(agents: int, turns: int, new_tokens: int) -> None:
    from common.memory import release_memory
    from common.policy.base import GenerationRequest, SamplingParams
    from common.policy.hf import HFPolicy
    from common.policy.models import load_model

    model, tok = load_model("smollm2", dtype="bfloat16")
    policy = HFPolicy(model, tok, max_batch_size=32, seed=0)
    release_memory()
    report("loaded (bfloat16)")
    base = json.loads((ROOT / "tests/fixtures/warmstart_calls.json").read_text())["act_messages"]

    async def agent(a: int) -> None:
        msgs = copy.deepcopy(base)
        msgs[-1]["content"] += " pad" * (60 * a)  # prompts of different lengths
        for t in range(turns):
            sp = SamplingParams(new_tokens + 16 * a, 1.0, seed=100 * a + t, ignore_eos=True)
            c = await policy.generate(GenerationRequest(messages=msgs, sampling=sp))
            msgs = [*msgs, {"role": "assistant", "content": c.text}, {"role": "user", "content": "ok " * 40}]
            await asyncio.sleep(0.3 * (a % 3))  # the agent's cell

    async def run() -> None:
        await asyncio.gather(*(agent(a) for a in range(agents)))

    asyncio.run(run())
    report(f"{agents} agents x {turns} turns")
    release_memory()
    report("after malloc_trim (what is live)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["training", "rollouts", "compare"], required=True)
    p.add_argument("--optimizer-state", choices=["auto", "memory", "disk"], default="auto")
    p.add_argument("--plain", action="store_true", help="training: no activation checkpointing, no hooks")
    p.add_argument("--datums", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=2048)
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=32)
    args = p.parse_args(argv)
    if args.part == "training":
        training(args.plain, args.datums, args.prompt_tokens, args.optimizer_state)
    elif args.part == "compare":
        compare(args.datums, args.prompt_tokens)
    else:
        rollouts(args.agents, args.turns, args.new_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
