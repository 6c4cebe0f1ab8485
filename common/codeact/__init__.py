"""CodeAct execution: model-written Python cells run in an isolated worker process per agent session.

* ``executor.py`` -- :class:`CodeActWorker` (trainer side: tool RPC, time limits, crash recovery) and
  :class:`WorkerLimits`
* ``worker.py``   -- the worker process and the zygote that forks workers (standard library only)
* ``checks.py``   -- static checks run before a cell (syntax, unawaited launches) and the loop detector

The in-process restricted interpreter (``common/sandbox.py``) stays available as a fast path without
isolation; ``docs/fidelity/codeact.md`` says when it is worth it (the benchmark: ``bench/bench_codeact.py``).
"""

from __future__ import annotations

from .checks import LOOP_THRESHOLD, LOOP_WINDOW, StaticCheck, check_cell, stuck_in_loop
from .executor import CodeActWorker, WorkerLimits

__all__ = [
    "LOOP_THRESHOLD",
    "LOOP_WINDOW",
    "CodeActWorker",
    "StaticCheck",
    "WorkerLimits",
    "check_cell",
    "stuck_in_loop",
]
