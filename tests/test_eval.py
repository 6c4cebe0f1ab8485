"""The evaluation harness: aggregation math, manifest pinning, resume after a kill, reports."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.data import write_jsonl
from common.eval import EvalConfig, ManifestMismatch, aggregate, compare, evaluate, render_markdown

ROOT = Path(__file__).resolve().parents[1]


def _res(tier: str, ok: bool, err: str | None = None) -> dict:
    return {"tier": tier, "success": ok, "error": err}


def test_textcraft_aggregation_is_task_weighted():
    # 3/4 easy, 0/1 hard: task-weighted 3/5 (the macro average would be 0.375)
    r = [_res("easy", True)] * 3 + [_res("easy", False), _res("hard", False)]
    a = aggregate(r, "textcraft")
    assert a["success_rate"] == pytest.approx(3 / 5)
    assert a["macro_rate"] == pytest.approx((0.75 + 0.0) / 2)
    assert a["per_tier"]["easy"] == {"n": 4, "successes": 3, "errors": 0, "rate": 0.75}
    assert list(a["per_tier"]) == ["easy", "hard"]


def test_textworld_aggregation_is_macro_over_tiers():
    r = [
        _res("extreme", True),
        _res("easy", True),
        _res("easy", False),
        _res("easy", False),
        _res("easy", True),
    ]
    a = aggregate(r, "textworld")
    assert a["success_rate"] == pytest.approx((0.5 + 1.0) / 2)
    assert a["task_weighted_rate"] == pytest.approx(3 / 5)
    assert list(a["per_tier"]) == ["easy", "extreme"]  # paper order, not insertion order


def test_errors_count_as_failures_even_if_flagged_success():
    a = aggregate([_res("easy", True, "RuntimeError: boom"), _res("easy", True)], "textcraft")
    assert a["successes"] == 1 and a["errors"] == 1 and a["success_rate"] == 0.5


def test_not_done_tasks_are_reported_not_counted():
    a = aggregate([_res("easy", True)], "textcraft", n_tasks=10)
    assert a["n_tasks"] == 10 and a["n_done"] == 1 and a["success_rate"] == 1.0


def test_markdown_report_renders_every_tier():
    a = aggregate([_res("easy", True), _res("medium", False)], "textcraft")
    a["policy"] = "oracle"
    md = render_markdown(a)
    assert "| easy | 1 | 1 | 100.00 |" in md and "| medium | 1 | 0 | 0.00 |" in md
    assert "**50.00**" in md


@pytest.fixture()
def textcraft_tasks(tmp_path: Path) -> Path:
    from common.envs.textcraft.tasks import generate_tasks

    path = tmp_path / "tasks.jsonl"
    write_jsonl(path, generate_tasks(split="val", n=8, seed=3))
    return path


def test_oracle_eval_writes_reports_and_refuses_a_different_model(tmp_path: Path, textcraft_tasks: Path):
    out = tmp_path / "eval"
    cfg = EvalConfig(
        env="textcraft", tasks=str(textcraft_tasks), policy="oracle", out=str(out), concurrency=3
    )
    report = asyncio.run(evaluate(cfg, progress=False))
    assert report["n_done"] == 8 and report["success_rate"] == 1.0
    saved = json.loads((out / "report.json").read_text())
    assert saved["success_rate"] == 1.0 and set(saved["per_tier"]) <= {"easy", "medium", "hard", "extreme"}
    assert (out / "report.md").read_text().startswith("# SERA evaluation")
    assert (out / "success_by_tier.png").stat().st_size > 1000
    tree = json.loads((out / "results" / "00000.json").read_text())["tree"]
    assert tree["success"] is True and tree["nodes"]
    with pytest.raises(ManifestMismatch, match="policy"):
        asyncio.run(
            evaluate(
                EvalConfig(env="textcraft", tasks=str(textcraft_tasks), policy="random", out=str(out)),
                progress=False,
            )
        )
    with pytest.raises(ManifestMismatch, match="max_steps"):
        asyncio.run(
            evaluate(
                EvalConfig(
                    env="textcraft", tasks=str(textcraft_tasks), policy="oracle", out=str(out), max_steps=5
                ),
                progress=False,
            )
        )
    # a changed task file is refused too (one more blank line changes its hash)
    textcraft_tasks.write_text(textcraft_tasks.read_text() + "\n")
    with pytest.raises(ManifestMismatch, match="tasks_sha256"):
        asyncio.run(evaluate(cfg, progress=False))
    # compare renders both runs
    table = compare(out, out, tmp_path / "cmp.png")
    assert "| overall | 100.00 | 100.00 | +0.00 |" in table and (tmp_path / "cmp.png").exists()


def test_errored_tasks_are_failures_and_are_retried(tmp_path: Path, textcraft_tasks: Path):
    out = tmp_path / "eval"
    cfg = EvalConfig(env="textcraft", tasks=str(textcraft_tasks), policy="oracle", out=str(out), limit=3)
    asyncio.run(evaluate(cfg, progress=False))
    # simulate a crashed task: rewrite one result as errored
    p = out / "results" / "00001.json"
    rec = json.loads(p.read_text())
    rec.update(success=False, error="RuntimeError: server went away")
    p.write_text(json.dumps(rec))
    from common.eval import load_results

    assert aggregate(list(load_results(out).values()), "textcraft")["success_rate"] == pytest.approx(2 / 3)
    report = asyncio.run(evaluate(cfg, progress=False))  # resume retries only the errored one
    assert report["success_rate"] == 1.0 and report["errors"] == 0


def test_resume_removes_the_torn_write_of_a_killed_run(tmp_path: Path, textcraft_tasks: Path):
    out = tmp_path / "eval"
    cfg = EvalConfig(env="textcraft", tasks=str(textcraft_tasks), policy="oracle", out=str(out), limit=2)
    asyncio.run(evaluate(cfg, progress=False))
    torn = out / "results" / ".00002.json.abc123.tmp"  # what a SIGKILL inside write_json_atomic leaves
    torn.write_text('{"index": 2, "succ')
    report = asyncio.run(evaluate(cfg, progress=False))
    assert not torn.exists() and report["n_done"] == 2


def test_a_manifest_pins_its_directory_only_after_a_task_finished(tmp_path: Path, textcraft_tasks: Path):
    """A run that died before any task finished cleanly (a typo'd policy, a model erroring on every call)
    leaves a directory the corrected command may reuse; one clean result pins it."""
    out = tmp_path / "eval"
    with pytest.raises(ValueError, match="unknown policy spec"):
        asyncio.run(
            evaluate(
                EvalConfig(env="textcraft", tasks=str(textcraft_tasks), policy="oraclee", out=str(out)),
                progress=False,
            )
        )
    assert not (out / "manifest.json").exists()  # the policy failed to build: nothing was pinned
    # A stale manifest whose run produced only errored results is replaced, not held against us.
    (out / "results").mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps({"env": "textcraft", "policy": "hf:typo"}))
    (out / "results" / "00000.json").write_text(
        json.dumps({"index": 0, "task_id": "x", "tier": "easy", "success": False, "error": "OSError: no"})
    )
    cfg = EvalConfig(env="textcraft", tasks=str(textcraft_tasks), policy="oracle", out=str(out), limit=2)
    report = asyncio.run(evaluate(cfg, progress=False))
    assert report["n_done"] == 2 and report["errors"] == 0 and report["success_rate"] == 1.0
    assert json.loads((out / "manifest.json").read_text())["policy"] == "oracle"
    with pytest.raises(ManifestMismatch, match="policy"):  # now clean results exist: pinned
        asyncio.run(
            evaluate(
                EvalConfig(
                    env="textcraft", tasks=str(textcraft_tasks), policy="random", out=str(out), limit=2
                ),
                progress=False,
            )
        )


def test_compare_refuses_reports_of_different_environments(tmp_path: Path):
    for name, env in (("a", "textcraft"), ("b", "textworld")):
        (tmp_path / name).mkdir()
        report = aggregate([_res("easy", True)], env)
        (tmp_path / name / "report.json").write_text(json.dumps(report))
    assert "overall" in compare(tmp_path / "a", tmp_path / "a")
    with pytest.raises(ValueError, match="'textcraft'.*'textworld'.*not comparable"):
        compare(tmp_path / "a", tmp_path / "b")
    with pytest.raises(FileNotFoundError, match="report.json does not exist"):
        compare(tmp_path / "a", tmp_path)


@pytest.mark.slow
def test_resume_after_kill_loses_and_duplicates_nothing(tmp_path: Path):
    from common.envs.textcraft.tasks import generate_tasks

    tasks = tmp_path / "tasks.jsonl"
    write_jsonl(tasks, generate_tasks(split="val", n=40, seed=5))
    out = tmp_path / "eval"
    cmd = [
        sys.executable,
        "-m",
        "sera",
        "eval",
        "--env",
        "textcraft",
        "--tasks",
        str(tasks),
        "--policy",
        "oracle",
        "--out",
        str(out),
        "--concurrency",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.time() + 300  # a loaded CI machine starts slowly
    results = out / "results"
    while time.time() < deadline and (not results.exists() or len(list(results.glob("*.json"))) < 3):
        if proc.poll() is not None:
            pytest.fail(f"eval exited early: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    n_before = len(list(results.glob("*.json")))
    assert 3 <= n_before < 40, f"the kill should land mid-run (had {n_before} results)"
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    files = sorted(results.glob("*.json"))
    assert [int(p.stem) for p in files] == list(range(40))  # none lost, none duplicated
    assert not list(results.glob(".*.tmp"))  # no torn temp files left behind
    report = json.loads((out / "report.json").read_text())
    assert report["n_done"] == 40 and report["success_rate"] == 1.0


def test_kv_cache_gib_sizes_the_vllm_engine_and_must_be_positive(
    tmp_path: Path, textcraft_tasks: Path, monkeypatch: pytest.MonkeyPatch
):
    """`sera eval --engine vllm --kv-cache-gib G` hands vLLM exactly G GiB of KV cache (to share the card with
    other jobs); without it the engine keeps vLLM's own sizing; 0 is refused by name."""
    import common.policy

    seen: list[dict] = []

    class Made(Exception):
        pass

    def fake_make_policy(spec: str, **kw):
        seen.append({"spec": spec, **kw})
        raise Made

    monkeypatch.setattr(common.policy, "make_policy", fake_make_policy)
    for gib in (2.5, None):
        cfg = EvalConfig(env="textcraft", tasks=str(textcraft_tasks), policy="hf:tiny", engine="vllm",
                         init_adapter="none", kv_cache_gib=gib, out=str(tmp_path / f"e{gib}"))
        with pytest.raises(Made):
            asyncio.run(evaluate(cfg, progress=False))
    assert seen[0]["spec"] == "vllm:tiny" and seen[0]["kv_cache_memory_bytes"] == int(2.5 * 2**30)
    assert "kv_cache_memory_bytes" not in seen[1]
    with pytest.raises(ValueError, match="--kv-cache-gib"):
        EvalConfig(env="textcraft", tasks=str(textcraft_tasks), policy="hf:tiny", kv_cache_gib=0.0, out="x")


def test_archived_results_read_back_as_the_files_did(tmp_path: Path, textcraft_tasks: Path):
    """``archive_results`` folds results/*.json into results.jsonl, trees kept; ``load_results``, the report
    and a resumed evaluation see the same outcomes; a damaged line names the file and line."""
    from common.eval import archive_results, load_results

    out = tmp_path / "eval"
    cfg = EvalConfig(env="textcraft", tasks=str(textcraft_tasks), policy="oracle", out=str(out), limit=3)
    asyncio.run(evaluate(cfg, progress=False))
    before = load_results(out)
    assert len(before) == 3 and all("tree" not in r for r in before.values())
    assert archive_results(out) == 3
    lines = (out / "results.jsonl").read_text().splitlines()
    assert not (out / "results").exists() and len(lines) == 3
    assert all(json.loads(line)["tree"] for line in lines)  # lossless: each task keeps its tree
    assert load_results(out) == before
    assert archive_results(tmp_path / "empty") == 0  # nothing to fold: nothing written
    report = asyncio.run(evaluate(cfg, progress=False))  # resuming finds every task done in the archive
    assert report["success_rate"] == 1.0 and not list((out / "results").glob("*.json"))  # nothing redone
    assert sorted(load_results(out)) == [0, 1, 2]
    (out / "results.jsonl").write_text((out / "results.jsonl").read_text() + "{not json\n")
    with pytest.raises(ValueError, match=r"results\.jsonl:4: not a JSON result line"):
        load_results(out)
