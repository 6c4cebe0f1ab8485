"""bench/plot_learning.py reads a bench/learning.sh run directory: finished and cut-off evaluations, SFT
and RL metrics; a phase that did not run is reported as missing, never as zero."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def rl_row(round_, step, stage, pair, skipped=0.0, datums=4):
    return {"round": round_, "step": step, "stage": stage, "rubric/pair_accuracy": pair, "train/skipped": skipped,
            "batch/datums": datums, "time/round_s": 10.0 + round_}  # fmt: skip


def eval_row(round_, step, success):
    return {"round": round_, "step": step, "eval/success": success, "eval/n_tasks": 4}


def test_table_and_figure_from_a_partial_run(tmp_path, bench_module):
    pl = bench_module("plot_learning")
    cut = tmp_path / "eval_base"
    (cut / "results").mkdir(parents=True)
    (cut / "manifest.json").write_text(json.dumps({"env": "textcraft", "limit": 3}))
    for i, ok in enumerate((True, False)):  # 2 of 3 tasks finished when the run was cut
        (cut / "results" / f"{i:05d}.json").write_text(
            json.dumps({"index": i, "success": ok, "tier": "easy", "error": None, "tree": {}})
        )
    write_jsonl(tmp_path / "sft" / "metrics.jsonl",
                [{"step": s, "loss/sft": 2.0 / (s + 1), "sft/token_acc": 0.5, "t_train": 1.0} for s in range(3)])  # fmt: skip
    write_jsonl(tmp_path / "rl_sera" / "metrics.jsonl", [
        eval_row(0, 0, 0.25), rl_row(0, 0, "execution", None), rl_row(1, 1, "rubric", 0.6),
        rl_row(2, 2, "rubric", 0.8, datums=2), eval_row(3, 3, 0.5), rl_row(3, 3, "execution", None, skipped=1.0, datums=0)])  # fmt: skip
    res = pl.load(tmp_path)
    text = pl.markdown(res, tmp_path)
    assert "| policy | step 0 | step 3 |" in text
    assert "| base model | 50.0 % (1/2, 2 of 3 done) | |" in text  # the cut-off eval: finished tasks only
    assert "| SFT + SERA | 25.0 % | 50.0 % |" in text
    assert "| SFT + RAO | not run |" in text  # never as zero
    # steps (rounds), datums per stage, pair accuracy per Rubric-stage step, mean round seconds per stage
    assert "| SFT + SERA | 3 (4) | 4 / 0 / 6 | 0.60, 0.80 | 11.5 / - / 11.5 |" in text
    assert pl.rl_summary(res["rl"]["sera"])["pair_accuracy"] == [(1, 0.6), (2, 0.8)]
    png = tmp_path / "l.png"
    pl.figure(res, png, "t")
    assert png.stat().st_size > 10_000


def test_partial_eval_without_limit_counts_the_task_file(tmp_path, bench_module):
    pl = bench_module("plot_learning")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": 0}\n{"id": 1}\n{"id": 2}\n{"id": 3}\n')
    d = tmp_path / "eval_x"
    (d / "results").mkdir(parents=True)
    (d / "manifest.json").write_text(
        json.dumps({"env": "textcraft", "limit": None, "tasks_file": str(tasks)})
    )
    (d / "results" / "00000.json").write_text(json.dumps({"index": 0, "success": True, "tier": "easy"}))
    r = pl.partial_report(d)
    assert (r["n_done"], r["n_tasks"], r["successes"]) == (1, 4, 1)  # 3 tasks not done, not failed


def test_figures_are_skipped_with_a_note_without_matplotlib(tmp_path, monkeypatch, capsys):
    """A bare GPU image may lack matplotlib: a finished run (SFT, RL, eval, learning.sh) must not fail on its
    figure; it says which PNG was not drawn and writes everything else."""
    from common.run.metrics import plot_curves

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1, "round": 1, "loss/total": 0.5}\n')
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    plot_curves(metrics, tmp_path / "curves.png")
    assert not (tmp_path / "curves.png").exists()
    assert "curves.png is not drawn" in capsys.readouterr().err
