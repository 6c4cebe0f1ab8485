"""The test suite cleans up after itself (issue #38.7: a full run left 4.4 GB in /tmp): a passing session
leaves nothing in TMPDIR, a failing one keeps its files in one named directory; the engine's copy of the
weights (``save_model``'s temp directory) goes when its process exits.

Run: ``python -m pytest tests/test_tmp_cleanup.py -q``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

INNER = '''
import os, tempfile
from pathlib import Path


def test_writes_where_tests_and_libraries_write(tmp_path):
    base = os.environ["SERA_TEST_SESSION_TMP"]
    assert os.environ["TMPDIR"] == base == tempfile.gettempdir()
    assert str(tmp_path).startswith(base + os.sep)
    Path(tempfile.mkdtemp(prefix="lib-"), "weights").write_bytes(b"w" * 4096)  # a library's temp directory
    (tmp_path / "run.log").write_text("x")
    assert {outcome}
'''


def run_session(tmp_path: Path, passing: bool, workers: int) -> tuple[subprocess.CompletedProcess, Path]:
    """A pytest session of one test file, run with tests/session_tmp.py and ``TMPDIR`` = a fresh directory;
    returns the result and that directory."""
    tmpdir, inner = tmp_path / "tmp", tmp_path / "inner"
    tmpdir.mkdir()
    inner.mkdir()
    (inner / "pytest.ini").write_text("[pytest]\n")
    (inner / "test_inner.py").write_text(INNER.format(outcome="True" if passing else "False"))
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": f"{ROOT / 'tests'}{os.pathsep}{ROOT}"}
    env.pop("SERA_TEST_SESSION_TMP", None)  # this session's: the inner one makes its own
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "session_tmp", "-p", "no:cacheprovider", "-q", "-n", str(workers),
         "-c", str(inner / "pytest.ini"), str(inner)],
        cwd=inner, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return r, tmpdir


@pytest.mark.slow
def test_a_passing_session_leaves_nothing_in_tmpdir(tmp_path):
    r, tmpdir = run_session(tmp_path, passing=True, workers=2)  # as the suite runs: xdist workers
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert list(tmpdir.iterdir()) == []


def test_a_failing_session_keeps_its_files_in_one_named_directory(tmp_path):
    r, tmpdir = run_session(tmp_path, passing=False, workers=0)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    (kept,) = list(tmpdir.iterdir())
    assert kept.name.startswith("sera-tests-") and f"kept in {kept}" in r.stdout
    assert list(kept.glob("lib-*/weights")) and list(kept.rglob("run.log"))


def test_this_session_writes_in_a_directory_of_its_own():
    base = os.environ["SERA_TEST_SESSION_TMP"]
    assert Path(base).name.startswith("sera-tests-") and tempfile.gettempdir() == base == os.environ["TMPDIR"]
    assert len(os.path.join(base, "ray", "session_2026-12-04_13-35-00_123456_12345", "sockets", "plasma_store")) < 107


def test_the_engines_copy_of_the_weights_goes_when_its_process_exits(tmp_path):
    """``save_model`` without a directory (level 1's ``--engine vllm``; the engine tests) makes a temp
    directory as big as the model: deleted at exit. One it was given is the caller's and stays."""
    script = (
        "from common.policy.models import build_tiny_model\n"
        "from level1_batched.vllm_engine import save_model\n"
        "m, t = build_tiny_model(0)\n"
        f"print(save_model(m, t)); print(save_model(m, t, {str(tmp_path / 'mine')!r}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    made, given = r.stdout.split()[-2:]
    assert Path(made).parent == tmp_path and Path(made).name.startswith("sera-engine-")
    assert not Path(made).exists()
    assert (Path(given) / "config.json").is_file()
