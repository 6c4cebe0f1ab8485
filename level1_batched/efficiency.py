"""Trainer efficiency for level 1 on a GPU: the same log-probs as ``train.packed_logprobs``, computed cheaper.

Level 1's reference path (``train.packed_logprobs``) packs datums into one row with restarting position
ids; transformers turns that into a dense ``[N, N]`` block-diagonal mask for sdpa, and the LM head
produces ``[K, V]`` logits that are upcast to float32 in one piece. At the paper's sizes (Qwen3-4B,
151,936-token vocabulary, 16K-token rows) both are the memory and time hogs. This module replaces them,
one small function per idea, and the parity test (tests/test_engine_efficiency.py) holds it to the
reference on CPU:

1. **Varlen attention, no mask** (:func:`varlen_attention`, registered with transformers as
   ``attn_implementation="sera_varlen"``): the packed row's sequence boundaries travel as
   ``cu_seq_lens`` (cumulative lengths) and ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention's
   varlen kernel) attends within each datum only. No ``[N, N]`` mask exists. On CPU (tests) it loops
   over the datums with causal sdpa: the same math, slowly.
2. **Chunked log-probs** (:func:`chunked_token_logprobs`): the base model returns hidden states; the head
   runs over ``chunk`` positions at a time, each chunk's ``[chunk, V]`` float32 logits are reduced to one
   log-prob per token and freed, and the backward pass recomputes them chunk by chunk (activation
   checkpointing of the head). Peak head memory: ``chunk x V x 4`` bytes instead of ``K x V x 4``.
   Liger's fused linear cross-entropy does the same in one Triton kernel but returns a loss, not the
   per-token log-probs CISPO needs; a plain torch loop keeps the code readable.
3. **Activation checkpointing** of every decoder layer (``gradient_checkpointing_enable``).
4. **bf16 compute, fp32 master weights, fused AdamW**: ``common.run.optim.make_optimizer`` (shared by
   every tier; fused kernels on CUDA). Not repeated here.

Use: ``sera train --level 1 --engine vllm --fast-trainer`` (``apply_efficiency(model)`` once; level 1's
``packing.packed_logprobs`` then dispatches to ``fast_packed_logprobs``). Only with a separate rollout engine (``--engine vllm``): the model then runs
``sera_varlen`` attention in every forward (and in the checkpointed recomputation during backward),
which cannot serve the hf engine's left-padded generation. Measured on one H200: bench/RESULTS.md ("Trainer efficiency").
Simplification: models whose head has a bias, a logit scale or soft-capping are refused (Llama / Qwen
families have none).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from common.rl.datums import Datum

ATTN_NAME = "sera_varlen"
"""The name ``varlen_attention`` is registered under in transformers' attention interface."""


# ----------------------------------------------------------------------------------------------------
# 1. Varlen attention: sequence boundaries as cumulative lengths, no mask.
# ----------------------------------------------------------------------------------------------------
def cu_seqlens(lengths: list[int], device: torch.device | str) -> torch.Tensor:
    """Cumulative lengths ``[0, L0, L0+L1, ...]`` (int32), the varlen kernels' boundary format.

    >>> cu_seqlens([3, 2, 4], "cpu").tolist()
    [0, 3, 5, 9]
    """
    out = [0]
    for n in lengths:
        out.append(out[-1] + int(n))
    return torch.tensor(out, dtype=torch.int32, device=device)


def _varlen_kernel_kwargs() -> dict[str, Any]:
    """Causal + GQA keywords of this torch's ``varlen_attn`` (its signature changed across releases)."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    kw: dict[str, Any] = {}
    if "is_causal" in params:
        kw["is_causal"] = True
    elif "window_size" in params:
        kw["window_size"] = (-1, 0)  # causal
    else:
        raise RuntimeError("torch.nn.attention.varlen.varlen_attn has neither is_causal nor window_size")
    kw["_gqa"] = "enable_gqa" in params
    kw["_scale"] = "scale" in params
    return kw


def varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``query`` ``[1, Hq, N, D]``, ``key``/``value`` ``[1, Hkv, N, D]``
    of ONE packed row whose datums end at ``kwargs["cu_seq_lens_q"]``; returns ``[1, N, Hq, D]``."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        raise ValueError(f"attn_implementation={ATTN_NAME!r} needs cu_seq_lens_q (use fast_packed_logprobs)")
    if query.shape[0] != 1:
        raise ValueError(f"{ATTN_NAME} takes one packed row, got a batch of {query.shape[0]}")
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [N, H, D]
    groups = q.shape[1] // k.shape[1]
    if q.is_cuda:
        from torch.nn.attention.varlen import varlen_attn

        kw = _varlen_kernel_kwargs()
        gqa = kw.pop("_gqa")
        if kw.pop("_scale"):
            kw["scale"] = scaling
        elif scaling is not None and abs(scaling - q.shape[-1] ** -0.5) > 1e-6:
            raise RuntimeError("this torch's varlen_attn has no scale argument and the model needs one")
        if groups > 1 and not gqa:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # [N, Hq, D]
        elif groups > 1:
            kw["enable_gqa"] = True
        max_len = int(kwargs.get("max_length_q") or int((cu[1:] - cu[:-1]).max()))
        out = varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)  # [N, Hq, D]
    else:  # CPU reference: causal sdpa per datum
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        bounds = cu.tolist()
        parts = []
        for s, e in zip(bounds[:-1], bounds[1:], strict=True):
            qs, ks, vs = (x[s:e].transpose(0, 1) for x in (q, k, v))  # [H, L, D]
            parts.append(
                F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scaling).transpose(0, 1)
            )
        out = torch.cat(parts)  # [N, Hq, D]
    return out.unsqueeze(0), None  # [1, N, Hq, D]


def register_varlen_attention() -> str:
    """Register :func:`varlen_attention` (and a no-mask mask function) with transformers; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(ATTN_NAME, varlen_attention)
    AttentionMaskInterface.register(ATTN_NAME, flash_attention_mask)
    return ATTN_NAME


# ----------------------------------------------------------------------------------------------------
# 2. Chunked log-probs: never materialise [K, V] float32 logits.
# ----------------------------------------------------------------------------------------------------
def _chunk_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = (hidden @ weight.t()).float()  # [C, V]: freed after this chunk (recomputed in backward)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # [C]


def chunked_token_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = 2048
) -> torch.Tensor:
    """``log softmax(hidden @ weight.T)[targets]`` for ``hidden`` ``[K, H]``, ``weight`` ``[V, H]``,
    ``targets`` ``[K]`` -> ``[K]`` float32, ``chunk`` rows at a time; under autograd every chunk is
    checkpointed, so backward holds one chunk's logits at a time too."""
    outs = []
    for s in range(0, hidden.shape[0], chunk):
        h, t = hidden[s : s + chunk], targets[s : s + chunk]
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            outs.append(checkpoint(_chunk_logprobs, h, weight, t, use_reentrant=False))
        else:
            outs.append(_chunk_logprobs(h, weight, t))
    return torch.cat(outs) if outs else hidden.new_zeros(0, dtype=torch.float32)


def _head(model: Any) -> torch.Tensor:
    head = model.get_output_embeddings()
    cfg = model.config
    if getattr(head, "bias", None) is not None or getattr(cfg, "final_logit_softcapping", None):
        raise ValueError("chunked log-probs support plain linear heads only (no bias / soft-capping)")
    if getattr(cfg, "logit_scale", None) not in (None, 1, 1.0):
        raise ValueError("chunked log-probs support plain linear heads only (no logit scale)")
    return head.weight  # [V, H]


# ----------------------------------------------------------------------------------------------------
# The fast twin of level 1's packed_logprobs, and the one-call setup.
# ----------------------------------------------------------------------------------------------------
def fast_packed_logprobs(model: Any, datums: list[Datum], chunk: int = 2048) -> torch.Tensor:
    """log pi_theta of every datum's output tokens as a ``[D, T_max]`` grid (0 = no token), like
    ``train.packed_logprobs``: one packed row, varlen attention, chunked head."""
    ids, pos, keep, spans, lengths = [], [], [], [], []
    for d in datums:
        seq = d.prompt_ids + d.output_ids
        start = len(ids) + len(d.prompt_ids) - 1  # position that predicts the first output token
        keep.extend(range(start, start + len(d.output_ids)))
        spans.append(len(d.output_ids))
        lengths.append(len(seq))
        ids.extend(seq)
        pos.extend(range(len(seq)))
    if getattr(model.config, "_attn_implementation", None) != ATTN_NAME:
        raise ValueError("fast_packed_logprobs needs apply_efficiency(model) first")
    dev = model.device
    row = torch.tensor([ids], device=dev)  # [1, N]
    keep_t = torch.tensor(keep, device=dev)  # [K]
    cu = cu_seqlens(lengths, dev)  # [D + 1]
    hidden = model.get_decoder()(
        input_ids=row,
        position_ids=torch.tensor([pos], device=dev),  # [1, N]
        use_cache=False,
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=max(lengths),
        max_length_k=max(lengths),
    ).last_hidden_state[0]  # [N, H]
    flat = chunked_token_logprobs(hidden[keep_t], _head(model), row[0, keep_t + 1], chunk)  # [K]
    grid = flat.new_zeros(len(datums), max(spans))  # [D, T_max]
    r = torch.repeat_interleave(torch.arange(len(datums), device=dev), torch.tensor(spans, device=dev))  # [K]
    c = torch.cat([torch.arange(n, device=dev) for n in spans])  # [K]
    return grid.index_put((r, c), flat)  # [D, T_max]


def apply_efficiency(
    model: Any, checkpointing: bool = True, checkpoint_fraction: float = 1.0, compile_layers: bool = False
) -> Any:
    """Varlen attention, (optionally) activation checkpointing and per-layer ``torch.compile``, in place.

    ``checkpoint_fraction`` < 1 checkpoints only the first ``round(fraction x layers)`` decoder layers
    (selective checkpointing: the rest keep their activations, so less of the forward is recomputed in the
    backward pass, for more memory). ``compile_layers`` runs every decoder layer through ``torch.compile``
    (inductor fuses the RMSNorm / SwiGLU / rope element-wise work; the first step pays the compile). On one
    H200, Qwen3-4B shape, 16K tokens per step in two micro-batches, no checkpointing and compiled layers
    reach 47.8 % MFU vs 29.5 % for plain HF training (bench/RESULTS.md). Returns ``model``.
    """
    if not 0.0 <= checkpoint_fraction <= 1.0:
        raise ValueError(f"checkpoint_fraction must be in [0, 1] (got {checkpoint_fraction})")
    model.set_attn_implementation(register_varlen_attention())
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    if checkpointing and checkpoint_fraction > 0:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        for layer in layers[round(checkpoint_fraction * len(layers)) :]:
            layer.gradient_checkpointing = False
    if compile_layers:
        import torch._dynamo as dynamo

        # one compiled frame per layer instance: room for all of them (the default limit is 8)
        dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 2 * len(layers))
        # a layer that fails to compile runs eagerly (with dynamo's warning) instead of ending the run
        dynamo.config.suppress_errors = True
        for layer in layers:
            layer.compile()
    return model


# ----------------------------------------------------------------------------------------------------
# Sizing: the packed-row length and checkpointing that fit the trainer's share of the card (issue #49).
# ----------------------------------------------------------------------------------------------------
ENGINE_OVERHEAD_GIB = 2.5
"""An in-card vLLM engine's memory besides its KV cache and weights (activations, CUDA graphs, context): a
SmolLM2 engine with a 4 GiB KV cache held 6.46 GiB on an H100 (bench/RESULTS.md "Runs that fit the card")."""


def trainer_budget_gib(total_gib: float, share: float, engine_util: float | None, kv_cache_gib: float | None,
                       weights_gib: float) -> float:  # fmt: skip
    """The trainer's part of a run given ``share`` of a ``total_gib`` card: the share less the engine's part
    (a fixed KV cache + its weights + :data:`ENGINE_OVERHEAD_GIB`, else ``engine_util`` of the card; no
    engine: nothing).

    >>> trainer_budget_gib(80.0, 0.2, 0.08, 4.0, 0.25)   # 16 GiB for the run, ~6.75 for the engine
    9.25
    >>> trainer_budget_gib(80.0, 1.0, 0.3, None, 0.25)   # alone on the card, the engine at 0.3
    56.0
    """
    if kv_cache_gib:
        engine = kv_cache_gib + weights_gib + ENGINE_OVERHEAD_GIB
    else:
        engine = (engine_util or 0.0) * total_gib
    return share * total_gib - engine


def size_trainer(model: Any, l1: Any, longest_datum: int, engine: bool, device: torch.device) -> tuple[Any, Any]:
    """``(l1, plan)``: ``l1`` (a resolved :class:`~level1_batched.config.Level1Config`) with
    ``max_tokens_per_microbatch`` and ``checkpoint_fraction`` filled in to fit the trainer's memory on this
    card (``plan``: a :class:`~common.run.trainer_memory.TrainerPlan`), the values the user gave kept and
    checked; a setting that cannot fit raises :class:`~common.run.trainer_memory.DoesNotFit` (one line).
    With ``--gpu-share`` the trainer's allocator is capped at its part (``set_per_process_memory_fraction``).
    Off CUDA or without the fast trainer: ``l1`` unchanged (with its CPU defaults) and no plan."""
    from dataclasses import replace

    from common.run.trainer_memory import GIB, DoesNotFit, model_shape, plan_trainer

    if device.type != "cuda" or not l1.fast_trainer:
        return replace(
            l1,
            max_tokens_per_microbatch=l1.max_tokens_per_microbatch or 2048,
            checkpoint_fraction=1.0 if l1.checkpoint_fraction is None else l1.checkpoint_fraction,
        ), None
    total = torch.cuda.get_device_properties(device).total_memory / GIB
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    weights = sum(p.numel() * p.element_size() for p in params) / GIB
    share = l1.gpu_share or 1.0
    budget = trainer_budget_gib(total, share, l1.gpu_memory_utilization if engine else 0.0,
                                l1.kv_cache_gib if engine else None, weights)  # fmt: skip
    if budget <= 0:
        raise DoesNotFit(
            f"--gpu-share {share:g} of this {total:.0f} GiB card leaves nothing for the trainer beside the "
            f"engine (--kv-cache-gib {l1.kv_cache_gib}, --gpu-memory-utilization {l1.gpu_memory_utilization}): "
            "give the run a larger share or the engine less"
        )
    plan = plan_trainer(
        model_shape(model.config),
        budget * GIB,
        n_params,
        trainable,
        want_tokens=32768,
        longest_datum=longest_datum,
        tokens=l1.max_tokens_per_microbatch,
        checkpoint_fraction=l1.checkpoint_fraction,
        dtype_bytes=next(iter(params)).element_size(),
    )
    if l1.gpu_share:  # the trainer never takes more than its part (an in-process engine is in the process)
        part = share if engine and not l1.engine_process else budget / total
        torch.cuda.set_per_process_memory_fraction(min(1.0, part), device)
    return replace(l1, max_tokens_per_microbatch=plan.tokens, checkpoint_fraction=plan.checkpoint_fraction), plan
