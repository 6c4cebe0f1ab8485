"""Ends a server's engine process when the server actor that started it dies.

    python -m level2_distributed.reaper ACTOR_PID ENGINE_PGID

A server actor starts its engine (SGLang, or ``engine_server`` under ``--server-python``) in a process
session of its own, so that ``shutdown`` can end the engine and every child of it at once (``killpg``). But
when the ACTOR dies (a crash, ``ray.kill``, an OOM kill), nothing calls ``shutdown``, and Ray does not end a
crashed worker's children (Ray docs, "Lifetimes of a User-Spawn Process": the subreaper option is off by
default): the engine would keep its GPU memory, and the restarted server on that GPU would fail to start.
So each actor also starts this watcher, in a session of its own too: it polls the actor's process every
``POLL_S`` and, once the actor is gone (or a zombie), sends the engine's process group SIGTERM, then SIGKILL
after ``GRACE_S``; it exits by itself when the engine's group is gone (a normal ``shutdown``).

Standard library only (it runs under the actor's interpreter, before and after anything else is loaded).
"""

from __future__ import annotations

import os
import signal
import sys
import time

POLL_S = 0.5
GRACE_S = 5.0


def _stat(pid: int) -> tuple[str, str] | None:
    """``(state, start time)`` of a process from ``/proc/PID/stat``, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # after "pid (comm)": state is field 3, starttime field 22
    return fields[0], fields[19]


def alive(pid: int, start: str) -> bool:
    """Is ``pid`` still the process that started at ``start`` (and not a zombie)?"""
    st = _stat(pid)
    return st is not None and st[0] != "Z" and st[1] == start


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(actor_pid: int, pgid: int) -> int:
    st = _stat(actor_pid)
    start = st[1] if st else ""
    while group_exists(pgid):
        if not alive(actor_pid, start):
            for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 0.0)):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    return 0
                deadline = time.time() + wait
                while time.time() < deadline and group_exists(pgid):
                    time.sleep(0.1)
            return 0
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(watch(int(sys.argv[1]), int(sys.argv[2])))
