"""A stop request (Ctrl-C, a plain ``kill``) that is never lost (issue #52.3).

Python runs a signal handler between two bytecodes of the main thread, wherever it is. A handler that raises
``KeyboardInterrupt`` there usually stops the run, but when it lands inside a weakref callback, a ``__del__``
or a garbage-collector callback Python prints "Exception ignored in ..." and carries on: the stop is lost
(4 of 12 ``kill``s of a level-0 run, issue #52). So a stop is a flag first, then an exception:

* :func:`request` (the CLI's signal handler) sets the flag; the handler then raises ``KeyboardInterrupt`` at
  once, which is right nearly every time (inside a running event loop it schedules the raise as a callback of
  its own, :func:`raise_soon`: it then leaves the loop between two callbacks, never inside a task);
* :func:`check` raises ``KeyboardInterrupt`` while a stop is requested and nobody has taken it up yet: the
  loops call it at points where an exception is always seen (between rounds and phases, between training
  datums, in the engine's batching loop), so a swallowed one is raised again there;
* a watchdog thread (:func:`start_watchdog`) interrupts the main thread again every
  :data:`RETRY_S` seconds until the stop is taken up, and after :data:`LAST_RESORT_S` seconds calls the
  command's last resort (print what was saved and the resume command, exit 130: checkpoints and logs are
  written atomically, so a hard exit loses nothing a resume needs);
* :func:`acknowledge` (the CLI's ``except KeyboardInterrupt``) says the stop is being carried out: nothing
  is raised any more, the watchdog ends;
* :func:`requested` tells background work (the engine's decoding thread, the heartbeat) to stop at once, so
  nothing decodes or prints after the resume line and the process ends when it says it does.

Pure Python, no project imports: every floor may use it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable

RETRY_S = 3.0
"""Seconds between the watchdog's interrupts of a main thread that has not taken the stop up."""
LAST_RESORT_S = 10.0
"""Seconds after the request when the watchdog gives up on the main thread and calls the last resort."""

_lock = threading.Lock()
_requested_at: float | None = None
_acknowledged = False
_watchdog: threading.Thread | None = None
_last_resort: Callable[[], None] | None = None
_closers: list[weakref.WeakMethod] = []


def request() -> bool:
    """Record a stop request; True for the first one."""
    global _requested_at
    with _lock:
        first = _requested_at is None
        if first:
            _requested_at = time.monotonic()
    return first


def requested() -> bool:
    """Whether a stop was requested (background work ends at once)."""
    return _requested_at is not None


def pending() -> bool:
    """A stop was requested and nobody has taken it up yet."""
    return _requested_at is not None and not _acknowledged


class Stopped(RuntimeError):
    """What an engine hands a caller whose request it dropped because a stop was requested."""


def check() -> None:
    """Raise ``KeyboardInterrupt`` while a stop is :func:`pending` (main thread, at a point where an exception
    propagates: never inside a callback whose errors are ignored). Inside a running event loop it is raised
    from a callback of its own instead (:func:`raise_soon`), not inside the calling task."""
    if not pending() or threading.current_thread() is not threading.main_thread():
        return
    loop = running_loop()
    if loop is None:
        raise KeyboardInterrupt
    raise_soon(loop)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_raised_in: weakref.WeakSet = weakref.WeakSet()
"""The event loops a stop has left already (once per loop: ``asyncio.run``'s own clean-up, which runs the
loop again to cancel the tasks, must not be cut short by a second one)."""


def raise_if_pending() -> None:
    """A loop callback: ``KeyboardInterrupt`` while a stop is :func:`pending`, once per loop. Raised from a
    callback of its own, it leaves ``run_forever`` at once and ``asyncio.run`` cancels every task (no task
    ends holding it, so none is reported as "exception was never retrieved" after the resume line)."""
    loop = running_loop()
    if pending() and loop not in _raised_in:
        _raised_in.add(loop)
        raise KeyboardInterrupt


def raise_soon(loop: asyncio.AbstractEventLoop) -> None:
    """Schedule :func:`raise_if_pending` on ``loop`` (from any thread, a signal handler included)."""
    if loop not in _raised_in:
        loop.call_soon_threadsafe(raise_if_pending)


def acknowledge() -> None:
    """The stop is being carried out (the resume line comes next): stop raising, end the watchdog, and close
    what registered with :func:`when_stopped` (a live progress bar, its heartbeat)."""
    global _acknowledged
    _acknowledged = True
    while _closers:
        close = _closers.pop()()
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - closing a display never hides the resume line
                pass


def when_stopped(method: Callable[[], None]) -> None:
    """Call the bound ``method`` (held weakly) when a stop is taken up (:func:`acknowledge`)."""
    _closers.append(weakref.WeakMethod(method))


def set_last_resort(fn: Callable[[], None] | None) -> None:
    """What the watchdog calls when the main thread has not taken the stop up after :data:`LAST_RESORT_S`
    (it must end the process: print the resume line and ``os._exit(130)``)."""
    global _last_resort
    _last_resort = fn


def start_watchdog(interrupt: Callable[[], None]) -> None:
    """Start (once) the thread that calls ``interrupt()`` (say ``_thread.interrupt_main``) every
    :data:`RETRY_S` while the stop is :func:`pending`, then the last resort."""
    global _watchdog
    with _lock:
        if _watchdog is not None:
            return
        _watchdog = threading.Thread(target=_watch, args=(interrupt,), name="sera-stop-watchdog", daemon=True)
    _watchdog.start()


def _watch(interrupt: Callable[[], None]) -> None:
    while True:
        time.sleep(RETRY_S)
        if not pending():
            return
        if _requested_at is not None and time.monotonic() - _requested_at >= LAST_RESORT_S and _last_resort:
            _last_resort()
            return
        interrupt()


def reset() -> None:
    """Forget any request (tests; a process that serves more than one command)."""
    global _requested_at, _acknowledged, _watchdog, _last_resort
    with _lock:
        _requested_at, _acknowledged, _watchdog, _last_resort = None, False, None, None
        _closers.clear()
