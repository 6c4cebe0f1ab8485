"""Smoke tests of every `sera` entry point, run as a user would (subprocess, tiny budgets)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "common" / "envs" / "textworld_sync" / "public_sample.jsonl"  # shipped with the package


def sera(*args: str, ok: bool = True, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    r = subprocess.run(
        [sys.executable, "-m", "sera", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if ok:
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def test_help_lists_every_command():
    out = sera("--help").stdout
    for cmd in ("data", "rollout", "view", "eval", "train", "setup"):
        assert cmd in out
    assert "--method" in sera("train", "--help").stdout


def test_data_rollout_view_eval_roundtrip(tmp_path: Path):
    tc = tmp_path / "tc.jsonl"
    sera("data", "textcraft", "--split", "val", "--n", "4", "--seed", "1", "--out", str(tc))
    assert len(tc.read_text().splitlines()) == 4
    tw = tmp_path / "tw.jsonl"
    sera("data", "textworld", "--split", "dev", "--n", "3", "--seed", "1", "--out", str(tw))
    log = tmp_path / "trees.jsonl"
    out = sera(
        "rollout", "--env", "textworld", "--task", f"{tw}:2", "--policy", "oracle", "--log", str(log)
    ).stdout
    assert "root success: True" in out
    html = tmp_path / "trees.html"
    sera("view", str(log), "--html", str(html))
    assert html.read_text().startswith("<!DOCTYPE html>")
    sera(
        "eval", "--env", "textcraft", "--tasks", str(tc), "--policy", "oracle", "--out", str(tmp_path / "ev")
    )
    assert json.loads((tmp_path / "ev" / "report.json").read_text())["success_rate"] == 1.0


@pytest.mark.skipif(not SAMPLE.exists(), reason=f"the shared sample tasks are not at {SAMPLE}")
def test_eval_on_the_public_sample_rows(tmp_path: Path):
    sera(
        "eval",
        "--env",
        "textworld",
        "--tasks",
        str(SAMPLE),
        "--policy",
        "oracle",
        "--out",
        str(tmp_path / "e"),
    )
    report = json.loads((tmp_path / "e" / "report.json").read_text())
    assert report["n_done"] == 4 and report["success_rate"] == 1.0


def test_bad_task_file_names_file_and_line(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    good = subprocess.run(
        [sys.executable, "-m", "sera", "data", "textcraft", "--n", "1", "--out", str(bad)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert good.returncode == 0
    bad.write_text(bad.read_text() + '{"id": "x", "goal": \n')
    r = sera(
        "rollout", "--env", "textcraft", "--task", f"{bad}:0", "--log", str(tmp_path / "l.jsonl"), ok=False
    )
    assert r.returncode != 0 and f"{bad}:2" in (r.stdout + r.stderr)


def test_unknown_policy_and_env_are_clear_errors(tmp_path: Path):
    r = sera(
        "rollout", "--env", "textcraft", "--policy", "gpt9", "--log", str(tmp_path / "l.jsonl"), ok=False
    )
    assert r.returncode != 0 and "gpt9" in (r.stdout + r.stderr)
    r = sera("rollout", "--env", "minecraft", "--log", str(tmp_path / "l.jsonl"), ok=False)
    assert r.returncode == 2 and "minecraft" in r.stderr and "textcraft" in r.stderr  # names the choices


def test_data_textcraft_paper_writes_the_papers_val_split(tmp_path: Path):
    out = tmp_path / "val.jsonl"
    sera("data", "textcraft", "--paper", "--split", "val", "--out", str(out))
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    tiers = [r["misc"]["difficulty"] for r in rows]
    assert len(rows) == 632 and rows[0]["id"] == "textcraft_synth.val.0"
    assert [tiers.count(t) for t in ("easy", "medium", "hard", "extreme")] == [147, 213, 136, 136]
