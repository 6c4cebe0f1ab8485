"""CodeAct execution: model-written Python cells run in an isolated worker process per agent session.

* ``executor.py`` -- :class:`CodeActWorker` (trainer side: tool RPC, time limits, crash recovery, the
  fixed-order mode ``ordered=True``), :class:`WorkerLimits` and :class:`CellResult`
* ``worker.py``   -- the worker process and the zygote that forks workers (standard library only)
* ``checks.py``   -- static checks run before a cell (syntax, unawaited launches) and the loop detector

This is the only CodeAct executor (the in-process restricted interpreter ``common/sandbox.py`` was removed,
issue #24; ``docs/fidelity/codeact.md``). The benchmark: ``bench/bench_codeact.py``.
"""

from __future__ import annotations

from .checks import LOOP_THRESHOLD, LOOP_WINDOW, StaticCheck, check_cell, stuck_in_loop
from .executor import EXECUTORS, CellResult, CodeActWorker, WorkerLimits, check_executor

__all__ = [
    "EXECUTORS",
    "LOOP_THRESHOLD",
    "LOOP_WINDOW",
    "CellResult",
    "CodeActWorker",
    "StaticCheck",
    "WorkerLimits",
    "check_cell",
    "check_executor",
    "stuck_in_loop",
]
