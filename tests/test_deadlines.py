"""No run hangs (issue #37): deadlines on every model call, agent step, tree and task group, bounds on
launches, the heartbeat and the stuck-call dump, on CPU with scripted policies and the real TextCraft
environment (CodeAct workers)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import pytest

from common.agent.runtime import RuntimeConfig, run_root
from common.envs import make_env
from common.envs.textcraft.tasks import generate_tasks as tc_tasks
from common.policy.base import Completion, GenerationRequest, Policy
from common.policy.scripted import rubric_json, score_json
from common.run.progress import CountingPolicy, LiveStats, RunProgress
from common.run.rollout import collect_groups, rollout_group
from common.train_config import TrainConfig

FINISH = '<thought>done</thought>\n<python>\nfinish("done")\n</python>'


def cell(code: str) -> str:
    return f"<thought>go</thought>\n<python>\n{code}\n</python>"


class Scripted(Policy):
    """``act`` replies by (depth, step); rubric/score valid JSON; ``hang`` = (role, node_id) pairs whose call
    never returns (an engine that lost the request), or, with ``release``, returns once ``release()`` is true."""

    def __init__(self, replies: dict[tuple[int, int], str], hang: set[tuple[str, str]] | None = None,
                 release=None):  # fmt: skip
        self.replies, self.hang, self.cancelled, self.release = replies, hang or set(), 0, release

    async def generate(self, request: GenerationRequest) -> Completion:
        meta = request.meta
        if (request.role, meta.get("node_id")) in self.hang:
            try:
                if self.release is None:
                    await asyncio.Event().wait()  # never set
                while not self.release():  # a condition, not a clock: returns once the test saw what it waits for
                    await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        await asyncio.sleep(0)
        if request.role == "rubric":
            text = rubric_json("goal")
        elif request.role == "score":
            text = score_json(bool(meta.get("child_success")))
        else:
            text = self.replies.get((meta["depth"], meta["step"]), FINISH)
        return Completion(text=text, prompt_ids=[1], output_ids=[2], logprobs=[-0.1])


def task():
    return tc_tasks("train", 1, seed=4, difficulty="easy")[0]


def run(policy, **cfg):
    env = make_env("textcraft", executor="worker-ordered")
    base = dict(max_steps=3, temperature=0.0)
    return asyncio.run(run_root(task(), env, policy, RuntimeConfig(**{**base, **cfg})))


def launch_code(n: int) -> str:
    goal = task()["goal"].split(":", 1)[1].split(",")[0].strip()  # "2x item"
    count, item = goal.split("x ", 1)
    return (
        f"out = []\nfor _ in range({n}):\n"
        f"    out.append(await launch_subagent({{{item!r}: {int(count)}}}))\nprint(out[-1])"
    )


def test_a_runaway_launch_loop_is_refused_past_the_per_step_bound():
    policy = Scripted({(0, 0): cell(launch_code(30))})
    tree = run(policy, max_launches_per_step=4, use_rubrics=False)
    children = [n for n in tree.nodes.values() if n.depth == 1]
    assert len(children) == 4  # 30 asked for, 4 ran
    step = tree.nodes["0"].steps[0]
    # launches 5..8 are refused with the text; the 9th (past twice the bound) raises in the cell: loop over
    assert step.refused_launches == 5 and tree.meta["refused_by_bound"] == 5
    assert "Launch refused: this agent already launched 4 sub-agents in this step" in step.observation
    assert "Traceback" in step.cell_output or "RuntimeError" in step.cell_output


def test_an_endless_launch_loop_is_stopped_in_its_cell():
    """The H200 run's round 3 (bench/RESULTS.md): a cell looping on launch_subagent. Without a bound every
    iteration ran a child (one model call at a time, for ever); with only refusals the loop spun until the
    cell's CPU limit (67,452 refusals, 40 s). Far past the bound the launch raises in the cell instead."""
    goal = task()["goal"].split(":", 1)[1].strip()
    count, item = goal.split("x ", 1)
    code = f"while True:\n    await launch_subagent({{{item!r}: {int(count)}}})"
    t0 = time.perf_counter()
    tree = run(Scripted({(0, 0): cell(code)}), max_launches_per_step=3, use_rubrics=False)
    assert time.perf_counter() - t0 < 30
    step = tree.nodes["0"].steps[0]
    assert len([n for n in tree.nodes.values() if n.depth == 1]) == 3
    assert step.refused_launches == 4  # launches 4..7 refused; the 7th raised in the cell
    assert "RuntimeError" in step.cell_output and "Launch refused" in step.cell_output
    assert tree.nodes["0"].error is None  # the agent goes on to its next step


def test_the_agents_of_one_tree_are_bounded():
    policy = Scripted({(0, 0): cell(launch_code(30)), (1, 0): cell(launch_code(30))})
    tree = run(policy, max_agents_per_tree=6, max_launches_per_step=100, use_rubrics=False)
    assert len(tree.nodes) == 6
    assert any(
        "this task already has 6 agents" in s.observation for n in tree.nodes.values() for s in n.steps
    )


def test_a_model_call_that_never_returns_ends_its_agent_not_the_tree():
    policy = Scripted({}, hang={("act", "0")})
    t0 = time.perf_counter()
    tree = run(policy, step_timeout_s=1.0, use_rubrics=False)
    assert time.perf_counter() - t0 < 30
    root = tree.nodes["0"]
    assert "the act call did not return within 1 s" in root.error and not tree.success
    assert root.steps == []  # the timed-out call is no step (no datum), as the public loop records none
    assert policy.cancelled == 1  # the call was cancelled, not left running
    assert "deadline" not in tree.meta  # the tree itself ended in time


def test_a_hung_rubric_call_ends_at_its_own_deadline_and_costs_only_that_childs_score():
    # the rubric call runs beside the child, outside the parent's step (issue #49): when it hangs, its own
    # deadline ends it, the child goes unscored (as after an unparseable rubric) and the parent goes on
    policy = Scripted({(0, 0): cell(launch_code(1))}, hang={("rubric", "0.1")})
    t0 = time.perf_counter()
    tree = run(policy, step_timeout_s=5.0)
    assert time.perf_counter() - t0 < 60 and policy.cancelled == 1
    child = tree.nodes["0.1"]
    assert child.rubric is None and child.score is None
    assert "the rubric call did not return within 5 s" in child.rubric_error
    assert tree.nodes["0"].error is None and "deadline" not in tree.meta


def test_a_cell_that_waits_on_a_child_forever_hits_the_step_deadline():
    # the child's act call never returns; the parent's cell awaits the child: the parent's step deadline
    # (children included, as the public loop's env.step) ends the parent and cancels the child. The cell waits
    # 0.8 s before it launches the child, so the child's own act-call deadline (2 s after ITS start) falls well
    # after the parent's: launched at once, the two fired within milliseconds and, on a loaded machine, the
    # child's own DeadlineError could land before the cancellation from above (seen once in a full run)
    policy = Scripted({(0, 0): cell("import time\ntime.sleep(0.8)\n" + launch_code(1))}, hang={("act", "0.1")})
    t0 = time.perf_counter()
    tree = run(policy, step_timeout_s=2.0, use_rubrics=False)
    assert time.perf_counter() - t0 < 30
    root, child = tree.nodes["0"], tree.nodes["0.1"]
    assert "step 0: the environment step (its children included) did not finish within 2 s" in root.error
    assert root.steps == [] and not tree.success
    assert child.error.startswith("cancelled: a deadline above this agent") and policy.cancelled == 1


def test_a_tree_past_its_deadline_is_cancelled_and_recorded():
    # a root that keeps launching children whose calls take a while: the tree deadline (1.5 s) cuts it
    class Slow(Scripted):
        async def generate(self, request):
            if request.meta.get("depth", 0) >= 1:
                await asyncio.sleep(0.5)
            return await super().generate(request)

    policy = Slow({(0, 0): cell(launch_code(8))})
    t0 = time.perf_counter()
    tree = run(policy, tree_timeout_s=1.5, cancel_grace_s=5.0, use_rubrics=False)
    assert time.perf_counter() - t0 < 20
    assert tree.meta["deadline"] == "tree" and not tree.success
    assert "tree deadline: the rollout ran past 2 s" in tree.nodes["0"].error


def test_a_group_deadline_cuts_every_tree_still_running():
    class Slow(Scripted):
        async def generate(self, request):
            await asyncio.sleep(0.4)
            return await super().generate(request)

    env = make_env("textcraft", executor="worker-ordered")
    rcfg = RuntimeConfig(max_steps=3, temperature=0.0, use_rubrics=False, group_timeout_s=1.0)
    policy = Slow({(0, 0): cell(launch_code(6))})
    trees = asyncio.run(rollout_group(task(), [rcfg, rcfg], env, policy, None))
    assert [t.meta.get("deadline") for t in trees] == ["group", "group"]


def test_a_tree_that_ignores_its_cancellation_is_abandoned_after_the_grace():
    class Stubborn(Scripted):
        async def generate(self, request):
            for _ in range(3):  # swallows the deadline's cancellation (a buggy engine client), then gives up
                try:
                    await asyncio.sleep(3)
                except asyncio.CancelledError:
                    continue
            return await super().generate(request)

    env = make_env("textcraft", executor="worker-ordered")
    rcfg = RuntimeConfig(
        max_steps=3, temperature=0.0, use_rubrics=False, group_timeout_s=0.5, cancel_grace_s=0.5
    )
    t0 = time.perf_counter()
    trees = asyncio.run(rollout_group(task(), [rcfg], env, Stubborn({}), None))
    assert [t.meta.get("deadline") for t in trees] == ["group"]
    assert "did not stop within the cancel grace" in trees[0].nodes["0"].error
    assert time.perf_counter() - t0 < 15


class IgnoresCancellation(Scripted):
    """An engine client that swallows every cancellation for 60 s (a cell or tool that never yields)."""

    async def generate(self, request):
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                await asyncio.sleep(0.2)
            except asyncio.CancelledError:
                continue
        return await super().generate(request)


@pytest.mark.parametrize("level", [0, 1])
def test_a_tree_that_ignores_cancellation_does_not_hold_the_round(level, capsys):
    """Issue #53: the group gives up on the tree after its deadline + the cancel grace, and the round's event
    loop no longer waits for it at shutdown (asyncio.run waited without limit: 60 s per wave here)."""
    from level0_single_process.train import collect_groups as level0_collect
    from level1_batched.rollouts import collect_groups_in_flight as level1_collect

    class Sampler:
        cursor = 0

        def next(self):
            self.cursor += 1
            return task()

    class Preset:
        generate_rubrics, execution_reward = False, "binary"

    cfg = TrainConfig.make(
        model="tiny", env="textcraft", tasks_per_step=1, rollouts_per_task=1, max_steps=3,
        group_timeout_s=0.5, cancel_grace_s=0.5,
    )  # fmt: skip
    env, dropped = make_env("textcraft", executor="worker-ordered"), []
    collect = level0_collect if level == 0 else level1_collect
    t0 = time.perf_counter()
    groups, _ = collect(cfg, "execution", 0, Sampler(), env, IgnoresCancellation({}), None, Preset, dropped=dropped)
    took = time.perf_counter() - t0
    # two waves (the cut group, then its replacement, cut too), each over at its deadline + grace (~1.5 s)
    assert groups == [] and len(dropped) == 2 and all(g[0].meta["deadline"] == "group" for g in dropped)
    assert took < 30, took
    err = capsys.readouterr().err
    assert "[abandoned] round 0:" in err and "left behind" in err


def test_an_eval_tree_that_ignores_cancellation_is_abandoned_after_its_deadline_and_grace():
    from common.run.rollout import ABANDONED, bounded_tree, run_round

    env = make_env("textcraft", executor="worker-ordered")
    rcfg = RuntimeConfig(max_steps=3, temperature=0.0, use_rubrics=False, tree_timeout_s=0.5, cancel_grace_s=0.5)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match="abandoned"):
        run_round(bounded_tree(run_root(task(), env, IgnoresCancellation({}), rcfg), rcfg, "eval tree"), 0.5)
    assert time.perf_counter() - t0 < 30  # run_root alone waited 60 s for the cancelled call
    assert any(t.get_name() == "eval tree" for t in ABANDONED)


def test_the_round_ahead_is_waited_for_at_most_its_limit(capsys):
    """Issue #53: RoundAhead.take and close joined the rollout thread without a timeout."""
    import threading

    from level1_batched.overlap import Rollouts, RoundAhead

    release = threading.Event()

    def collect(rnd, stage):
        release.wait(120)  # a round that never ends (released when the test is over)
        return Rollouts(rnd, stage, [], 0)

    try:
        ahead = RoundAhead(collect, limit_s=0.5)
        t0 = time.perf_counter()
        ahead.start(1, "execution")
        with pytest.raises(RuntimeError, match=r"round 1 \(execution\) still rolling out 0.5 s after it started"):
            ahead.take(1, "execution")
        ahead.start(2, "rubric")  # the abandoned round no longer blocks the next one
        ahead.close()
        assert time.perf_counter() - t0 < 30
        assert "[abandoned] round 2 (rubric) still rolling out" in capsys.readouterr().err
    finally:
        release.set()


def test_a_group_cut_by_a_deadline_is_dropped_and_replaced():
    from common.agent.tree import Node, Tree

    def tree(ok: bool, late: bool = False) -> Tree:
        t = Tree(task_id="t", env="textcraft", success=ok)
        t.nodes["0"] = Node(node_id="0", parent_id=None, depth=0, fork_step=None, goal="g", max_steps=3)
        t.nodes["0"].success = ok
        if late:
            t.meta["deadline"] = "tree"
        return t

    class Sampler:
        cursor = 0

        def next(self):
            self.cursor += 1
            return {"id": f"t{self.cursor}", "goal": "g"}

    outcomes = iter([[tree(True, late=True), tree(False)], [tree(True), tree(False)]])

    class Preset:
        generate_rubrics, execution_reward = False, "binary"

    cfg = TrainConfig.make(model="tiny", env="textworld", tasks_per_step=1, rollouts_per_task=2)
    dropped: list = []
    groups, replaced = collect_groups(
        cfg, "execution", 0, Sampler(), Preset, lambda jobs: [next(outcomes) for _ in jobs], 1, dropped
    )
    assert len(groups) == 1 and not any(t.meta.get("deadline") for t in groups[0])
    assert len(dropped) == 1 and dropped[0][0].meta["deadline"] == "tree"  # TextWorld too (no signal rule)


def test_bad_deadline_values_are_refused_in_one_line():
    with pytest.raises(ValueError, match="--step-timeout-s must be > 0"):
        RuntimeConfig(step_timeout_s=0)
    with pytest.raises(ValueError, match="--max-launches-per-step must be >= 0"):
        RuntimeConfig(max_launches_per_step=-1)
    cfg = TrainConfig.make(model="tiny", tree_timeout_s=60, max_agents_per_tree=9)
    assert (cfg.rollout.tree_timeout_s, cfg.rollout.max_agents_per_tree) == (60, 9)


def test_the_default_deadlines_are_the_public_ones():
    """SERA's configs set ``step_timeout: 1800`` and ``timeout: 3600`` (``Training/configs/textcraft.yaml``,
    ``textworld.yaml``) and every rollout passes them; platoon's 300 s ``run_episode`` default is overridden
    everywhere (audit 2026-12-06 N2; issue #52: 300 s cut the quick start's own trees on a loaded CPU)."""
    rc, tc = RuntimeConfig(), TrainConfig.make(model="tiny").rollout
    for c in (rc, tc):
        assert (c.step_timeout_s, c.tree_timeout_s, c.group_timeout_s) == (1800, 3600, 3600)
        assert c.cancel_grace_s == 30


def test_without_launch_bounds_every_launch_runs():
    """``0`` turns both launch bounds off (the public form, what ``--paper`` sets): 12 launches, 12 children."""
    tree = run(Scripted({(0, 0): cell(launch_code(12))}), max_launches_per_step=0, max_agents_per_tree=0,
               use_rubrics=False)  # fmt: skip
    assert len([n for n in tree.nodes.values() if n.depth == 1]) == 12
    assert tree.nodes["0"].steps[0].refused_launches == 0 and "refused_by_bound" not in tree.meta


def test_a_cut_step_is_said_on_the_console(capsys):
    """Issue #52: a round whose trees a deadline cut said only "(no update)". Now the loop's progress prints
    one ``[deadline]`` line naming the deadline and the option that raises it when the rollout phase ends.
    One wall-clock deadline only (the step's, 1 s; the tree's is the default 3,600 s)."""
    stats = LiveStats()
    policy = CountingPolicy(Scripted({}, hang={("act", "0")}), stats)
    bar = RunProgress(False, 1, 0, stats, heartbeat_s=0)
    bar.phase("execution rollouts")
    env = make_env("textcraft", executor="worker-ordered")
    rcfg = RuntimeConfig(max_steps=3, temperature=0.0, use_rubrics=False, step_timeout_s=1.0)
    trees = asyncio.run(rollout_group(task(), [rcfg], env, policy, None))
    assert "the act call did not return within 1 s" in trees[0].root.error
    assert "[deadline]" not in capsys.readouterr().out  # said once the rollouts are over
    bar.phase("training")
    out = capsys.readouterr().out
    assert (
        f"[deadline] 1 agent cut by the step deadline (1 s, --step-timeout-s): {trees[0].task_id}: act call of "
        "node 0 past 1 s; each ended with an error and reward 0. On a slow or shared machine raise "
        "--step-timeout-s." in out
    )
    bar.close()
    assert "[deadline]" not in capsys.readouterr().out  # said once


def test_the_heartbeat_says_where_a_slow_round_is_and_dumps_a_call_that_waits(tmp_path):
    # no race between two clocks: the hung call returns once the heartbeat has both said where the round is and
    # dumped the waiting call (what the test checks); the step deadline (60 s) only bounds a failing run
    stats, said = LiveStats(), []
    stats.stuck_path = tmp_path / "stuck_calls.jsonl"
    where = "0/1 trees done | 1 calls in flight (oldest: act call of node 0.1 step 0"

    def seen() -> bool:
        dumped = stats.stuck_path.exists() and "heartbeat: a call waits for" in stats.stuck_path.read_text()
        return dumped and any(where in line for line in said)

    policy = CountingPolicy(Scripted({(0, 0): cell(launch_code(1))}, hang={("act", "0.1")}, release=seen), stats)
    bar = RunProgress(False, 1, 0, stats, heartbeat_s=0.2)
    bar.log = lambda line, done=None: said.append(line)  # type: ignore[method-assign]
    bar.phase("execution rollouts")
    env = make_env("textcraft", executor="worker-ordered")
    rcfg = RuntimeConfig(max_steps=3, temperature=0.0, use_rubrics=False, step_timeout_s=60.0)
    asyncio.run(rollout_group(task(), [rcfg], env, policy, None))
    bar.close()
    assert any(line.startswith("[heartbeat] execution rollouts for") and where in line for line in said), said
    lines = [json.loads(x) for x in stats.stuck_path.read_text().splitlines()]
    beat = next(x for x in lines if x["reason"].startswith("heartbeat: a call waits for"))
    assert [(c["kind"], c["node_id"]) for c in beat["calls"]] == [("act", "0.1")]
    assert not any("past" in x["reason"] for x in lines)  # released before any deadline


def test_a_step_deadline_dumps_the_calls_in_flight(tmp_path):
    stats = LiveStats()
    stats.stuck_path = tmp_path / "stuck_calls.jsonl"
    scripted = Scripted({(0, 0): cell(launch_code(1))}, hang={("act", "0.1")})
    policy = CountingPolicy(scripted, stats)
    env = make_env("textcraft", executor="worker-ordered")
    rcfg = RuntimeConfig(max_steps=3, temperature=0.0, use_rubrics=False, step_timeout_s=1.5)
    asyncio.run(rollout_group(task(), [rcfg], env, policy, None))  # one clock: the step deadline, no heartbeat
    lines = [json.loads(x) for x in stats.stuck_path.read_text().splitlines()]
    line = next(x for x in lines if "past" in x["reason"])
    assert "step 0 of node 0 past 1.5 s" in line["reason"]
    assert line["calls"][0]["kind"] == "act" and line["calls"][0]["node_id"] == "0.1"
    assert line["calls"][0]["age_s"] >= 1.4
    assert scripted.cancelled == 1  # the hung call was cancelled, not left running


def test_a_paper_run_keeps_the_paper_deadlines():
    from common.train_config import paper_profile

    cfg = TrainConfig.make(model="tiny", **paper_profile("textcraft"))
    assert replace(cfg.rollout).step_timeout_s == 1800 and cfg.rollout.group_timeout_s == 3600
    assert (cfg.rollout.max_launches_per_step, cfg.rollout.max_agents_per_tree) == (0, 0)  # public: none


# ---- signals: a stuck run stops on SIGINT or SIGTERM, even when started with SIGINT ignored ----------------
STUCK_AFTER_FIRST_CHECKPOINT = """
import asyncio
from common.run import checkpoint, progress

_save, _generate = checkpoint.TorchCheckpointer.save, progress.CountingPolicy.generate
STUCK = []

def save(self, *a, **k):
    _save(self, *a, **k)
    STUCK.append(1)  # from now on every model call hangs: an engine that lost its requests

async def generate(self, request):
    if STUCK:
        await asyncio.Event().wait()
    return await _generate(self, request)

checkpoint.TorchCheckpointer.save, progress.CountingPolicy.generate = save, generate
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stuck_run_stops_on_a_signal_with_the_resume_command_and_its_checkpoint(tmp_path, sig):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import torch

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "sitecustomize.py").write_text(STUCK_AFTER_FIRST_CHECKPOINT)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{root}", "OMP_NUM_THREADS": "1"}
    out = tmp_path / "run"
    args = ["train", "--model", "tiny", "--steps", "5", "--oracle-mix", "0.5", "--out", str(out),
            "--codeact-executor", "worker-ordered"]  # fmt: skip
    # started as `setsid nohup sera train ... &` starts it: SIGINT ignored (the H200 run that could not be stopped)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sera", *args], cwd=root, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    t0 = time.time()
    ckpt = out / "checkpoints" / "step_000001"
    while not ckpt.exists() and proc.poll() is None and time.time() - t0 < 300:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    time.sleep(3)  # the next round's calls are in flight and hang
    t1 = time.time()
    proc.send_signal(getattr(signal, sig))
    stdout, stderr = proc.communicate(timeout=60)
    assert time.time() - t1 < 10, f"took {time.time() - t1:.1f} s to stop"
    assert proc.returncode == 130, stderr[-3000:]
    said = stderr.strip().splitlines()
    assert said[-2].startswith("interrupted: checkpoint of step 1 saved"), said[-3:]
    assert said[-1].startswith("resume with: sera train") and said[-1].endswith("--resume"), said[-1]
    state = torch.load(ckpt / "state.pt", weights_only=False)  # intact: it loads
    assert state is not None
