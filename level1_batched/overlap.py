"""Level 1's one-step-off-policy rounds (``--max-staleness 1``): the next round rolls out while this one trains.

A synchronous round is rollouts, then the optimizer step, then the weight sync: the engine idles while the
trainer steps, and the trainer idles through the rollouts (on an H200, 15-18 s of dependent short
generations per 8 x 8 round). With ``--max-staleness 1`` the loop (``level1_batched/train.py``) starts the
next round's rollouts on a background thread (:class:`RoundAhead`) right after this round's batch is built,
then trains on that batch; the weights reach the engine after the step while the rollouts go on (vLLM: at
its next scheduler step, requests in flight continue; the hf engine: a copy of the model,
:func:`rollout_copy`, takes them when its running batch empties). The next round then trains on
data that is at most one optimizer step old, and CISPO's importance ratio against the behaviour log-probs
recorded per token (``pi_theta / pi_behaviour``, clipped) is the correction, as in AReaL's bounded
staleness and verl's one-step-off-policy recipe.

The rules that keep a run exact:

* **Stage clock**: the next round's stage is ``schedule.stage_at(step + updated)`` where ``updated`` is
  this batch's ``takes_step``, known before the step runs; so a prefetched round always has the stage a
  synchronous run would give it (no guess, nothing redone). The next round is not started when the run
  will stop (``--steps`` reached, ``--max-idle-rounds``).
* **Versions**: every tree records the engine's policy version as its wave starts
  (``meta["policy_version"]``, the oldest weights any of its calls saw: an update during the wave only
  makes later calls newer); :func:`tag_datums` copies it to every datum (``meta["policy_version"]``);
  :func:`fresh_groups` drops any task group more than ``max_staleness`` versions older than the trainer
  (``batch/stale_groups``; by construction none: the rollouts start after the previous sync).
* **Cursor**: a round carries the sampler's cursor before and after its draws (:class:`Rollouts`); a
  checkpoint stores the trained round's cursor, never the one after an in-flight round's draws, so a killed
  run redoes the in-flight round from the same tasks and seeds, once.

What it simplifies: one round ahead at most (``--max-staleness`` is 0 or 1), one rank (the producer's
all-gather would need a process group of its own beside the gradient all-reduce), the version recorded per
wave, not per call. Level 2: level2_distributed/README.md says why it does not have it yet.

Run: ``sera train --level 1 --model tiny --steps 3 --max-staleness 1`` (add ``--engine vllm`` on a GPU);
``python bench/bench_rounds.py --compare staleness --model tiny`` runs 0 and 1 side by side.
"""

from __future__ import annotations

import copy
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Rollouts:
    """One round's task groups, as :func:`level1_batched.rollouts.collect_groups_in_flight` returns them,
    with where they came from."""

    round: int
    stage: str
    groups: list[list[Any]]
    replaced: int
    """Groups without signal replaced (``batch/replaced_tasks``)."""
    dropped: list[list[Any]] = field(default_factory=list)
    """Groups cut by a deadline (logged, never trained)."""
    first_task: int = 0
    """The sampler's cursor before the round's first draw."""
    end_task: int = 0
    """The sampler's cursor after its last kept draw (what a checkpoint after this round stores)."""
    seconds: float = 0.0
    """Wall time of the rollouts themselves."""


def collect_round(
    rnd: int, stage: str, sampler: Any, collect: Callable[[list[list[Any]]], tuple[list[list[Any]], int]]
) -> Rollouts:
    """Run ``collect(dropped) -> (groups, replaced)`` (the loop's ``collect_groups_in_flight`` for this round,
    its arguments bound) and record the sampler's cursor before and after, and the time."""
    t0, first = time.perf_counter(), sampler.cursor
    dropped: list[list[Any]] = []
    groups, replaced = collect(dropped)
    return Rollouts(rnd, stage, groups, replaced, dropped, first, sampler.cursor, time.perf_counter() - t0)


class RoundAhead:
    """At most one round's rollouts running on a background thread while the caller trains.

    ``collect(rnd, stage) -> Rollouts`` runs the round (it owns the sampler while it runs: the caller draws
    nothing meanwhile). :meth:`start` launches it; :meth:`take` returns the round asked for, waiting for it,
    or collects it on the calling thread when none was started (the first round, the first after a resume,
    the round after the loop chose not to start one).

    >>> ahead = RoundAhead(lambda rnd, stage: Rollouts(rnd, stage, [], 0))
    >>> ahead.take(0, "execution").round                       # nothing started: collected now
    0
    >>> ahead.start(1, "rubric"); ahead.take(1, "rubric").stage  # started, then taken
    'rubric'
    >>> ahead.start(2, "rubric"); ahead.take(2, "execution")
    Traceback (most recent call last):
    ...
    RuntimeError: round 2 was started as a rubric round but the loop asks for execution (the stage clock must be known before a round starts)
    """

    def __init__(self, collect: Callable[[int, str], Rollouts], limit_s: float | None = None) -> None:
        """``limit_s``: the longest a round may run (:func:`round_limit_s`; None: no limit). :meth:`take`
        and :meth:`close` wait for a round started ahead at most until ``limit_s`` after its start; past
        that :meth:`take` raises (the run stops: a resume redoes the round from the checkpoint's cursor) and
        :meth:`close` says so in one line; the round's thread is left behind either way."""
        self.collect = collect
        self.limit_s = limit_s
        self._thread: threading.Thread | None = None
        self._box: dict[str, Any] = {}  # the round ahead: planned, started, and its result or error
        self.wait_s = 0.0
        """Seconds the last :meth:`take` waited for a round already running."""

    def start(self, rnd: int, stage: str) -> None:
        if self._thread is not None:
            raise RuntimeError(f"round {self._box['planned']} is still ahead: take it before starting round {rnd}")
        box: dict[str, Any] = {"planned": (rnd, stage), "started": time.monotonic()}

        def run() -> None:  # writes only its own box: a round left behind cannot touch a later one
            try:
                box["result"] = self.collect(rnd, stage)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread by take()
                box["error"] = exc

        self._box = box
        self._thread = threading.Thread(target=run, name=f"rollouts-round{rnd}", daemon=True)
        self._thread.start()

    def take(self, rnd: int, stage: str) -> Rollouts:
        t0 = time.perf_counter()
        if self._thread is None:
            got = self.collect(rnd, stage)
            self.wait_s = time.perf_counter() - t0
            return got
        ended, box = self._join(), self._box
        self._thread, self._box = None, {}
        self.wait_s = time.perf_counter() - t0
        planned = box["planned"]
        if not ended:
            raise RuntimeError(
                f"round {planned[0]} ({planned[1]}) still rolling out {self.limit_s:g} s after it started, past "
                "every deadline and cancel grace of its waves: abandoned (its thread is left behind; "
                "RUN/stuck_calls.jsonl and the heartbeat lines say what it waits for)"
            )
        if "error" in box:
            raise box["error"]
        if planned != (rnd, stage):
            raise RuntimeError(
                f"round {planned[0]} was started as a {planned[1]} round but the loop asks for "
                f"{stage if planned[0] == rnd else f'round {rnd}'} (the stage clock must be known before a "
                "round starts)"
            )
        return box["result"]

    def _join(self) -> bool:
        """Wait for the round ahead, at most until ``limit_s`` after its start; True when it ended."""
        assert self._thread is not None
        left = None if self.limit_s is None else max(0.0, self._box["started"] + self.limit_s - time.monotonic())
        self._thread.join(left)
        return not self._thread.is_alive()

    def close(self) -> None:
        """Wait for a round still running, at most until ``limit_s`` after its start (its rollouts are
        discarded: no checkpoint counts its draws); one line says so when it had to be left behind, or when
        it failed (nobody takes its error any more)."""
        if self._thread is None:
            return
        ended, box = self._join(), self._box
        self._thread, self._box = None, {}
        rnd, stage = box["planned"]
        if not ended:
            print(
                f"[abandoned] round {rnd} ({stage}) still rolling out {self.limit_s:g} s after it started: "
                "left behind at the end of the run (its rollouts are discarded)",
                file=sys.stderr,
                flush=True,
            )
        elif "error" in box:
            print(f"[overlap] round {rnd} started ahead failed (discarded): {box['error']!r}", file=sys.stderr, flush=True)


def round_limit_s(cfg: Any) -> float:
    """The longest one round's rollouts can take once every deadline is kept: each wave of task groups ends
    by its group deadline plus the cancel grace (plus one more grace for stragglers at its loop's shutdown:
    ``common.run.rollout.run_round``) and a margin of 60 s for judging and bookkeeping; a round has at most
    one wave, plus one per flat group replaced (``--max-task-replacements``), plus one per group cut by a
    deadline (at most ``2 * tasks_per_step``: ``common.run.rollout.collect_groups``).

    >>> from types import SimpleNamespace as N
    >>> round_limit_s(N(max_task_replacements=2, tasks_per_step=1, rollout=N(group_timeout_s=10.0, cancel_grace_s=1.0)))
    360.0
    """
    r = cfg.rollout
    waves = 1 + cfg.max_task_replacements + 2 * cfg.tasks_per_step
    return waves * (r.group_timeout_s + 2 * r.cancel_grace_s + 60.0)


def fresh_groups(groups: list[list[Any]], step: int, max_staleness: int) -> tuple[list[list[Any]], int]:
    """The task groups whose trees were all sampled at most ``max_staleness`` policy versions before
    ``step`` (``meta["policy_version"]``; a tree without one counts as current), and how many were dropped.

    >>> from types import SimpleNamespace as T
    >>> g = [[T(meta={"policy_version": 4})], [T(meta={"policy_version": 2}), T(meta={"policy_version": 4})]]
    >>> kept, stale = fresh_groups(g, step=4, max_staleness=1)
    >>> len(kept), stale
    (1, 1)
    """
    kept = [
        trees
        for trees in groups
        if all(step - t.meta.get("policy_version", step) <= max_staleness for t in trees)
    ]
    return kept, len(groups) - len(kept)


def tag_datums(batch: Any, groups: list[list[Any]]) -> list[int]:
    """Copy each task group's policy version (the oldest of its trees) into ``meta["policy_version"]`` of
    every datum built from it and return the versions, one per datum. The batch builders name a datum's
    trajectory ``"<group index>/..."`` (``common/rl/batch.py``), which is how a datum finds its group."""
    versions = [min(t.meta["policy_version"] for t in trees) for trees in groups]
    out = []
    for d in batch.datums:
        v = versions[int(str(d.trajectory_id).split("/", 1)[0])]
        d.meta["policy_version"] = v
        out.append(v)
    return out


def rollout_copy(model: Any, tokenizer: Any, max_batch_size: int, seed: int) -> Any:
    """The hf engine's rollouts while the trainer steps: an ``HFPolicy`` on a deep copy of ``model`` (its
    LoRA adapter included), synced by name after every step (``HFPolicy.update_weights``, which waits for
    the copy's running batch to empty: a request never sees two versions). Twice the model's memory: fine
    for the tiny model and SmolLM2 on a CPU; on a GPU use ``--engine vllm``."""
    from common.policy.hf import HFPolicy

    twin = copy.deepcopy(model).eval()
    for p in twin.parameters():
        p.requires_grad_(False)
    return HFPolicy(twin, tokenizer, max_batch_size=max_batch_size, seed=seed)


def mps_hint(l1: Any, engine: bool, device_type: str, environ: Any = None) -> str | None:
    """One line for an overlapped run (``--max-staleness`` >= 1) whose trainer and vLLM engine core are two
    processes on one card without CUDA MPS: the GPU then runs the two by turns, and each training step slows
    the next round's rollouts. Measured on one H100 (bench/RESULTS.md, "Rollouts overlapping training"): the
    N=1 round was 1.12x the N=0 rollout by turns, 1.08x under MPS. ``None`` when none of that applies.

    >>> from types import SimpleNamespace as NS
    >>> l1 = NS(max_staleness=1, engine_process=True)
    >>> mps_hint(l1, True, "cuda", {}).split(":")[0]
    '[level1] --max-staleness 1 on one card'
    >>> mps_hint(l1, True, "cuda", {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps"}) is None
    True
    >>> mps_hint(NS(max_staleness=0, engine_process=True), True, "cuda", {}) is None
    True
    """
    environ = os.environ if environ is None else environ
    if not (l1.max_staleness and engine and l1.engine_process and device_type == "cuda"):
        return None
    if environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        return None
    return (
        f"[level1] --max-staleness {l1.max_staleness} on one card: the trainer and the vLLM engine share the GPU by "
        "turns; under CUDA MPS their kernels run at once and training slows rollouts less (start the daemon "
        "first: `export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log; "
        "nvidia-cuda-mps-control -d`; tutorials/07)"
    )
