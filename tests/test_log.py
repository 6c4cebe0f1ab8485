"""Tests of common/agent/log.py: round trip, torn final line, malformed lines, and a SIGKILL mid-write."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from common.agent.log import TreeLogError, append_tree, read_trees
from common.agent.tree import CallRecord, Node, Step, Tree

REPO = Path(__file__).resolve().parents[1]


def make_tree(task_id: str = "t0", payload: int = 10) -> Tree:
    call = CallRecord(
        role="act", messages=[{"role": "user", "content": "go"}], text="reply", output_ids=[1, 2]
    )
    root = Node("0", None, 0, None, "root goal", 20, steps=[Step(0, call, "o" * payload, launched=["0.1"])])
    child = Node("0.1", "0", 1, 0, "child goal", 20, finished=True, score=0.5, score_success=True)
    return Tree(task_id=task_id, env="textcraft", nodes={"0": root, "0.1": child}, success=True)


def test_round_trip(tmp_path):
    path = tmp_path / "sub" / "trees.jsonl"
    trees = [make_tree(f"t{i}") for i in range(3)]
    for t in trees:
        append_tree(path, t)
    back = read_trees(path)
    assert [t.task_id for t in back] == ["t0", "t1", "t2"]
    assert back[0] == trees[0]
    assert back[0].root.steps[0].call.output_ids == [1, 2]


def test_torn_final_line_is_skipped_with_warning(tmp_path, caplog):
    path = tmp_path / "trees.jsonl"
    append_tree(path, make_tree("a"))
    line = json.dumps(make_tree("b").to_dict())
    with open(path, "a") as f:
        f.write(line[: len(line) // 2])
    with caplog.at_level(logging.WARNING, logger="common.agent.log"):
        trees = read_trees(path)
    assert [t.task_id for t in trees] == ["a"]
    assert "torn final line" in caplog.text and "trees.jsonl:2" in caplog.text


@pytest.mark.parametrize(
    "bad, why",
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"schema_version": 99, "nodes": {}}', "schema_version"),
        ('{"schema_version": 1, "task_id": "x", "env": "e", "nodes": {}, "bogus": 1}', "invalid tree"),
        ('{"schema_version": 1, "task_id": "x", "env": "e", "nodes": {}}', "root_id"),
    ],
)
def test_malformed_middle_line_names_file_and_line(tmp_path, bad, why):
    path = tmp_path / "trees.jsonl"
    append_tree(path, make_tree("a"))
    with open(path, "a") as f:
        f.write(bad + "\n")
    append_tree(path, make_tree("c"))
    with pytest.raises(TreeLogError, match=why) as info:
        read_trees(path)
    assert f"{path}:2:" in str(info.value) and info.value.line == 2


def test_unknown_parent_is_rejected(tmp_path):
    tree = make_tree()
    tree.nodes["0.1"].parent_id = "nope"
    path = tmp_path / "trees.jsonl"
    append_tree(path, tree)
    with pytest.raises(TreeLogError, match="unknown parent"):
        read_trees(path)


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        read_trees("/nonexistent/trees.jsonl")


WRITER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repo!r})
    from common.agent.log import append_tree
    from common.agent.tree import CallRecord, Node, Step, Tree
    i = 0
    while True:
        call = CallRecord(role="act", messages=[], text="reply")
        root = Node("0", None, 0, None, "root goal", 20, steps=[Step(0, call, "o" * (400_000 + 37 * i))])
        append_tree({path!r}, Tree(task_id=f"t{{i}}", env="textcraft", nodes={{"0": root}}))
        i += 1
    """
)


def test_log_survives_sigkill_mid_write(tmp_path):
    path = tmp_path / "trees.jsonl"
    code = WRITER.format(repo=str(REPO), path=str(path))
    for attempt in range(3):  # three kills at different moments
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if path.exists() and path.read_bytes().count(b"\n") >= 3 * (attempt + 1):
                    break
                time.sleep(0.01)
            else:
                pytest.fail("the writer subprocess produced no lines within 20 s")
            time.sleep(0.003 * attempt)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        data = path.read_bytes()
        if not data.endswith(b"\n"):
            # A torn tail from this kill: the reader must skip it; drop it so the next writer appends cleanly.
            trees = read_trees(path)
            assert len(trees) == data.count(b"\n")
            path.write_bytes(data[: data.rfind(b"\n") + 1])
    data = path.read_bytes()
    trees = read_trees(path)
    assert len(trees) == data.count(b"\n") >= 9
    assert all(t.root.goal == "root goal" for t in trees)


def test_one_json_document_eval_result_or_tree(tmp_path):
    """`sera view results/00001.json`: an eval result file yields its tree (not a "torn final line")."""
    tree = make_tree("r1")
    result = tmp_path / "00001.json"
    result.write_text(json.dumps({"index": 1, "task_id": "r1", "success": False, "tree": tree.to_dict()}))
    assert [t.task_id for t in read_trees(result)] == ["r1"]
    bare = tmp_path / "tree.json"
    bare.write_text(json.dumps(tree.to_dict(), indent=1))  # pretty-printed over many lines
    assert [t.task_id for t in read_trees(bare)] == ["r1"]
    errored = tmp_path / "00002.json"
    errored.write_text(json.dumps({"index": 2, "task_id": "r2", "error": "RuntimeError: boom"}))
    with pytest.raises(TreeLogError, match=r"00002.json:1: .*no tree.*RuntimeError: boom"):
        read_trees(errored)
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"env": "textcraft", "per_tier": {}}))
    with pytest.raises(TreeLogError, match="neither a tree nor"):
        read_trees(report)
    with pytest.raises(IsADirectoryError):
        read_trees(tmp_path)


def test_closing_line_names_only_outputs_that_exist(tmp_path: Path):
    from common.run.metrics import closing_line

    (tmp_path / "metrics.jsonl").write_text("")
    line = closing_line(tmp_path, 0, 3)
    assert line.startswith("done: 0 optimizer steps in 3 rounds.")
    assert "metrics.jsonl" in line and "checkpoints/" not in line and "curves.png" not in line
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "curves.png").write_bytes(b"")
    line = closing_line(tmp_path, 2, 3)
    assert "checkpoints/" in line and "curves.png" in line
