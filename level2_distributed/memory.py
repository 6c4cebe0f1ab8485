"""Memory measurement of level 2's actors (trainer ranks in both modes, colocated engines): GPU memory of the
whole device (``cudaMemGetInfo``, sampled through NVML by :class:`PeakPoller`) and the torch allocator's
peak on CUDA; the process's resident set on a CPU. Used by ``trainer.TrainerRank`` (``mem/*`` of every
step, split and colocated alike) and ``colocate.ColocatedRank`` (engine awake / asleep)."""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

from common.run.metrics import peak_rss_gb

GIB = float(2**30)


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
