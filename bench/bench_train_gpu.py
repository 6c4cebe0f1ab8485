"""Trainer tokens/s and MFU on one GPU: naive HF training vs level 1's efficient path (efficiency.py).

Both variants run the CISPO loss + backward + optimizer step on ``--rows`` x ``--row-tokens`` tokens of a
random-init model (default the Qwen3-4B shape, bf16 weights, fp32 master weights in the optimizer,
activation checkpointing, fused AdamW — ``common.run.optim.make_optimizer``):

* **naive**: one sequence per row as a ``[rows, row_tokens]`` batch, sdpa attention, the full
  ``[rows, row_tokens, V]`` logits upcast to float32 for the log-probs (the anchor figure of the GPU machine notes: 29% MFU);
* **efficient**: ``--datums-per-row`` datums of each row (prompt half / output half), all rows packed
  into ONE micro-batch of ``rows x row_tokens`` tokens, ``sera_varlen`` attention (FlashAttention varlen,
  no mask), log-probs only at output positions through the chunked head
  (``efficiency.fast_packed_logprobs``); ``efficient-half`` checkpoints only half of the decoder layers
  (selective checkpointing); ``efficient-nockpt`` is the same without activation checkpointing.
  ``--micro-rows R`` splits the efficient variants' step into micro-batches of R rows (gradient
  accumulation, one token mean over the whole step), trading batch size for activation memory.
  ``--compile`` runs the efficient variants' decoder layers through ``torch.compile``
  (``apply_efficiency(compile_layers=True)``; the warm-up step pays the compile).

MFU = model FLOPs / (seconds x ``--peak-tflops``), model FLOPs = 6 x (non-embedding params) x tokens
+ 6 x V x H x (positions whose logits are computed) + 6 x layers x q_dim x sum(L_i^2) (causal attention,
forward + backward; the checkpointing recompute is not counted). ``mfu_6N`` is the plain 6 x N x tokens
convention of the anchor. Results print as a table and go to ``--out`` (JSON).

Run (GPU): ``python bench/bench_train_gpu.py`` (Qwen3-4B shape, 8 x 2048, 4 datums/row)
SmolLM2-135M as level 1 trains it on CUDA (32K-token packed rows, no checkpointing):
``python bench/bench_train_gpu.py --shape smollm2 --rows 8 --row-tokens 32768 --datums-per-row 16
--micro-rows 1 --variants efficient-nockpt``
As an RL step sees it (new datum lengths every step, so compiled layers meet new shapes; tokens/s over all
timed steps): add ``--vary`` (with ``--compile`` for level 1's CUDA default).
CPU smoke: ``python bench/bench_train_gpu.py --shape tiny --rows 2 --row-tokens 64 --steps 1``
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.rl.datums import Datum  # noqa: E402
from common.rl.loss import cispo_loss, token_logprobs  # noqa: E402
from level1_batched.efficiency import apply_efficiency, fast_packed_logprobs  # noqa: E402

QWEN3_4B = dict(
    vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, tie_word_embeddings=True,
    rope_theta=1e6, rms_norm_eps=1e-6, attention_bias=False,
)  # fmt: skip
# SmolLM2-135M-Instruct's config.json: the learning run's model (issue #21's >= 150K tok/s)
SMOLLM2_135M = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, tie_word_embeddings=True,
    rope_theta=100000.0, rms_norm_eps=1e-5,
)  # fmt: skip
TINY = dict(
    vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=4096, tie_word_embeddings=False,
)  # fmt: skip


def build(shape: str, device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        if shape == "qwen3-4b":
            model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_4B))
        elif shape == "smollm2":
            model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M))
        else:
            model = LlamaForCausalLM(LlamaConfig(**TINY))
    return model.to(dtype)


def optimizer_for(model):
    try:
        from common.run.optim import make_optimizer
        from common.train_config import OptimConfig

        return make_optimizer(model, OptimConfig(dtype="bfloat16")), "common.run.optim (fp32 masters)"
    except ImportError:  # before the shared optimizer existed: plain fused AdamW
        opt = torch.optim.AdamW(model.parameters(), lr=3e-6, fused=next(model.parameters()).is_cuda)

        class _Step:
            def zero_grad(self):
                opt.zero_grad(set_to_none=True)

            def clip_and_step(self, grad_clip):
                n = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
                opt.step()
                return float(n)

        return _Step(), "torch.optim.AdamW"


def make_datums(
    rows: int, row_tokens: int, per_row: int, vocab: int, seed: int = 0, vary: bool = False
) -> list[list[Datum]]:
    """``rows`` rows of ``per_row`` datums (prompt half, output half). ``vary``: each datum's length is
    drawn from [1/2, 1] of its even share, so every seed gives other shapes (as a real RL step does)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(rows):
        row, left = [], row_tokens
        for j in range(per_row):
            n = left if j == per_row - 1 else row_tokens // per_row
            if vary:
                n = max(4, int(n * (0.5 + 0.5 * torch.rand((), generator=g).item())))
            left -= n
            seq = torch.randint(3, vocab, (n,), generator=g).tolist()
            p = n // 2
            o = n - p
            row.append(Datum(seq[:p], seq[p:], [-1.0] * o, [1] * o, 0.5, 0, j, True, "bench"))
        out.append(row)
    return out


def naive_step(model, opt, batch: torch.Tensor, out_from: int) -> None:
    """[rows, T] rows, full float32 logits, CISPO on the second half of each row."""
    logits = model(input_ids=batch, use_cache=False).logits[:, :-1].float()  # [R, T-1, V] in float32
    logp = token_logprobs(logits, batch[:, 1:])[:, out_from - 1 :]  # [R, T_out]
    loss, _ = cispo_loss(
        logp,
        torch.full_like(logp, -1.0),
        torch.full((logp.shape[0],), 0.5, device=logp.device),
        torch.ones_like(logp),
    )
    loss.backward()


def efficient_step(model, opt, rows: list[list[Datum]], total_out: int, micro_rows: int) -> None:
    for i in range(0, len(rows), micro_rows):  # micro-batches of micro_rows x row_tokens packed tokens
        ds = [d for r in rows[i : i + micro_rows] for d in r]
        logp = fast_packed_logprobs(model, ds)  # [D, T_max]
        mask = torch.ones_like(logp)
        loss, _ = cispo_loss(
            logp, torch.full_like(logp, -1.0), torch.full((len(ds),), 0.5, device=logp.device), mask,
            num_tokens=total_out,
        )  # fmt: skip
        loss.backward()


def flops(model, seqs: list[int], head_positions: int, tokens: int) -> tuple[float, float]:
    c = model.config
    n_all = sum(p.numel() for p in model.parameters())
    n_embed = c.vocab_size * c.hidden_size
    n_body = n_all - n_embed * (1 if c.tie_word_embeddings else 2)  # without embedding and head
    q_dim = c.num_attention_heads * getattr(c, "head_dim", c.hidden_size // c.num_attention_heads)
    model_flops = (
        6 * n_body * tokens
        + 6 * c.vocab_size * c.hidden_size * head_positions
        + 6 * c.num_hidden_layers * q_dim * sum(n * n for n in seqs)
    )
    return float(model_flops), float(6 * n_all * tokens)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen3-4b", choices=["qwen3-4b", "smollm2", "tiny"])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--row-tokens", type=int, default=2048)
    ap.add_argument("--datums-per-row", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per variant (after one warm-up)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100/H200: 989)")
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["naive", "efficient"],
        choices=["naive", "efficient", "efficient-half", "efficient-nockpt"],
    )
    ap.add_argument("--micro-rows", type=int, default=0, help="rows per micro-batch (0: all rows in one)")
    ap.add_argument("--compile", action="store_true", help="torch.compile every decoder layer (inductor)")
    ap.add_argument(
        "--vary",
        action="store_true",
        help="efficient variants: new datum lengths every step (other shapes, as in RL; compiled layers"
        " recompile for them): tokens/s = all timed tokens / all timed seconds",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    res = {"args": vars(args), "device": torch.cuda.get_device_name(0) if cuda else "cpu", "variants": {}}
    for variant in args.variants:
        try:
            res["variants"][variant] = run_variant(variant, args, device, dtype)
        except Exception as exc:  # report and go on with the next variant
            res["variants"][variant] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        if cuda:
            torch.cuda.empty_cache()
    print(
        f"\n{args.shape} | {res['device']} | {args.rows} x {args.row_tokens} tokens | {args.datums_per_row} datums/row"
        f" | micro-batches of {args.micro_rows or args.rows} rows"
        + (" | torch.compile per layer" if args.compile else "")
        + (" | new datum lengths every step (mean s/step)" if args.vary else "")
    )
    print("| variant | s/step | slowest step s | (optimizer s) | tokens/s | MFU | MFU (6N) | peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for k, v in res["variants"].items():
        if "error" in v:
            print(f"| {k} | error: {v['error']} |")
            continue
        print(
            f"| {k} | {v['seconds_per_step']} | {v['max_step_seconds']} | {v['optimizer_seconds']} | {v['tokens_per_s']} | {v['mfu']:.1%} | {v['mfu_6N']:.1%} | {v['peak_GiB']} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    return 0


def run_variant(variant: str, args, device: str, dtype: torch.dtype) -> dict:
    """One variant: build, warm up, time ``args.steps`` optimizer steps."""
    cuda = device == "cuda"
    model = build(args.shape, device, dtype)
    if variant.startswith("efficient"):
        apply_efficiency(
            model,
            checkpointing=variant != "efficient-nockpt",
            checkpoint_fraction=0.5 if variant == "efficient-half" else 1.0,
            compile_layers=args.compile,
        )
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt, opt_name = optimizer_for(model)
    vocab = model.config.vocab_size
    if args.vary and variant == "naive":
        raise ValueError("--vary is for the efficient variants")
    if variant == "naive":
        g = torch.Generator().manual_seed(0)
        batch = torch.randint(3, vocab, (args.rows, args.row_tokens), generator=g).to(device)
        seqs, head = [args.row_tokens] * args.rows, args.rows * (args.row_tokens - 1)
        plan = [(functools.partial(naive_step, model, opt, batch, args.row_tokens // 2), seqs, head)]
    else:  # one datum layout for every step, or (--vary) a new one per step
        layouts = [
            make_datums(args.rows, args.row_tokens, args.datums_per_row, vocab, seed=i, vary=args.vary)
            for i in range(args.steps + 1 if args.vary else 1)
        ]
        plan = []
        for rows in layouts:
            out = sum(len(d.output_ids) for r in rows for d in r)
            seqs = [len(d.prompt_ids) + len(d.output_ids) for r in rows for d in r]
            plan.append(
                (
                    functools.partial(efficient_step, model, opt, rows, out, args.micro_rows or args.rows),
                    seqs,
                    out,
                )
            )

    times, opt_times, step_flops = [], [], []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(args.steps + 1):
        step, seqs, head = plan[i % len(plan)]
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad()
        step()
        if cuda:
            torch.cuda.synchronize()
        t_opt = time.perf_counter()
        opt.clip_and_step(1.0)
        if cuda:
            torch.cuda.synchronize()
        if i > 0:
            times.append(time.perf_counter() - t)
            opt_times.append(time.perf_counter() - t_opt)
            step_flops.append((sum(seqs), *flops(model, seqs, head, sum(seqs))))
        print(
            f"  {variant} step {i}{' (warm-up)' if i == 0 else ''}: {time.perf_counter() - t:.2f} s",
            flush=True,
        )
    # --vary: every timed step counts, recompiles included (means); else the median step
    sec = sum(times) / len(times) if args.vary else sorted(times)[len(times) // 2]
    tokens, model_flops, flops_6n = (sum(x) / len(x) for x in zip(*step_flops, strict=True))
    return {
        "seconds_per_step": round(sec, 3),
        "optimizer_seconds": round(sorted(opt_times)[len(opt_times) // 2], 3),
        "tokens_per_s": round(tokens / sec, 1),
        "mfu": round(model_flops / sec / (args.peak_tflops * 1e12), 4),
        "mfu_6N": round(flops_6n / sec / (args.peak_tflops * 1e12), 4),
        "peak_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None,
        "optimizer": opt_name,
        "max_step_seconds": round(max(times), 3),
    }


if __name__ == "__main__":
    raise SystemExit(main())
