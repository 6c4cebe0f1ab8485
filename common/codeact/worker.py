"""The CodeAct worker process: runs model-written Python cells with real Python semantics, isolated from
the trainer. Standard library only (it runs as ``python -I -S worker.py``, without the project on its path).

Two roles live in this one file:

* the **zygote** (``python -I -S worker.py zygote FD N_SPARES``): started once per trainer process by
  :mod:`common.codeact.executor`. It imports everything a worker needs, then waits on a Unix socket for
  "spawn" requests that carry two pipe ends (``SCM_RIGHTS``). It keeps a few **spare** workers forked
  and isolated in advance and hands the pipes to one of them (refilling after its reply), so the trainer
  never waits for a fork; starting a fresh Python instead would cost 100+ ms per agent.
* a **worker** (one per agent session): applies its session's limits, installs the audit hook, then
  serves ``run`` requests, one cell at a time, in one persistent namespace.

Isolation, applied in the worker before any cell runs:

1. **rlimits**: address space (``RLIMIT_AS``: a 10 GB allocation is a ``MemoryError``), a total CPU cap
   for the worker's life (``RLIMIT_CPU``, SIGKILL at the hard limit), no core files, no file writes
   (``RLIMIT_FSIZE`` 0), a small number of open files.
2. **namespaces** (when the kernel allows unprivileged user namespaces): ``unshare(NEWUSER|NEWNET|NEWPID)``
   then one more fork: the cell runs as pid 1 of a fresh pid namespace (it cannot see or signal the
   trainer or anything else on the machine), in a network namespace without interfaces (no network, even
   from native code), with no capabilities outside its namespace (so it cannot raise its hard rlimits).
   The intermediate process waits for it and exits the same way; ``PR_SET_PDEATHSIG`` kills the worker
   when the intermediate dies. Without user namespaces the worker runs unnamespaced (``isolation`` in the
   ready message says which).
3. **an audit hook** (:pep:`578`, defence in depth inside the interpreter): no process creation (fork,
   exec, spawn, system, subprocess), no signals except to itself, no sockets other than ``AF_UNIX`` and no
   name resolution, no ``ctypes``, no file reads outside the standard library, no file-system changes,
   no ``setrlimit``. Functions that bypass auditing (``os.pidfd_open``, ``signal.pidfd_send_signal``,
   ``_posixsubprocess.fork_exec``) are removed. Native code could get around the hook; it cannot get
   around the namespaces and rlimits.
4. **time**: per cell a wall-clock timer (``ITIMER_REAL``, paused while the cell waits for the trainer:
   tool calls and sub-agents) and a CPU timer (``ITIMER_PROF``); both raise ``TimeoutError`` in the cell.
   The trainer also kills the worker if a cell outlives its limit by a grace period (a cell that blocks
   in C code, or swallows the timeout).
5. **output**: ``sys.stdout`` and ``sys.stderr`` are separate capped buffers; file descriptors 0-2 are
   ``/dev/null``.

Cell semantics (as the paper's IPython executor): persistent globals, top-level ``await``, the real
``asyncio`` (imported already), any standard-library import, the value of a final expression statement
echoed as IPython's displayhook prints it (``Out[1]: `` and IPython's pretty printer; a trailing ``;`` does not
hide it, as under platoon), an exception's traceback in IPython's layout written to stdout after the cell's
output (only the cell's frames), and what the cell writes to ``sys.stderr`` kept apart (``stderr``): the
texts of the paper's shell, see :mod:`ipython_layout`.
Tools are proxies: each call is a JSON message to the trainer, which runs the tool on the shared world
and answers; ``launch_subagent`` returns a coroutine, so ``await`` and ``asyncio.gather`` work while the
trainer runs the children.

Protocol: one JSON object per line (``json.dumps`` never emits a raw newline). Tool arguments and
results use :func:`encode` / :func:`decode` (plain data with tuples and non-string dict keys kept).

Run: started by :class:`common.codeact.executor.CodeActWorker`; ``pytest tests/test_codeact_worker.py``.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import inspect
import json
import linecache
import os
import select
import selectors
import signal
import socket
import sys
import traceback

try:
    import resource
except ImportError:  # not POSIX: the trainer side refuses to start workers there
    resource = None  # type: ignore[assignment]

if __package__:
    from . import ipython_layout
else:  # ``python -I -S worker.py``: the module beside this file (read now, before any isolation), then
    # the directory leaves the path again, so cells cannot read it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import ipython_layout
    finally:
        del sys.path[0]

# --- plain-data encoding (shared with the trainer side) -------------------------------------------------
MAX_DEPTH = 64
"""Deepest nesting of an encoded value (deeper values are refused, both directions)."""


class EncodeError(TypeError):
    """A value that is not plain data (str, int, float, bool, None, list, tuple, dict)."""


def encode(value, depth=0):
    """Plain data -> JSON-safe data; tuples become ``{"t": [...]}``, dicts ``{"d": [[k, v], ...]}``.

    >>> encode({"a": (1, [2.5, None])})
    {'d': [['a', {'t': [1, [2.5, None]]}]]}
    """
    if depth > MAX_DEPTH:
        raise EncodeError("value is nested too deeply")
    t = type(value)
    if value is None or t in (str, int, float, bool):
        return value
    if t is list:
        return [encode(v, depth + 1) for v in value]
    if t is tuple:
        return {"t": [encode(v, depth + 1) for v in value]}
    if t is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise EncodeError(
        f"only plain data (str, int, float, bool, None, list, tuple, dict) can be passed, got {t.__name__}"
    )


def decode(value, depth=0):
    """Inverse of :func:`encode`; raises ``ValueError`` on anything :func:`encode` cannot produce."""
    if depth > MAX_DEPTH:
        raise ValueError("value is nested too deeply")
    t = type(value)
    if value is None or t in (str, int, float, bool):
        return value
    if t is list:
        return [decode(v, depth + 1) for v in value]
    if t is dict and len(value) == 1:
        if "t" in value and type(value["t"]) is list:
            return tuple(decode(v, depth + 1) for v in value["t"])
        if "d" in value and type(value["d"]) is list:
            out = {}
            for pair in value["d"]:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError("malformed dict entry")
                key = decode(pair[0], depth + 1)
                if type(key) in (list, dict):
                    raise ValueError("unhashable dict key")
                out[key] = decode(pair[1], depth + 1)
            return out
    raise ValueError(f"malformed encoded value of type {t.__name__}")


def dumps(obj) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


# --- the worker -------------------------------------------------------------------------------------------
CELL_PREFIX = "<cell-"
_CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWPID = 0x10000000, 0x40000000, 0x20000000
_PR_SET_PDEATHSIG = 1
_BLOCKED_IMPORTS = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "posix", "_signal", "_socket", "_thread", "_xxsubinterpreters", "_testcapi", "_testinternalcapi"})  # fmt: skip
_PROCESS_EVENTS = frozenset({"os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system", "subprocess.Popen", "os.startfile", "pty.spawn"})  # fmt: skip
_FS_CHANGE_EVENTS = frozenset({"os.symlink", "os.link", "os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "shutil.rmtree", "shutil.move", "shutil.copyfile", "shutil.copytree", "shutil.chown"})  # fmt: skip
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class CellTimeout(BaseException):
    """Raised into the cell by the wall-clock or CPU timer (a BaseException: plain ``except Exception``
    does not swallow it)."""


class _Capped:
    """A text stream that keeps the first ``cap`` characters and counts the rest."""

    def __init__(self, cap: int):
        self.cap, self.parts, self.kept, self.dropped = cap, [], 0, 0

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        room = self.cap - self.kept
        if room > 0:
            piece = s[:room]
            self.parts.append(piece)
            self.kept += len(piece)
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)

    def flush(self):
        pass

    def isatty(self):
        return False

    def text(self) -> str:
        out = "".join(self.parts)
        if self.dropped:
            out += f"\n[... output truncated: {self.dropped} more characters not shown ...]\n"
        return out


class Worker:
    """One persistent namespace served over two pipe file descriptors."""

    def __init__(self, rfd: int, wfd: int, config: dict):
        self.rfd, self.wfd, self.config = rfd, wfd, config
        self.buf = b""
        self.next_id = 0
        self.replies: dict[int, dict] = {}
        self.futures: dict[int, asyncio.Future] = {}
        self.waiting = 0  # calls in flight (the cell's wall clock is paused while > 0)
        self.remaining = 0.0  # wall seconds left when the clock was paused
        self.in_cell = False
        self.created: list = []  # launch coroutines created by the current cell
        self.extra_loops: list = []  # loops other than ours that a cell ran (asyncio.run) and we read on
        self.loop = self._new_loop()
        self.input_names: dict[str, str] = {}  # cell file name -> the file name IPython would give it
        self.pid = os.getpid()
        self.namespace: dict = {"__name__": "__main__", "__builtins__": builtins, "asyncio": asyncio}
        for name in config.get("tools", []):
            self.namespace[name] = self._sync_proxy(name)
        for name in config.get("async_tools", []):
            self.namespace[name] = self._async_proxy(name)

    # --- messages -----------------------------------------------------------------------------------
    def send(self, obj) -> None:
        data = dumps(obj)
        while data:
            data = data[os.write(self.wfd, data) :]

    def _read_some(self, block: bool = True) -> None:
        """Append what the pipe holds (the fd is non-blocking; ``block`` waits for data first)."""
        while True:
            try:
                chunk = os.read(self.rfd, 1 << 16)
                break
            except BlockingIOError:
                if not block:
                    return
                select.select([self.rfd], [], [])
        if not chunk:  # the trainer is gone
            os._exit(0)
        self.buf += chunk

    def _pop_line(self):
        i = self.buf.find(b"\n")
        if i < 0:
            return None
        line, self.buf = self.buf[:i], self.buf[i + 1 :]
        return json.loads(line)

    def read_message(self) -> dict:
        while True:
            msg = self._pop_line()
            if msg is not None:
                return msg
            self._read_some()

    def _dispatch(self, msg) -> None:
        """A reply arrived: wake its future (async call) or keep it (sync call)."""
        cid = msg.get("id")
        fut = self.futures.pop(cid, None)
        if fut is not None:
            if not fut.done():
                fut.set_result(msg)
        else:
            self.replies[cid] = msg

    def _on_readable(self) -> None:
        self._read_some(block=False)
        while (msg := self._pop_line()) is not None:
            self._dispatch(msg)

    # --- turns: the trainer runs one cell segment at a time per world (the paper's single event loop) ----
    def _new_loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.SelectorEventLoop(_TurnSelector(self))

    def before_block(self) -> None:
        """The cell's event loop is about to wait (for the trainer or a timer): give the turn away."""
        self.send({"type": "idle"})

    def after_block(self) -> None:
        """The loop woke up: take the turn back before running any more cell code."""
        self._wait_begin()  # waiting for other agents is not this cell's time
        try:
            self.send({"type": "resume"})
            while True:
                msg = self.read_message()
                if msg.get("type") == "go":
                    break
                self._dispatch(msg)
        finally:
            self._wait_end()

    # --- the wall clock pauses while the trainer works for the cell ------------------------------------
    def _wait_begin(self) -> None:
        self.waiting += 1
        if self.waiting == 1 and self.in_cell:
            self.remaining = signal.setitimer(signal.ITIMER_REAL, 0)[0]

    def _wait_end(self) -> None:
        self.waiting -= 1
        if self.waiting == 0 and self.in_cell:
            signal.setitimer(signal.ITIMER_REAL, max(self.remaining, 1e-3))

    # --- tool proxies ---------------------------------------------------------------------------------
    def _call_message(self, name, args, kwargs):
        self.next_id += 1
        payload = {"type": "call", "id": self.next_id, "name": name}
        try:
            payload["args"] = encode(list(args))
            payload["kwargs"] = encode(kwargs)
        except EncodeError as e:
            raise TypeError(f"{name}(): {e}") from None
        return self.next_id, payload

    @staticmethod
    def _result(msg):
        if msg.get("ok"):
            return decode(msg.get("value"))
        kind = msg.get("error_type", "RuntimeError")
        cls = getattr(builtins, kind, None) if isinstance(kind, str) else None
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            cls = RuntimeError
        raise cls(msg.get("error", "tool failed"))

    def _sync_proxy(self, name):
        worker = self

        def tool(*args, **kwargs):
            cid, payload = worker._call_message(name, args, kwargs)
            worker._wait_begin()
            try:
                worker.send(payload)
                while cid not in worker.replies:
                    worker._dispatch(worker.read_message())
            finally:
                worker._wait_end()
            return worker._result(worker.replies.pop(cid))

        tool.__name__ = tool.__qualname__ = name
        return tool

    def _async_proxy(self, name):
        worker = self

        async def call(cid, payload):
            loop = asyncio.get_running_loop()
            if loop is not worker.loop and loop not in worker.extra_loops:  # e.g. asyncio.run(...) in a cell
                loop.add_reader(worker.rfd, worker._on_readable)
                worker.extra_loops.append(loop)
            fut = loop.create_future()
            worker.futures[cid] = fut
            worker._wait_begin()
            try:
                worker.send(payload)
                msg = await fut
            finally:
                worker.futures.pop(cid, None)
                worker._wait_end()
            return worker._result(msg)

        def tool(*args, **kwargs):
            cid, payload = worker._call_message(name, args, kwargs)  # bad arguments fail here, at the call
            coro = call(cid, payload)
            worker.created.append(coro)
            return coro

        tool.__name__ = tool.__qualname__ = name
        return tool

    # --- cells ----------------------------------------------------------------------------------------
    def _compile(self, code: str, filename: str):
        """The cell's code object, and whether its last statement is an expression whose value is shown
        (IPython's ``last_expr``; a trailing ``;`` does not hide it: platoon runs cells without
        ``store_history``, and IPython looks for the ``;`` in the stored history)."""
        tree = ast.parse(code, filename, "exec")
        echo = bool(tree.body) and isinstance(tree.body[-1], ast.Expr)
        if echo:
            last = tree.body[-1]
            target = ast.Name(id="_codeact_echo_", ctx=ast.Store())
            tree.body[-1] = ast.copy_location(ast.Assign(targets=[target], value=last.value), last)
            ast.fix_missing_locations(tree)
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        return compile(tree, filename, "exec", flags=flags, dont_inherit=True), echo

    def run_cell(self, req: dict) -> dict:
        """Run one cell. The answer carries what IPython under platoon's ``ShellCapture`` would have
        captured: ``stdout`` (prints, the last expression's ``Out[1]: ...`` line, and the traceback of an
        exception the cell raised) and ``stderr``; ``exception`` names that exception (``NameError: ...``);
        ``error``/``syntax`` describe a cell that did not compile."""
        cell = int(req.get("cell", 0))
        code = req["code"]
        filename = f"{CELL_PREFIX}{cell}>"
        self.input_names[filename] = ipython_layout.input_name(code)
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        cap = int(req.get("max_output_chars", 8000))
        out, err = _Capped(cap), _Capped(cap)
        sys.stdout, sys.stderr = out, err
        error, exception, traceback_text, timed_out, notes, syntax = None, None, "", False, [], None
        tasks_before = asyncio.all_tasks(self.loop)
        wall, cpu = float(req.get("wall_time_s", 10.0)), float(req.get("cpu_time_s", 10.0))
        self.created = []
        self.waiting, self.in_cell = 0, True
        try:
            try:
                codeobj, echo = self._compile(code, filename)
                signal.setitimer(signal.ITIMER_PROF, cpu)
                signal.setitimer(signal.ITIMER_REAL, wall)
                self.namespace.pop("_codeact_echo_", None)
                if codeobj.co_flags & 0x80:  # CO_COROUTINE: the cell uses top-level await
                    self.loop.add_reader(self.rfd, self._on_readable)
                    try:
                        self.loop.run_until_complete(eval(codeobj, self.namespace))
                    finally:
                        self.loop.remove_reader(self.rfd)
                else:
                    exec(codeobj, self.namespace)
                if echo:
                    value = self.namespace.pop("_codeact_echo_", None)
                    if value is not None:
                        self.namespace["_"] = value
                        out.write(ipython_layout.display_text(value))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.setitimer(signal.ITIMER_PROF, 0)
                self.in_cell = False
        except SyntaxError as e:
            error = "".join(traceback.format_exception_only(type(e), e)).rstrip()
            syntax = [(e.text or "").rstrip(), str(e.msg)]
        except BaseException as e:  # noqa: BLE001 -- everything the cell raises is reported, not fatal
            timed_out = isinstance(e, CellTimeout)
            exception, traceback_text = self._format_error(e)
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        if timed_out:  # the timer may have fired inside the event loop's own code: start a clean loop
            self._replace_loop()
        else:
            leftover = [t for t in asyncio.all_tasks(self.loop) if t not in tasks_before and not t.done()]
            if leftover:
                for t in leftover:
                    t.cancel()
                try:
                    self.loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
                except BaseException:  # noqa: BLE001
                    self._replace_loop()
                notes.append(
                    f"[Warning] {len(leftover)} asyncio task(s) started by this cell were still running "
                    "when it ended and were cancelled."
                )
        for loop in self.extra_loops:
            try:
                loop.remove_reader(self.rfd)
            except BaseException:  # noqa: BLE001 -- already closed by asyncio.run
                pass
        self.extra_loops = []
        unawaited = 0
        for coro in self.created:
            if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                coro.close()
                unawaited += 1
        self.created = []
        self.futures.clear()
        # IPython prints the traceback to stdout after what the cell printed (beyond the output cap)
        return {"type": "done", "cell": cell, "stdout": out.text() + traceback_text, "stderr": err.text(),
                "exception": exception, "error": error, "timed_out": timed_out, "notes": notes,
                "unawaited": unawaited, "syntax": syntax}  # fmt: skip

    def _replace_loop(self) -> None:
        old = self.loop
        self.loop = self._new_loop()
        try:
            old.close()
        except BaseException:  # noqa: BLE001
            pass

    def _format_error(self, exc: BaseException) -> tuple[str, str]:
        """``(summary, traceback)`` of an exception the cell raised: the summary is the traceback's last
        line(s) (``NameError: name 'x' is not defined``); the traceback is IPython's layout over the cell's
        frames (:mod:`ipython_layout`) as an agent's shell other than the process's first writes it
        (``File <ipython-input-1-...>:k``), at most 4,000 characters. The timer's exception reads as
        ``TimeoutError``."""
        name = "TimeoutError" if isinstance(exc, CellTimeout) else None
        try:
            text = ipython_layout.format_traceback(
                exc,
                lambda f: f.startswith(CELL_PREFIX),
                name=name,
                label=lambda f, n: ipython_layout.cell_label(self.input_names.get(f, f), n),
            )
        except BaseException:  # noqa: BLE001 -- a hostile exception (its __str__, its frames)
            text = f"{name or type(exc).__name__}\n"
        if len(text) > 4000:
            text = text[:2000] + "\n[...]\n" + text[-1800:]
        summary = text.rstrip("\n").rsplit("\n\n", 1)[-1]
        return summary, text

    def serve(self) -> None:
        self.send({"type": "ready", "isolation": self.config.get("isolation", "none"), "pid": self.pid})
        while True:
            try:
                msg = self.read_message()
                if msg.get("type") == "run":
                    self.send(self.run_cell(msg))
                elif msg.get("type") in ("reply", "go"):
                    pass  # a late answer for a cell that has ended
                elif msg.get("type") == "exit":
                    os._exit(0)
            except CellTimeout:
                continue  # a timer that fired between cells
            except (OSError, ValueError):
                os._exit(3)


class _TurnSelector(selectors.DefaultSelector):
    """The worker loop's selector: announces a blocking wait during a cell (``idle``) and asks for the
    turn back (``resume``/``go``) before the loop runs cell code again."""

    def __init__(self, worker: Worker):
        super().__init__()
        self.worker = worker

    def select(self, timeout=None):
        w = self.worker
        if not w.in_cell or (timeout is not None and timeout <= 0):
            return super().select(timeout)
        w.before_block()
        try:
            return super().select(timeout)
        finally:
            w.after_block()


# --- isolation -------------------------------------------------------------------------------------------
def _apply_rlimits(cfg: dict) -> None:
    mem = int(cfg.get("memory_mb", 1024)) * 1024 * 1024
    cpu = int(cfg.get("cpu_total_s", 600))
    for limit, value in (
        (resource.RLIMIT_AS, mem),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, 0),
        (resource.RLIMIT_NOFILE, int(cfg.get("max_open_files", 64))),
    ):
        try:
            resource.setrlimit(limit, (value, value))
        except (ValueError, OSError):
            pass
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    except (ValueError, OSError):
        pass
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _enter_namespaces(close_in_intermediate: list[int], use: bool) -> str:
    """unshare(user, net, pid) and fork once; returns the isolation achieved (in the worker only)."""
    if not use or not sys.platform.startswith("linux"):
        return "rlimits+audit"
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWPID) != 0:
            return "rlimits+audit (user namespaces unavailable)"
    except (OSError, AttributeError):
        return "rlimits+audit (user namespaces unavailable)"
    pid = os.fork()
    if pid:  # the intermediate: wait for the worker and exit the same way
        for fd in close_in_intermediate:
            os.close(fd)
        signal.signal(signal.SIGTERM, lambda *a: os.kill(pid, signal.SIGKILL))
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return "rlimits+audit+userns+netns+pidns"


_READ_ROOTS: tuple[str, ...] = ()
"""Directories a cell may read (the standard library); computed once in the zygote."""


def _read_roots() -> tuple[str, ...]:
    import sysconfig

    roots = set()
    for key in ("stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            roots.add(os.path.realpath(p))
    roots.update(os.path.realpath(p) for p in sys.path if p)
    return tuple(sorted(r.rstrip("/") + "/" for r in roots))


def _install_audit_hook() -> None:
    roots = _READ_ROOTS or _read_roots()
    devices = frozenset({"/dev/null", "/dev/urandom", "/dev/random"})
    me = os.getpid()

    def readable(path) -> bool:
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return False
        full = os.path.normpath(os.path.join(os.getcwd() if not path.startswith("/") else "/", path))
        return full in devices or full.startswith(roots) or full + "/" in roots

    def deny(message: str):
        raise PermissionError(f"{message} (not available in the CodeAct worker)")

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(flags, int) and flags & _WRITE_FLAGS) or (
                isinstance(mode, str) and any(c in mode for c in "wax+")
            )
            if writing:
                deny(f"writing files: {path!r}")
            if not readable(path):
                deny(f"reading {path!r}")
        elif event == "import":
            name = args[0]
            if name in _BLOCKED_IMPORTS or name.startswith("ctypes."):
                raise ImportError(f"import of {name!r} is not available in the CodeAct worker")
        elif event in _PROCESS_EVENTS:
            deny("starting processes")
        elif event == "os.kill":
            if args[0] not in (me, 0) or args[0] == 0:
                deny("sending signals to other processes")
        elif event in ("os.killpg", "signal.pidfd_send_signal", "os.pidfd_open"):
            deny("sending signals to other processes")
        elif event == "socket.__new__":
            if len(args) > 1 and args[1] not in (-1, socket.AF_UNIX):
                deny("network sockets")
        elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.gethostbyname_ex", "socket.getnameinfo"):  # fmt: skip
            deny("name resolution")
        elif event in ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"):
            addr = args[1] if len(args) > 1 else None
            if not isinstance(addr, (str, bytes)):
                deny("network sockets")
        elif event.startswith("ctypes."):
            deny("ctypes")
        elif event in ("resource.setrlimit", "resource.prlimit"):
            deny("changing resource limits")
        elif event in _FS_CHANGE_EVENTS:
            deny("changing the file system")
        elif event in ("os.listdir", "os.scandir"):
            path = args[0] if args and args[0] is not None else "."
            if isinstance(path, int) or not readable(path):
                deny(f"listing {path!r}")
        elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents"):
            deny("walking the garbage collector's objects")

    sys.addaudithook(hook)
    # Functions that bypass auditing.
    import _posixsubprocess  # noqa: F401  (loaded by subprocess/asyncio already)
    import _signal
    import posix

    for mod, names in (
        (os, ("pidfd_open",)),
        (posix, ("pidfd_open",)),
        (signal, ("pidfd_send_signal",)),
        (_signal, ("pidfd_send_signal",)),
        (sys.modules["_posixsubprocess"], ("fork_exec",)),
    ):
        for name in names:
            if hasattr(mod, name):
                delattr(mod, name)
    import _thread
    import threading

    def no_threads(*args, **kwargs):
        raise PermissionError("starting threads (not available in the CodeAct worker)")

    threading._start_new_thread = no_threads
    for name in ("start_new_thread", "start_new"):
        if hasattr(_thread, name):
            delattr(_thread, name)
    for name in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.") or m == "_ctypes"]:
        del sys.modules[name]


def _timer(signum, frame):
    kind = "wall-clock" if signum == signal.SIGALRM else "CPU"
    raise CellTimeout(f"the cell exceeded its {kind} time limit")


def _detach() -> None:
    try:
        os.setsid()  # its own process group: the trainer kills the worker (and anything it made) at once
    except OSError:
        pass
    os.chdir("/")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _serve_assigned(rfd: int, wfd: int, config: dict) -> None:
    """Apply the session's limits (lowering limits needs no privilege), install the audit hook, serve."""
    os.set_blocking(rfd, False)
    _apply_rlimits(config)
    signal.signal(signal.SIGALRM, _timer)
    signal.signal(signal.SIGPROF, _timer)
    signal.signal(signal.SIGXCPU, _timer)
    worker = Worker(rfd, wfd, config)

    class _Policy(asyncio.DefaultEventLoopPolicy):
        def new_event_loop(self):  # asyncio.run(...) in a cell gets a turn-taking loop too
            return worker._new_loop()

    asyncio.set_event_loop_policy(_Policy())
    _install_audit_hook()
    sys.argv = [""]
    worker.serve()


def worker_main(rfd: int, wfd: int, config: dict) -> None:
    """A worker forked for one request: isolate, then serve cells until the trainer closes the pipe."""
    _detach()
    config["isolation"] = _enter_namespaces([rfd, wfd], bool(config.get("namespaces", True)))
    _serve_assigned(rfd, wfd, config)


def spare_main(chan: socket.socket) -> None:
    """A worker made ahead of time: isolated already, it waits for its pipes and its session's config."""
    _detach()
    isolation = _enter_namespaces([chan.fileno()], True)
    try:
        msg, fds, _flags, _addr = socket.recv_fds(chan, 1 << 16, 4)
    except OSError:
        os._exit(0)
    if not msg or len(fds) != 2:
        os._exit(0)  # the zygote is gone
    chan.close()
    config = json.loads(msg)
    config["isolation"] = isolation
    _serve_assigned(fds[0], fds[1], config)


# --- the zygote ------------------------------------------------------------------------------------------
def zygote_main(sock_fd: int, n_spares: int) -> None:
    """Serve the trainer's requests, in order, one JSON reply line each:

    * ``spawn`` (+ 2 fds: the worker's read and write ends) -> ``{"pid": n}``: hand the pipes to a spare
      worker (isolated in advance; refilled after the reply, off the trainer's critical path), or fork one;
    * ``poll`` ``{"ticket": t}`` -> ``{"status": wait status or None}``: how a worker ended, if it has;
    * ``stop`` ``{"ticket": t}`` -> ``{"status": ...}``: kill it if it runs, reap it, forget it.

    A ticket is the index of the ``spawn`` request in the stream (both sides count), so the trainer never
    waits for a spawn reply. Only the zygote signals workers: an unreaped child's pid cannot be reused.
    """
    import array  # noqa: F401  (used by socket.recv_fds)
    import sysconfig  # noqa: F401

    try:
        import ctypes  # noqa: F401  (warm: workers use it to unshare, then lose it)
    except ImportError:
        pass
    global _READ_ROOTS
    _READ_ROOTS = _read_roots()
    sock = socket.socket(fileno=sock_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    live: set[int] = set()  # forked and not yet reaped
    statuses: dict[int, int] = {}
    tickets: dict[int, int] = {}  # spawn request index -> pid
    spares: list[tuple[int, socket.socket]] = []
    pending = b""
    fd_queue: list[int] = []  # fds arrive with the first bytes of their spawn line, maybe with other lines
    n_requests = 0

    def reap(pid: int = -1, block: bool = False) -> None:
        while live:
            try:
                got, status = os.waitpid(pid, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return
            if got == 0:
                return
            live.discard(got)
            statuses[got] = status
            if len(statuses) > 4096:
                statuses.pop(next(iter(statuses)))
            if pid != -1:
                return

    def make_spare() -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        child = os.fork()
        if child == 0:
            try:
                sock.close()
                ours.close()
                for _, other in spares:
                    other.close()
                spare_main(theirs)
            finally:
                os._exit(4)
        theirs.close()
        live.add(child)
        spares.append((child, ours))

    def spawn(rfd: int, wfd: int, config: dict) -> int:
        if not config.get("namespaces", True):
            child = os.fork()
            if child == 0:
                try:
                    sock.close()
                    for _, other in spares:
                        other.close()
                    worker_main(rfd, wfd, config)
                finally:
                    os._exit(4)
            live.add(child)
            return child
        while True:
            if not spares:
                make_spare()
            child, chan = spares.pop(0)
            try:
                socket.send_fds(chan, [json.dumps(config).encode()], [rfd, wfd])
                return child
            except OSError:  # that spare died: take another
                continue
            finally:
                chan.close()

    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 4)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)
        pending += msg
        fd_queue.extend(fds)
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            req = json.loads(line)
            reply: dict = {}
            reap()
            op = req.get("op")
            pid = tickets.get(int(req.get("ticket", -1)), -1)
            if op == "spawn" and len(fd_queue) >= 2:
                rfd, wfd = fd_queue.pop(0), fd_queue.pop(0)
                child = spawn(rfd, wfd, req.get("config", {}))
                os.close(rfd)
                os.close(wfd)
                tickets[n_requests] = child
                reply = {"pid": child}
            elif op == "poll":
                reply = {"status": statuses.get(pid)}
            elif op == "stop":
                if pid in live:
                    for kill in (os.killpg, os.kill):
                        try:
                            kill(pid, signal.SIGKILL)
                            break
                        except OSError:
                            continue
                    reap(pid, block=True)
                reply = {"status": statuses.pop(pid, None)}
                tickets.pop(int(req.get("ticket", -1)), None)
            n_requests += 1
            sock.sendall(dumps(reply))
            if op == "spawn":
                while len(spares) < n_spares:
                    make_spare()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "zygote":
        zygote_main(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit("usage: python -I -S worker.py zygote FD N_SPARES  (started by common.codeact.executor)")
