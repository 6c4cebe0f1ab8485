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
* :func:`rank_plan` — on a GPU each rank checks at set-up that its step fits its part of the card (the
  sharded state, two gathered layers, the row's activations: ``common/run/trainer_memory.py``) and refuses
  one that cannot in one line, instead of an OOM mid-run; ``mem/plan_gib`` logs the estimate.

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
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from common.rl.datums import Datum
from common.run.checkpoint import RunState
from common.run.trainer_memory import gpu_memory_metrics
from common.train_config import OptimConfig, TrainConfig
from level1_batched.packing import accumulate_gradients_packed
from level2_distributed.checkpoint import DCPCheckpointer

FAULT_ENV = "SERA_L2_FAULT"
"""Fault injection for the recovery tests: ``RANK:ROUND:MARKER_FILE`` makes trainer ``RANK`` exit in the
middle of round ``ROUND``'s step (after its backward, before the optimizer) once (the marker file records
that it fired); ``RANK:ROUND:MARKER_FILE:hang`` makes it hang there instead (the other ranks' next
collective times out: the NCCL-timeout case, with gloo on CPU). Not a user option."""


# ----------------------------------------------------------------------------------------------------
# Parallelism as wrappers around an unmodified model.
# ----------------------------------------------------------------------------------------------------
def apply_activation_checkpointing(model) -> None:
    """Recompute every decoder layer in the backward pass (non-reentrant, so it composes with FSDP2)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def apply_fsdp(model, dtype: str, replicate_root: bool = False) -> list:
    """``fully_shard`` each decoder layer (one all-gather unit each), then the root (embeddings, norm, head).

    ``replicate_root`` (the fast trainer): the root's own parameters (embeddings, final norm, head) stay
    whole on every rank (``ignored_params``), because level 1's fast path calls the decoder and the head
    weight directly (``model.get_decoder()(...)``, ``head.weight``), outside the root module's forward,
    where FSDP would leave them sharded. Their gradients are averaged by :func:`allreduce_replicated`.
    Returns the replicated parameters."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if dtype == "bfloat16"
        else MixedPrecisionPolicy()  # float32 end to end (the parity tests)
    )
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    in_layers = {id(p) for layer in model.model.layers for p in layer.parameters()}
    replicated = [p for p in model.parameters() if id(p) not in in_layers] if replicate_root else []
    fully_shard(model, mp_policy=mp, ignored_params=set(replicated) or None)
    return replicated


def init_fsdp_root(model) -> None:
    """The fast path never calls the root's forward (it calls the decoder), where FSDP2 makes the root the
    root of every shard group (its lazy init); without it the first layer called would init as the root.
    Run that init now, on materialised parameters, as the root's forward would (FSDP2's private hook:
    torch 2.13 has no public call)."""
    from torch.distributed.fsdp._fully_shard._fully_shard import _get_module_fsdp_state

    _get_module_fsdp_state(model)._lazy_init()


def allreduce_replicated(params: list, world: int) -> None:
    """Average the gradients of the replicated (un-sharded) parameters over the ranks (FSDP's convention)."""
    for p in params:
        if p.grad is not None and world > 1:
            dist.all_reduce(p.grad)
            p.grad.div_(world)


def clip_grad_norm(params: list, max_norm: float) -> float:
    """Global gradient norm over sharded (DTensor) and replicated gradients, clipped to ``max_norm`` in place
    (``torch.nn.utils.clip_grad_norm_`` refuses a mix of DTensor and plain gradients)."""
    sharded = [p.grad for p in params if p.grad is not None and hasattr(p.grad, "full_tensor")]
    plain = [p.grad for p in params if p.grad is not None and not hasattr(p.grad, "full_tensor")]
    if not plain:
        return float(_full(torch.nn.utils.clip_grad_norm_(params, max_norm)))
    sq = sum(float(_full(g.float().pow(2).sum())) for g in sharded) + sum(
        float(g.float().pow(2).sum()) for g in plain
    )
    norm = sq**0.5
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        for g in sharded + plain:
            g.mul_(coef)
    return norm


def build_sharded_model(name: str, seed: int, device: torch.device, dtype: str, world: int, *,
                        checkpointing: bool = True, fast: bool = False, checkpoint_fraction: float = 1.0,
                        compile_layers: bool = False) -> tuple[Any, list, dict[str, float]]:  # fmt: skip
    """The trainer's model, sharded, in fp32 storage (with bf16 training FSDP's MixedPrecisionPolicy casts
    for compute: the fp32 shards are the master weights). Returns ``(model, replicated params, report)``.

    A model with files (a directory, SmolLM2, an HF id on disk) is built on the META device (no memory),
    sharded, materialised empty, and each rank reads from the safetensors files ONLY the slices it owns
    (``safe_open(...).get_slice``; ``report["bytes_read"]``): no rank holds the full fp32 model. The
    in-memory test models (``tiny``, ``tiny-tied``) and :data:`DUMMY_WEIGHTS` directories are built from their
    seed on every rank, then sharded (each rank holds the full fp32 model until ``fully_shard``)."""
    from common.policy.models import ALIASES, IN_MEMORY, load_model

    report = {"meta": 0.0, "bytes_read": 0.0}
    if ALIASES.get(name.lower()) in IN_MEMORY:
        model, _ = load_model(name, dtype="float32", device=device, seed=seed)
        meta = False
    elif dummy_weights(name):  # a config-only directory (bench/bench_level2.py --shape): random init
        model, meta = random_model(name, seed, device), False
    else:
        from transformers import AutoConfig, AutoModelForCausalLM

        from common.policy.models import resolve_model_path

        path = resolve_model_path(name)
        config = AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        meta = True
    if fast:
        from level1_batched.efficiency import apply_efficiency

        apply_efficiency(model, checkpointing=checkpointing, checkpoint_fraction=checkpoint_fraction,
                         compile_layers=compile_layers)  # fmt: skip
    elif checkpointing:
        apply_activation_checkpointing(model)
    replicated = apply_fsdp(model, dtype, replicate_root=fast)
    if meta:
        model.to_empty(device=device)
        if getattr(model.config, "tie_word_embeddings", False):
            model.tie_weights()  # to_empty makes new Parameter objects: a replicated tied head comes apart
        report["bytes_read"] = float(load_own_shards(model, path))
        _init_rotary(model, device)
        report["meta"] = 1.0
    if fast:
        init_fsdp_root(model)
        # to_empty made new Parameter objects for the replicated root: take them from the model now
        replicated = [p for p in model.parameters() if not hasattr(p, "to_local")]
    return model, replicated, report


DUMMY_WEIGHTS = "sera_dummy_weights.json"
"""A model directory holding this file (beside ``config.json`` and a tokenizer, no weight files) has DUMMY
weights: trainer ranks build the model from the config with random init (:func:`random_model`, the run's seed;
every rank the same, then sharded), colocated engines start from random weights too (vLLM's
``load_format="dummy"``; the hf engine from another seed) and hold the trainer's only after the first weight
sync. Made by ``bench/bench_level2.py --shape`` to measure a big model's memory and speed without its files
(issue #22.7: the Qwen3-4B shape on one GPU); no real run meets it (an ordinary directory without weights
still fails to load)."""


def dummy_weights(name: str) -> bool:
    """Is ``name`` a model directory of :data:`DUMMY_WEIGHTS` (config only, random weights)?"""
    return (Path(name) / DUMMY_WEIGHTS).is_file()


def random_model(name: str, seed: int, device: torch.device, dtype: torch.dtype = torch.float32):
    """The model of ``name``'s ``config.json`` with random init (transformers' own), built on ``device`` from
    ``seed`` (the same weights on every rank that passes the same seed). For :data:`DUMMY_WEIGHTS` directories."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(name)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def _safetensors_index(path: str) -> dict[str, str]:
    """tensor name -> safetensors file of a model directory (single file or ``model.safetensors.index.json``)."""
    import json

    d = Path(path)
    index = d / "model.safetensors.index.json"
    if index.exists():
        return {k: str(d / f) for k, f in json.loads(index.read_text())["weight_map"].items()}
    from safetensors import safe_open

    single = d / "model.safetensors"
    with safe_open(str(single), "pt") as f:
        return dict.fromkeys(f.keys(), str(single))


def load_own_shards(model, path: str) -> int:
    """Fill this rank's shard of every tensor from the safetensors files (slices only). Returns bytes read."""
    from safetensors import safe_open
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    where = _safetensors_index(path)
    files: dict[str, Any] = {}
    read = 0
    with torch.no_grad():
        for name, t in unique_state(model):
            src = name if name in where else None
            if src is None:
                if name.endswith("rotary_emb.inv_freq") or name.endswith("original_inv_freq"):
                    continue
                raise KeyError(f"{name} is in none of {sorted(set(where.values()))}")
            f = files.get(where[src]) or files.setdefault(where[src], safe_open(where[src], "pt"))
            sl = f.get_slice(src)
            if hasattr(t, "to_local"):
                local = t.to_local()
                shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
                if local.numel() == 0:
                    continue
                index = tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))
                part = sl[index]
            else:
                local, part = t, sl[:]
            local.copy_(part.to(local.dtype))
            read += part.numel() * part.element_size()
    return read


def _init_rotary(model, device: torch.device) -> None:
    """Recompute the non-persistent rotary buffers (``inv_freq``) that ``to_empty`` left uninitialised."""
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            fresh = type(module)(config=module.config).to(device)
            for bname, buf in fresh.named_buffers(recurse=False):
                getattr(module, bname).copy_(buf)


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


def unsharded_grad_bytes(model) -> float:
    """Bytes of FULL (unsharded) gradients FSDP2 holds between backwards (``unsharded_accumulated_grad`` and
    the unsharded parameters' ``.grad``; FSDP2's private state, torch 2.13: NaN when it is not there). 0 when
    every backward reduce-scatters: the accumulated gradients are then the 1/world shards only."""
    total = 0
    try:
        for module in model.modules():
            if not hasattr(module, "_get_fsdp_state"):
                continue
            state = module._get_fsdp_state()
            groups = getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]
            for group in groups:
                for fp in [] if group is None else group.fsdp_params:
                    grad = getattr(getattr(fp, "_unsharded_param", None), "grad", None)
                    for t in (fp.unsharded_accumulated_grad, grad):
                        total += 0 if t is None else t.numel() * t.element_size()
    except AttributeError:
        return float("nan")
    return float(total)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective: every rank must call it in the same order)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def param_groups(model: torch.nn.Module, replicated: list) -> list[dict[str, Any]]:
    """The optimizer's parameter groups: the sharded (DTensor) parameters, then the ``replicated`` whole ones
    (:func:`build_sharded_model`'s). One fused AdamW call over both kinds fails on CUDA ("got mixed torch.Tensor
    and DTensor", measured on an H200), and AdamW calls its kernel once per group. One group without replicated
    parameters (the plain trainer), so its checkpoints keep their layout."""
    whole = {id(q) for q in replicated}
    sharded = [q for q in model.parameters() if id(q) not in whole]
    return [{"params": g} for g in (sharded, list(replicated)) if g]


def rank_plan(
    model: Any, world: int, tokens: int, checkpoint_fraction: float, fast: bool, dtype_bytes: int, budget_bytes: float
) -> Any:
    """Check that one FSDP rank's training step fits ``budget_bytes`` (issue #49): the sharded weights and
    optimizer state (1/world each, two gathered decoder layers), the replicated root's whole state (the fast
    trainer keeps embeddings / norm / head on every rank), the head (chunked with ``fast``, else the row's
    logits at once) and the row's activations. Returns the :class:`~common.run.trainer_memory.TrainerPlan`
    (``mem/plan_gib``); a row or checkpointing that cannot fit raises
    :class:`~common.run.trainer_memory.DoesNotFit` (one line: which setting to lower). ``model``: the sharded
    model (a DTensor's ``numel()`` is the whole tensor's)."""
    from dataclasses import replace

    from common.run.trainer_memory import GIB, DoesNotFit, model_shape, plan_trainer, static_bytes

    params = list(model.parameters())
    sharded = sum(p.numel() for p in params if hasattr(p, "to_local"))
    replicated = sum(p.numel() for p in params if not hasattr(p, "to_local"))
    root = static_bytes(replicated, replicated, dtype_bytes)
    try:
        plan = plan_trainer(
            model_shape(model.config), budget_bytes - root, sharded, sharded, tokens=tokens,
            checkpoint_fraction=checkpoint_fraction, dtype_bytes=dtype_bytes, shards=world, chunked_head=fast,
        )  # fmt: skip
        return replace(plan, estimate_gib=plan.estimate_gib + root / GIB, budget_gib=budget_bytes / GIB)
    except DoesNotFit as e:
        flags = "--trainer-microbatch-tokens, --trainer-checkpoint-fraction (with --trainer-fast)"
        msg = str(e).replace("--max-tokens-per-microbatch", "--trainer-microbatch-tokens")
        msg = msg.replace("--checkpoint-fraction", "--trainer-checkpoint-fraction")
        msg = msg.replace("--gpu-share", "more trainer ranks or GPUs")
        raise DoesNotFit(f"level-2 trainer rank, {world} FSDP ranks: {msg} ({flags})") from None


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
        fast_trainer: bool = False,
        checkpoint_fraction: float = 1.0,
        compile_layers: bool = False,
        collective_timeout_s: float = 600.0,
        gpu_share: float = 1.0,
    ) -> None:
        self.rank, self.world, self.cfg = rank, world, cfg
        self.gpu_share = float(gpu_share)  # the part of its GPU this rank may train in (the memory check)
        self.plan: Any = None
        self.activation_checkpointing, self.microbatch_tokens = activation_checkpointing, microbatch_tokens
        self.fast = {
            "fast": fast_trainer,
            "checkpoint_fraction": checkpoint_fraction,
            "compile_layers": compile_layers,
        }
        self.sync_group = None
        self.timeout_s = float(collective_timeout_s)
        self.replicated: list = []
        self.load_report: dict[str, float] = {}
        self.mem_phases: dict[str, dict[str, float]] = {}
        self.mem_peak = 0.0

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def free_port(self) -> int:
        from level2_distributed.sync import free_port

        return free_port()

    def setup(self, master: str) -> int:
        """Join the FSDP group at ``master`` (``host:port`` of rank 0), load and shard the model."""
        cuda = torch.cuda.is_available()
        self.device = (
            torch.device("cuda", 0) if cuda else torch.device("cpu")
        )  # Ray sets CUDA_VISIBLE_DEVICES
        if cuda:
            torch.cuda.set_device(self.device)
        else:
            torch.set_num_threads(max(1, int(os.environ.get("SERA_L2_THREADS", "1"))))
        dist.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"tcp://{master}", rank=self.rank, world_size=self.world,
            timeout=timedelta(seconds=self.timeout_s),
        )  # fmt: skip
        model, self.replicated, self.load_report = build_sharded_model(
            self.cfg.model, self.cfg.seed, self.device, self.cfg.optim.dtype, self.world,
            checkpointing=self.activation_checkpointing, **self.fast,
        )  # fmt: skip
        self.model = model.train()
        # the step must fit this rank's part of the card: checked now, in one line, not by an OOM later
        if cuda:
            fast = self.fast["fast"]
            f = self.fast["checkpoint_fraction"] if fast else float(self.activation_checkpointing)
            total = torch.cuda.get_device_properties(self.device).total_memory
            dtype_bytes = 4 if self.cfg.optim.dtype == "float32" else 2
            self.plan = rank_plan(self.model, self.world, self.microbatch_tokens, f, fast, dtype_bytes,
                                  self.gpu_share * total)  # fmt: skip
            if self.rank == 0:
                print(self.plan.line().replace("[memory] trainer", "[memory] trainer rank"), flush=True)
        o: OptimConfig = self.cfg.optim
        self.optimizer = torch.optim.AdamW(
            param_groups(self.model, self.replicated), lr=o.lr, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2),
            **({"fused": True} if cuda else {}),
        )  # fmt: skip
        self._note("trainer_built")  # the sharded fp32 model (optimizer states come with the first step)
        return self.rank

    # ------------------------------------------------------------------ memory (split and colocated alike)
    def memory(self) -> dict[str, Any]:
        """This rank's memory now, the last sample of every phase (each with ``phase_peak``: the largest use
        seen while it ran) and the running peak; GiB (``memory.memory_now``)."""
        from level2_distributed.memory import memory_now

        return {"now": memory_now(self.device), "phases": dict(self.mem_phases), "peak": self.mem_peak}

    def _note(self, phase: str, peak: float | None = None) -> None:
        from level2_distributed.memory import memory_now

        now = memory_now(self.device)
        used = now.get("gpu_used", now.get("rss", 0.0))
        self.mem_phases[phase] = {**now, "phase_peak": max(used, peak or 0.0)}
        self.mem_peak = max(self.mem_peak, self.mem_phases[phase]["phase_peak"])

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
        global pre-clip gradient norm (and, with ``return_grads``, the full unsharded gradients: a collective),
        and its memory (GiB): ``mem/train_peak_gib`` (during this update), ``mem/peak_gib`` (the largest of every
        phase so far), ``mem/torch_peak_gib`` (CUDA: this process's allocator peak), ``mem/on_gpu`` (1: GPU
        memory of the whole device; 0: this process's resident set on a CPU)."""
        from level2_distributed.memory import GIB, PeakPoller

        with PeakPoller(self.device) as poll:
            m = self._train_step(micro, n_tokens, dry_run, round, return_grads)
        self._note("train_step", poll.peak)
        gpu = self.device.type == "cuda"
        return {
            **m, "mem/on_gpu": float(gpu), "mem/train_peak_gib": poll.peak, "mem/peak_gib": self.mem_peak,
            **({"mem/torch_peak_gib": torch.cuda.max_memory_allocated(self.device) / GIB} if gpu else {}),
            **gpu_memory_metrics(self.device, self.plan),  # levels 0 and 1's names: mem/gpu_peak_gib, mem/plan_gib
        }  # fmt: skip

    def _train_step(self, micro, n_tokens: float, dry_run: bool, round: int, return_grads: bool) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        total, clipped, packed, unsharded = 0.0, 0.0, 0.0, 0.0
        ratios = [0.0, 0.0, 0.0, 0.0]  # scored tokens, sum rho, sum |log rho|, max rho (the dummy's left out)
        for datums, weights in micro:
            if not datums:
                datums, weights = [dummy_datum()], [0.0]
            # every micro-batch's backward reduce-scatters (FSDP2's default): the accumulated gradient stays a
            # 1/world fp32 shard on every rank (deferring the sync to the last micro-batch would keep a FULL
            # unsharded fp32 gradient on every rank until then; verl, AReaL and torchtitan sync every one too)
            m = accumulate_gradients_packed(
                self.model, datums, weights, 10**9, num_tokens=n_tokens / self.world
            )
            unsharded = max(unsharded, unsharded_grad_bytes(self.model))
            total += m["loss/cispo"] / self.world  # exact: a power-of-two world only rescales the exponent
            # the micro-batch's clipped tokens (its fraction is of |M|/world): summed over ranks, / |M| = global
            clipped += m["loss/clip_frac"] * n_tokens / self.world
            packed += m["train/packed_tokens"] if datums[0].stage != "dummy" else 0.0
            if datums[0].stage != "dummy":
                ratios[0] += m["loss/scored_tokens"]
                ratios[1] += m["loss/ratio_sum"]
                ratios[2] += m["loss/abs_log_ratio_sum"]
                ratios[3] = max(ratios[3], m["loss/ratio_max"])
        allreduce_replicated(self.replicated, self.world)
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
        grad_norm = clip_grad_norm(params, self.cfg.optim.grad_clip)
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
            "mem/unsharded_grads_gib": unsharded / 2**30,
            "loss/scored_tokens": ratios[0],  # the ratio sums: the driver adds them over ranks (RatioStats)
            "loss/ratio_sum": ratios[1],
            "loss/abs_log_ratio_sum": ratios[2],
            "loss/ratio_max": ratios[3],
            **({"grads": grads} if return_grads else {}),
        }

    def _maybe_fail(self, round: int) -> None:
        spec = os.environ.get(FAULT_ENV, "")
        if not spec:
            return
        rank, at, marker = spec.split(":", 2)
        hang = marker.endswith(":hang")
        marker = marker.removesuffix(":hang")
        if int(rank) == self.rank and int(at) == round and not Path(marker).exists():
            Path(marker).write_text("fired")
            if hang:  # skip the next collective: the peers wait in it until their timeout
                time.sleep(10 * self.timeout_s)
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

    def weights_fingerprint(self, dtype: str) -> tuple[int, float, float] | None:
        """``engine.weights_fingerprint`` of the full weights cast to ``dtype`` (the serving dtype: what a
        sync sends); every rank takes part (one all-gather per tensor), rank 0 returns it, the others None.
        Parameters only, each once (a tied head is the embedding), as an engine's own parameters are."""
        from common.policy.engine import weights_fingerprint

        target = getattr(torch, dtype)
        full = (_full(p.detach().to(target)) for p in self.model.parameters())
        if self.rank == 0:
            return weights_fingerprint(full)
        for _ in full:  # the other ranks take part in each gather
            pass
        return None

    def join_sync_group(self, host: str, port: int, size: int, group_name: str = "") -> bool:
        """Rank 0 joins the weight-sync group (itself = member 0, the servers 1..size-1); with
        ``group_name`` (SGLang servers) the group is built as SGLang builds it (``sync.init_named_group``).
        Then every rank waits at a barrier of the FSDP group: no rank goes on to its next collective while
        rank 0 is still creating the other group (the rank-0-only group creation that, without a barrier,
        interleaved with FSDP2's all-gathers and hung TRL's weight sync: huggingface/trl #7103, PR #7104)."""
        from level2_distributed.sync import NamedGroup, init_named_group, make_sync_group

        if self.rank == 0 and group_name:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            pg = init_named_group(backend, host, port, 0, size, group_name, self.timeout_s)
            self.sync_group = NamedGroup(pg)
        elif self.rank == 0:
            self.sync_group = make_sync_group(host, port, 0, size, self.device, self.timeout_s)
        if self.world > 1:
            dist.barrier()
        return True

    def _buckets(self, buckets: list[list[int]] | None) -> list[list[tuple[str, Any]]]:
        state = unique_state(self.model)
        return [[state[i] for i in b] for b in buckets] if buckets is not None else [state]

    def gather_bucket(self, bucket: list[tuple[str, Any]], target: torch.dtype) -> list[tuple[str, torch.Tensor]]:
        """The full tensors of one bucket, in ``target`` dtype (every rank: all-gathers). Each shard is cast
        BEFORE its all-gather (bf16 halves the traffic of the fp32 masters), and the whole bucket is gathered
        before anything is sent (on CUDA the stream is synchronised): FSDP's collectives never interleave
        with the sync group's (TRL's fix for its FSDP2 hang: gather a bucket to completion, then send)."""
        out = [(n, _full(p.detach().to(target))) for n, p in bucket]
        if self.device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        return out

    def broadcast_weights(self, dtype: str, buckets: list[list[int]] | None = None) -> float:
        """Bucket by bucket (``sync.plan_buckets``: indices into :meth:`weight_specs`; None: one bucket): every
        rank all-gathers the bucket's tensors, then rank 0 broadcasts them, in order, to the servers (which
        load each bucket as it arrives). Returns seconds."""
        from level2_distributed.sync import broadcast_tensor

        t0 = time.perf_counter()
        target = getattr(torch, dtype)
        for bucket in self._buckets(buckets):
            full = self.gather_bucket(bucket, target)
            if self.rank == 0:
                for _, t in full:
                    broadcast_tensor(self.sync_group, t.contiguous())
            del full
        return time.perf_counter() - t0

    def save_for_disk(self, path: str, dtype: str | None = None, tokenizer: bool = False) -> float:
        """Fallback sync (in the serving dtype: ``sync_weights`` passes it): rank 0 writes the full weights as ``model.safetensors`` + ``config.json`` (the
        layout SGLang's /update_weights_from_disk and ``from_pretrained`` read; a tied head is written once,
        as transformers does). ``dtype`` casts them (default: fp32 storage); ``tokenizer`` adds the
        tokenizer and generation config: the HF export of the trained model (``out/model``, for ``sera eval``)."""
        from safetensors.torch import save_file

        t0 = time.perf_counter()
        sd = self.full_state_dict()
        if self.rank == 0:
            tmp = Path(path + ".tmp")
            tmp.mkdir(parents=True, exist_ok=True)
            target = getattr(torch, dtype) if dtype else None
            import copy

            config = copy.deepcopy(self.model.config)
            if target is not None:
                config.dtype = target
                sd = {k: v.to(target) for k, v in sd.items()}
            config.save_pretrained(tmp)
            if tokenizer:
                from common.policy.models import load_tokenizer

                load_tokenizer(self.cfg.model).save_pretrained(tmp)
                if getattr(self.model, "generation_config", None) is not None:
                    self.model.generation_config.save_pretrained(tmp)
            sd = {k: v for k, v in sd.items() if not k.endswith("rotary_emb.inv_freq")}
            save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp / "model.safetensors"),
                      metadata={"format": "pt"})  # fmt: skip
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

    def report(self) -> dict[str, float]:
        """How the model was loaded (``meta``: 1 = meta device + own shards; ``bytes_read`` by this rank)."""
        return dict(self.load_report)

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
