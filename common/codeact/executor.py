"""The trainer side of the CodeAct worker: :class:`CodeActWorker` runs an agent's cells in its own process.

One worker per agent session, forked from a per-trainer **zygote** (a warm Python that has already
imported everything, see :mod:`common.codeact.worker`), so starting a session costs about a millisecond and
one cell with one tool call costs two pipe round trips. The world stays in the trainer: a tool call in a
cell is a JSON message to the trainer, which runs the tool (``craft``, ``get_info``, ...) on the shared
world or on the fork the session was given, and answers. Async tools (``launch_subagent``) run as asyncio
tasks of the trainer, so ``await asyncio.gather(launch_subagent(a), launch_subagent(b))`` runs both
children concurrently while the worker waits.

Two modes. The default runs every worker's cell segments concurrently with the trainer's event loop
(agents on different worlds run their cells in parallel; agents on one world take turns, in an order the
OS scheduler sets). ``ordered=True`` (``TextCraftEnv(executor="worker-ordered")``) serves each segment
**inline**: from the moment the trainer lets a cell run until it ends or waits for launches in flight,
the trainer blocks on that worker's pipe and answers its tool calls in place, as the paper's in-process
IPython runs a cell on the event loop. No other agent's work can slip in by OS timing, so sibling
agents act on a shared world in the event loop's order and a run repeats exactly (the resume tests).

The trainer's guarantees, whatever the cell does (it is untrusted):

* a cell ends within ``wall_time_s + grace_s`` of its own running time: time while the trainer works for
  it (tool calls, sub-agents) is not counted, as in the paper's executor where a step may await children
  for minutes. Past that the worker's process group is SIGKILLed;
* a worker that dies (segfault, ``os._exit``, out of memory, closed pipes, killed) is reported as the
  cell's error and replaced at the next cell (its variables are lost, and the error says so);
* nothing the worker sends is trusted: messages are size-capped JSON (never pickle), tool names are
  checked against the session's tools, arguments are decoded to plain data only.

Not covered: the worker shares the machine (CPU time is capped per cell and per worker, memory by
``RLIMIT_AS``, but not disk or memory bandwidth); see ``docs/fidelity/codeact.md`` for the full list.

Run: ``pytest tests/test_codeact_worker.py -q``; ``python bench/bench_codeact.py``.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .worker import decode, dumps, encode

WORKER_FILE = Path(__file__).resolve().parent / "worker.py"

EXECUTORS = ("worker", "worker-ordered")
"""The CodeAct executors (``TextCraftEnv(executor=...)``, ``--codeact-executor``): an isolated worker
process per agent; the same with siblings' cells served in one fixed order (``ordered=True``: repeatable
runs). The in-process interpreter (``inprocess``) was removed (issue #24): ``worker-ordered`` gives its
fixed order with the worker's isolation."""


def check_executor(name: str, what: str = "executor") -> None:
    """Raise one ``ValueError`` naming the choices when ``name`` is not an executor.

    >>> check_executor("inprocess", "--codeact-executor")
    Traceback (most recent call last):
    ValueError: --codeact-executor must be one of worker, worker-ordered, got 'inprocess' (the in-process interpreter was removed: worker-ordered runs cells in its fixed order, isolated)
    """
    if name not in EXECUTORS:
        removed = (
            " (the in-process interpreter was removed: worker-ordered runs cells in its fixed order, isolated)"
            if name == "inprocess"
            else ""
        )
        raise ValueError(f"{what} must be one of {', '.join(EXECUTORS)}, got {name!r}{removed}")


@dataclass
class CellResult:
    """What one cell produced."""

    stdout: str
    """The output slot, as the paper's IPython shell captures it: what the cell printed (capped at
    ``max_output_chars``), the last expression's ``Out[1]: ...`` line, and the IPython-layout traceback of
    an exception the cell raised (``exception``)."""
    error: str | None
    """None when the cell ran (to its end or to an exception it raised, which is in ``stdout``); else why it
    did not: a compile error (``syntax_error``), or the trainer's message when the worker was killed, died or
    was busy (``WorkerError: ...``, ``TimeoutError: ... did not finish ...``)."""
    stderr: str = ""
    """What the cell wrote to ``sys.stderr`` (capped like ``stdout``): the paper's error slot."""
    exception: str | None = None
    """The last line(s) of the traceback in ``stdout`` (``NameError: name 'x' is not defined``), or None."""
    timed_out: bool = False
    """True when the cell was stopped by the time limit."""
    restarted: bool = False
    """True when the cell's process died or was killed: its namespace is gone."""
    unawaited_launches: int = 0
    """Launch coroutines the cell created but never awaited (closed unrun)."""
    syntax_error: tuple[str, str] | None = None
    """``(source line, message)`` when the cell did not compile."""


@dataclass
class WorkerLimits:
    """Limits of one CodeAct worker and of each of its cells."""

    wall_time_s: float = 10.0
    """Seconds a cell may run, not counting time awaiting the trainer (tool calls, sub-agents); the cell
    gets ``TimeoutError`` and keeps its namespace."""
    cpu_time_s: float = 10.0
    """CPU seconds per cell (counted even while sub-agents run); ``TimeoutError`` in the cell."""
    grace_s: float = 2.0
    """Extra seconds after ``wall_time_s`` before the trainer kills the worker (a cell stuck in C code,
    or one that swallows its TimeoutError); the namespace is lost then."""
    memory_mb: int = 1024
    """Address-space limit of the worker (``RLIMIT_AS``); larger allocations raise ``MemoryError``."""
    cpu_total_s: int = 900
    """CPU seconds over the worker's whole life (``RLIMIT_CPU``; SIGKILL 5 s past it)."""
    max_output_chars: int = 8000
    """Characters of printed output kept per cell; the rest is counted and a marker line added."""
    max_message_bytes: int = 4_000_000
    """Largest message the trainer accepts from a worker; a larger one kills the worker."""
    namespaces: bool = True
    """Use user/net/pid namespaces when the kernel allows them (falls back to rlimits + audit hook)."""
    start_timeout_s: float = 20.0
    """Seconds to wait for a new worker to say it is ready."""


# --- the zygote (one per trainer process) -----------------------------------------------------------------
class _Zygote:
    """A warm Python that forks workers on request (``python -I -S worker.py zygote FD N_SPARES``).

    Requests go out without waiting; replies come back in order and are read when one is needed (or
    drained on the way), so starting or stopping a worker never blocks the trainer's event loop."""

    SPARES = 4
    """Workers the zygote keeps isolated and ready in advance."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        self.lock = threading.Lock()
        self.pending_stops: list[int] = []
        """Stops asked for while the lock was held (a finalizer run by the garbage collector in the middle of
        a send, on the same thread); the next send delivers them."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(WORKER_FILE), "zygote", str(theirs.fileno()), str(self.SPARES)],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd="/",
        )
        theirs.close()
        _raise_open_file_limit()
        ours.setblocking(True)  # blocking reads only when a reply is needed; MSG_DONTWAIT otherwise
        self.sock = ours
        self.buf = b""
        self.sent = self.received = 0
        self.replies: dict[int, dict[str, Any]] = {}
        self.discard: set[int] = set()

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def _take(self, block: bool) -> bool:
        """Read replies that have arrived (``block``: wait for at least one line); False at EOF."""
        while True:
            while (i := self.buf.find(b"\n")) >= 0:
                line, self.buf = self.buf[:i], self.buf[i + 1 :]
                seq = self.received
                self.received += 1
                if seq in self.discard:
                    self.discard.discard(seq)
                else:
                    self.replies[seq] = json.loads(line)
                block = False
            try:
                chunk = self.sock.recv(1 << 16, 0 if block else socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return True
            if not chunk:
                return False
            self.buf += chunk

    def _send(self, req: dict[str, Any], fds: list[int] | None = None, want_reply: bool = True) -> int:
        self._take(block=False)  # keep the zygote's replies from piling up in the socket
        while self.pending_stops:
            ticket = self.pending_stops.pop()
            self.discard.add(self.sent)
            self.sock.sendall(dumps({"op": "stop", "ticket": ticket}))
            self.sent += 1
        if fds:
            socket.send_fds(self.sock, [dumps(req)], fds)
        else:
            self.sock.sendall(dumps(req))
        seq = self.sent
        self.sent += 1
        if not want_reply:
            self.discard.add(seq)
        return seq

    def _request(self, req: dict[str, Any]) -> dict[str, Any] | None:
        try:
            with self.lock:
                seq = self._send(req)
                while seq not in self.replies:
                    if not self._take(block=True):
                        return None
                return self.replies.pop(seq)
        except (OSError, ValueError):
            return None

    def spawn(self, config: dict[str, Any]) -> tuple[int, int, int]:
        """Ask for a worker without waiting; returns ``(ticket, fd to write to it, fd to read from it)``."""
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        try:
            with self.lock:
                ticket = self._send({"op": "spawn", "config": config}, [to_r, from_w], want_reply=False)
        except BaseException:
            for fd in (to_w, from_r):
                os.close(fd)
            raise
        finally:
            os.close(to_r)
            os.close(from_w)
        return ticket, to_w, from_r

    def poll(self, ticket: int) -> int | None:
        """The wait status of a worker that has ended by itself (None while it runs)."""
        reply = self._request({"op": "poll", "ticket": ticket})
        return reply.get("status") if reply else None

    def stop(self, ticket: int, wait: bool = True) -> int | None:
        """Kill a worker if it still runs and reap it; with ``wait``, returns how it ended."""
        if wait:
            reply = self._request({"op": "stop", "ticket": ticket})
            return reply.get("status") if reply else None
        # Never wait for the lock here: this is also the finalizer of a forgotten worker, which the garbage
        # collector can run on a thread that holds the lock mid-send (seen: a spawn deadlocked on itself).
        if not self.lock.acquire(blocking=False):
            self.pending_stops.append(ticket)
            return None
        try:
            self._send({"op": "stop", "ticket": ticket}, want_reply=False)
        except OSError:
            pass
        finally:
            self.lock.release()
        return None


def _raise_open_file_limit() -> None:
    """Each live session holds two pipe ends in the trainer: lift the soft open-file limit to the hard one
    (capped at 65,536), as servers commonly do (the usual soft default, 1,024, is ~500 sessions)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass


_ZYGOTE: _Zygote | None = None
_ZYGOTE_LOCK = threading.Lock()


def _zygote() -> _Zygote:
    global _ZYGOTE
    with _ZYGOTE_LOCK:
        if _ZYGOTE is None or not _ZYGOTE.alive():
            if _ZYGOTE is not None and _ZYGOTE.owner == os.getpid():
                _ZYGOTE.close()
            _ZYGOTE = _Zygote()
        return _ZYGOTE


def _describe(status: int | None) -> str:
    if status is None:
        return "stopped"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"was killed by signal {name}"
    return f"exited with status {os.WEXITSTATUS(status) if os.WIFEXITED(status) else status}"


LOST = "It has been restarted: variables, functions and imports from earlier cells are gone."


# --- turns: one running cell segment per world --------------------------------------------------------------
_TURNS: weakref.WeakKeyDictionary[Any, dict[asyncio.AbstractEventLoop, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


_TURNS_BY_ID: dict[int, dict[asyncio.AbstractEventLoop, asyncio.Lock]] = {}


def _turn_lock(key: Any, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
    """The lock that makes the cells of agents sharing ``key`` (their world) take turns."""
    try:
        per_loop = _TURNS.setdefault(key, {})
    except TypeError:  # a key without weak references: one lock per key object id (kept)
        per_loop = _TURNS_BY_ID.setdefault(id(key), {})
    lock = per_loop.get(loop)
    if lock is None:
        for old in [lp for lp in per_loop if lp.is_closed()]:
            del per_loop[old]
        lock = per_loop[loop] = asyncio.Lock()
    return lock


# --- one worker -------------------------------------------------------------------------------------------
def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Run:
    """Book-keeping of one cell on the trainer side."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.events: collections.deque[tuple[str, Any]] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.inflight: set[asyncio.Future[Any]] = set()
        self.used = 0.0  # seconds the worker ran on its own (no call of it in flight)
        self.t0 = loop.time()
        self.done = False
        self.turn: asyncio.Lock = asyncio.Lock()
        self.holding = False
        self.final: CellResult | dict[str, Any] | None = None
        """Ordered mode: how the cell ended (the worker's ``done`` message, or the trainer's verdict)."""
        self.watching = False
        """Ordered mode: the loop watches the pipe (the cell waits for launches in flight)."""

    def put(self, kind: str, value: Any = None) -> None:
        """An event for :meth:`get` (called from the pipe reader and from finished tool calls)."""
        self.events.append((kind, value))
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def get(self, timeout: float | None) -> tuple[str, Any] | None:
        """The next event, or None after ``timeout`` seconds (cheaper than ``asyncio.wait_for``)."""
        if not self.events:
            self.waiter = self.loop.create_future()
            timer = None
            if timeout is not None:
                timer = self.loop.call_later(timeout, _wake, self.waiter)
            try:
                await self.waiter
            finally:
                self.waiter = None
                if timer is not None:
                    timer.cancel()
            if not self.events:
                return None
        return self.events.popleft()

    def pause(self) -> None:
        self.used += self.loop.time() - self.t0

    def resume(self) -> None:
        self.t0 = self.loop.time()


class CodeActWorker:
    """An agent's persistent Python, in its own process. ``await run(code)`` executes one cell.

    ``tools``: plain functions run in the trainer when the cell calls them; ``async_tools``: coroutine
    functions (``launch_subagent``), which the cell gets as functions returning awaitables.

    >>> import asyncio
    >>> w = CodeActWorker({"double": lambda x: 2 * x}, {})
    >>> asyncio.run(w.run("import math\\ny = double(21)\\nmath.sqrt(y * 42)")).stdout
    'Out[1]: 42.0\\n'
    >>> w.close()
    """

    def __init__(
        self,
        tools: Mapping[str, Callable[..., Any]],
        async_tools: Mapping[str, Callable[..., Awaitable[Any]]] | None = None,
        limits: WorkerLimits | None = None,
        turn_key: Any = None,
        ordered: bool = False,
    ):
        if not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
            raise RuntimeError(
                "the CodeAct worker needs a POSIX system with fork and SCM_RIGHTS (Linux): "
                "TextCraft cells cannot run here"
            )
        self.tools = dict(tools)
        self.turn_key = turn_key
        """Workers with the same key (the world they act on) run their cells' code one segment at a
        time, switching only where a cell waits (an ``await`` that blocks), as the paper's cells do on
        its single event loop; None: a private key."""
        self.ordered = ordered
        """Serve each cell segment inline, blocking the event loop (see the module docstring): siblings'
        cells run in the event loop's order, so runs repeat; no two cells run at once in this trainer."""
        self.async_tools = dict(async_tools or {})
        for name in [*self.tools, *self.async_tools]:
            if not name.isidentifier() or name.startswith("_"):
                raise ValueError(f"tool name {name!r} must be an identifier not starting with '_'")
        self.limits = limits or WorkerLimits()
        self._zygote: _Zygote | None = None
        self._ticket: int | None = None
        self.isolation: str | None = None
        """What isolation the running worker achieved (from its ready message)."""
        self.cells = 0
        self.restarts = 0
        """Workers started after the first (crashes, timeouts)."""
        self._wfd = self._rfd = -1
        self._rbuf = b""
        self._wbuf = b""
        self._ready = False
        self._run: _Run | None = None
        self._writer_on: asyncio.AbstractEventLoop | None = None
        self._finalizer: weakref.finalize | None = None
        self._start()

    # --- process life ---------------------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        lim = self.limits
        return {
            "tools": sorted(self.tools),
            "async_tools": sorted(self.async_tools),
            "memory_mb": lim.memory_mb,
            "cpu_total_s": lim.cpu_total_s,
            "namespaces": lim.namespaces,
        }

    def _start(self) -> None:
        zygote = _zygote()
        ticket, wfd, rfd = zygote.spawn(self._config())
        os.set_blocking(wfd, False)
        os.set_blocking(rfd, False)
        self._zygote, self._ticket = zygote, ticket
        self._wfd, self._rfd = wfd, rfd
        self._rbuf = self._wbuf = b""
        self._ready = False
        self._finalizer = weakref.finalize(self, _stop_worker, zygote, ticket, wfd, rfd)

    def _stop(self, wait: bool = True) -> int | None:
        """Kill the worker (if it still runs) and close its pipes; with ``wait``, returns how it ended."""
        if self._ticket is None:
            return None
        self._unregister()
        if self._finalizer is not None:
            self._finalizer.detach()
        status = _stop_worker(self._zygote, self._ticket, self._wfd, self._rfd, wait)
        self._ticket = None
        self._wfd = self._rfd = -1
        return status

    async def _stop_after_exit(self) -> int | None:
        """The worker closed its pipe: give it a moment to exit by itself (so the report says how it
        ended), then stop it."""
        if self._ticket is not None and self._zygote is not None:
            for _ in range(50):
                if self._zygote.poll(self._ticket) is not None:
                    break
                await asyncio.sleep(0.01)
        return self._stop()

    def _unregister(self) -> None:
        """Take the pipes out of the event loop's selector (before they are closed: a closed fd left
        registered would shadow a later pipe that reuses its number)."""
        run = self._run
        if run is not None and self._rfd >= 0 and not run.loop.is_closed():
            run.loop.remove_reader(self._rfd)
            run.watching = False
        if self._writer_on is not None:
            if not self._writer_on.is_closed():
                self._writer_on.remove_writer(self._wfd)
            self._writer_on = None

    def close(self) -> None:
        """Stop the worker without waiting for it (idempotent). A later ``run`` starts a new one."""
        self._stop(wait=False)

    # --- pipes ----------------------------------------------------------------------------------------
    def _on_readable(self) -> None:
        run = self._run
        if run is None:
            return
        while True:
            try:
                chunk = os.read(self._rfd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                run.loop.remove_reader(self._rfd)
                run.put("eof")
                return
            self._rbuf += chunk
            while (event := self._next_message()) is not None:
                kind, msg = event
                if kind == "bad":
                    run.put("bad", msg)
                    return
                if msg.get("type") == "call" and msg.get("name") in self.tools and run.holding:
                    # Fast path: a plain tool call is answered right here, without waking _serve.
                    t = run.loop.time()
                    self._send(self._sync_call(msg))
                    run.t0 += run.loop.time() - t  # the tool's own time is the trainer's, not the cell's
                    continue
                run.put("msg", msg)
            if len(self._rbuf) > self.limits.max_message_bytes:
                run.put("bad", "a message larger than max_message_bytes")
                run.loop.remove_reader(self._rfd)
                return

    def _next_message(self) -> tuple[str, Any] | None:
        """The next whole line of the read buffer, taken out of it: ``("msg", dict)`` or ``("bad", why)``
        (not a JSON object); None until a line is complete."""
        i = self._rbuf.find(b"\n")
        if i < 0:
            return None
        line, self._rbuf = self._rbuf[:i], self._rbuf[i + 1 :]
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):
            msg = None
        return ("msg", msg) if isinstance(msg, dict) else ("bad", "a malformed message")

    def _send(self, obj: dict[str, Any]) -> None:
        self._wbuf += dumps(obj)
        self._flush()

    def _flush(self) -> None:
        while self._wbuf:
            try:
                n = os.write(self._wfd, self._wbuf)
            except BlockingIOError:
                break
            except OSError:  # the worker is gone; its EOF will tell the run
                self._wbuf = b""
                break
            self._wbuf = self._wbuf[n:]
        run = self._run
        if self._wbuf and run is not None and self._writer_on is None:
            run.loop.add_writer(self._wfd, self._flush)
            self._writer_on = run.loop
        elif not self._wbuf and self._writer_on is not None:
            self._writer_on.remove_writer(self._wfd)
            self._writer_on = None

    # --- tool calls -----------------------------------------------------------------------------------
    @staticmethod
    def _reply(cid: Any, value: Any = None, error: BaseException | None = None) -> dict[str, Any]:
        if error is None:
            try:
                return {"type": "reply", "id": cid, "ok": True, "value": encode(value)}
            except TypeError as e:
                error = TypeError(f"the tool returned something that is not plain data ({e})")
        message = str(error)
        if len(message) > 4000:
            message = message[:4000] + " ...(truncated)"
        return {"type": "reply", "id": cid, "ok": False, "error_type": type(error).__name__, "error": message}

    @staticmethod
    def _arguments(msg: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        args, kwargs = decode(msg.get("args", [])), decode(msg.get("kwargs", {"d": []}))
        if (
            not isinstance(args, list)
            or not isinstance(kwargs, dict)
            or not all(isinstance(k, str) for k in kwargs)
        ):
            raise ValueError("malformed call")
        return args, kwargs

    def _sync_call(self, msg: dict[str, Any]) -> dict[str, Any]:
        cid, name = msg.get("id"), msg.get("name")
        fn = self.tools.get(name) if isinstance(name, str) else None
        if fn is None:
            return self._reply(cid, error=NameError(f"no tool named {name!r}"))
        try:
            args, kwargs = self._arguments(msg)
            return self._reply(cid, fn(*args, **kwargs))
        except (ValueError, RecursionError) as e:
            return self._reply(cid, error=ValueError(f"malformed tool call ({e})"))
        except Exception as e:  # the tool's own error is the cell's error, as in the paper's executor
            return self._reply(cid, error=e)

    async def _async_call(self, msg: dict[str, Any], run: _Run) -> None:
        cid, name = msg.get("id"), msg.get("name")
        try:
            args, kwargs = self._arguments(msg)
            reply = self._reply(cid, await self.async_tools[name](*args, **kwargs))
        except (ValueError, RecursionError) as e:
            reply = self._reply(cid, error=ValueError(f"malformed tool call ({e})"))
        except Exception as e:
            reply = self._reply(cid, error=e)
        if not run.done and self._ticket is not None:
            if self.ordered:  # the worker is idle: answer, then serve what the answer wakes, inline
                run.inflight.discard(asyncio.current_task())  # type: ignore[arg-type]
                self._send(reply)
                self._segment(run)
            else:
                self._send(reply)

    # --- cells ----------------------------------------------------------------------------------------
    def _send_run(self, code: str) -> None:
        """Ask the worker to run ``code`` as cell ``self.cells`` under this worker's limits."""
        lim = self.limits
        self._send(
            {
                "type": "run",
                "code": code,
                "cell": self.cells,
                "wall_time_s": lim.wall_time_s,
                "cpu_time_s": lim.cpu_time_s,
                "max_output_chars": lim.max_output_chars,
            }
        )

    async def run(self, code: str) -> CellResult:
        """Run one cell; never raises for anything the cell does (cancellation of the caller propagates,
        and then the worker is killed)."""
        if self._run is not None:
            return CellResult("", "WorkerError: another cell is still running in this worker")
        if self._ticket is None:
            self.restarts += int(self.cells > 0)
            self._start()
        loop = asyncio.get_running_loop()
        run = self._run = _Run(loop)
        if self.ordered:
            serve = self._serve_ordered(run, code)
        else:
            run.turn = _turn_lock(self.turn_key if self.turn_key is not None else self, loop)
            loop.add_reader(self._rfd, self._on_readable)
            serve = self._serve(run, code)
        try:
            return await serve
        except BaseException:
            self._stop()
            raise
        finally:
            if run.holding:
                run.turn.release()
                run.holding = False
            run.done = True
            for task in run.inflight:
                task.cancel()
            if self._rfd >= 0:
                loop.remove_reader(self._rfd)
            if self._writer_on is not None:
                self._writer_on.remove_writer(self._wfd)
                self._writer_on = None
            self._run = None

    def _take_ready(self, event: tuple[str, Any] | None) -> CellResult | None:
        """The worker's first message, which must be ``ready``: None when it is, else the cell's error."""
        kind, msg = event if event is not None else ("bad", "no ready message")
        if kind != "msg" or msg.get("type") != "ready":
            return CellResult(
                "", f"WorkerError: the Python worker could not start (it {_describe(self._stop())})."
            )
        self._ready = True
        self.isolation = str(msg.get("isolation"))
        return None

    async def _serve(self, run: _Run, code: str) -> CellResult:
        lim = self.limits
        if not self._ready and (failed := self._take_ready(await run.get(lim.start_timeout_s))):
            return failed
        self.cells += 1
        await run.turn.acquire()
        run.holding = True
        self._send_run(code)
        run.resume()
        budget = lim.wall_time_s + lim.grace_s
        while True:
            timeout = None if run.inflight else budget - run.used - (run.loop.time() - run.t0)
            if timeout is not None and timeout <= 0:
                self._stop()
                return self._timed_out()
            event = await run.get(timeout)
            if event is None:
                continue
            kind, msg = event
            if kind == "eof":
                return self._died(await self._stop_after_exit())
            if kind == "bad":
                self._stop()
                return self._bad(msg)
            if kind == "wake":
                continue
            typ = msg.get("type")
            if typ == "idle":  # the cell waits: other agents on this world may run
                if run.holding:
                    run.turn.release()
                    run.holding = False
            elif typ == "resume":  # the cell wants to go on: wait for the turn (not the cell's time)
                if not run.holding:
                    if not run.inflight:
                        run.pause()
                    await run.turn.acquire()
                    run.holding = True
                    if not run.inflight:
                        run.resume()
                self._send({"type": "go"})
            elif typ == "call":
                if msg.get("name") in self.async_tools:
                    if not run.inflight:
                        run.pause()
                    task = asyncio.ensure_future(self._async_call(msg, run))
                    run.inflight.add(task)
                    task.add_done_callback(lambda t, run=run: self._call_finished(t, run))
                else:
                    t = run.loop.time()
                    self._send(self._sync_call(msg))
                    run.t0 += run.loop.time() - t  # the tool's own time is the trainer's, not the cell's
            elif typ == "done":
                if msg.get("cell") != self.cells:
                    continue  # a stale or forged answer for an earlier cell
                if run.inflight:  # launched children cannot be un-launched: let them end
                    run.done = True
                    if run.holding:  # ... and run: a child on this world needs the turn this cell held
                        run.turn.release()
                        run.holding = False
                    await asyncio.gather(*run.inflight, return_exceptions=True)
                return self._result(msg)

    # --- ordered mode: cell segments served inline ----------------------------------------------------
    async def _serve_ordered(self, run: _Run, code: str) -> CellResult:
        """Ordered mode: every exchange with the worker happens inline (the event loop waits), so where the
        cell's segments fall among other agents' work depends only on the event loop's order."""
        lim = self.limits
        # read inline too: awaiting it would let a sibling whose worker is ready first go first
        if not self._ready and (failed := self._take_ready(self._read_inline(lim.start_timeout_s))):
            return failed
        self.cells += 1
        self._send_run(code)
        self._segment(run)
        while run.final is None:  # the cell waits for launches: they run as tasks; each answer resumes it
            await run.get(None)
        if isinstance(run.final, CellResult):
            return run.final
        if run.inflight:  # launched children cannot be un-launched: let them end
            await asyncio.gather(*run.inflight, return_exceptions=True)
        return self._result(run.final)

    def _segment(self, run: _Run) -> None:
        """Serve the worker inline until its cell ends (``run.final``) or waits with launches in flight
        (then the loop watches the pipe, for a cell woken by its own timer). The cell's own time here is
        bounded by ``wall_time_s + grace_s`` (tool calls excluded), past which the worker is killed."""
        if run.final is not None or self._ticket is None or self._run is not run:
            return
        try:
            self._serve_inline(run)
        except Exception as e:  # noqa: BLE001 -- a trainer-side failure must not leave the cell hanging
            self._stop()
            self._finish(run, CellResult("", f"WorkerError: {type(e).__name__}: {e}. {LOST}", restarted=True))

    def _serve_inline(self, run: _Run) -> None:
        if run.watching:
            run.loop.remove_reader(self._rfd)
            run.watching = False
        lim = self.limits
        budget = lim.wall_time_s + lim.grace_s
        while True:
            left = budget - run.used
            if left <= 0:
                self._stop()
                return self._finish(run, self._timed_out())
            t0 = time.monotonic()
            event = self._read_inline(left)  # the tool calls below are not timed: the trainer's time
            run.used += time.monotonic() - t0
            if event is None:
                continue
            kind, msg = event
            if kind == "eof":
                return self._finish(run, self._died(self._stop_after_exit_inline()))
            if kind == "bad":
                self._stop()
                return self._finish(run, self._bad(msg))
            typ = msg.get("type")
            if typ == "idle":  # the cell's loop waits: for launches in flight, or for its own timer
                if run.inflight:
                    run.loop.add_reader(self._rfd, self._on_idle_readable, run)
                    run.watching = True
                    return None
            elif typ == "resume":
                self._send({"type": "go"})
            elif typ == "call":
                if msg.get("name") in self.async_tools:
                    task = asyncio.ensure_future(self._async_call(msg, run))
                    run.inflight.add(task)
                    task.add_done_callback(lambda t, run=run: self._call_finished(t, run))
                else:
                    self._send(self._sync_call(msg))
            elif typ == "done":
                if msg.get("cell") != self.cells:
                    continue  # a stale or forged answer for an earlier cell
                return self._finish(run, msg)

    def _on_idle_readable(self, run: _Run) -> None:
        """The pipe of a waiting cell is readable: its own timer woke it (or it died). A launch answer's
        task may have served it already in this loop iteration: then there is nothing to read."""
        if self._run is not run or run.final is not None or self._rfd < 0:
            return
        if b"\n" not in self._rbuf:
            poller = select.poll()
            poller.register(self._rfd, select.POLLIN)
            if not poller.poll(0):
                return
        self._segment(run)

    def _finish(self, run: _Run, outcome: CellResult | dict[str, Any]) -> None:
        run.final = outcome
        run.done = True  # launches still in flight: their answers are not sent
        if run.watching and self._rfd >= 0:
            run.loop.remove_reader(self._rfd)
        run.watching = False
        run.put("wake")

    def _read_inline(self, timeout: float) -> tuple[str, Any] | None:
        """The worker's next message, waiting at most ``timeout`` seconds with the event loop blocked:
        ``("msg", dict)``, ``("eof", None)``, ``("bad", why)``, or None when the time ran out. Pending
        writes to the worker are flushed meanwhile (a large answer may not fit the pipe at once)."""
        deadline = time.monotonic() + timeout
        poller = select.poll()  # not select(): the trainer may hold fds past FD_SETSIZE
        while True:
            if (event := self._next_message()) is not None:
                return event
            if len(self._rbuf) > self.limits.max_message_bytes:
                return ("bad", "a message larger than max_message_bytes")
            try:
                chunk = os.read(self._rfd, 1 << 16)
            except BlockingIOError:
                chunk = None
            except OSError:
                chunk = b""
            if chunk is not None:
                if not chunk:
                    return ("eof", None)
                self._rbuf += chunk
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            poller.register(self._rfd, select.POLLIN)
            if self._wbuf:
                poller.register(self._wfd, select.POLLOUT)
            ready = poller.poll(max(1, int(left * 1000 + 0.999)))
            if self._wbuf and any(fd == self._wfd for fd, _ in ready):
                self._flush()
            for fd in {self._rfd, self._wfd}:
                try:
                    poller.unregister(fd)
                except KeyError:
                    pass

    def _stop_after_exit_inline(self) -> int | None:
        """:meth:`_stop_after_exit` without yielding to the event loop."""
        if self._ticket is not None and self._zygote is not None:
            for _ in range(50):
                if self._zygote.poll(self._ticket) is not None:
                    break
                time.sleep(0.01)
        return self._stop()

    # --- outcomes of a cell the trainer ended -----------------------------------------------------------
    def _timed_out(self) -> CellResult:
        return CellResult(
            "",
            f"TimeoutError: the cell did not finish within its {self.limits.wall_time_s:g} s time limit and "
            f"was stopped. {LOST}",
            timed_out=True,
            restarted=True,
        )

    @staticmethod
    def _died(status: int | None) -> CellResult:
        how = _describe(status)
        return CellResult(
            "", f"WorkerError: the Python process running this cell {how}. {LOST}", restarted=True
        )

    @staticmethod
    def _bad(what: str) -> CellResult:
        return CellResult(
            "", f"WorkerError: the Python process sent {what} and was stopped. {LOST}", restarted=True
        )

    def _call_finished(self, task: asyncio.Future[Any], run: _Run) -> None:
        run.inflight.discard(task)
        if not run.inflight:
            run.resume()
        run.put("wake")

    @staticmethod
    def _result(msg: dict[str, Any]) -> CellResult:
        def text(key: str) -> str | None:
            return msg.get(key) if isinstance(msg.get(key), str) else None

        stdout, error = text("stdout") or "", text("error")
        notes = (
            [n for n in msg.get("notes", []) if isinstance(n, str)]
            if isinstance(msg.get("notes"), list)
            else []
        )
        if notes:
            stdout += "".join(n + "\n" for n in notes)
        unawaited = msg.get("unawaited")
        syntax = msg.get("syntax")
        if not (isinstance(syntax, list) and len(syntax) == 2 and all(isinstance(x, str) for x in syntax)):
            syntax = None
        return CellResult(
            stdout=stdout,
            error=error,
            stderr=text("stderr") or "",
            exception=text("exception"),
            timed_out=bool(msg.get("timed_out")),
            unawaited_launches=unawaited if isinstance(unawaited, int) else 0,
            syntax_error=(syntax[0], syntax[1]) if syntax else None,
        )


def _stop_worker(zygote: _Zygote | None, ticket: int, wfd: int, rfd: int, wait: bool = False) -> int | None:
    """Stop a worker through the zygote and close its pipes (also the finalizer of a forgotten
    :class:`CodeActWorker`)."""
    for fd in (wfd, rfd):
        try:
            os.close(fd)
        except OSError:
            pass
    if zygote is None or not zygote.alive():
        return None  # the zygote is gone: the worker sees EOF on its pipe and exits
    return zygote.stop(ticket, wait=wait)


def worker_limits_dict(limits: WorkerLimits) -> dict[str, Any]:
    """The limits as a plain dict (for logs and run manifests)."""
    return asdict(limits)
