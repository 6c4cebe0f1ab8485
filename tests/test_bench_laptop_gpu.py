"""bench/bench_laptop_gpu.py runs on a CPU too (gpu "cpu", no GPU memory), so its summary is tested here on a
few-second run of the test model: summary.json has exactly the issue's keys with sane values, the run's
metrics.jsonl and config.json are copied beside it, the details hold the resident set over time, and
``--profile`` writes the stack samples.

Run: ``python -m pytest -n 0 tests/test_bench_laptop_gpu.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model", "tiny", "--steps", "1", "--schedule", "execution:1", "--max-new-tokens", "12",
        "--rubric-max-new-tokens", "12", "--score-max-new-tokens", "12", "--max-steps", "2",
        "--oracle-mix", "0.7", "--score-noise", "0.3", "--n-tasks", "8", "--difficulty", "medium",
        "--max-task-replacements", "3"]  # fmt: skip


def test_the_quick_start_bench_writes_its_summary_on_a_cpu(tmp_path: Path):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "bench/bench_laptop_gpu.py", "--out", str(out), "--profile", "--", *TINY],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["wall_s", "optimizer_steps", "gpu_peak_gib", "host_peak_rss_gb", "tokens_per_s", "gpu"]
    assert summary["optimizer_steps"] == 1 and 0 < summary["wall_s"] < 600
    assert summary["gpu"] == "cpu" and summary["gpu_peak_gib"] == 0
    assert 0.1 < summary["host_peak_rss_gb"] < 16 and summary["tokens_per_s"] > 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows and json.loads((out / "config.json").read_text())["model"] == "tiny"
    details = json.loads((out / "details.json").read_text())
    assert details["exit_code"] == 0 and details["rss_timeline"]["rows"]
    assert 0 < details["wall_to_last_step_s"] <= summary["wall_s"]
    assert details["command"].startswith("sera train --model tiny")
    stacks = (out / "stacks.txt").read_text()
    assert "samples" in stacks.splitlines()[0] and "MainThread;" in stacks
    assert "[bench] 1 optimizer steps" in r.stdout and "host peak RSS" in r.stdout


@pytest.mark.parametrize("part", ["decode"])
def test_the_decode_part_times_every_mode(tmp_path: Path, part: str):
    r = subprocess.run(
        [sys.executable, "bench/bench_laptop_gpu.py", "--part", part, "--model", "tiny", "--batches", "1,2",
         "--new-tokens", "6", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads((tmp_path / "decode.json").read_text())
    assert {(x["mode"], x["batch"]) for x in got["rows"]} >= {("hf", 1), ("slots", 2)}
    # a step's time is (full run - prefill) / steps: on a loaded 2-core machine the difference may read 0
    assert all(x["ms_per_step"] >= 0 and x["prefill_s"] > 0 for x in got["rows"])
