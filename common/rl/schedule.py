"""Stage schedule and method presets (SPEC.md §4).

Each optimizer step trains ONE stage. The stage of a step is read off the policy version (the number of
completed optimizer steps) from a repeating cycle written as ``"execution:16,delegation:2,rubric:2"``:
steps 0-15 Execution, 16-17 Delegation, 18-19 Rubric, step 20 Execution again, ...

The method presets are the ablation rows of the paper:

| preset        | execution reward of a child | rubrics written/scored | schedule                          |
|---------------|-----------------------------|------------------------|-----------------------------------|
| rao           | binary child success        | no                     | execution                         |
| rao_d         | binary child success        | no                     | execution:12,delegation:4         |
| sera_wo_d_rt  | rubric score s              | yes (never trained)    | execution                         |
| sera_wo_d     | rubric score s              | yes                    | execution:16,rubric:2             |
| sera          | rubric score s              | yes                    | execution:16,delegation:2,rubric:2|

Leaf delegation reward is on exactly when ``delegation`` is in the schedule; rubric (ranking) training
exactly when ``rubric`` is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

STAGES = ("execution", "delegation", "rubric")
Stage = Literal["execution", "delegation", "rubric"]


@dataclass(frozen=True)
class Schedule:
    """A repeating cycle of ``(stage, number of optimizer steps)``."""

    cycle: tuple[tuple[str, int], ...]

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """Parse ``"stage:steps,stage:steps,..."`` (a bare ``"execution"`` means ``execution:1``).

        >>> Schedule.parse("execution:16,delegation:2,rubric:2").period
        20
        """
        cycle: list[tuple[str, int]] = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            name, _, count = part.partition(":")
            name = name.strip()
            if name not in STAGES:
                raise ValueError(
                    f"unknown stage {name!r} in schedule {text!r}; stages are {', '.join(STAGES)}"
                )
            try:
                steps = int(count) if count.strip() else 1
            except ValueError:
                raise ValueError(
                    f"stage {name!r} in schedule {text!r} needs an integer step count, e.g. {name}:2"
                ) from None
            if steps < 1:
                raise ValueError(
                    f"stage {name!r} in schedule {text!r} has {steps} steps; drop the stage instead"
                )
            cycle.append((name, steps))
        if not cycle:
            raise ValueError(f"empty schedule {text!r}; write e.g. 'execution:16,delegation:2,rubric:2'")
        return cls(tuple(cycle))

    @property
    def period(self) -> int:
        """Length of one cycle in optimizer steps."""
        return sum(n for _, n in self.cycle)

    @property
    def stages(self) -> frozenset[str]:
        """The stages that occur in the cycle."""
        return frozenset(name for name, _ in self.cycle)

    def stage_at(self, step: int) -> str:
        """The stage of optimizer step ``step`` (= number of completed optimizer steps, 0-based).

        >>> s = Schedule.parse("execution:16,delegation:2,rubric:2")
        >>> [s.stage_at(i) for i in (0, 15, 16, 17, 18, 19, 20)]
        ['execution', 'execution', 'delegation', 'delegation', 'rubric', 'rubric', 'execution']
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        k = step % self.period
        for name, n in self.cycle:
            if k < n:
                return name
            k -= n
        raise AssertionError("unreachable: k < period")

    def __str__(self) -> str:
        return ",".join(f"{name}:{n}" for name, n in self.cycle)


def stage_at(schedule: str | Schedule, step: int) -> str:
    """Functional form of :meth:`Schedule.stage_at`.

    >>> stage_at("execution:16,rubric:2", 17)
    'rubric'
    """
    sched = schedule if isinstance(schedule, Schedule) else Schedule.parse(schedule)
    return sched.stage_at(step)


@dataclass(frozen=True)
class MethodPreset:
    """One training method (an ablation row)."""

    name: str
    """Preset name (``rao``, ``rao_d``, ``sera_wo_d_rt``, ``sera_wo_d``, ``sera``)."""
    execution_reward: Literal["binary", "rubric"]
    """Execution reward of a non-root node: ``binary`` = the child's verified success (program check or
    external judge, RAO); ``rubric`` = the policy's own score s against its frozen rubric (SERA)."""
    schedule: str
    """The stage cycle, e.g. ``execution:16,delegation:2,rubric:2``."""
    description: str = ""
    """One line for logs and ``--help``."""

    @property
    def parsed_schedule(self) -> Schedule:
        return Schedule.parse(self.schedule)

    @property
    def generate_rubrics(self) -> bool:
        """Rubrics are written (before each child) and scored (after) iff child rewards come from them."""
        return self.execution_reward == "rubric"

    @property
    def train_rubrics(self) -> bool:
        """Rubric-generation tokens are trained on counterfactual branches (Rubric stage in the cycle)."""
        return "rubric" in self.parsed_schedule.stages

    @property
    def leaf_delegation_reward(self) -> bool:
        """Launch statements are trained with leaf credit (Delegation stage in the cycle)."""
        return "delegation" in self.parsed_schedule.stages

    def __post_init__(self) -> None:
        if self.execution_reward not in ("binary", "rubric"):
            raise ValueError(f"execution_reward must be 'binary' or 'rubric', got {self.execution_reward!r}")
        sched = Schedule.parse(self.schedule)
        if "rubric" in sched.stages and self.execution_reward != "rubric":
            raise ValueError(
                f"preset {self.name!r}: a rubric stage needs execution_reward='rubric' (rubrics are written)"
            )


PRESETS: dict[str, MethodPreset] = {
    p.name: p
    for p in (
        MethodPreset("rao", "binary", "execution:1", "RAO: binary per-node execution reward, no rubrics"),
        MethodPreset(
            "rao_d", "binary", "execution:12,delegation:4", "RAO + leaf delegation reward (public 12:4)"
        ),
        MethodPreset(
            "sera_wo_d_rt",
            "rubric",
            "execution:1",
            "SERA w/o D & RT: rubric-score rewards, rubrics untrained",
        ),
        MethodPreset("sera_wo_d", "rubric", "execution:16,rubric:2", "SERA w/o D: + ranking-trained rubrics"),
        MethodPreset(
            "sera", "rubric", "execution:16,delegation:2,rubric:2", "SERA: + leaf delegation reward"
        ),
    )
}


def get_preset(name: str) -> MethodPreset:
    """The preset called ``name`` (case-insensitive; ``-`` and ``_`` are interchangeable).

    >>> p = get_preset("sera")
    >>> p.execution_reward, p.generate_rubrics, p.train_rubrics, p.leaf_delegation_reward
    ('rubric', True, True, True)
    >>> get_preset("rao").leaf_delegation_reward
    False
    """
    key = name.strip().lower().replace("-", "_")
    if key not in PRESETS:
        raise ValueError(f"unknown method {name!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[key]
