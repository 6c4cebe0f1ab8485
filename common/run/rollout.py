"""The runtime settings of one rollout, and the rule that accepts or replaces a task group."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from common.agent.runtime import RuntimeConfig, run_root
from common.envs import env_spec

Job = tuple[dict[str, Any], list[RuntimeConfig]]
"""One task group to roll out: the task and one seeded RuntimeConfig per rollout."""


def runtime_config_for(env: str, base: RuntimeConfig | None = None, **overrides: Any) -> RuntimeConfig:
    """A :class:`RuntimeConfig` with ``env``'s paper caps (evaluation) and stop strings, then ``overrides``.

    ``base`` (for example a training run's ``cfg.rollout``) replaces the caps where given; the stop strings
    always come from the environment.
    """
    spec = env_spec(env)
    cfg = base or RuntimeConfig(
        max_prompt_tokens=spec.caps.max_prompt_tokens, max_new_tokens=spec.caps.max_new_tokens
    )
    return replace(cfg, stop=spec.stop, **overrides)


def stage_runtime_config(
    env: str, rollout: RuntimeConfig, stage: str, generate_rubrics: bool, seed: int
) -> RuntimeConfig:
    """One training rollout's settings: K counterfactual branches only in Rubric-stage rollouts, rubrics
    only for methods that write them, a per-rollout seed."""
    return runtime_config_for(
        env,
        rollout,
        use_rubrics=generate_rubrics,
        counterfactual_k=rollout.counterfactual_k if stage == "rubric" else 1,
        seed=seed,
    )


async def rollout_group(task: dict[str, Any], rcfgs: list[RuntimeConfig], env, policy, judge) -> list[Any]:
    """The trees of one task group, all at once (one seeded RuntimeConfig per rollout): their agents' model
    calls meet in the policy's batching queue. The group has one deadline (``group_timeout_s``, the paper's
    3,600 s): every tree still running then is cancelled and comes back marked (``meta["deadline"]``). A tree
    that has not wound down ``cancel_grace_s`` later (the paper's 30 s) is abandoned: a failed stand-in
    tree, also marked, takes its place, so the group always comes back."""
    if not rcfgs:
        return []
    deadline = time.monotonic() + rcfgs[0].group_timeout_s
    stats = _live_stats(policy)
    if stats is not None:
        stats.trees_started += len(rcfgs)

    async def one(rcfg: RuntimeConfig):
        try:
            return await run_root(task, env, policy, rcfg, judge=judge, deadline=deadline)
        finally:
            if stats is not None:
                stats.trees_done += 1

    loop, tid = asyncio.get_running_loop(), task.get("id", task.get("task_id", "?"))
    jobs = [loop.create_task(one(rcfg), name=f"tree of task {tid} (seed {rcfg.seed})") for rcfg in rcfgs]
    try:
        _, late = await asyncio.wait(jobs, timeout=rcfgs[0].group_timeout_s + rcfgs[0].cancel_grace_s)
    except asyncio.CancelledError:  # Ctrl-C, a caller's deadline: the trees go too
        for job in jobs:
            job.cancel()
        raise
    for job in late:
        job.cancel()
        ABANDONED.append(job)  # run_round's shutdown does not wait for it again
    return [_abandoned(task, env) if job in late else job.result() for job in jobs]


async def bounded_tree(work: Awaitable[Any], rcfg: RuntimeConfig, name: str) -> Any:
    """``await work`` (one ``run_root``, outside any task group: ``sera eval``, the in-run eval) for at most its
    tree deadline plus the cancel grace: a tree past its deadline is cancelled by ``run_root`` itself, and one
    that ignores the cancellation is given up on then (:data:`ABANDONED`) with a ``TimeoutError``, which the
    eval records as that task's error, instead of holding the whole evaluation."""
    job = asyncio.get_running_loop().create_task(work, name=name)  # type: ignore[arg-type]
    try:
        done, _ = await asyncio.wait({job}, timeout=rcfg.tree_timeout_s + rcfg.cancel_grace_s)
    except asyncio.CancelledError:
        job.cancel()
        raise
    if not done:
        job.cancel()
        ABANDONED.append(job)
        raise TimeoutError(
            f"the rollout did not stop within the cancel grace ({rcfg.cancel_grace_s:g} s) after its deadline "
            f"({rcfg.tree_timeout_s:g} s, --tree-timeout-s) and was abandoned"
        )
    return job.result()


ABANDONED: deque[asyncio.Task] = deque(maxlen=1000)
"""Tasks given up on after their cancel grace (the newest 1,000; held so that nothing is collected while its
loop still refers to it, and so a test or a debugger can see them). Their event loop is closed under them."""


def run_round(work: Awaitable[Any], grace_s: float, what: str = "round") -> Any:
    """``asyncio.run(work)`` whose shutdown is bounded (issue #53): ``asyncio.run`` cancels the tasks still
    pending when ``work`` returns and then waits for every one of them without limit, so a tree that ignores
    cancellation held the round (level 0, level 1, the in-run eval) even after its group had given up on it.

    Here the tasks still pending are cancelled once more; the ones :func:`rollout_group` already gave up on
    (:data:`ABANDONED`: they had their grace) are not waited for again, every other one for at most
    ``grace_s`` (the run's ``--cancel-grace-s``). Whatever is still running then is left behind with its loop
    closed, and one ``[abandoned]`` line on stderr names it. So a round ends at most at its group deadline +
    the cancel grace, plus one more grace only for other tasks (an abandoned tree's own children) that
    ignore their cancellation too."""
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(work)
    finally:
        try:
            _shutdown(loop, grace_s, what)
        finally:
            asyncio.set_event_loop(None)
            loop.close()  # shuts the default executor down without waiting for its threads


def _shutdown(loop: asyncio.AbstractEventLoop, grace_s: float, what: str) -> None:
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in left:
        t.cancel()
    given_up = {id(t) for t in ABANDONED}
    wait = [t for t in left if id(t) not in given_up]
    if wait:
        loop.run_until_complete(asyncio.wait(wait, timeout=max(0.0, grace_s)))
    for t in left:  # a task that ended with an error: retrieved (asyncio would warn "never retrieved")
        if t.done() and not t.cancelled():
            t.exception()
    stuck = [t for t in left if not t.done()]
    if not stuck:  # asyncio.run's own clean-up: nothing can block it now
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        return
    ABANDONED.extend(t for t in stuck if id(t) not in given_up)
    names = sorted({t.get_name() for t in stuck})
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    print(
        f"[abandoned] {what}: {len(stuck)} task{'s' if len(stuck) > 1 else ''} still running after "
        f"cancellation and the cancel grace ({grace_s:g} s, --cancel-grace-s) left behind, their event loop "
        f"closed: {'; '.join(names[:3])}{more}. A tree that ignores cancellation (a cell or tool that never "
        "yields) is a bug to report.",
        file=sys.stderr,
        flush=True,
    )


def _abandoned(task: dict[str, Any], env) -> Any:
    """The record of a tree that did not stop within the cancel grace after its group's deadline."""
    from common.agent.tree import Node, Tree

    tree = Tree(
        task_id=str(task.get("id", task.get("task_id", ""))), env=env.name, meta={"deadline": "group"}
    )
    tree.nodes["0"] = Node(node_id="0", parent_id=None, depth=0, fork_step=None, goal="", max_steps=0)
    tree.nodes[
        "0"
    ].error = "group deadline: the rollout did not stop within the cancel grace and was abandoned"
    return tree


def _live_stats(policy) -> Any:
    """The run's :class:`LiveStats` when ``policy`` counts calls (the training loops' ``CountingPolicy``)."""
    from common.run.progress import CountingPolicy

    return policy.stats if isinstance(policy, CountingPolicy) else None


async def rollout_in_flight(jobs: list[Job], env, policy, judge) -> list[list[Any]]:
    """Every tree of ``jobs`` at once, one group per job, in job order."""
    return list(
        await asyncio.gather(*(rollout_group(task, rcfgs, env, policy, judge) for task, rcfgs in jobs))
    )


def spares_in_flight(cfg, stage: str, replaced: int) -> int:
    """How many spare groups ride beside the groups a step still needs (``--spare-groups``): only where a
    group without signal is replaced (TextCraft's Execution stage), never more than the replacements left."""
    if stage != "execution" or not env_spec(cfg.env).replace_flat_groups:
        return 0
    return max(0, min(cfg.spare_groups, cfg.max_task_replacements - replaced))


def draw_job(cfg, stage: str, rnd: int, sampler, preset) -> Job:
    """The next task and its rollouts' settings, each seeded by (seed, round, cursor, rollout)."""
    from common.run.data import hash_seed

    task = sampler.next()
    seeds = [hash_seed(cfg.seed, rnd, sampler.cursor, r) for r in range(cfg.rollouts_per_task)]
    return task, [
        stage_runtime_config(cfg.env, cfg.rollout, stage, preset.generate_rubrics, s) for s in seeds
    ]


def collect_groups(
    cfg,
    stage: str,
    rnd: int,
    sampler,
    preset,
    roll: Callable[[list[Job]], list[list[Any]]],
    per_wave: int | None,
    dropped: list[list[Any]] | None = None,
) -> tuple[list[list[Any]], int]:
    """The ``tasks_per_step`` task groups of one round, and how many groups without signal were replaced.

    Tasks are drawn in sampler order, each rollout seeded by (seed, round, cursor, rollout), and judged in
    draw order by :func:`accept_group`: a group without signal is dropped and the next one stands in, while
    ``max_task_replacements`` last. ``roll(jobs)`` rolls a wave of groups out together (level 0: in this
    process; level 1: each rank its share). A wave holds ``per_wave`` of the groups still needed (``None``:
    all of them) plus the spares of :func:`spares_in_flight`, so a replacement is already rolled out when it
    is needed instead of in a wave of its own after it. Spares no group needed are discarded and their tasks
    given back to the sampler: the tasks, seeds and accepted groups are those of replacing one group at a time
    (``--spare-groups 0``); only the compute differs.

    A group with a tree cut by a deadline (``meta["deadline"]``: the paper's per-rollout and per-group
    timeouts) is dropped in every stage and environment, appended to ``dropped`` (the loops log it to
    ``deadline_trees.jsonl``) and replaced by the next task, at most ``tasks_per_step`` times a round; past
    that the round trains on the groups it has."""
    groups: list[list[Any]] = []
    replaced = 0
    late = 0  # groups dropped for a deadline
    target = cfg.tasks_per_step
    pending: list[list[Any]] = []  # rolled out, not judged yet: always the last tasks drawn
    while len(groups) < target:
        missing = target - len(groups)
        wave = (missing if per_wave is None else min(per_wave, missing)) + spares_in_flight(
            cfg, stage, replaced
        )
        jobs = [draw_job(cfg, stage, rnd, sampler, preset) for _ in range(wave - len(pending))]
        if jobs:
            pending += roll(jobs)
        while pending and len(groups) < target:
            trees = pending.pop(0)
            if any(getattr(t, "meta", {}).get("deadline") for t in trees):
                late += 1
                if dropped is not None:
                    dropped.append(trees)
                if late > cfg.tasks_per_step:  # no more replacements for deadlines this round
                    target -= 1
                continue
            if accept_group(
                trees, cfg.env, stage, preset.execution_reward, cfg.max_task_replacements - replaced
            ):
                groups.append(trees)
            else:
                replaced += 1  # no signal: the next group stands in (SPEC.md §4)
    sampler.cursor -= len(pending)  # spares nobody needed: as far as the run is concerned, never drawn
    return groups, replaced


def has_signal(trees: list[Any], stage: str, execution_reward: str) -> bool:
    """Does this task group carry a learning signal in ``stage``? The zero-variance rule of SPEC.md §4,
    judged on the advantages of ALL the group's datums (roots and children), not only on root rewards:
    :func:`common.rl.batch.group_has_signal`."""
    from common.rl.batch import group_has_signal

    return bool(group_has_signal(trees, stage, execution_reward))


def accept_group(
    trees: list[Any], env: str, stage: str, execution_reward: str, replacements_left: int
) -> bool:
    """Keep this group, or drop it and roll out another task instead (TextCraft's rule in the Execution
    stage, while replacements are left). Every tier calls this, so the rule lives here once."""
    if stage != "execution" or not env_spec(env).replace_flat_groups or replacements_left <= 0:
        return True
    return has_signal(trees, stage, execution_reward)


@dataclass
class RolloutConfig:
    """Run one recursive rollout (tree) and append it to the offline log."""

    env: Literal["textcraft", "textworld", "textworld-cooking"] = "textcraft"
    """Environment."""
    task: str | None = None
    """Task file (JSONL); FILE:INDEX picks one row (default row 0). Default: one freshly generated easy task."""
    policy: str = "oracle"
    """Policy: oracle | random | replay:FILE.json | hf:MODEL (smollm2, tiny, a path) | openai:URL#MODEL."""
    log: str = "runs/rollouts.jsonl"
    """Offline log: one JSON line per tree."""
    temperature: float = 0.0
    """Sampling temperature of agent steps (0 = greedy)."""
    best_of_n: int = 1
    """Test-time selection candidates per delegation (paper: 2)."""
    max_depth: int = 3
    """Maximum delegation depth."""
    max_steps: int = 20
    """Steps per agent (the protocol's 20; fewer for a quick look on a CPU)."""
    max_new_tokens: int | None = None
    """Output cap per agent step (default: the environment's paper cap, 512 TextCraft / 3,072 TextWorld)."""
    seed: int = 0
    """Seed for generated tasks and sampling."""
    prompts_dir: str | None = None
    """A directory of prompt templates (NAME.txt) replacing the packaged ones: the environment's agent
    templates and the rubric/score templates (e.g. the paper's original texts)."""

    def __post_init__(self) -> None:
        from common.config import check_choices, check_ranges

        check_choices(self)
        check_ranges(
            [
                ("max_steps", self.max_steps, 1),
                ("best_of_n", self.best_of_n, 1),
                ("max_depth", self.max_depth, 0),
                ("max_new_tokens", 1 if self.max_new_tokens is None else self.max_new_tokens, 1),
                ("temperature", self.temperature, 0),
                ("seed", self.seed, 0),
            ]
        )

    def runtime(self) -> RuntimeConfig:
        over: dict[str, Any] = {"max_new_tokens": self.max_new_tokens} if self.max_new_tokens else {}
        return runtime_config_for(
            self.env,
            temperature=self.temperature,
            best_of_n=self.best_of_n,
            max_depth=self.max_depth,
            max_steps=self.max_steps,
            seed=self.seed,
            prompts_dir=self.prompts_dir,
            **over,
        )


def make_env_with_prompts(
    env: str,
    prompts_dir: str | None,
    codeact_executor: str | None = None,
    prompt_set: Literal["training", "evaluation"] = "training",
):
    """``make_env`` with the user's prompt templates, where given (one --prompts-dir for every template),
    for TextCraft the CodeAct executor (``worker`` | ``worker-ordered``), where given, and the prompt set:
    ``training`` (the default: every training tier builds its environment here) or ``evaluation``
    (``sera eval``, ``sera rollout``). The public code has two TextWorld builders
    (``textworld_training.py`` / ``textworld_evaluation.py``); TextCraft uses one set for both."""
    from common.envs import make_env

    if prompt_set not in ("training", "evaluation"):
        raise ValueError(f"prompt_set must be 'training' or 'evaluation', got {prompt_set!r}")
    kwargs: dict[str, Any] = {"prompts_dir": prompts_dir} if prompts_dir else {}
    if env == "textworld":
        kwargs["prompt_set"] = prompt_set
    if codeact_executor is not None and env == "textcraft":
        kwargs["executor"] = codeact_executor
    return make_env(env, **kwargs)


def pick_task(env: str, task: str | None, seed: int) -> dict[str, Any]:
    """``FILE``, ``FILE:INDEX`` or a freshly generated easy task."""
    from pathlib import Path

    from common.envs import load_tasks

    if task is None:
        return env_spec(env).generate_tasks("train", 1, seed, "easy")[0]
    path, index = task, ""
    if not Path(task).exists() and ":" in task:
        path, _, index = task.rpartition(":")
    if not Path(path).exists():
        raise FileNotFoundError(f"task file {path} does not exist")
    rows = load_tasks(env, path)
    try:
        i = int(index) if index else 0
    except ValueError:
        raise ValueError(f"--task {task}: the part after ':' must be a row index") from None
    if not 0 <= i < len(rows):
        raise ValueError(f"{path} has {len(rows)} tasks; index {i} is out of range")
    return rows[i]
