"""Throughput of the ``hf`` policy backend (HFPolicy) on this machine.

For each dtype and batch size it runs one warm-up batch, then ``--repeats`` timed batches of
``batch`` requests, each a ~``--prompt-tokens``-token prompt sampled (temperature 1, seeded) for
``--new-tokens`` new tokens, and prints generated tokens per second (all rows together), per-row
decode speed and the time to first token (prefill of the whole batch). Rows that hit EOS early are
counted with the tokens they really produced. ``--hf-generate`` adds a reference row with
transformers' own ``model.generate`` (batch 1, greedy, same prompt length).

Simplifications: one process, the CPU threads torch picks; the numbers are for comparing backends and
settings on one machine, not absolute claims.

Run: ``python bench/bench_policy.py`` (SmolLM2 bf16+fp32, batch 1 and 8, 64 new tokens after ~200
prompt tokens), or e.g. ``python bench/bench_policy.py --model tiny --dtypes float32 --batches 1 8 32``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from common.policy.hf import HFPolicy  # noqa: E402

BASE_TEXT = (
    "You are crafting items in a procedural recipe world. The inventory holds m3_ore, c7_ore and raw_o1. "
    "Recipes need one to six ingredients from the two tiers below. Write a long, careful plan that lists "
    "every intermediate item, the recipe you expect, how many executions you need, and the order. "
)


def make_messages(tokenizer, prompt_tokens: int, i: int) -> list[dict[str, str]]:
    text = f"Request {i}. "
    while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < prompt_tokens - 30:
        text += BASE_TEXT
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][: prompt_tokens - 30]
    return [
        {"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": tokenizer.decode(ids)},
    ]


def bench_policy(policy: HFPolicy, batch: int, args: argparse.Namespace) -> dict[str, float]:
    reqs = [
        GenerationRequest(
            messages=make_messages(policy.tokenizer, args.prompt_tokens, i),
            sampling=SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=i),
        )
        for i in range(batch)
    ]
    policy.generate_batch(reqs)  # warm-up
    total_tokens, total_s, ttft = 0, 0.0, 0.0
    prompt_len = 0
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        one = [GenerationRequest(messages=r.messages, sampling=SamplingParams(1, 1.0, seed=0)) for r in reqs]
        policy.generate_batch(one)
        ttft += time.perf_counter() - t0
        t0 = time.perf_counter()
        comps = policy.generate_batch(reqs)
        total_s += time.perf_counter() - t0
        total_tokens += sum(len(c.output_ids) for c in comps)
        prompt_len = max(len(c.prompt_ids) for c in comps)
    longest = args.new_tokens
    return {
        "batch": batch,
        "prompt": prompt_len,
        "tokens": total_tokens / args.repeats,
        "seconds": total_s / args.repeats,
        "tok_s": total_tokens / total_s,
        "row_tok_s": longest / (total_s / args.repeats),
        "ttft": ttft / args.repeats,
    }


def bench_hf_generate(policy: HFPolicy, args: argparse.Namespace) -> dict[str, float]:
    msgs = make_messages(policy.tokenizer, args.prompt_tokens, 0)
    text = policy.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = policy.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids.to(policy.device)
    kw = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False}
    with torch.inference_mode():
        policy.model.generate(ids, **kw)
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            out = policy.model.generate(ids, **kw)
        s = (time.perf_counter() - t0) / args.repeats
    n = out.shape[1] - ids.shape[1]
    return {"batch": 1, "prompt": ids.shape[1], "tokens": n, "seconds": s, "tok_s": n / s, "row_tok_s": n / s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="HFPolicy throughput")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--hf-generate", action="store_true", help="add a transformers model.generate row")
    args = ap.parse_args(argv)

    print(f"# HFPolicy throughput: model={args.model}, torch threads={torch.get_num_threads()}, "
          f"~{args.prompt_tokens} prompt tokens, {args.new_tokens} new tokens, {args.repeats} repeats")  # fmt: skip
    header = (
        f"| {'backend':<22} | {'dtype':<8} | {'batch':>5} | {'prompt':>6} | {'gen tok':>7} | {'s/batch':>7} "
        f"| {'tok/s':>7} | {'tok/s/row':>9} | {'TTFT s':>6} |"
    )
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for dtype in args.dtypes:
        policy = HFPolicy(args.model, dtype=dtype, device="cpu", max_batch_size=max(args.batches))
        rows = [("HFPolicy", bench_policy(policy, b, args)) for b in args.batches]
        if args.hf_generate:
            rows.append(("transformers generate", bench_hf_generate(policy, args)))
        for name, r in rows:
            ttft = f"{r['ttft']:.3f}" if "ttft" in r else "-"
            print(
                f"| {name:<22} | {dtype:<8} | {r['batch']:>5} | {r['prompt']:>6} | {r['tokens']:>7.0f} "
                f"| {r['seconds']:>7.2f} | {r['tok_s']:>7.1f} | {r['row_tok_s']:>9.1f} | {ttft:>6} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
