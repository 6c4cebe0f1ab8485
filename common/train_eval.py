"""Held-out evaluation during training (verl's ``test_freq``): ``--eval-tasks FILE --eval-every N``.

At optimizer step 0, every N steps and at the last step, the run evaluates its CURRENT policy on a held-out
task file with ``sera eval``'s protocol (``common.eval.evaluate``: greedy, one trajectory per task, root
success judged by the environment) on the engine the run already has (no restart, no weight export), and
logs one row to metrics.jsonl / TensorBoard:

    {"round": R, "step": S, "eval/success": 0.25, "eval/success_ci95": 0.15, "eval/success_easy": 0.25,
     "eval/n_tasks": 32, "time/eval_s": 9.8}

With ``--eval-samples K`` the same tasks also run K times at the rollout temperature (1.0: the policy RL
trains and samples from; greedy success moves only when an argmax flips), each sample with its own seed
(:func:`sampled_eval_seed`: no two training seeds share one) and directory (``OUT/evals/step_SSSSS_sample_k/``), all in flight together with the greedy pass, and the row adds
``eval/sampled_success`` (the mean over tasks of each task's success rate over its K samples),
``eval/sampled_ci95`` and ``eval/sampled_k``. Every ``*_ci95`` is the half-width of a 95 % interval over
tasks (1.96 standard errors of the mean of the per-task values).

``round`` is the next round to run, so a resumed run's ``truncate_logs`` drops that row together with the
rounds after the checkpoint, and the loop writes it again from ``OUT/evals/step_SSSSS/`` (the evaluation's
own resumable directory: finished tasks are read back, not re-run).

The agent evaluated is the agent that trains: every setting of :data:`AGENT_SETTINGS` (steps, depth, prompt
and reply caps, rubric and score caps, step and tree deadlines, launch and agent bounds) is the run's own
rollout setting, not ``sera eval``'s paper caps; the run says so in one ``[eval]`` line before the first
evaluation, and each evaluation's ``report.json`` records them (``agent_settings``). What stays the
protocol's: greedy decoding (the sampled passes: the rollout temperature), one trajectory per task, no
counterfactual branches, root success judged by the environment.
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


AGENT_SETTINGS = (
    "max_steps", "max_depth", "max_prompt_tokens", "max_new_tokens", "rubric_max_new_tokens",
    "score_max_new_tokens", "step_timeout_s", "tree_timeout_s", "cancel_grace_s", "max_launches_per_step",
    "max_agents_per_tree", "prompts_dir",
)  # fmt: skip
"""The rollout settings the in-run evaluation takes from the run (the agent that trains), in place of
``sera eval``'s protocol values. Not taken: the temperature (greedy; the sampled passes use the rollout's),
the Rubric stage's counterfactual branches and environment budget, the training group's deadline."""


def agent_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The trained agent's :data:`AGENT_SETTINGS`, as the in-run evaluation runs them.

    >>> s = agent_settings(TrainConfig.make(step_timeout_s=60, max_launches_per_step=4))
    >>> s["max_prompt_tokens"], s["step_timeout_s"], s["max_launches_per_step"]
    (2048, 60, 4)
    """
    return {name: getattr(cfg.rollout, name) for name in AGENT_SETTINGS}


def settings_line(cfg: TrainConfig) -> str:
    """The one line a run prints before its first in-run evaluation: which agent is evaluated."""
    a = agent_settings(cfg)

    def bound(n: int) -> str:
        return str(n) if n else "no bound"

    return (
        f"[eval] held-out evaluation with the trained agent's settings (not sera eval's paper caps): "
        f"{a['max_steps']} steps, depth {a['max_depth']}, prompt cap {a['max_prompt_tokens']}, reply cap "
        f"{a['max_new_tokens']}, step deadline {a['step_timeout_s']:g} s, tree deadline {a['tree_timeout_s']:g} s, "
        f"launches per step {bound(a['max_launches_per_step'])}, agents per tree {bound(a['max_agents_per_tree'])}"
        f"; greedy{f' + {cfg.eval_samples} sampled passes' if cfg.eval_samples else ''}"
    )


def sampled_eval_seed(seed: int, k: int) -> int:
    """The seed of sampled pass ``k`` of training seed ``seed``: the Cantor pairing of the two, one-to-one,
    so no two (training seed, sample) pairs share a seed (``seed + 1 + k`` made seed 0's sample 1 seed 1's
    sample 0). It depends on nothing else, so SERA and RAO at one training seed sample with the same seeds.

    >>> [sampled_eval_seed(0, k) for k in range(3)], [sampled_eval_seed(1, k) for k in range(3)]
    ([0, 2, 5], [1, 4, 8])
    """
    return (seed + k) * (seed + k + 1) // 2 + k


def eval_config(cfg: TrainConfig, step: int, sample: int | None = None) -> Any:
    """The ``sera eval`` config of the evaluation at ``step`` (its directory: ``OUT/evals/step_SSSSS``);
    with ``sample`` k, the k-th sampled pass (``OUT/evals/step_SSSSS_sample_k``: the rollout temperature,
    seed :func:`sampled_eval_seed`). The agent's other settings: :func:`agent_settings`."""
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
        seed=cfg.seed if sample is None else sampled_eval_seed(cfg.seed, sample),
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
    said: bool = False
    """Whether :func:`settings_line` was logged."""

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
            agent = agent_settings(self.cfg)  # the agent that trains, not sera eval's paper caps
            return await asyncio.gather(*(evaluate(c, inner, False, agent) for c in configs))

        reports = asyncio.run(all_passes())
        self.done.add(step)
        row = eval_row(reports[0], rnd, step, time.perf_counter() - t0)
        if self.cfg.eval_samples:
            row.update(sampled_row([Path(c.out) for c in configs[1:]]))
        return row

    def log_if_due(self, policy: Any, rnd: int, step: int, writer: Any, log: Any) -> None:
        """Evaluate if due; write the row with ``writer`` (a MetricsWriter) and one line with ``log`` (before
        the first evaluation, :func:`settings_line` too)."""
        if not self.said and eval_due(self.cfg, step) and step not in self.done:
            log(settings_line(self.cfg))
            self.said = True
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
