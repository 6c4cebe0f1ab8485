"""Level 1's packed loss: first-fit-decreasing micro-batches, one forward per packed row, CISPO per row.

Moved out of ``level1_batched/train.py`` so that level 2 (``level2_distributed/trainer.py``) can train with
exactly the same packed loss without importing another tier's training script; ``level1_batched.train``
re-exports every name, so nothing that imported them from there changes.

    from level1_batched.packing import accumulate_gradients_packed
    m = accumulate_gradients_packed(model, datums, weights, max_tokens_per_microbatch=4096)
    m = accumulate_gradients_packed(model, datums, weights, 4096, optimizer=opt)  # summed in fp32 on opt's masters
"""

from __future__ import annotations

import torch

from common.rl.datums import Datum
from common.rl.loss import RatioStats, cispo_loss, token_logprobs


def pack_microbatches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """First-fit decreasing: longest first, each into the first micro-batch with room (a datum longer than
    ``max_tokens`` gets its own). Returns datum indices per micro-batch.

    >>> pack_microbatches([5, 3, 4, 2], max_tokens=7)
    [[0, 3], [2, 1]]
    """
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        b = next((b for b in range(len(bins)) if room[b] >= lengths[i]), None)
        if b is None:
            bins.append([])
            room.append(max_tokens)
            b = len(bins) - 1
        bins[b].append(i)
        room[b] -= lengths[i]
    return bins


def packed_logprobs(model, datums: list[Datum]) -> torch.Tensor:
    """log pi_theta of every datum's output tokens from ONE packed row, as a [D, T_max] grid (0 = no token).

    Row: ``prompt_0 + output_0 + prompt_1 + output_1 + ...`` with position ids ``0..L_0-1, 0..L_1-1, ...``.
    With no attention mask and no cache, transformers reads the restarts as packed sequences and builds a
    block-diagonal causal mask, so each datum sees only itself (exactly level 0's separate forwards).
    A model prepared by ``efficiency.apply_efficiency`` (``--fast-trainer``) takes the varlen + chunked-head
    path instead (same values, no dense mask, no [K, V] float32 logits).
    """
    if getattr(model.config, "_attn_implementation", None) == "sera_varlen":
        from level1_batched.efficiency import fast_packed_logprobs

        return fast_packed_logprobs(model, datums)
    ids, pos, keep, spans = [], [], [], []
    for d in datums:
        seq = d.prompt_ids + d.output_ids
        start = len(ids) + len(d.prompt_ids) - 1  # position that predicts the first output token
        keep.extend(range(start, start + len(d.output_ids)))
        spans.append(len(d.output_ids))
        ids.extend(seq)
        pos.extend(range(len(seq)))
    dev = model.device
    row = torch.tensor([ids], device=dev)  # [1, N]
    keep_t = torch.tensor(keep, device=dev)  # [K], K = sum of T_d
    logits = model(
        input_ids=row,
        position_ids=torch.tensor([pos], device=dev),  # [1, N]
        use_cache=False,
        logits_to_keep=keep_t,
    ).logits  # [1, K, V]: logits only where an output token is predicted
    flat = token_logprobs(logits, row[:, keep_t + 1])[0]  # [K]
    grid = flat.new_zeros(len(datums), max(spans))  # [D, T_max]
    r = torch.repeat_interleave(torch.arange(len(datums), device=dev), torch.tensor(spans, device=dev))  # [K]
    c = torch.cat([torch.arange(n, device=dev) for n in spans])  # [K]
    return grid.index_put((r, c), flat)  # [D, T_max]


def check_packing(model, n: int = 12) -> None:
    """Refuse a model whose attention does not isolate packed datums (e.g. custom code that ignores
    position-id packing): two random sequences packed in one row must score as they do alone. A bf16 model
    is checked on an fp32 copy (bf16 logits differ by an ulp, up to 0.125 nats, between two kernels)."""
    if next(model.parameters()).dtype != torch.float32:
        import copy

        return check_packing(copy.deepcopy(model).float(), n)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    a, b = (torch.randint(0, vocab, (n,), generator=g).tolist() for _ in range(2))
    pair = [
        Datum(x[:4], x[4:], [0.0] * (n - 4), [1] * (n - 4), 0.0, 0, i, True, "check")
        for i, x in enumerate((a, b))
    ]
    with torch.no_grad():
        packed = packed_logprobs(model, pair)  # [2, n - 4]
        alone = torch.cat([packed_logprobs(model, [d]) for d in pair])  # [2, n - 4]
    diff = float((packed - alone).abs().max())
    if diff > 1e-3:
        raise SystemExit(
            f"packed datums leak attention into each other with this model (max |log-prob diff| {diff:.3g}); "
            "train without packing: --max-tokens-per-microbatch 1"
        )


def _grid(rows: list[list[float]], width: int, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor([list(x) + [0] * (width - len(x)) for x in rows], dtype=dtype)  # [D, T_max]


def accumulate_gradients_packed(
    model,
    datums: list[Datum],
    weights: list[float],
    max_tokens_per_microbatch: int,
    num_tokens: float | None = None,
    optimizer=None,
) -> dict[str, float]:
    """Backpropagate the CISPO loss of ``datums`` in packed micro-batches; gradients accumulate in ``.grad``,
    or, with ``optimizer`` (a :class:`~common.run.optim.MasterWeightAdamW`), on its fp32 masters: each
    micro-batch's gradient is moved there right after its backward (``accumulate_model_grads``), so the
    step's sum is taken in fp32 even when the model computes in bf16 (level 0 does the same per datum; the
    public trainer accumulates in fp32). With an fp32 model the masters are the parameters: nothing moves.

    ``num_tokens`` is |M|, the trained-token count of the whole optimizer step (all ranks); default: this
    call's count. Every micro-batch divides by it, so the micro-batch (and rank) losses sum to the
    step's token-mean. ``loss/cispo`` and ``loss/clip_frac`` are this call's shares (they add up over
    ranks); ``train/microbatches`` and ``train/packed_tokens`` count what ran here. The ratio metrics
    (``loss/ratio_mean``, ``loss/ratio_max``, ``loss/abs_log_ratio``) are this call's; the sums behind them
    (``loss/scored_tokens``, ``loss/ratio_sum``, ``loss/abs_log_ratio_sum``) add up over ranks.
    """
    local = sum(d.num_trained_tokens for d in datums)
    n_tokens = float(local if num_tokens is None else num_tokens)
    lengths = [len(d.prompt_ids) + len(d.output_ids) for d in datums]
    micro = pack_microbatches(lengths, max_tokens_per_microbatch)
    total, clipped, ratios = 0.0, 0.0, RatioStats()
    for idx in micro:
        ds = [datums[i] for i in idx]
        logp = packed_logprobs(model, ds)  # [D, T_max]
        width = logp.shape[1]
        loss, m = cispo_loss(
            logp,
            _grid([d.behaviour_logprobs for d in ds], width).to(logp.device),  # [D, T_max]
            torch.tensor([d.advantage for d in ds], device=logp.device),  # [D]
            _grid([d.loss_mask for d in ds], width).to(logp.device),  # [D, T_max]
            weights=torch.tensor([weights[i] for i in idx], device=logp.device),  # [D]
            num_tokens=n_tokens,
        )  # this micro-batch's share of the token-mean
        loss.backward()  # grads add up
        if optimizer is not None:
            optimizer.accumulate_model_grads()  # ... in fp32, on the masters (no-op for an fp32 model)
        total += loss.item()
        clipped += m["loss/clip_frac"] * m["loss/tokens"]
        ratios.add(m)
    tokens, ratio_sum, abs_log_sum = ratios.totals()
    return {
        "loss/cispo": total,
        "loss/tokens": n_tokens,
        "loss/clip_frac": clipped / max(1.0, n_tokens),
        "train/microbatches": float(len(micro)),
        "train/packed_tokens": float(sum(lengths)),
        **ratios.metrics(),  # this call's; a data-parallel step combines the sums below over ranks
        "loss/scored_tokens": tokens,
        "loss/ratio_sum": ratio_sum,
        "loss/abs_log_ratio_sum": abs_log_sum,
    }
