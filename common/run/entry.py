"""A tier's own entry point runs the ``sera`` command as a program, so imports flow cli -> tiers -> common.

``python -m level1_batched.train ARGS`` (also what torchrun starts on each rank),
``python level0_single_process/train.py ARGS`` and ``python -m level0_single_process.sft ARGS`` are the
``sera train --level N`` / ``sera sft`` commands with their checks (run directory, --resume, optional
packages, one-line errors, Ctrl-C). The tier does not import ``sera.cli`` for that (the CLI imports the
tiers): :func:`exec_sera` replaces the process with ``python -m sera COMMAND ARGS`` (same pid, so torchrun,
signals and the exit code are the command's own) and tells the CLI how the user typed it, so a resume hint
names ``python -m level1_batched.train ...`` again.

Cost: the tier's module was imported before its ``__main__`` block ran, so the entry point starts about as
slowly as twice ``sera train`` (2-3 s more on a 2-core CPU); ``sera train --level N`` itself is unchanged.
"""

from __future__ import annotations

import json
import os
import sys
from typing import NoReturn

ENTRY_ENV = "SERA_ENTRY"
"""``{"as": [...], "skip": n}``: the command line the user typed, and how many leading arguments of the
``sera`` process :func:`exec_sera` added (the CLI reads and removes it: ``typed_command``)."""


def exec_sera(command: list[str], module: str, argv: list[str] | None = None) -> NoReturn:
    """Become ``python -m sera *command *argv`` (``argv`` defaults to this process's arguments); ``module``
    (``level1_batched.train``) is how the user started it, shown again in resume hints."""
    args = sys.argv[1:] if argv is None else list(argv)
    entry = json.dumps({"as": ["python", "-m", module], "skip": len(command)})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(
        sys.executable, [sys.executable, "-m", "sera", *command, *args], {**os.environ, ENTRY_ENV: entry}
    )
