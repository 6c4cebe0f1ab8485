"""How much GPU memory a training step needs, and the packed-row length and checkpointing that fit a budget.

Issue #49: on one H100 a level-1 trainer of SmolLM2-135M (rank-4 LoRA, 32,768-token packed rows, no
activation checkpointing) held 22-35 GB beside four other runs and died of OOM. The row's activations, not
the weights, are what grows: a decoder layer keeps about ``act_layer`` bytes per token for its backward
pass, so a row of N tokens through L layers holds ``N x L x act_layer``. This module estimates that
(arithmetic on the model's config, no torch) and picks the settings that fit:

1. :func:`model_shape` reads the sizes that matter from a transformers config (Llama / Qwen / Mistral
   names).
2. :func:`step_bytes` = the weights and optimizer state (:func:`static_bytes`) + the chunked LM head's
   float32 logits (:func:`head_bytes`) + the packed row's activations (:func:`activation_bytes_per_token`
   with a share ``f`` of the layers checkpointed: such a layer keeps only its input, and one layer at a
   time is recomputed in the backward pass).
3. :func:`plan_trainer` takes the bytes a trainer may use and returns a :class:`TrainerPlan`: no
   checkpointing and the longest row up to ``want_tokens`` when that fits with at least ``min_fast_tokens``
   tokens (the fastest setting), else every layer checkpointed and the longest row that fits; a row shorter
   than the longest datum is refused (:class:`DoesNotFit`, one line naming the setting to change). Values the
   user set (``tokens``, ``checkpoint_fraction``) are kept and checked.
4. Level 2's FSDP ranks (``level2_distributed/trainer.py: rank_plan``): ``shards`` ranks each hold 1/shards of
   the weights and optimizer state plus two gathered decoder layers; a rank checks its step (its row length
   and checkpointing, as given) against its part of the card at set-up and refuses one that cannot fit.

The estimate counts every saved tensor of an eager Llama layer in the compute dtype (the RMSNorm's float32
copies included); without checkpointing it is above what was measured (32,768-token rows: 38.9 GiB
estimated, 22-35 GB held on an H100), with every layer checkpointed slightly below (SmolLM2, LoRA, 32,768
tokens: 5.07 GiB estimated, 5.5-6.2 GiB peak measured, allocator reservation and context included;
bench/RESULTS.md "Runs that fit the card"). The plan therefore fills at most ``MARGIN`` of the budget, and a
run logs its real peak (``mem/gpu_peak_gib``) beside the estimate (``mem/plan_gib``).

    >>> s = ModelShape(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64, vocab=49152)
    >>> round(activation_bytes_per_token(s, 0.0) / 2**20, 2), round(activation_bytes_per_token(s, 1.0) / 2**20, 3)
    (1.21, 0.078)
    >>> p = plan_trainer(s, budget_bytes=20 * 2**30, n_params=134_515_008, trainable_params=1_000_000)
    >>> p.tokens, p.checkpoint_fraction, round(p.estimate_gib, 1)
    (11264, 0.0, 15.9)
    >>> p = plan_trainer(s, budget_bytes=6 * 2**30, n_params=134_515_008, trainable_params=1_000_000)
    >>> p.tokens, p.checkpoint_fraction, round(p.estimate_gib, 1)
    (32768, 1.0, 5.1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.memory import gpu_budget_gib, gpu_held_note

__all__ = [
    "DoesNotFit",
    "OutOfMemory",
    "TrainerPlan",
    "check_weights_fit",
    "generation_oom",
    "gpu_budget_gib",
    "gpu_held_note",
    "gpu_memory_metrics",
    "plan_trainer",
    "setup_oom",
    "training_oom",
]

GIB = float(2**30)
MARGIN = 0.85
"""Share of the budget a plan may fill (the allocator's fragmentation, cuBLAS/attention workspaces)."""
FIXED_OVERHEAD = 1.0 * GIB
"""Bytes a trainer process holds besides tensors: the CUDA context, cuBLAS handles, kernels."""
ROW_STEP = 1024
"""Planned row lengths are multiples of this (fewer distinct shapes for compiled layers)."""


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that set its training memory."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


def model_shape(config: Any) -> ModelShape:
    """A :class:`ModelShape` from a transformers config (``num_hidden_layers``, ``hidden_size``, ...).

    >>> from types import SimpleNamespace as NS
    >>> model_shape(NS(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
    ...                num_key_value_heads=2, vocab_size=100)).head_dim
    16
    """
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
    return ModelShape(
        layers=int(config.num_hidden_layers),
        hidden=int(config.hidden_size),
        intermediate=int(config.intermediate_size),
        heads=heads,
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim),
        vocab=int(config.vocab_size),
    )


def layer_bytes_per_token(s: ModelShape, dtype_bytes: int = 2) -> float:
    """Bytes one decoder layer keeps per token for its backward pass when not checkpointed: the two
    RMSNorms (input, float32 copy and normalised output), q/k/v and rotary copies, the attention output and
    its log-sum-exp, the residuals, and the SwiGLU MLP's gate, up, activation and product."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    in_dtype = 10 * s.hidden + 4 * q + 4 * kv + 5 * s.intermediate
    fp32 = 2 * 2 * s.hidden + s.heads  # the norms' float32 copies, the attention's float32 log-sum-exp
    return dtype_bytes * in_dtype + 4 * fp32


def activation_bytes_per_token(s: ModelShape, checkpoint_fraction: float, dtype_bytes: int = 2) -> float:
    """Bytes per packed token during a training step with ``checkpoint_fraction`` of the layers
    checkpointed: a checkpointed layer keeps its input (``hidden`` values), the others everything, and the
    backward pass recomputes one checkpointed layer at a time; plus the embedding output, the final norm
    and the gathered hidden states of the trained positions."""
    layer = layer_bytes_per_token(s, dtype_bytes)
    done = round(checkpoint_fraction * s.layers)
    kept = done * dtype_bytes * s.hidden + (s.layers - done) * layer
    recompute = layer if done else 0.0
    return kept + recompute + 4 * dtype_bytes * s.hidden


def head_bytes(s: ModelShape, chunk: int = 2048, dtype_bytes: int = 2) -> float:
    """The chunked LM head's peak: one chunk's logits in the compute dtype and as float32, the
    log-sum-exp's float32 temporary and the logits' float32 gradient (level1_batched/efficiency.py).
    ``chunk`` = the row's length for a head that is not chunked (level 2 without ``--trainer-fast``)."""
    return chunk * s.vocab * (dtype_bytes + 3 * 4)


def layer_params(s: ModelShape) -> int:
    """Weights of one decoder layer (attention, SwiGLU MLP, two norms): the unit FSDP gathers whole."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return s.hidden * (2 * q + 2 * kv) + 3 * s.hidden * s.intermediate + 2 * s.hidden


def static_bytes(
    n_params: int, trainable_params: int, dtype_bytes: int = 2, shards: int = 1, gathered_params: int = 0
) -> float:
    """The weights in the compute dtype, and per trainable weight its gradient in that dtype, an fp32 master
    copy and gradient and AdamW's two fp32 moments (common/run/optim.py). With FSDP over ``shards`` ranks
    (level 2) each rank holds 1/shards of all of it, plus two gathered units of ``gathered_params`` weights in
    the compute dtype (the one computing and the one prefetched)."""
    per_rank = (n_params * dtype_bytes + trainable_params * (dtype_bytes + 4 + 4 + 8)) / max(1, shards)
    return per_rank + (2 * gathered_params * dtype_bytes if shards > 1 else 0)


def step_bytes(
    s: ModelShape,
    tokens: int,
    checkpoint_fraction: float,
    n_params: int,
    trainable_params: int,
    dtype_bytes: int = 2,
    shards: int = 1,
    chunked_head: bool = True,
) -> float:
    """The estimated peak of one training step on rows of ``tokens`` tokens (the fixed overhead included);
    ``shards``: FSDP ranks (:func:`static_bytes`); ``chunked_head=False``: the whole row's logits at once."""
    return (
        FIXED_OVERHEAD
        + static_bytes(n_params, trainable_params, dtype_bytes, shards, layer_params(s))
        + head_bytes(s, chunk=2048 if chunked_head else tokens, dtype_bytes=dtype_bytes)
        + tokens * activation_bytes_per_token(s, checkpoint_fraction, dtype_bytes)
    )


class DoesNotFit(ValueError):
    """The training step cannot fit the memory given: the message says which setting to change."""


@dataclass(frozen=True)
class TrainerPlan:
    """What :func:`plan_trainer` chose."""

    tokens: int
    """Tokens per packed row (``--max-tokens-per-microbatch``)."""
    checkpoint_fraction: float
    """Share of decoder layers checkpointed (``--checkpoint-fraction``)."""
    estimate_gib: float
    """The estimated peak of a step with these settings (GiB)."""
    budget_gib: float
    """The memory the trainer was given (GiB)."""

    def line(self) -> str:
        return (
            f"[memory] trainer: rows of {self.tokens} tokens, checkpoint fraction {self.checkpoint_fraction:g}: "
            f"~{self.estimate_gib:.1f} GiB of its {self.budget_gib:.1f} GiB"
        )


def plan_trainer(
    s: ModelShape,
    budget_bytes: float,
    n_params: int,
    trainable_params: int,
    want_tokens: int = 32768,
    longest_datum: int = 0,
    tokens: int | None = None,
    checkpoint_fraction: float | None = None,
    min_fast_tokens: int = 8192,
    dtype_bytes: int = 2,
    shards: int = 1,
    chunked_head: bool = True,
) -> TrainerPlan:
    """The packed-row length and checkpointing of a trainer given ``budget_bytes`` of GPU memory.

    ``tokens`` / ``checkpoint_fraction``: the user's values (kept, and refused when they do not fit).
    Otherwise: no checkpointing when rows of ``min(want_tokens, min_fast_tokens)`` tokens fit that way
    (the row as long as fits, up to ``want_tokens``), else every layer checkpointed and the longest row
    that fits. ``longest_datum``: a row never holds less than one whole datum, so a plan whose rows are
    shorter is refused (:class:`DoesNotFit`). ``shards`` / ``chunked_head``: level 2's FSDP ranks and plain
    head (:func:`step_bytes`; with ``chunked_head=False`` give both ``tokens`` and ``checkpoint_fraction``).
    """
    usable = MARGIN * budget_bytes

    def need_bytes(n: int, f: float) -> float:
        return step_bytes(s, n, f, n_params, trainable_params, dtype_bytes, shards, chunked_head)

    def fits(n: int, f: float) -> bool:
        return need_bytes(n, f) <= usable

    def longest(f: float) -> int:
        free = usable - need_bytes(0, f)
        n = int(free // activation_bytes_per_token(s, f, dtype_bytes)) if free > 0 else 0
        return min(want_tokens, n // ROW_STEP * ROW_STEP if n >= ROW_STEP else n)

    def plan(n: int, f: float) -> TrainerPlan:
        est = need_bytes(n, f)
        return TrainerPlan(tokens=n, checkpoint_fraction=f, estimate_gib=est / GIB, budget_gib=budget_bytes / GIB)

    need = max(1, longest_datum)
    if tokens is not None and checkpoint_fraction is not None:  # both set: check them
        if not fits(max(tokens, need), checkpoint_fraction):
            est = need_bytes(max(tokens, need), checkpoint_fraction)
            raise DoesNotFit(
                f"--max-tokens-per-microbatch {tokens} with --checkpoint-fraction {checkpoint_fraction:g} needs "
                f"~{est / GIB:.1f} GiB, more than the trainer's {budget_bytes / GIB:.1f} GiB: lower them "
                "(or leave them unset to have them sized) or give the run more memory (--gpu-share)"
            )
        return plan(tokens, checkpoint_fraction)
    options = [checkpoint_fraction] if checkpoint_fraction is not None else [0.0, 1.0]
    if tokens is not None:  # the user's row length stays: the least checkpointing that fits it
        for f in options:
            if fits(max(tokens, need), f):
                return plan(tokens, f)
        est = need_bytes(max(tokens, need), options[-1])
        raise DoesNotFit(
            f"--max-tokens-per-microbatch {tokens} needs ~{est / GIB:.1f} GiB even with every layer checkpointed, "
            f"more than the trainer's {budget_bytes / GIB:.1f} GiB: lower it (or leave it unset to have it sized) "
            "or give the run more memory (--gpu-share)"
        )
    for f in options:
        n = longest(f)
        enough = min(want_tokens, min_fast_tokens) if f == 0.0 and len(options) > 1 else need
        if n >= max(enough, need):
            return plan(n, f)
    best = need_bytes(need, options[-1])
    raise DoesNotFit(
        f"one datum of {need} tokens needs ~{best / GIB:.1f} GiB to train (checkpoint fraction "
        f"{options[-1]:g}), more than the trainer's {budget_bytes / GIB:.1f} GiB: give the run more memory "
        "(--gpu-share) or shorten prompts and replies (--max-prompt-tokens, --max-new-tokens)"
    )


# ----------------------------------------------------------------------------------------------------
# A run that does not fit its card: one line naming the setting to lower (issue #54), not a CUDA traceback.
# ----------------------------------------------------------------------------------------------------
class OutOfMemory(DoesNotFit):
    """A CUDA out-of-memory error of a run, as the one line it stops with (``sera train`` prints it, exit 2).
    The hf engine's own (``common.policy.hf.EngineOutOfMemory``) becomes one of these in the tier's loop."""


def generation_oom(cfg: Any, rows: int, device: Any = "cuda", note: str | None = None) -> OutOfMemory:
    """The run's line for an out-of-memory error while the engine decoded ``rows`` calls together (``note``:
    what the process held then, :func:`gpu_held_note`; default: now)."""
    note = gpu_held_note(device) if note is None else note
    together = f"{rows} model calls decoding together" if rows else "decoding"
    return OutOfMemory(
        f"CUDA out of memory while generating ({together}{note}): lower --max-batch-size "
        f"({cfg.max_batch_size}: the calls decoded together), --rollouts-per-task ({cfg.rollouts_per_task}) or "
        f"--max-new-tokens ({cfg.rollout.max_new_tokens})"
    )


def training_oom(cfg: Any, tokens: int, device: Any = "cuda", note: str | None = None) -> OutOfMemory:
    """The run's line for an out-of-memory error in a training step whose longest datum has ``tokens``."""
    note = gpu_held_note(device) if note is None else note
    datum = f"datums of up to {tokens} tokens" if tokens else "its datums"
    lora = "" if getattr(cfg, "lora_rank", 0) else " or train a LoRA adapter (--lora-rank 8: ~1% of the optimizer state)"
    return OutOfMemory(
        f"CUDA out of memory in the training step ({datum}{note}): lower --max-prompt-tokens "
        f"({cfg.rollout.max_prompt_tokens}) or --max-new-tokens ({cfg.rollout.max_new_tokens}){lora}"
    )


def check_weights_fit(model: Any, cfg: Any, device: Any = "cuda") -> None:
    """Refuse in one line a run whose weights and optimizer state alone (:func:`static_bytes`: weights in
    their dtype, and per trainable weight a gradient, fp32 master, master gradient and AdamW's two moments)
    need more than this process may use on its card; a no-op off CUDA."""
    budget = gpu_budget_gib(device)
    if not budget:
        return
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    need = (FIXED_OVERHEAD + static_bytes(n, trainable, params[0].element_size() if params else 2)) / GIB
    if need > budget:
        lora = "" if getattr(cfg, "lora_rank", 0) else "train a LoRA adapter (--lora-rank 8) or "
        raise DoesNotFit(
            f"the model's weights and optimizer state need ~{need:.1f} GiB, more than the {budget:.1f} GiB this "
            f"process may use on its GPU: {lora}use a smaller --model"
        )


def setup_oom(cfg: Any, device: Any = "cuda", note: str | None = None) -> OutOfMemory:
    """The run's line for an out-of-memory error while the model and its optimizer state were put on the card."""
    note = gpu_held_note(device) if note is None else note
    lora = "" if getattr(cfg, "lora_rank", 0) else "train a LoRA adapter (--lora-rank 8) or "
    held = f" ({note.removeprefix('; ')})" if note else ""
    return OutOfMemory(f"CUDA out of memory loading the model and its optimizer state{held}: {lora}use a smaller --model")


# ----------------------------------------------------------------------------------------------------
# What a run holds on its GPU, measured (every round's mem/gpu_* metrics).
# ----------------------------------------------------------------------------------------------------
def _children(pid: int) -> set[int]:
    """Every descendant process of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    import os

    parent: dict[int, int] = {}
    try:
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
    except OSError:
        return set()
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in out}
        out |= frontier
    return out


def gpu_process_gib() -> dict[int, float]:
    """GPU memory (GiB) of every compute process on the machine's GPUs, by pid: NVML (``pynvml``) when
    installed, else ``nvidia-smi``; empty when neither answers (a CPU machine)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        out: dict[int, float] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i)):
                out[int(p.pid)] = out.get(int(p.pid), 0.0) + (p.usedGpuMemory or 0) / GIB
        return out
    except Exception:  # noqa: BLE001 - no NVML: ask nvidia-smi
        pass
    import subprocess

    try:
        text = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    out = {}
    for line in text.splitlines():
        try:
            pid, mib = (x.strip() for x in line.split(","))
            out[int(pid)] = out.get(int(pid), 0.0) + float(mib) / 1024
        except ValueError:
            continue
    return out


def gpu_memory_metrics(device: Any, plan: TrainerPlan | None = None) -> dict[str, float]:
    """This run's GPU memory (GiB), for every round's metrics; ``{}`` off CUDA.

    ``mem/gpu_peak_gib``: this process's peak (the torch allocator's peak reservation, plus what the process
    holds outside it now: CUDA context, kernels; an engine running in this process included);
    ``mem/gpu_engine_gib``: what this process's child processes hold now (an engine core in a process of its
    own; vLLM reserves its memory at start, so now is its peak), 0 when none; ``mem/gpu_run_gib``: the two
    together, the run's footprint on the card; ``mem/gpu_total_gib``: the card; ``mem/plan_gib``: the
    trainer plan's estimate (:func:`plan_trainer`), when the run was sized."""
    import os

    import torch

    if getattr(device, "type", str(device)) != "cuda" or not torch.cuda.is_available():
        return {}
    total = torch.cuda.get_device_properties(device).total_memory / GIB
    peak = torch.cuda.max_memory_reserved(device) / GIB
    procs = gpu_process_gib()
    me = os.getpid()
    if me in procs:  # what the process holds outside the allocator (context, kernels, an in-process engine)
        peak += max(0.0, procs[me] - torch.cuda.memory_reserved(device) / GIB)
    kids = _children(me)
    engine = sum(v for p, v in procs.items() if p in kids)
    return {
        "mem/gpu_peak_gib": peak,
        "mem/gpu_engine_gib": engine,
        "mem/gpu_run_gib": peak + engine,
        "mem/gpu_total_gib": total,
        **({"mem/plan_gib": plan.estimate_gib} if plan is not None else {}),
    }
