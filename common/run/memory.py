"""Memory a run gives back between its phases (issue #38.7).

A level-0 round has two phases that each need a few hundred MB for a while: the rollouts (prefills and KV
caches, on the engine's worker thread) and the training step (activations, on the main thread). glibc's
malloc keeps what a thread frees in that thread's arena for later; memory freed on the worker thread is not
reused by the main thread, so without help the two peaks add up in the resident set, and so does every
round's fragmentation (continuous batching allocates and frees a KV cache at every merge). Two settings:

* :func:`large_blocks_to_the_os` (``mallopt(M_MMAP_THRESHOLD, 4 MiB)``): every block of 4 MiB or more (KV
  caches, prefill and training activations) is its own mapping, returned to the OS the moment it is freed.
  glibc's default threshold starts at 128 KiB but rises with every large block freed, up to 32 MiB, after
  which such blocks stay in the heap. 8 SmolLM2 agents x 2 turns (1.2-1.6K-token prompts, bf16, continuous
  batching) left the process at 1.47 GB RSS by default, 1.15 GB with a 4 MiB threshold and 0.84 GB with
  1 MiB, of which 0.72 GB live; but at 1 MiB every decode step's logits-sized temporaries (1-2 MB) are
  mapped and faulted in afresh: a whole quick start took 81 M minor page faults and 239 s of system time
  instead of 4.7 M and 48 s (bench/RESULTS.md, "The quick start's cost");
* :func:`release_memory` (``malloc_trim(0)``: every arena's free pages go back to the OS) at each phase
  boundary, for the smaller blocks.

Both are no-ops where the C library has neither (macOS, musl).

    >>> release_memory() in (True, False)
    True
"""

from __future__ import annotations

import ctypes
import gc
import resource
import sys
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


M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter number for the mmap threshold (malloc.h)."""

MMAP_THRESHOLD = 4 * 2**20
"""Blocks of this many bytes or more are mapped on their own and unmapped when freed."""


def large_blocks_to_the_os() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` (it also stops the threshold's growth). True
    where ``mallopt`` ran and accepted it; call it once, early (it applies to blocks allocated after it)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def release_memory() -> bool:
    """Collect garbage and return the C heap's free pages to the OS. True where ``malloc_trim`` ran."""
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def peak_rss_gb() -> float:
    """This process's peak resident set size so far, in GB (10^9 bytes; ``ru_maxrss``: kB on Linux, bytes on
    macOS): what ``/usr/bin/time -v`` reports as "Maximum resident set size" for the run's main process."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e9 if sys.platform == "darwin" else peak * 1e3 / 1e9
