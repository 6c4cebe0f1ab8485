"""``--time-limit-s``: a run that must end inside a fixed window (a 30-minute GPU job) stops after the round
that ends past the limit, as if that step were its last: the step's checkpoint, the last step's held-out
evaluation, exit 3 with the reason, and ``--resume`` goes on from there.

The limit in these tests is a microsecond, so the first round always ends past it: no race with the clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_level1_async import SMALL as LEVEL1_SMALL

from common.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
SMALL = {**LEVEL1_SMALL, "schedule": "execution:5"}
"""tests/test_level1_async.py's small config (teacher-forced oracle replies give mixed groups, so rounds train),
Execution steps only."""


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _held_out(tmp_path: Path) -> str:
    from common.data import write_jsonl
    from common.envs.textcraft.tasks import generate_tasks

    write_jsonl(tmp_path / "val.jsonl", generate_tasks("val", 2))
    return str(tmp_path / "val.jsonl")


def _check_stopped_at_the_first_round(run: Path, history) -> None:
    """One round ran; it trained (step 1), its checkpoint is on disk and its policy was evaluated (step 0 by
    the schedule, step 1 because the run stopped there, though --eval-every 10 would not have)."""
    assert history.stopped is not None and "past --time-limit-s 1e-06" in history.stopped, history.stopped
    rows = _rows(run)
    rounds = [r for r in rows if "stage" in r]
    assert [r["round"] for r in rounds] == [0] and not rounds[0]["train/skipped"]
    assert [r["step"] for r in rows if "eval/success" in r] == [0, 1]
    assert (run / "checkpoints" / "step_000001").is_dir()
    assert {json.loads(x)["meta"]["round"] for x in (run / "trees.jsonl").read_text().splitlines()} == {0}


def test_level0_stops_at_the_round_past_the_limit_and_evaluates_it(tmp_path: Path):
    from level0_single_process.train import train

    cfg = TrainConfig.make(**SMALL, out=str(tmp_path / "run"), steps=5, time_limit_s=1e-6,
                           eval_tasks=_held_out(tmp_path), eval_every=10)  # fmt: skip
    _check_stopped_at_the_first_round(tmp_path / "run", train(cfg, progress=False))


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [0, 1])
def test_level1_stops_there_too_and_starts_no_round_ahead_past_the_limit(tmp_path: Path, staleness: int):
    """Level 1 the same; with --max-staleness 1 the next round would start during the step: past the limit it
    does not (no round-1 tree is ever written, and the run does not wait for one)."""
    import level1_batched.train as level1

    cfg = TrainConfig.make(**SMALL, out=str(tmp_path / "run"), steps=5, time_limit_s=1e-6,
                           eval_tasks=_held_out(tmp_path), eval_every=10)  # fmt: skip
    history = level1.train(cfg, level1.Level1Config(max_staleness=staleness), progress=False)
    _check_stopped_at_the_first_round(tmp_path / "run", history)


def test_sera_train_exits_3_with_the_limit_and_resume_goes_on(tmp_path: Path):
    """The command line: exit 3, the reason and the command that continues it; that command (the limit may
    change on --resume) trains on to --steps."""
    run = tmp_path / "run"
    flags = ["--model", "tiny", "--out", str(run), "--steps", "2", "--schedule", "execution:2", "--max-steps", "3",
             "--max-new-tokens", "16", "--rubric-max-new-tokens", "16", "--oracle-mix", "0.7",
             "--score-noise", "0.3", "--difficulty", "medium", "--n-tasks", "16", "--tasks-per-step", "1",
             "--max-task-replacements", "3", "--max-idle-rounds", "4", "--codeact-executor", "worker-ordered"]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}

    def sera(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sera", "train", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip

    first = sera(*flags, "--time-limit-s", "0.000001")
    assert first.returncode == 3, (first.returncode, first.stderr[-3000:])
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith("stopped before --steps 2: ") and "past --time-limit-s 1e-06" in last, last
    assert last.endswith("--resume)") and "Traceback" not in first.stderr
    assert [r["step"] for r in _rows(run) if "stage" in r] == [0]
    second = sera(*flags, "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    rounds = [r for r in _rows(run) if "stage" in r]
    assert [r["round"] for r in rounds][:1] == [0] and sum(not r["train/skipped"] for r in rounds) == 2
