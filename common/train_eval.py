"""Held-out evaluation during training (verl's ``test_freq``): ``--eval-tasks FILE --eval-every N``.

At optimizer step 0, every N steps and at the last step, the run evaluates its CURRENT policy on a held-out
task file with ``sera eval``'s protocol (``common.eval.evaluate``: greedy, one trajectory per task, root
success judged by the environment) on the engine the run already has (no restart, no weight export), and
logs one row to metrics.jsonl / TensorBoard:

    {"round": R, "step": S, "eval/success": 0.25, "eval/success_lo": 0.13, "eval/success_hi": 0.42,
     "eval/success_easy": 0.25, "eval/n_tasks": 32, "time/eval_s": 9.8}

With ``--eval-samples K`` the same tasks also run K times at the rollout temperature (1.0: the policy RL
trains and samples from; greedy success moves only when an argmax flips), each sample with its own seed
(:func:`sampled_eval_seed`: no two training seeds share one) and directory
(``OUT/evals/step_SSSSS_sample_k/``), all in flight together with the greedy pass, and the row adds
``eval/sampled_success`` (the mean over tasks of each task's success rate over its K samples),
``eval/sampled_lo`` / ``eval/sampled_hi`` and ``eval/sampled_k``. The 95 % intervals: the greedy rate is one
proportion over tasks, Wilson's interval (:func:`wilson`); the sampled rate pools K correlated samples per
task, an interval clustered by task (:func:`clustered_interval`).

``round`` is the next round to run, so a resumed run's ``truncate_logs`` drops that row together with the
rounds after the checkpoint, and the loop writes it again from ``OUT/evals/step_SSSSS/`` (the evaluation's
own resumable directory: finished tasks are read back, not re-run). Directories of that step that hold passes
of other settings (made before the in-run evaluation ran the trained agent's settings and seeds) are set aside
as ``NAME.stale`` with one line, and the step is evaluated again.

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


def eval_due(cfg: TrainConfig, step: int, last: bool = False) -> bool:
    """Whether the policy at optimizer step ``step`` is evaluated: step 0, every ``eval_every`` steps, the
    last step (``--steps``, or with ``last`` the step a run stops at before it: ``--time-limit-s``).

    >>> cfg = TrainConfig(steps=12, eval_every=5, eval_tasks="held_out.jsonl")
    >>> [s for s in range(13) if eval_due(cfg, s)], eval_due(cfg, 7, last=True)
    ([0, 5, 10, 12], True)
    >>> eval_due(TrainConfig(steps=12), 0)  # no --eval-tasks: never
    False
    """
    if not cfg.eval_tasks or cfg.eval_every < 1:
        return False
    return step % cfg.eval_every == 0 or step == cfg.steps or last


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


def wilson(p: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``p`` of ``n`` independent trials (NaNs without trials):
    where one proportion stands alone (a greedy evaluation: one 0/1 outcome per task). Unlike the normal
    (Wald) interval it is never of zero width at 0 or 1 and never leaves [0, 1].

    >>> [round(x, 4) for x in wilson(0.5, 64)], [round(x, 4) for x in wilson(0.0, 20)]
    ([0.381, 0.619], [0.0, 0.1611])
    """
    if not n or p != p:
        return float("nan"), float("nan")
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / d
    return max(0.0, c - h), min(1.0, c + h)


def clustered_interval(clusters: list[tuple[float, float]], z: float = 1.96) -> dict[str, float]:
    """The 95 % interval of a success rate pooled over clusters of correlated 0/1 outcomes (a task's K
    sampled trajectories, or its rollouts in a training window: one task is one unit). ``clusters``: one
    ``(successes, outcomes)`` pair per task. The rate is successes / outcomes; its cluster-robust variance
    (CR1: G/(G-1) sum_g (y_g - p m_g)^2 / M^2) gives the effective sample size n_eff = p(1-p) / var (Kish),
    at most the M outcomes (never narrower than treating them as independent) and G, the number of tasks,
    when the variance is 0 (every task at the same rate); the interval is Wilson's at n_eff.

    >>> r = clustered_interval([(4, 4), (0, 4), (4, 4), (0, 4)])   # each task all or nothing
    >>> r["p"], r["n_eff"], [round(x, 3) for x in (r["lo"], r["hi"])]  # 4 tasks, not 16 draws
    (0.5, 3.0, [0.125, 0.875])
    """
    g = len(clusters)
    m = sum(n for _, n in clusters)
    if not g or not m:
        return {"p": float("nan"), "lo": float("nan"), "hi": float("nan"), "n_eff": 0.0, "tasks": g}
    p = sum(y for y, _ in clusters) / m
    var = g / max(1, g - 1) * sum((y - p * n) ** 2 for y, n in clusters) / (m * m)
    n_eff = min(float(m), p * (1 - p) / var) if var > 0 else float(g)
    lo, hi = wilson(p, n_eff, z)
    return {"p": p, "lo": lo, "hi": hi, "n_eff": n_eff, "tasks": g}


def per_task_success(directory: Path) -> dict[str, float]:
    """``{task_id: 1.0 | 0.0}`` of one evaluation directory (an errored task counts as a failure)."""
    from common.eval import load_results

    return {
        str(r["task_id"]): float(bool(r.get("success")) and not r.get("error"))
        for r in load_results(Path(directory)).values()
    }


def sampled_row(directories: list[Path]) -> dict[str, float]:
    """``eval/sampled_success``, its 95 % interval ``eval/sampled_lo`` / ``eval/sampled_hi`` and
    ``eval/sampled_k`` from the K sampled passes: each task's success rate over its samples, then the mean
    over tasks; the interval is clustered by task (:func:`clustered_interval`: a task's K samples are one
    unit, not K independent draws)."""
    passes = [per_task_success(d) for d in directories]
    tasks = sorted(set().union(*passes)) if passes else []
    clustered = clustered_interval([(sum(p.get(t, 0.0) for p in passes), len(passes)) for t in tasks])
    return {
        "eval/sampled_success": clustered["p"] if tasks else 0.0,
        "eval/sampled_lo": clustered["lo"],
        "eval/sampled_hi": clustered["hi"],
        "eval/sampled_k": len(passes),
    }


def eval_row(report: dict[str, Any], rnd: int, step: int, seconds: float) -> dict[str, Any]:
    """The metrics row of one evaluation (``eval/success`` and one ``eval/success_TIER`` per tier). The
    greedy rate is one proportion over the tasks (one 0/1 outcome each): its 95 % interval
    (``eval/success_lo`` / ``eval/success_hi``) is Wilson's. A macro rate over tiers (TextWorld) gets none:
    Wilson's would be the task-weighted rate's."""
    row: dict[str, Any] = {
        "round": rnd,
        "step": step,
        "eval/success": report["success_rate"],
        "eval/n_tasks": report["n_tasks"],
        "eval/errors": report["errors"],
        "time/eval_s": seconds,
    }
    if report.get("aggregation") != "macro_over_tiers":
        row["eval/success_lo"], row["eval/success_hi"] = wilson(report["task_weighted_rate"], report["n_done"])
    for tier, t in report["per_tier"].items():
        row[f"eval/success_{tier}"] = t["rate"]
    return row


def set_aside(directory: Path) -> Path:
    """Rename ``directory`` to the first free ``NAME.stale``, ``NAME.stale1``, ... beside it (kept, never
    read again: the plot scripts read ``step_SSSSS[_sample_k]`` only); returns the new path."""
    for i in range(10**6):
        target = directory.with_name(f"{directory.name}.stale{i or ''}")
        if not target.exists():
            directory.rename(target)
            return target
    raise RuntimeError(f"no free name to set {directory} aside")


@dataclass
class InRunEval:
    """Evaluates at the steps :func:`eval_due` names, at most once per step in this process."""

    cfg: TrainConfig
    done: set[int] = field(default_factory=set)
    said: bool = False
    """Whether :func:`settings_line` was logged."""

    def __call__(self, policy: Any, rnd: int, step: int, last: bool = False) -> dict[str, Any] | None:
        """Evaluate ``policy`` (the run's engine, holding the weights of ``step``) if due (``last``: the run
        stops at this step, :func:`eval_due`); returns the row to log, or None. Call it where no rollout is
        in flight (it runs its own asyncio loop)."""
        if step in self.done or not eval_due(self.cfg, step, last):
            return None
        from common.eval import ManifestMismatch, evaluate

        t0 = time.perf_counter()
        configs = [eval_config(self.cfg, step)]  # greedy, then the sampled passes: all in flight at once
        configs += [eval_config(self.cfg, step, k) for k in range(self.cfg.eval_samples)]
        inner = eval_policy(policy)

        async def all_passes() -> list[dict[str, Any]]:
            agent = agent_settings(self.cfg)  # the agent that trains, not sera eval's paper caps
            return await asyncio.gather(*(evaluate(c, inner, False, agent) for c in configs))

        from common.run.rollout import run_round

        def run_passes() -> list[dict[str, Any]]:  # bounded shutdown: a tree that ignores cancellation cannot hold the eval (issue #53)
            return run_round(all_passes(), self.cfg.rollout.cancel_grace_s, f"held-out eval at step {step}")

        try:
            reports = run_passes()
        except ManifestMismatch:  # a resumed run's step redone: its directories hold another agent's passes
            moved = [set_aside(Path(c.out)) for c in configs if Path(c.out).exists()]
            print(f"[eval] step {step}: {', '.join(m.name for m in moved)} held passes of other settings "
                  "(made before this code, or by another agent); set aside, evaluating again", flush=True)  # fmt: skip
            reports = run_passes()
        self.done.add(step)
        row = eval_row(reports[0], rnd, step, time.perf_counter() - t0)
        if self.cfg.eval_samples:
            row.update(sampled_row([Path(c.out) for c in configs[1:]]))
        return row

    def log_if_due(self, policy: Any, rnd: int, step: int, writer: Any, log: Any, last: bool = False) -> None:
        """Evaluate if due (``last``: the run stops at this step); write the row with ``writer`` (a
        MetricsWriter) and one line with ``log`` (before the first evaluation, :func:`settings_line` too)."""
        if not self.said and eval_due(self.cfg, step, last) and step not in self.done:
            log(settings_line(self.cfg))
            self.said = True
        if (row := self(policy, rnd, step, last)) is not None:
            writer.write(row)
            log(eval_line(row))


def eval_line(row: dict[str, Any]) -> str:
    """One log line for an evaluation row."""
    tiers = " ".join(
        f"{k.removeprefix('eval/success_')}={v:.3f}"
        for k, v in row.items()
        if k.startswith("eval/success_") and k not in ("eval/success_lo", "eval/success_hi")
    )

    def band(lo: str, hi: str) -> str:
        return f" [{row[lo]:.3f}, {row[hi]:.3f}]" if lo in row and hi in row else ""

    sampled = (
        f" sampled={row['eval/sampled_success']:.3f}{band('eval/sampled_lo', 'eval/sampled_hi')} "
        f"(k={row['eval/sampled_k']}, clustered by task)"
        if "eval/sampled_success" in row
        else ""
    )
    return (
        f"eval step={row['step']} success={row['eval/success']:.3f}{band('eval/success_lo', 'eval/success_hi')} "
        f"({tiers}){sampled} n={row['eval/n_tasks']} errors={row['eval/errors']} {row['time/eval_s']:.1f}s"
    )
