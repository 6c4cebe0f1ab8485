"""bench/learning.sh (data -> SFT -> SERA / RAO turns with in-run held-out evals -> base eval -> figure) resumes
after a kill -9 in every phase: the same command, run again, finishes the job with nothing lost or doubled.

Tiny model, hf engine, a few steps: the point is the bookkeeping (phase markers, checkpoints, truncated logs,
evaluation directories), not learning.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KNOBS = {
    "PYTHON": sys.executable,
    "MODEL": "tiny",
    "ENGINE": "hf",
    "SFT_STEPS": "1",  # one step and one task's demonstrations: a model is written, resumed or not
    "SFT_TASKS": "1",
    "RL_STEPS": "2",
    "RL_TURNS": "1 2",
    "N_EVAL": "1",
    "EVAL_EVERY": "1",
    "BATCH": "8",
    "AGENT": "--max-steps 2 --max-new-tokens 12",
    "CALLS": "--rubric-max-new-tokens 16 --score-max-new-tokens 16",
    "RL_EXTRA": "--codeact-executor worker-ordered --n-tasks 8 --tasks-per-step 1 --rollouts-per-task 2 "
    "--oracle-mix 0.7 --score-noise 0.3 --max-task-replacements 3 --lr 1e-3",
    "OMP_NUM_THREADS": "1",
}
PHASES = ["sft", "rl_sera_1", "rl_rao_1", "rl_sera_2", "rl_rao_2", "eval_base"]


def start(out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", "bench/learning.sh", str(out)],
        cwd=ROOT,
        env={**os.environ, **KNOBS},
        start_new_session=True,  # its own process group: the kill takes the phase's python with it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def kill_during(out: Path, phase: str, after_s: float = 2.0, limit_s: float = 600) -> None:
    """Start the driver, wait until ``phase`` starts, let it run ``after_s`` seconds, then kill -9 it all."""
    times = out / "times.txt"
    seen = len(times.read_text()) if times.exists() else 0  # only this call's lines count
    proc, t0 = start(out), time.time()
    while proc.poll() is None and time.time() - t0 < limit_s:
        if times.exists() and f"{phase}: start" in times.read_text()[seen:]:
            time.sleep(after_s)
            break
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_learning_driver_resumes_after_a_kill_in_every_phase(tmp_path: Path):
    out = tmp_path / "learn"
    for phase in PHASES:
        kill_during(out, phase)
    done = subprocess.run(
        ["bash", "bench/learning.sh", str(out)], cwd=ROOT, env={**os.environ, **KNOBS}, timeout=900,
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for phase in ["data", *PHASES]:
        assert (out / f"{phase}.done").exists(), f"{phase} not finished: {(out / 'times.txt').read_text()}"
    log = (out / "times.txt").read_text()
    for phase in PHASES:  # every phase was killed once, started again and finished
        assert log.count(f"{phase}: start") >= 2 and f"{phase}: rc=0" in log, log
    assert (out / "sft" / "model" / "config.json").exists()
    for method in ("sera", "rao"):
        m = rows(out / f"rl_{method}" / "metrics.jsonl")
        evals = [r["step"] for r in m if "eval/success" in r]
        assert evals == [0, 1, 2], f"{method}: held-out evals {evals} (one per step, none doubled or lost)"
        rounds = [r["round"] for r in m if "stage" in r]
        assert rounds == list(range(len(rounds))), f"{method}: rounds {rounds}"
        assert sum(not r["train/skipped"] for r in m if "stage" in r) == 2
        assert (out / f"rl_{method}" / "checkpoints" / "step_000002" / "state.pt").exists()
    report = json.loads((out / "eval_base" / "report.json").read_text())
    assert report["n_done"] == report["n_tasks"] == 1
    table = (out / "learning.md").read_text()
    assert "| policy | step 0 | step 1 | step 2 |" in table
    assert table.count("| SFT + SERA | ") == 2 and "not run" not in table
    assert (out / "learning.png").stat().st_size > 10_000


def test_a_run_directory_has_one_writer(tmp_path: Path):
    """A second process writing the same run directory (say, a phase that outlived a killed driver) is refused
    while the first lives; once it is gone the directory is free again."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from common.run.checkpoint import "
         "prepare_out; prepare_out(Path(sys.argv[1]), resume=True); print('held', flush=True); time.sleep(60)",
         str(tmp_path / "run")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines = iter(holder.stdout.readline, "")  # prepare_out may first say it starts a fresh run
        assert any(line.strip() == "held" for line in lines)
        from common.run.checkpoint import prepare_out

        with pytest.raises(SystemExit, match="being written by another running process"):
            prepare_out(tmp_path / "run", resume=True)
    finally:
        holder.kill()
        holder.wait()
    prepare_out(tmp_path / "run", resume=True)  # the lock died with its process
