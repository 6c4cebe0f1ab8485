"""Live progress: what is happening INSIDE a step (agents at work, model calls, tokens/s), not only a
step counter that sits at 0/N for a minute. :class:`CountingPolicy` wraps any policy and counts; the
display reads the counts from rich's refresh thread, so it moves while the event loop is busy."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

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

    def reset(self) -> None:
        self.calls, self.tokens, self.t0 = 0, 0, time.perf_counter()

    def line(self) -> str:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        return f"{self.in_flight} calls in flight | {self.calls} calls | {self.tokens} tokens | {self.tokens / dt:.1f} tok/s"


class CountingPolicy(Policy):
    """Delegates to ``inner`` and counts calls and tokens in ``stats`` (every other attribute passes through)."""

    def __init__(self, inner: Policy, stats: LiveStats):
        self.inner, self.stats = inner, stats
        self.name, self.trainable = inner.name, inner.trainable

    async def generate(self, request: GenerationRequest) -> Completion:
        self.stats.in_flight += 1
        try:
            out = await self.inner.generate(request)
        finally:
            self.stats.in_flight -= 1
        self.stats.calls += 1
        self.stats.tokens += len(out.output_ids) or len(out.text.split())
        return out

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __getattr__(self, name: str) -> Any:  # tokenizer, model, ... of the wrapped policy
        return getattr(self.inner, name)


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


class RunProgress:
    """A step bar plus a live status line; ``log(line)`` prints above it. Plain prints when disabled."""

    def __init__(self, enabled: bool, total: int, done: int, stats: LiveStats, label: str = "train"):
        self.stats, self.enabled, self.bar = stats, enabled, None
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn
        from rich.text import Text

        live = stats

        class StatsColumn(ProgressColumn):
            def render(self, task: Any) -> Text:
                return Text(f"{task.fields.get('phase', '')} | {live.line()}", style="dim")

        self.bar = Progress(
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            StatsColumn(),
            refresh_per_second=4,
        )
        self.bar.start()
        self.task = self.bar.add_task(label, total=total, completed=done, phase="")

    def phase(self, text: str) -> None:
        """What the loop is doing now (``rollouts``, ``training``)."""
        if text == "rollouts":
            self.stats.reset()
        if self.bar is not None:
            self.bar.update(self.task, phase=text)

    def log(self, line: str, done: int | None = None) -> None:
        if self.bar is None:
            print(line, flush=True)
            return
        self.bar.console.print(line, highlight=False)
        if done is not None:
            self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
