"""The two costs of a quick-start round (`sera train`, level 0, SmolLM2 + the shipped warm start) on this CPU,
each measured side by side in one run: a decode step of the rollouts and a training forward+backward.

1. Generation: ``HFPolicy`` replies to the quick start's recorded act prompt (tests/fixtures/warmstart_calls.json,
   ~1.2K tokens) with a ``StaticCache`` (the default) and a ``DynamicCache``, at batch 1 (level 0) and 4
   (level 1), ``--new-tokens`` tokens each (EOS ignored), bf16 and fp32.
2. Training: level 0's ``datum_logprobs`` forward + backward of one datum (that prompt + its recorded reply,
   the shape of one quick-start datum) in fp32 and bf16, with the LM head over every position and only
   over the reply (``logits_to_keep``, level 0's default now).

3. Agents: ``--agents`` asyncio agents (siblings of one tree) each take ``--turns`` turns on that prompt,
   replies of different lengths (EOS ignored), and a 0.2 s "cell" between turns; generated tokens per
   second of the whole run with one call at a time (level 0 before), run-to-completion batches (a batch
   decodes until its longest row; requests arriving meanwhile wait) and continuous batching (the default:
   a request joins the running batch at the next step, a finished row returns at once). Each turn's prompt
   is the agent's history. bf16.

Prints one table per part and the ratios. Simplifications: one prompt; the CPU threads torch picks; the
rest of a round (sandboxed cells, rubric parsing) is not here (``sera train`` itself:
bench/RESULTS.md "The quick start on the 2-core CPU").

Run: ``python bench/bench_cpu_quickstart.py`` (about 6 minutes on 2 cores; ``--parts agents`` only part 3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from common.policy.hf import HFPolicy  # noqa: E402
from common.policy.models import load_model  # noqa: E402
from common.rl.loss import token_logprobs  # noqa: E402

CALLS = ROOT / "tests" / "fixtures" / "warmstart_calls.json"


def decode_rate(policy: HFPolicy, messages: list[dict], batch: int, new_tokens: int) -> tuple[float, float]:
    """(seconds per decode step, prefill seconds) of one batch of ``batch`` copies of ``messages``."""
    sp = [SamplingParams(new_tokens, temperature=1.0, seed=i, ignore_eos=True) for i in range(batch)]
    one = [
        GenerationRequest(messages=messages, sampling=SamplingParams(1, 1.0, seed=i)) for i in range(batch)
    ]
    policy.generate_batch(one)  # warm-up
    t0 = time.perf_counter()
    policy.generate_batch(one)
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    policy.generate_batch([GenerationRequest(messages=messages, sampling=s) for s in sp])
    return (time.perf_counter() - t0 - prefill) / max(1, new_tokens - 1), prefill


def train_seconds(model, ids: list[int], n_out: int, keep_all: bool, repeats: int) -> float:
    """Seconds of one forward + backward of level 0's loss shape over ``ids`` (last ``n_out`` are the reply)."""
    x = torch.tensor([ids])
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        if keep_all:
            logits = model(input_ids=x).logits[:, -n_out - 1 : -1]
        else:
            logits = model(input_ids=x, logits_to_keep=n_out + 1).logits[:, :-1]
        token_logprobs(logits, x[:, -n_out:]).sum().backward()
        best = min(best, time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    return best


def agents_rate(policy: HFPolicy, messages: list[dict], agents: int, turns: int) -> tuple[int, float]:
    """(generated tokens, seconds) of ``agents`` concurrent agents taking ``turns`` turns each: replies of
    24 .. 24 + 40 * (agents - 1) tokens (agent a's turn t: rotated, so lengths mix in every batch), 0.2 s
    between an agent's turns (its cell)."""
    lengths = [24 + 40 * i for i in range(agents)]

    async def agent(a: int) -> int:
        n, history = 0, list(messages)
        for t in range(turns):
            sp = SamplingParams(lengths[(a + t) % agents], temperature=1.0, seed=100 * a + t, ignore_eos=True)
            comp = await policy.generate(GenerationRequest(messages=history, sampling=sp))
            n += len(comp.output_ids)
            history += [
                {"role": "assistant", "content": comp.text},
                {"role": "user", "content": f"Step {t}: ok."},
            ]
            await asyncio.sleep(0.2)  # the agent's cell
        return n

    async def run() -> int:
        return sum(await asyncio.gather(*(agent(a) for a in range(agents))))

    t0 = time.perf_counter()
    tokens = asyncio.run(run())
    return tokens, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--parts", default="decode,train,agents", help="comma-separated: decode, train, agents")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    calls = json.loads(CALLS.read_text())
    messages = calls["act_messages"]
    print(f"# quick-start costs on this CPU: torch threads {torch.get_num_threads()}, SmolLM2-135M, prompt "
          f"from {CALLS.name}")  # fmt: skip
    if "decode" in parts:
        decode_table(messages, args.new_tokens)
    if "train" in parts:
        train_table(calls, messages, args.repeats)
    if "agents" in parts:
        agents_table(messages, args.agents, args.turns)
    return 0


def agents_table(messages: list[dict], agents: int, turns: int) -> None:
    model, tokenizer = load_model("smollm2", dtype="bfloat16")
    print(f"\n| {agents} agents x {turns} turns, bf16 | generated tokens | seconds | tokens/s |")
    print("|---|---|---|---|")
    rates = {}
    for name, batch, continuous in (
        ("one call at a time", 1, False),
        ("run-to-completion batches", agents, False),
        ("continuous batching", agents, True),
    ):
        policy = HFPolicy(model, tokenizer, max_batch_size=batch, kv_cache="static", continuous=continuous)
        tokens, secs = agents_rate(policy, messages, agents, turns)
        rates[name] = tokens / secs
        print(f"| {name} | {tokens} | {secs:.1f} | {tokens / secs:.1f} |", flush=True)
    one = rates["one call at a time"]
    print(f"ratio continuous / one call at a time: {rates['continuous batching'] / one:.2f}x")
    print(
        f"ratio continuous / run-to-completion: {rates['continuous batching'] / rates['run-to-completion batches']:.2f}x"
    )


def decode_table(messages: list[dict], new_tokens: int) -> None:

    print("\n| dtype | batch | cache | prompt tokens | prefill s | decode ms/step | ms/token |")
    print("|---|---|---|---|---|---|---|")
    steps: dict[tuple[str, int, str], float] = {}
    for dtype in ("bfloat16", "float32"):
        model, tokenizer = load_model("smollm2", dtype=dtype)
        n_prompt = 0
        for batch in (1, 4):
            for cache in ("static", "dynamic"):
                policy = HFPolicy(model, tokenizer, max_batch_size=batch, kv_cache=cache)
                step, prefill = decode_rate(policy, messages, batch, new_tokens)
                n_prompt = len(
                    policy.generate_batch([GenerationRequest(messages, SamplingParams(0))])[0].prompt_ids
                )
                steps[dtype, batch, cache] = step
                print(f"| {dtype} | {batch} | {cache} | {n_prompt} | {prefill:.2f} | {step * 1e3:.1f} "
                      f"| {step * 1e3 / batch:.1f} |", flush=True)  # fmt: skip
    for dtype in ("bfloat16", "float32"):
        for batch in (1, 4):
            r = steps[dtype, batch, "dynamic"] / steps[dtype, batch, "static"]
            print(f"ratio dynamic/static decode step, {dtype}, batch {batch}: {r:.2f}x")


def train_table(calls: dict, messages: list[dict], repeats: int) -> None:
    _, tokenizer = load_model("smollm2", dtype="bfloat16")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    reply = tokenizer(calls["act_text"], add_special_tokens=False)["input_ids"]
    ids = prompt_ids + reply
    print("\n| dtype | LM head over | tokens (reply) | forward + backward s |")
    print("|---|---|---|---|")
    secs: dict[tuple[str, bool], float] = {}
    for dtype in ("float32", "bfloat16"):
        model, _ = load_model("smollm2", dtype=dtype)
        model.train()
        for keep_all in (True, False):
            secs[dtype, keep_all] = s = train_seconds(model, ids, len(reply), keep_all, repeats)
            where = "every position" if keep_all else "the reply only"
            print(f"| {dtype} | {where} | {len(ids)} ({len(reply)}) | {s:.2f} |", flush=True)
    print(f"ratio fp32 / bf16 (reply-only head): {secs['float32', False] / secs['bfloat16', False]:.2f}x")
    print(
        f"ratio every position / reply only (bf16): {secs['bfloat16', True] / secs['bfloat16', False]:.2f}x"
    )


if __name__ == "__main__":
    raise SystemExit(main())
