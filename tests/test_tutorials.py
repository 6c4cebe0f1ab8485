"""Every tutorial runs top to bottom as a plain script (they are jupytext percent-format files) and prints
its key number line, checked here against the value the tutorial teaches (the tutorials assert on their
own numbers too; this catches a tutorial whose asserts were weakened or whose output changed silently).

Run: pytest tests/test_tutorials.py -q  (all of them: a few minutes on 2 cores; -k 03 for one)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))


def _float(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m, f"no line matching {pattern!r} in the output"
    return float(m.group(1))


def _check_08(out: str) -> None:
    if "SKIPPED: level 2 needs Ray" in out:
        pytest.skip("tutorial 08 skipped itself: ray is not installed")
    assert _float(r"TUTORIAL08 max_loss_diff (\S+)", out) <= 1e-5
    assert _float(r"max_grad_norm_rel_diff (\S+) sync_gap", out) <= 1e-4
    assert _float(r"sync_gap (\S+)", out) <= 1e-4


KEY_LINES = {
    "01_environments": lambda out: _float(r"TUTORIAL01 tw_steps_left (\d+)", out) == 27,
    "02_recursive_agent": lambda out: re.search(r"TUTORIAL02 children 3 mean_score 1\.0\b", out),
    "03_rewards_and_loss": lambda out: (
        _float(r"TUTORIAL03 cispo_loss (\S+)", out) == _float(r"by_hand (\S+)", out) == -0.397434
    ),
    "04_counterfactual_branches": lambda out: (
        "TUTORIAL04 L_rank g1 0.0750 g2 0.0000 g3 0.1000 pair_accuracy 0.8333" in out
    ),
    "05_one_training_step": lambda out: _float(r"TUTORIAL05 max_param_diff (\S+)", out) <= 1e-6,
    "06_level0_training": lambda out: re.search(r"TUTORIAL06 steps 3 stages execution,delegation,rubric ", out),
    "07_level0_to_level1": lambda out: (
        _float(r"TUTORIAL07 max_loss_diff (\S+)", out) <= 1e-5
        and _float(r"max_grad_norm_rel_diff (\S+)", out) <= 1e-4
    ),
    "08_level2_on_one_machine": lambda out: _check_08(out) or True,
    "09_learning_demo": lambda out: 0.0 <= _float(r"TUTORIAL09 sera_rubric_pair_accuracy (\S+)", out) <= 1.0,
    "10_your_own_environment": lambda out: _float(r"TUTORIAL10 last_objective_gain (\S+)", out) > 0,
}
"""Per tutorial: a predicate on its stdout (tutorials not listed only have to run and print something)."""


def test_there_are_tutorials():
    assert len(TUTORIALS) >= 10
    missing = sorted(set(KEY_LINES) - {p.stem for p in TUTORIALS})
    assert not missing, f"KEY_LINES names tutorials that do not exist: {missing}"


LEFT_BEHIND_LIMIT = 5 * 2**20
"""Bytes a tutorial may leave in its temporary directory (library caches); its own runs must be gone."""


def _size(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path: Path, tmp_path: Path):
    # SERA_TUTORIAL_QUICK: the tutorials that honour it (07, 09) run a smaller version of their demo (their
    # default numbers are for people); every KEY_LINES check below still holds on the short run.
    # TMPDIR: a directory of the test's own (short: Ray puts sockets there), so what the tutorial leaves
    # behind can be measured; Ray's session logs (tmp/ray) are Ray's and not counted.
    tmp = Path(tempfile.mkdtemp(prefix="sera-tut-", dir="/tmp"))
    try:
        # SERA_TUTORIAL_OUT: where a tutorial writes what it keeps for you (02's HTML page; runs/tutorials/
        # by default), outside the temporary directory that must be left empty.
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "SERA_TUTORIAL_QUICK": "1",
               "TMPDIR": str(tmp), "SERA_TUTORIAL_OUT": str(tmp_path / "kept")}  # fmt: skip
        # a guard against a hang, not a speed check: tutorial 08 (Ray, 2 actors) takes under a minute alone on
        # the 2 cores and ran past 300 s once beside a whole second test run (2026-12-07)
        r = subprocess.run(
            [sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, r.stderr[-3000:]
        left = sorted(p.name for p in tmp.iterdir() if p.name != "ray")
        size = sum(_size(tmp / n) if (tmp / n).is_dir() else (tmp / n).stat().st_size for n in left)
        assert size < LEFT_BEHIND_LIMIT and not [n for n in left if n.startswith("sera_tutorial")], (
            f"{path.name} left {size / 2**20:.1f} MB in its temporary directory: {left}"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert r.stdout.strip(), "a tutorial should show something"
    if path.stem == "02_recursive_agent":  # the page it names is there after the script ended
        page = tmp_path / "kept" / "02_tree.html"
        assert f"wrote {page}" in r.stdout and page.read_text().lstrip().lower().startswith("<!doctype html")
    check = KEY_LINES.get(path.stem)
    if check is not None:
        assert check(r.stdout), f"{path.name}: its key number line is wrong:\n{r.stdout[-2000:]}"
