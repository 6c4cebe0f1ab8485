"""Held-out evaluation during training (verl's ``test_freq``): ``--eval-tasks FILE --eval-every N``.

At optimizer step 0, every N steps and at the last step, the run evaluates its CURRENT policy on a held-out
task file with ``sera eval``'s protocol (``common.eval.evaluate``: greedy, one trajectory per task, root
success judged by the environment) on the engine the run already has (no restart, no weight export), and
logs one row to metrics.jsonl / TensorBoard:

    {"round": R, "step": S, "eval/success": 0.25, "eval/success_ci95": 0.15, "eval/success_easy": 0.25,
     "eval/n_tasks": 32, "time/eval_s": 9.8}

With ``--eval-samples K`` the same tasks also run K times at the rollout temperature (1.0: the policy RL
trains and samples from; greedy success moves only when an argmax flips), each sample with its own seed and
directory (``OUT/evals/step_SSSSS_sample_k/``), all in flight together with the greedy pass, and the row adds
``eval/sampled_success`` (the mean over tasks of each task's success rate over its K samples),
``eval/sampled_ci95`` and ``eval/sampled_k``. Every ``*_ci95`` is the half-width of a 95 % interval over
tasks (1.96 standard errors of the mean of the per-task values).

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


def eval_config(cfg: TrainConfig, step: int, sample: int | None = None) -> Any:
    """The ``sera eval`` config of the evaluation at ``step`` (its directory: ``OUT/evals/step_SSSSS``);
    with ``sample`` k, the k-th sampled pass (``OUT/evals/step_SSSSS_sample_k``: the rollout temperature,
    seed ``seed + 1 + k``)."""
    from common.eval import EvalConfig

    n = cfg.eval_limit
    name = f"step_{step:05d}" + ("" if sample is None else f"_sample_{sample}")
    return EvalConfig(
        env=cfg.env,
        tasks=cfg.eval_tasks or "",
        policy=f"run:{Path(cfg.out).name}@step{step}",
        out=str(Path(cfg.out) / "evals" / name),
        concurrency=10**6,  # every task in flight: their calls share the engine's batches
        limit=n,
        temperature=0.0 if sample is None else cfg.rollout.temperature,
        max_steps=cfg.rollout.max_steps,
        max_depth=cfg.rollout.max_depth,
        max_new_tokens=cfg.rollout.max_new_tokens,
        seed=cfg.seed if sample is None else cfg.seed + 1 + sample,
        prompts_dir=cfg.rollout.prompts_dir,
    )


def ci95(values: list[float]) -> float:
    """Half-width of the 95 % interval of the mean of ``values`` (1.96 standard errors; the sample standard
    deviation, so 0/1 values give the binomial interval's normal approximation).

    >>> round(ci95([1, 0, 0, 0]), 4)   # p = 0.25, sd 0.5, n 4: 1.96 * 0.5 / 2
    0.49
    >>> ci95([1.0]), ci95([])
    (0.0, 0.0)
    """
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return 1.96 * (var / n) ** 0.5


def per_task_success(directory: Path) -> dict[str, float]:
    """``{task_id: 1.0 | 0.0}`` of one evaluation directory (an errored task counts as a failure)."""
    from common.eval import load_results

    return {
        str(r["task_id"]): float(bool(r.get("success")) and not r.get("error"))
        for r in load_results(Path(directory)).values()
    }


def sampled_row(directories: list[Path]) -> dict[str, float]:
    """``eval/sampled_success`` / ``eval/sampled_ci95`` / ``eval/sampled_k`` from the K sampled passes:
    each task's success rate over its samples, then the mean (and interval) over tasks."""
    passes = [per_task_success(d) for d in directories]
    tasks = sorted(set().union(*passes)) if passes else []
    rates = [sum(p.get(t, 0.0) for p in passes) / len(passes) for t in tasks]
    return {
        "eval/sampled_success": sum(rates) / len(rates) if rates else 0.0,
        "eval/sampled_ci95": ci95(rates),
        "eval/sampled_k": len(passes),
    }


def eval_row(report: dict[str, Any], rnd: int, step: int, seconds: float) -> dict[str, Any]:
    """The metrics row of one evaluation (``eval/success`` and one ``eval/success_TIER`` per tier)."""
    p, n = report["task_weighted_rate"], max(1, report["n_done"])
    row: dict[str, Any] = {
        "round": rnd,
        "step": step,
        "eval/success": report["success_rate"],
        "eval/success_ci95": 1.96 * (p * (1 - p) * n / max(1, n - 1) / n) ** 0.5,  # as ci95 over 0/1 tasks
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
        configs = [eval_config(self.cfg, step)]  # greedy, then the sampled passes: all in flight at once
        configs += [eval_config(self.cfg, step, k) for k in range(self.cfg.eval_samples)]
        inner = eval_policy(policy)

        async def all_passes() -> list[dict[str, Any]]:
            return await asyncio.gather(*(evaluate(c, policy=inner, progress=False) for c in configs))

        from common.run.rollout import run_round

        # bounded shutdown: a tree that ignores cancellation cannot hold the eval (issue #53)
        reports = run_round(all_passes(), self.cfg.rollout.cancel_grace_s, f"held-out eval at step {step}")
        self.done.add(step)
        row = eval_row(reports[0], rnd, step, time.perf_counter() - t0)
        if self.cfg.eval_samples:
            row.update(sampled_row([Path(c.out) for c in configs[1:]]))
        return row

    def log_if_due(self, policy: Any, rnd: int, step: int, writer: Any, log: Any) -> None:
        """Evaluate if due; write the row with ``writer`` (a MetricsWriter) and one line with ``log``."""
        if (row := self(policy, rnd, step)) is not None:
            writer.write(row)
            log(eval_line(row))


def eval_line(row: dict[str, Any]) -> str:
    """One log line for an evaluation row."""
    tiers = " ".join(
        f"{k.removeprefix('eval/success_')}={v:.3f}"
        for k, v in row.items()
        if k.startswith("eval/success_") and k != "eval/success_ci95"
    )
    sampled = (
        f" sampled={row['eval/sampled_success']:.3f}±{row['eval/sampled_ci95']:.3f} (k={row['eval/sampled_k']})"
        if "eval/sampled_success" in row
        else ""
    )
    return (
        f"eval step={row['step']} success={row['eval/success']:.3f}±{row.get('eval/success_ci95', 0.0):.3f} "
        f"({tiers}){sampled} n={row['eval/n_tasks']} errors={row['eval/errors']} {row['time/eval_s']:.1f}s"
    )
