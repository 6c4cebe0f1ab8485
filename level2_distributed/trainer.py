"""FSDP2 trainer ranks: one Ray actor per rank, one process group over them.

Parallelism is applied to an unmodified Hugging Face model by small ``apply_*`` functions (the model code
knows nothing about it):

* :func:`apply_activation_checkpointing` — each decoder layer recomputes its activations in the backward
  pass (transformers' non-reentrant checkpointing), trading ~1/3 more compute for activation memory;
* :func:`apply_fsdp` — ``torch.distributed.fsdp.fully_shard`` on every decoder layer, then on the root:
  each rank stores 1/world of every parameter (a DTensor shard); a layer's full weights are all-gathered
  just before its forward/backward and freed after; gradients are reduce-scattered, so each rank holds
  1/world of the gradients and of AdamW's state. With ``dtype=bfloat16`` the
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` keeps the sharded parameters in fp32
  (they ARE the master weights of level 0's ``MasterWeightAdamW``), computes in bf16 and reduces
  gradients in fp32.

The loss is level 1's packed loss (``level1_batched/packing.py``), unchanged. The driver packs the step's
datums into micro-batches once and deals them out so that every rank runs the SAME number of micro-batches
(an FSDP2 forward is a collective: a rank with fewer would leave the others waiting in an all-gather); a
rank short of work runs a zero-weight dummy micro-batch. FSDP's reduce-scatter AVERAGES the ranks'
gradients (the usual data-parallel convention; summing instead needs ReduceOp.PREMUL_SUM, which gloo lacks),
so every micro-batch divides by the step's GLOBAL trained-token count / world: the average of the ranks'
gradients is then the sum of the global token-mean's parts, i.e. level 0's gradient (tests/test_level2.py checks it against the recorded fixture at world size 1 and 2).

On CPU the group is gloo (``fully_shard`` runs on CPU tensors with gloo in torch 2.13: checked by the
tests); on GPUs it is NCCL. Not used directly: ``level2_distributed/train.py`` starts the actors.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from common.rl.datums import Datum
from common.run.checkpoint import RunState
from common.train_config import OptimConfig, TrainConfig
from level1_batched.packing import accumulate_gradients_packed
from level2_distributed.checkpoint import DCPCheckpointer

FAULT_ENV = "SERA_L2_FAULT"
"""Fault injection for the recovery test: ``RANK:ROUND:MARKER_FILE`` makes trainer ``RANK`` exit in the
middle of round ``ROUND``'s step (after its backward, before the optimizer) once (the marker file records
that it fired). Not a user option."""


# ----------------------------------------------------------------------------------------------------
# Parallelism as wrappers around an unmodified model.
# ----------------------------------------------------------------------------------------------------
def apply_activation_checkpointing(model) -> None:
    """Recompute every decoder layer in the backward pass (non-reentrant, so it composes with FSDP2)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def apply_fsdp(model, dtype: str) -> None:
    """``fully_shard`` each decoder layer (one all-gather unit each), then the root (embeddings, norm, head)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if dtype == "bfloat16"
        else MixedPrecisionPolicy()  # float32 end to end (the parity tests)
    )
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)


def dummy_datum() -> Datum:
    """One masked token: a micro-batch that trains nothing but takes part in FSDP's collectives."""
    return Datum([0], [0], [0.0], [0], 0.0, 0, 0, False, "dummy")


def unique_state(model) -> list[tuple[str, torch.Tensor]]:
    """``model.state_dict()`` without the aliases of tied weights (``lm_head.weight`` when the embeddings
    are tied: the same tensor as ``model.embed_tokens.weight``), in state-dict order. What every weight
    sync sends and the HF export writes (transformers re-ties on load; vLLM's loaders skip the alias)."""
    seen: set[int] = set()
    out = []
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue
        seen.add(id(t))
        out.append((name, t))
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective: every rank must call it in the same order)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


# ----------------------------------------------------------------------------------------------------
# The actor.
# ----------------------------------------------------------------------------------------------------
class TrainerRank:
    """One FSDP2 rank. ``ray.remote(num_gpus=...)(TrainerRank)`` makes it an actor (train.py does)."""

    def __init__(
        self,
        rank: int,
        world: int,
        cfg: TrainConfig,
        activation_checkpointing: bool = True,
        microbatch_tokens: int = 4096,
    ) -> None:
        self.rank, self.world, self.cfg = rank, world, cfg
        self.activation_checkpointing, self.microbatch_tokens = activation_checkpointing, microbatch_tokens
        self.sync_group = None

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def free_port(self) -> int:
        from level2_distributed.sync import free_port

        return free_port()

    def setup(self, master: str) -> int:
        """Join the FSDP group at ``master`` (``host:port`` of rank 0), load and shard the model."""
        from common.policy.models import load_model

        cuda = torch.cuda.is_available()
        self.device = (
            torch.device("cuda", 0) if cuda else torch.device("cpu")
        )  # Ray sets CUDA_VISIBLE_DEVICES
        if cuda:
            torch.cuda.set_device(self.device)
        else:
            torch.set_num_threads(max(1, int(os.environ.get("SERA_L2_THREADS", "1"))))
        dist.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"tcp://{master}", rank=self.rank, world_size=self.world
        )
        # fp32 storage: with bf16 training FSDP's MixedPrecisionPolicy casts for compute (the fp32 shards are
        # the master weights)
        model, _ = load_model(self.cfg.model, dtype="float32", device=self.device, seed=self.cfg.seed)
        if self.activation_checkpointing:
            apply_activation_checkpointing(model)
        apply_fsdp(model, self.cfg.optim.dtype)
        self.model = model.train()
        o: OptimConfig = self.cfg.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=o.lr, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2),
            **({"fused": True} if cuda else {}),
        )  # fmt: skip
        return self.rank

    # ------------------------------------------------------------------ training
    def train_step(
        self,
        micro: list[tuple[list[Datum], list[float]]],
        n_tokens: float,
        dry_run: bool = False,
        round: int = -1,
        return_grads: bool = False,
    ) -> dict[str, Any]:
        """One optimizer step over this rank's micro-batches (the same count on every rank). ``dry_run``:
        gradients and their norm only (no update; the parity tests). Returns this rank's loss share and the
        global pre-clip gradient norm (and, with ``return_grads``, the full unsharded gradients: a collective)."""
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        total, clipped, packed = 0.0, 0.0, 0.0
        for i, (datums, weights) in enumerate(micro):
            if not datums:
                datums, weights = [dummy_datum()], [0.0]
            self.model.set_requires_gradient_sync(i == len(micro) - 1)  # reduce-scatter once, at the end
            m = accumulate_gradients_packed(
                self.model, datums, weights, 10**9, num_tokens=n_tokens / self.world
            )
            total += m["loss/cispo"] / self.world  # exact: a power-of-two world only rescales the exponent
            clipped += m["loss/clip_frac"] * n_tokens
            packed += m["train/packed_tokens"] if datums[0].stage != "dummy" else 0.0
        self._maybe_fail(round)
        grads = (
            {
                n: _full(p.grad).detach().cpu().clone()
                for n, p in self.model.named_parameters()
                if p.grad is not None
            }
            if return_grads
            else None
        )
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = _full(torch.nn.utils.clip_grad_norm_(params, self.cfg.optim.grad_clip))
        if not dry_run:
            self.optimizer.step()
        else:
            self.optimizer.zero_grad(set_to_none=True)
        return {
            "loss/cispo": total,
            "loss/clip_frac": clipped / max(1.0, n_tokens),
            "loss/tokens": float(n_tokens),
            "grad_norm": float(grad_norm),
            "train/microbatches": float(sum(1 for d, _ in micro if d)),
            "train/packed_tokens": packed,
            "time/rank_train_s": time.perf_counter() - t0,
            **({"grads": grads} if return_grads else {}),
        }

    def _maybe_fail(self, round: int) -> None:
        spec = os.environ.get(FAULT_ENV, "")
        if not spec:
            return
        rank, at, marker = spec.split(":", 2)
        if int(rank) == self.rank and int(at) == round and not Path(marker).exists():
            Path(marker).write_text("fired")
            os._exit(1)  # a crash in the middle of the step: gradients computed, no update applied

    # ------------------------------------------------------------------ weights out
    def weight_specs(self) -> list[tuple[str, list[int], str]]:
        """``(name, full shape, dtype)`` of every tensor in the order :meth:`broadcast_weights` sends them."""
        return [(n, list(p.shape), str(p.dtype).removeprefix("torch.")) for n, p in unique_state(self.model)]

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """All-gather the full weights (every rank takes part); rank 0 returns them on CPU, others None."""
        out = {}
        for n, p in unique_state(self.model):
            t = _full(p.detach())
            if self.rank == 0:
                out[n] = t.detach().to("cpu", copy=True)
        return out if self.rank == 0 else None

    def join_sync_group(self, host: str, port: int, size: int) -> bool:
        """Rank 0 joins the weight-sync group (itself = member 0, the servers 1..size-1)."""
        from level2_distributed.sync import make_sync_group

        if self.rank == 0:
            self.sync_group = make_sync_group(host, port, 0, size, self.device)
        return True

    def broadcast_weights(self, dtype: str) -> float:
        """Every rank all-gathers each tensor in turn; rank 0 broadcasts it to the servers. Returns seconds."""
        from level2_distributed.sync import broadcast_tensor

        t0 = time.perf_counter()
        target = getattr(torch, dtype)
        for _, p in unique_state(self.model):
            full = _full(p.detach())
            if self.rank == 0:
                broadcast_tensor(self.sync_group, full.detach().to(target).contiguous())
        return time.perf_counter() - t0

    def save_for_disk(self, path: str) -> float:
        """Fallback sync: rank 0 writes the full weights as ``model.safetensors`` + ``config.json`` (the
        layout SGLang's /update_weights_from_disk and ``from_pretrained`` read)."""
        from safetensors.torch import save_file

        t0 = time.perf_counter()
        sd = self.full_state_dict()
        if self.rank == 0:
            tmp = Path(path + ".tmp")
            tmp.mkdir(parents=True, exist_ok=True)
            self.model.config.save_pretrained(tmp)
            save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp / "model.safetensors"))
            if Path(path).exists():
                import shutil

                shutil.rmtree(path)
            os.replace(tmp, path)
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ checkpoints
    def save(self, state: dict[str, int], out: str, config: dict[str, Any]) -> bool:
        DCPCheckpointer(Path(out)).save(RunState(**state), self.model, self.optimizer, config)
        return True

    def load_latest(self, out: str, config: dict[str, Any]) -> dict[str, int] | None:
        state = DCPCheckpointer(Path(out)).load_latest(self.model, self.optimizer, config)
        return None if state is None else asdict(state)

    def score_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """log pi_theta of ``output_ids`` after ``prompt_ids`` under the trainer's current weights (every rank
        must call it: the forward all-gathers the shards). The sync test compares it with the server's."""
        from level1_batched.packing import packed_logprobs

        d = Datum(
            list(prompt_ids),
            list(output_ids),
            [0.0] * len(output_ids),
            [1] * len(output_ids),
            0.0,
            0,
            0,
            True,
            "x",
        )
        with torch.no_grad():
            return packed_logprobs(self.model, [d])[0].float().cpu().tolist()

    def ping(self) -> int:
        return self.rank

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
