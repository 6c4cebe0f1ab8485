"""Memory a run gives back between its phases (issue #38.7), and what a process may hold on its GPU (issue #54).

A level-0 round has two phases that each need a few hundred MB for a while: the rollouts (prefills and KV
caches, on the engine's worker thread) and the training step (activations, on the main thread). glibc's
malloc keeps what a thread frees in that thread's arena for later; memory freed on the worker thread is not
reused by the main thread, so without help the two peaks add up in the resident set, and so does every
round's fragmentation (continuous batching allocates and frees a KV cache at every merge). Hence:

* :func:`release_memory` (``malloc_trim(0)``: every arena's free pages go back to the OS) at each phase
  boundary.

Tried and not kept: a fixed glibc mmap threshold (``mallopt(M_MMAP_THRESHOLD, ...)``, so that every large
block is unmapped when freed). 8 SmolLM2 agents x 2 turns left the process at 1.15 GB RSS with 4 MiB and
0.84 GB with 1 MiB instead of 1.47 GB (0.72 GB live), but whole quick starts did not peak lower (4.13 GB
with 4 MiB vs 3.97 GB without, the same trajectory) and at 1 MiB every decode step's logits-sized
temporaries were faulted in afresh: 81 M minor page faults and 239 s of system time instead of 4.7 M and
48 s (bench/RESULTS.md, "The quick start's cost").

A no-op where the C library has no ``malloc_trim`` (macOS, musl).

    >>> release_memory() in (True, False)
    True
"""

from __future__ import annotations

import ctypes
import gc
import resource
import sys
import time
from functools import cache
from typing import Any


@cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_memory() -> bool:
    """Collect garbage and return the C heap's free pages to the OS. True where ``malloc_trim`` ran."""
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


_last_trim = [0.0]


def trim_memory_every(seconds: float) -> bool:
    """``malloc_trim(0)`` unless one ran in the last ``seconds`` (no garbage collection): what the engine's
    thread calls after a continuous-batching merge has freed two KV caches, so the rollouts' resident set
    follows what is live instead of the largest caches so far. True where it ran."""
    now = time.monotonic()
    trim = _malloc_trim()
    if trim is None or now - _last_trim[0] < seconds:
        return False
    _last_trim[0] = now
    trim(0)
    return True


def peak_rss_gb() -> float:
    """This process's peak resident set size so far, in GB (10^9 bytes; ``ru_maxrss``: kB on Linux, bytes on
    macOS): what ``/usr/bin/time -v`` reports as "Maximum resident set size" for the run's main process."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e9 if sys.platform == "darwin" else peak * 1e3 / 1e9


GIB = float(2**30)


def cuda_index(device: Any = "cuda") -> int:
    """The card a CUDA device names: ``"cuda:1"`` -> 1, plain ``"cuda"`` -> the current one (some torch.cuda
    calls, e.g. ``get_per_process_memory_fraction`` in torch 2.11, refuse a device without an index)."""
    import torch

    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def gpu_budget_gib(device: Any = "cuda") -> float:
    """The GPU memory this process may use (GiB): the card's, times the allocator's per-process fraction
    (``torch.cuda.set_per_process_memory_fraction``; 1 unless capped). 0 off CUDA."""
    import torch

    if getattr(device, "type", str(device).split(":")[0]) != "cuda" or not torch.cuda.is_available():
        return 0.0
    index = cuda_index(device)
    total = torch.cuda.get_device_properties(index).total_memory / GIB
    try:
        fraction = float(torch.cuda.get_per_process_memory_fraction(index))
    except (AttributeError, RuntimeError):  # an older torch: the fraction cannot be read
        fraction = 1.0
    return total * min(1.0, fraction)


def gpu_held_note(device: Any = "cuda") -> str:
    """``"; this process held 7.9 GiB of the 8.0 GiB it may use"`` (what torch's caching allocator reserves),
    for an out-of-memory line; "" off CUDA."""
    import torch

    budget = gpu_budget_gib(device)
    if not budget:
        return ""
    held = torch.cuda.memory_reserved(cuda_index(device)) / GIB
    return f"; this process held {held:.1f} GiB of the {budget:.1f} GiB it may use"
