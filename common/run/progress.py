"""Live progress: what is happening INSIDE a step (agents at work, model calls, tokens/s), not only a
step counter that sits at 0/N for a minute. :class:`CountingPolicy` wraps any policy and counts; the
display reads the counts from rich's refresh thread, so it moves while the event loop is busy.

A slow round says where it is: :class:`RunProgress` starts a heartbeat thread that says, every 30 s of a
round, where the trees in flight are and which model call is oldest (its kind, node and age): on a terminal
on the live status line, rewritten in place, in a plain log as a line at 30, 90, 210, 450 s and then every
300 s of a phase (:func:`beat_due`); when a deadline fires, :meth:`CountingPolicy.report_stuck` appends
every call in flight (and, for the vllm engine, each request's prompt length, sampling parameters and
output so far) to ``RUN/stuck_calls.jsonl``."""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import stop
from common.policy.base import Completion, GenerationRequest, Policy


@dataclass
class LiveStats:
    """Counters shared by the wrapped policy and the display."""

    calls: int = 0
    """Model calls finished."""
    tokens: int = 0
    """Output tokens generated."""
    in_flight: int = 0
    """Model calls running right now (one per waiting agent, rubric writer or scorer)."""
    t0: float = field(default_factory=time.perf_counter)
    open_calls: dict[int, tuple[float, str, dict[str, Any]]] = field(default_factory=dict)
    """The calls in flight: id -> (start, kind, the runtime's meta: node, depth, step)."""
    trees_started: int = 0
    """Root rollouts started since the last reset (``common.run.rollout.rollout_group`` counts them)."""
    trees_done: int = 0
    """... and finished (cut ones included)."""
    stuck_path: Path | None = None
    """Where :meth:`CountingPolicy.report_stuck` appends (the training loops: ``RUN/stuck_calls.jsonl``)."""
    policy: Any = None
    """The :class:`CountingPolicy` counting into these stats (the heartbeat asks it about the engine)."""
    deadlines: list[str] = field(default_factory=list)
    """What each deadline that fired since :meth:`deadline_line` last spoke said (``TASK: step 1 of node 0
    past 1800 s``, ``TASK: act call of node 0.1 past 1800 s``, ``TASK: tree past its deadline (3600 s)``)."""

    def deadline_line(self) -> str | None:
        """One console line for the deadlines that cut work since the last call (then forgotten), naming each
        deadline and the option that raises it; None when none fired. A cut step ends its agent (reward 0)
        and a cut tree drops its task group, so a slow machine's round can lose its data to them.

        >>> s = LiveStats(deadlines=["t1: step 1 of node 0 past 1800 s", "t2: tree past its deadline (3600 s)"])
        >>> print(s.deadline_line())
        [deadline] 1 agent cut by the step deadline (1800 s, --step-timeout-s): t1: step 1 of node 0 past 1800 s; each ended with an error and reward 0; 1 tree cut by the tree or group deadline (--tree-timeout-s, --group-timeout-s): t2: tree past its deadline (3600 s); its task group is dropped and replaced. On a slow or shared machine raise --step-timeout-s and --tree-timeout-s / --group-timeout-s.
        >>> s.deadline_line() is None
        True
        """
        fired, self.deadlines = self.deadlines, []
        if not fired:
            return None
        trees = [r for r in fired if "tree past its deadline" in r]
        steps = [r for r in fired if "tree past its deadline" not in r]
        parts = []
        if steps:
            limit = steps[0].rsplit(" past ", 1)[-1]
            parts.append(
                f"{len(steps)} agent{'s' if len(steps) > 1 else ''} cut by the step deadline ({limit}, "
                f"--step-timeout-s): {steps[0]}; each ended with an error and reward 0"
            )
        if trees:
            parts.append(
                f"{len(trees)} tree{'s' if len(trees) > 1 else ''} cut by the tree or group deadline "
                f"(--tree-timeout-s, --group-timeout-s): {trees[0]}; its task group is dropped and replaced"
            )
        options = (("--step-timeout-s", steps), ("--tree-timeout-s / --group-timeout-s", trees))
        flags = " and ".join(f for f, hit in options if hit)
        return f"[deadline] {'; '.join(parts)}. On a slow or shared machine raise {flags}."

    def reset(self) -> None:
        self.calls, self.tokens, self.t0 = 0, 0, time.perf_counter()
        self.trees_started = self.trees_done = 0

    def oldest_call(self) -> str:
        """``act call of node 0.2 (step 1) for 64 s``, or ``no call in flight``."""
        calls = list(self.open_calls.values())
        if not calls:
            return "no call in flight"
        start, kind, meta = min(calls, key=lambda c: c[0])
        step = f" step {meta['step']}" if "step" in meta else ""
        return f"oldest: {kind} call of node {meta.get('node_id', '?')}{step}, {time.perf_counter() - start:.0f} s"

    def oldest_age(self) -> float:
        """Seconds the oldest call in flight has been waiting (0 when none)."""
        starts = [c[0] for c in list(self.open_calls.values())]
        return time.perf_counter() - min(starts) if starts else 0.0

    def heartbeat_line(self, phase: str, seconds: float) -> str:
        """One line for a slow round: where it is and what it waits for (and, for the vllm engine, what its
        oldest request has produced so far)."""
        trees = ""
        if self.trees_started:
            trees = f"{self.trees_done}/{self.trees_started} trees done | "
        line = f"[heartbeat] {phase} for {seconds:.0f} s: {trees}{self.in_flight} calls in flight ({self.oldest_call()})"
        describe = getattr(getattr(self.policy, "inner", None), "describe_inflight", None)
        if callable(describe):
            reqs = describe()
            if reqs:
                r = reqs[0]
                line += (
                    f" | engine: {len(reqs)} requests, oldest {r['age_s']:.0f} s: {r['prompt_tokens']} prompt"
                    f" tokens, {r.get('output_tokens', 0)}/{r['max_tokens']} output tokens"
                )
        return line

    def line(self) -> str:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        return f"{self.in_flight} calls in flight | {self.calls} calls | {self.tokens} tokens | {self.tokens / dt:.1f} tok/s"


class CountingPolicy(Policy):
    """Delegates to ``inner`` and counts calls and tokens in ``stats`` (every other attribute passes through)."""

    def __init__(self, inner: Policy, stats: LiveStats):
        self.inner, self.stats = inner, stats
        self.name, self.trainable = inner.name, inner.trainable
        self._ids = itertools.count()
        self._last_dump: dict[bool, float] = {}
        stats.policy = self

    async def generate(self, request: GenerationRequest) -> Completion:
        self.stats.in_flight += 1
        key = next(self._ids)
        self.stats.open_calls[key] = (time.perf_counter(), request.role, dict(request.meta or {}))
        try:
            out = await self.inner.generate(request)
        finally:
            self.stats.in_flight -= 1
            self.stats.open_calls.pop(key, None)
        self.stats.calls += 1
        self.stats.tokens += len(out.output_ids) or len(out.text.split())
        return out

    async def aclose(self) -> None:
        await self.inner.aclose()

    def report_stuck(self, reason: str) -> None:
        """A deadline fired (``common.agent.runtime``): append one JSON line to ``stats.stuck_path`` with the
        reason, every call in flight (kind, node, step, age) and, where the engine can say it
        (``describe_inflight``: the vllm engine), each request's prompt length, sampling parameters and
        output so far. At most one line per 10 s for deadlines (many trees of a group hit theirs together)
        and one per 60 s for the heartbeat's slow calls."""
        now = time.perf_counter()
        beat = reason.startswith("heartbeat")
        if not beat:
            self.stats.deadlines.append(reason)  # the console says so (RunProgress: LiveStats.deadline_line)
        if self.stats.stuck_path is None or now - self._last_dump.get(beat, -1e9) < (60.0 if beat else 10.0):
            return
        self._last_dump[beat] = now
        calls = [
            {"kind": kind, "age_s": round(now - start, 1), **{k: v for k, v in meta.items() if _plain(v)}}
            for start, kind, meta in sorted(self.stats.open_calls.values(), key=lambda c: c[0])
        ]
        describe = getattr(self.inner, "describe_inflight", None)
        engine = describe() if callable(describe) else None
        line = {"time": time.time(), "reason": reason, "calls": calls, "engine_requests": engine}
        path = Path(self.stats.stuck_path)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line, default=str) + "\n")

    def __getattr__(self, name: str) -> Any:  # tokenizer, model, ... of the wrapped policy
        return getattr(self.inner, name)


def _plain(v: Any) -> bool:
    return isinstance(v, (str, int, float, bool)) or v is None


def stats_column(stats: LiveStats, phase_field: str | None = None) -> Any:
    """A rich progress column that renders ``stats`` live (rich redraws it from its refresh thread), after
    the task's ``phase_field`` value if given."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class StatsColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            phase = f"{task.fields.get(phase_field, '')} | " if phase_field else ""
            return Text(phase + stats.line(), style="dim")

    return StatsColumn()


def beat_due(beats: int, every: float) -> float:
    """Seconds into a phase at which a log gets heartbeat line ``beats + 1``: the gaps double from ``every``
    up to ten times it (30 s: at 30, 90, 210, 450 s, then every 300 s).

    >>> [beat_due(k, 30.0) for k in range(6)]
    [30.0, 90.0, 210.0, 450.0, 750.0, 1050.0]
    """
    t, gap = 0.0, every
    for _ in range(beats + 1):
        t += gap
        gap = min(2 * gap, 10 * every)
    return t


class RunProgress:
    """A step bar plus a live status line; ``log(line)`` prints above it. Plain prints when disabled."""

    def __init__(
        self,
        enabled: bool,
        total: int,
        done: int,
        stats: LiveStats,
        label: str = "train",
        heartbeat_s: float = 30.0,
    ):
        self.stats, self.enabled, self.bar = stats, enabled, None
        self.in_place = False
        self.phase_text, self.phase_t0 = "", time.perf_counter()
        self._beside: tuple[str, float] | None = None  # rollouts running beside the phase (rollouts_begin)
        self.heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        self._beat = None
        stop.when_stopped(self.close)  # Ctrl-C / kill: the bar and its heartbeat end before the resume line
        if heartbeat_s > 0:  # prints from its own thread, so it speaks while the event loop waits
            self._beat = threading.Thread(target=self._heartbeat, name="sera-heartbeat", daemon=True)
            self._beat.start()
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn
        from rich.text import Text

        live = stats

        class StatsColumn(ProgressColumn):
            def render(self, task: Any) -> Text:
                beat = task.fields.get("beat") or ""
                return Text(f"{task.fields.get('phase', '')} | {live.line()}{beat}", style="dim")

        self.bar = Progress(
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            StatsColumn(),
            refresh_per_second=4,
        )
        self.bar.start()
        self.task = self.bar.add_task(label, total=total, completed=done, phase="", beat="")
        self.in_place = self.bar.console.is_terminal  # a terminal: the heartbeat rewrites the live line

    def phase(self, text: str) -> None:
        """What the loop is doing now (``execution rollouts``, ``training``). First, a line for every deadline
        that cut work in the phase before (:meth:`LiveStats.deadline_line`); a stop request that was swallowed
        before is raised here (common/stop.py)."""
        stop.check()
        self.say_deadlines()
        if text.endswith("rollouts"):
            self.stats.reset()
        self.phase_text, self.phase_t0 = text, time.perf_counter()
        if self.bar is not None:
            self.bar.update(self.task, phase=text, beat="")

    def rollouts_begin(self, text: str) -> None:
        """Rollouts started on another thread beside the loop's own phase (level 1's ``--max-staleness 1``:
        the next round rolls out while the loop trains or waits): the live counters restart for them, as a
        phase ending in ``rollouts`` restarts them, and until :meth:`rollouts_end` the heartbeat (and its
        stuck-call dump) speaks about them whatever the loop's phase is, as ``TEXT (trainer: PHASE)``."""
        self.stats.reset()
        self._beside = (text, time.perf_counter())

    def rollouts_end(self) -> None:
        self._beside = None

    def log(self, line: str, done: int | None = None) -> None:
        if self.bar is None:
            print(line, flush=True)
            return
        self.bar.console.print(line, highlight=False, markup=False, soft_wrap=True)  # text as is: no [tags]
        if done is not None:
            self.bar.update(self.task, completed=done)

    def _heartbeat(self) -> None:
        """Every ``heartbeat_s`` of a rollout phase, or of rollouts running beside the phase
        (:meth:`rollouts_begin`), where they are (a quick round says nothing): on a terminal rewritten in
        place on the live line; in a log one line at the :func:`beat_due` moments (30, 90, 210, 450 s, then
        every 300 s of a phase), so a slow round leaves a few lines, not one every 30 s."""
        beats, phase_t0 = 0, None
        while not self._stop.wait(self.heartbeat_s):
            if stop.requested():  # Ctrl-C / kill: nothing prints after the resume line
                return
            text, t0, beside = self.phase_text, self.phase_t0, self._beside
            if not text.endswith("rollouts"):
                if beside is None:
                    continue
                text, t0 = f"{beside[0]} (trainer: {text})", beside[1]
            if phase_t0 != t0:
                beats, phase_t0 = 0, t0
            seconds = time.perf_counter() - t0
            if seconds >= self.heartbeat_s:
                try:
                    line = self.stats.heartbeat_line(text, seconds)
                    bar = self.bar
                    if self.in_place and bar is not None:
                        bar.update(self.task, beat=" | " + line.removeprefix("[heartbeat] "))
                    elif seconds >= beat_due(beats, self.heartbeat_s):
                        self.log(line)
                        beats += 1
                    policy = self.stats.policy
                    if policy is not None and self.stats.oldest_age() >= 2 * self.heartbeat_s:
                        policy.report_stuck(f"heartbeat: a call waits for {self.stats.oldest_age():.0f} s")
                except Exception:  # noqa: BLE001 - a diagnostic never ends a run
                    pass

    def say_deadlines(self) -> None:
        """Print :meth:`LiveStats.deadline_line` when a deadline fired since it last spoke."""
        line = self.stats.deadline_line()
        if line:
            self.log(line)

    def close(self) -> None:
        self.say_deadlines()
        self._stop.set()
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
