"""Held-out evaluation during training (verl's ``test_freq``): ``--eval-tasks FILE --eval-every N``.

At optimizer step 0, every N steps and at the last step, the run evaluates its CURRENT policy on a held-out
task file with ``sera eval``'s protocol (``common.eval.evaluate``: greedy, one trajectory per task, root
success judged by the environment) on the engine the run already has (no restart, no weight export), and
logs one row to metrics.jsonl / TensorBoard:

    {"round": R, "step": S, "eval/success": 0.25, "eval/success_easy": 0.25, "eval/n_tasks": 32,
     "time/eval_s": 9.8}

``round`` is the next round to run, so a resumed run's ``truncate_logs`` drops that row together with the
rounds after the checkpoint, and the loop writes it again from ``OUT/evals/step_SSSSS/`` (the evaluation's
own resumable directory: finished tasks are read back, not re-run). Agent sizes (steps, reply tokens, depth)
are the run's own rollout settings, so the held-out number measures the same agent that trains.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.train_config import TrainConfig


def eval_due(cfg: TrainConfig, step: int) -> bool:
    """Whether the policy at optimizer step ``step`` is evaluated: step 0, every ``eval_every`` steps, the
    last step.

    >>> cfg = TrainConfig(steps=12, eval_every=5, eval_tasks="held_out.jsonl")
    >>> [s for s in range(13) if eval_due(cfg, s)]
    [0, 5, 10, 12]
    >>> eval_due(TrainConfig(steps=12), 0)  # no --eval-tasks: never
    False
    """
    if not cfg.eval_tasks or cfg.eval_every < 1:
        return False
    return step % cfg.eval_every == 0 or step == cfg.steps


def eval_policy(policy: Any) -> Any:
    """The plain engine under the run's wrappers: live-stat counting (``inner``) and the teacher-forced
    oracle mix (``model``), which must not write held-out replies."""
    from common.policy.forced import TeacherForcedPolicy
    from common.run.progress import CountingPolicy

    while isinstance(policy, (CountingPolicy, TeacherForcedPolicy)):
        policy = policy.inner if isinstance(policy, CountingPolicy) else policy.model
    return policy


def eval_config(cfg: TrainConfig, step: int) -> Any:
    """The ``sera eval`` config of the evaluation at ``step`` (its directory: ``OUT/evals/step_SSSSS``)."""
    from common.eval import EvalConfig

    n = cfg.eval_limit
    return EvalConfig(
        env=cfg.env,
        tasks=cfg.eval_tasks or "",
        policy=f"run:{Path(cfg.out).name}@step{step}",
        out=str(Path(cfg.out) / "evals" / f"step_{step:05d}"),
        concurrency=10**6,  # every task in flight: their calls share the engine's batches
        limit=n,
        temperature=0.0,
        max_steps=cfg.rollout.max_steps,
        max_depth=cfg.rollout.max_depth,
        max_new_tokens=cfg.rollout.max_new_tokens,
        seed=cfg.seed,
        prompts_dir=cfg.rollout.prompts_dir,
    )


def eval_row(report: dict[str, Any], rnd: int, step: int, seconds: float) -> dict[str, Any]:
    """The metrics row of one evaluation (``eval/success`` and one ``eval/success_TIER`` per tier)."""
    row: dict[str, Any] = {
        "round": rnd,
        "step": step,
        "eval/success": report["success_rate"],
        "eval/n_tasks": report["n_tasks"],
        "eval/errors": report["errors"],
        "time/eval_s": seconds,
    }
    for tier, t in report["per_tier"].items():
        row[f"eval/success_{tier}"] = t["rate"]
    return row


@dataclass
class InRunEval:
    """Evaluates at the steps :func:`eval_due` names, at most once per step in this process."""

    cfg: TrainConfig
    done: set[int] = field(default_factory=set)

    def __call__(self, policy: Any, rnd: int, step: int) -> dict[str, Any] | None:
        """Evaluate ``policy`` (the run's engine, holding the weights of ``step``) if due; returns the row to
        log, or None. Call it where no rollout is in flight (it runs its own asyncio loop)."""
        if step in self.done or not eval_due(self.cfg, step):
            return None
        from common.eval import evaluate

        t0 = time.perf_counter()
        report = asyncio.run(
            evaluate(eval_config(self.cfg, step), policy=eval_policy(policy), progress=False)
        )
        self.done.add(step)
        return eval_row(report, rnd, step, time.perf_counter() - t0)

    def log_if_due(self, policy: Any, rnd: int, step: int, writer: Any, log: Any) -> None:
        """Evaluate if due; write the row with ``writer`` (a MetricsWriter) and one line with ``log``."""
        if (row := self(policy, rnd, step)) is not None:
            writer.write(row)
            log(eval_line(row))


def eval_line(row: dict[str, Any]) -> str:
    """One log line for an evaluation row."""
    tiers = " ".join(
        f"{k.removeprefix('eval/success_')}={v:.3f}" for k, v in row.items() if k.startswith("eval/success_")
    )
    return (
        f"eval step={row['step']} success={row['eval/success']:.3f} ({tiers}) n={row['eval/n_tasks']} "
        f"errors={row['eval/errors']} {row['time/eval_s']:.1f}s"
    )
