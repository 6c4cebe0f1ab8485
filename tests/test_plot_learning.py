"""bench/plot_learning.py reads a bench/learning.sh run directory (OUT/rl_{sera,rao}/s<seed>/): per-task held-out
results (greedy and K samples), metrics rows; its statistics (per-run 95 % intervals, paired improvements with
seeds pooled per task, SERA - RAO) are checked against numbers worked out by hand on a fabricated run; a run or
evaluation that does not exist is reported as missing, never as zero."""

from __future__ import annotations

import doctest
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["t0", "t1", "t2", "t3"]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_eval(d: Path, outcomes: list, limit: int = 4, errors: tuple = ()) -> None:
    """An evaluation directory: one result per outcome (task t_i at index i; None = not finished yet)."""
    (d / "results").mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"env": "textcraft", "limit": limit}))
    for i, ok in enumerate(outcomes):
        if ok is not None:
            r = {"index": i, "task_id": TASKS[i], "tier": "easy", "success": bool(ok),
                 "error": "boom" if i in errors else None}  # fmt: skip
            (d / "results" / f"{i:05d}.json").write_text(json.dumps(r))


def write_trees(d: Path, rates: dict[int, float]) -> None:
    """trees.jsonl of rounds whose 8 tasks x 8 rollouts are each all or nothing (a task's difficulty decides
    its rollouts: the correlated case): in round r, task j succeeds iff j < 8 * rate."""
    trees = [{"task_id": f"r{r}t{j}", "success": j < 8 * rate, "meta": {"round": r, "step": r}}
             for r, rate in rates.items() for j in range(8) for _ in range(8)]  # fmt: skip
    write_jsonl(d / "trees.jsonl", trees)


def round_row(rnd, step, stage, success, skipped=0.0, **extra):
    return {"round": rnd, "step": step, "stage": stage, "reward/root_success": success, "train/skipped": skipped,
            "batch/datums": 4, "time/round_s": 10.0, **extra}  # fmt: skip


def make_run(d: Path, greedy: dict, sampled: dict | None = None, rounds=(), errors: dict | None = None,
             limits: dict | None = None, eval_rows=()):  # fmt: skip
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"tasks_per_step": 8, "rollouts_per_task": 8, "steps": 4}))
    for step, outcomes in greedy.items():
        write_eval(
            d / "evals" / f"step_{step:05d}",
            outcomes,
            (limits or {}).get(step, 4),
            (errors or {}).get(step, ()),
        )
    for step, samples in (sampled or {}).items():
        for k, outcomes in enumerate(samples):
            write_eval(d / "evals" / f"step_{step:05d}_sample_{k}", outcomes)
    write_jsonl(d / "metrics.jsonl", [*rounds, *eval_rows])


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Two SERA seeds, two RAO seeds, held-out tasks t0..t3 evaluated at steps 0 and 4.

    greedy:  SERA s0 [1,0,0,0] -> [1,1,0,E] (E: success with an error = failure), s1 [1,0,0,0] -> [1,1,1,0]
             RAO  s0 [1,0,0,0] -> [0,0,0,0], s1 [1,0,0,0] -> [1,0,0,-] (cut off: 3 of 4 done)
    sampled (K=2, SERA only, both seeds alike): step 0 [0,0,0,0] x2 -> step 4 [1,1,0,1] and [0,1,1,0]
    RAO s0 has a sampled number in its step-0 metrics row only (no per-task files).
    """
    rounds = [round_row(0, 0, "execution", 0.25, **{"grad_norm/execution": 0.2, "loss/ratio_max": 1.5}),
              round_row(1, 1, "execution", 0.0, skipped=1.0),  # no step: left out of the curve
              round_row(2, 1, "execution", 0.5, **{"grad_norm/execution": 0.4, "loss/ratio_max": 2.5}),
              round_row(3, 2, "delegation", 0.5, **{"grad_norm/delegation": 0.05}),
              round_row(4, 3, "rubric", 0.75, grad_norm=0.01)]  # fmt: skip
    sera_s = {0: [[0, 0, 0, 0], [0, 0, 0, 0]], 4: [[1, 1, 0, 1], [0, 1, 1, 0]]}
    make_run(
        tmp_path / "rl_sera" / "s0", {0: [1, 0, 0, 0], 4: [1, 1, 0, 1]}, sera_s, rounds, errors={4: (3,)}
    )
    write_trees(tmp_path / "rl_sera" / "s0", {0: 0.25, 1: 0.0, 2: 0.5, 3: 0.5, 4: 0.75})
    make_run(tmp_path / "rl_sera" / "s1", {0: [1, 0, 0, 0], 4: [1, 1, 1, 0]}, sera_s)
    make_run(tmp_path / "rl_rao" / "s0", {0: [1, 0, 0, 0], 4: [0, 0, 0, 0]},
             eval_rows=[{"round": 0, "step": 0, "eval/success": 0.25, "eval/n_tasks": 4,
                         "eval/sampled_success": 0.25, "eval/sampled_ci95": 0.1}])  # fmt: skip
    make_run(tmp_path / "rl_rao" / "s1", {0: [1, 0, 0, 0], 4: [1, 0, 0, None]})
    return tmp_path


def se(xs):
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def test_paired_statistics_by_hand(run_dir, bench_module):
    pl = bench_module("plot_learning")
    res = pl.load(run_dir)
    assert sorted(res) == ["rao", "sera"] and sorted(res["sera"]) == [0, 1]
    # SERA greedy: per-task differences s0 [0,1,0,0] (t3's success had an error), s1 [0,1,1,0];
    # seeds pooled per task: [0, 1, 0.5, 0] -> mean 0.375, SE = sqrt(0.6875 / 3 / 4) = 0.23936
    imp = pl.improvement(res["sera"], "greedy")
    assert imp["n"] == 4 and imp["seeds"] == [0, 1] and imp["lasts"] == [4, 4]
    assert imp["mean"] == pytest.approx(0.375)
    assert imp["se"] == pytest.approx(math.sqrt(0.6875 / 12)) == pytest.approx(0.239357, abs=1e-6)
    assert imp["half"] == pytest.approx(1.96 * 0.239357, abs=1e-5)
    assert (imp["a"], imp["b"]) == (pytest.approx(0.25), pytest.approx(0.625))
    assert pl.verdict(imp).startswith("not significant")  # 0.375 < 0.469
    # each seed on its own (s0 [0,1,0,0], s1 [0,1,1,0]) and the spread between them
    assert [x["mean"] for x in imp["per_seed"]] == pytest.approx([0.25, 0.5])
    assert imp["per_seed"][0]["se"] == pytest.approx(se([0, 1, 0, 0]))
    assert pl.seed_spread(imp) == pytest.approx(math.sqrt(0.125 ** 2 * 2))  # sd (n - 1) of 0.25 and 0.5
    # pooled beyond 1.96 SE but the seeds disagree in sign: not called significant
    split = {"mean": 0.3, "se": 0.1, "per_seed": [{"mean": 0.7}, {"mean": -0.1}]}
    assert pl.verdict(split).startswith("not significant: the seeds disagree")
    assert pl.verdict({**split, "per_seed": [{"mean": 0.7}, {"mean": 0.1}]}).startswith("significant increase")
    assert math.isnan(pl.seed_spread({"per_seed": [{"mean": 0.7}]}))  # one seed: no spread
    # SERA sampled: per task mean of the 2 samples at step 4 [0.5, 1, 0.5, 0.5] minus step 0's 0s;
    # mean 0.625, SE = sqrt(0.1875 / 3 / 4) = 0.125 -> 0.625 > 1.96 * 0.125 = 0.245: significant
    imp = pl.improvement(res["sera"], "sampled")
    assert imp["mean"] == pytest.approx(0.625) and imp["se"] == pytest.approx(0.125)
    assert pl.verdict(imp).startswith("significant increase")
    # RAO greedy: s0 [-1,0,0,0]; s1 over its 3 finished tasks [0,0,0]; pooled [-0.5, 0, 0, 0]
    imp = pl.improvement(res["rao"], "greedy")
    assert imp["mean"] == pytest.approx(-0.125) and imp["se"] == pytest.approx(0.125) and imp["n"] == 4
    assert pl.verdict(imp).startswith("not significant")
    assert pl.improvement(res["rao"], "sampled") is None  # a metrics-row number has no per-task results
    # SERA - RAO at step 4, greedy: SERA pooled [1, 1, 0.5, 0], RAO pooled [0.5, 0, 0, 0] (t3: s0 only)
    # -> differences [0.5, 1, 0.5, 0], mean 0.5, SE = sqrt(0.5 / 3 / 4) = 0.2041, interval [0.0999, 0.9001]
    d = pl.sera_minus_rao(res, "greedy")
    assert d["mean"] == pytest.approx(0.5) and d["se"] == pytest.approx(se([0.5, 1, 0.5, 0]))
    assert (d["lo"], d["hi"]) == (
        pytest.approx(0.5 - 1.96 * 0.204124, abs=1e-5),
        pytest.approx(0.900083, abs=1e-5),
    )
    assert (d["b"], d["a"]) == (pytest.approx(0.625), pytest.approx(0.125))  # SERA's, RAO's mean
    assert pl.sera_minus_rao(res, "sampled") is None


def test_per_run_points_and_table(run_dir, bench_module):
    pl = bench_module("plot_learning")
    res = pl.load(run_dir)
    p = res["sera"][0]["evals"][4]["greedy"]  # [1,1,0,E]: 2 of 4, one proportion: Wilson
    z, n = 1.96, 4
    half = z * math.sqrt(0.25 / n + z * z / (4 * n * n)) / (1 + z * z / n)  # centre 0.5 at p = 0.5
    assert p["rate"] == pytest.approx(0.5) and (p["lo"], p["hi"]) == pytest.approx((0.5 - half, 0.5 + half))
    p0 = res["sera"][0]["evals"][0]["sampled"]  # 0 of 2 samples on every task: not a zero-width interval
    assert p0["rate"] == 0.0 and p0["lo"] == 0.0 and p0["hi"] == pytest.approx(pl.wilson(0.0, 4)[1])  # 4 tasks
    p = res["rao"][1]["evals"][4]["greedy"]  # cut off: 3 of 4 finished, rate over the finished ones
    assert (p["n"], p["done"], p["planned"], p["rate"]) == (3, 3, 4, pytest.approx(1 / 3))
    p = res["rao"][0]["evals"][0]["sampled"]  # from the metrics row: no per-task values
    assert p["tasks"] is None and (p["rate"], p["lo"], p["hi"]) == pytest.approx((0.25, 0.15, 0.35))  # old row
    assert res["rao"][1]["evals"][0]["sampled"] is None
    text = pl.markdown(res, run_dir)
    assert "| SERA s0 | 4 (5) | 25.0 % [4.6, 69.9] (n=4) | step 4: 50.0 % [15.0, 85.0] (n=4) | 0.0 % [0.0, 49.0] " \
           "(n=4, K=2) | step 4: 62.5 % [30.6, 86.3] (n=4, K=2) |" in text  # fmt: skip
    assert "step 4: 33.3 % [6.1, 79.2] (n=3, 3 of 4 done)" in text
    assert (
        "| RAO s0 | 0 (0) | 25.0 % [4.6, 69.9] (n=4) | step 4: 0.0 % [0.0, 49.0] (n=4) | 25.0 % [15.0, 35.0] (n=4) | "
        "step 4: not run |" in text
    )
    # each seed on its own beside the pooled change, and the spread between the seeds (sd of +25.0, +50.0)
    assert (
        "| SERA | greedy | s0@4, s1@4 | 4 | 25.0 % | 62.5 % | +37.5 ± 46.9 | [-9.4, +84.4] | s0 +25.0 ± 49.0; "
        "s1 +50.0 ± 56.6 | 17.7 | not significant" in text
    )
    assert (
        "| SERA | sampled | s0@4, s1@4 | 4 | 0.0 % | 62.5 % | +62.5 ± 24.5 | [+38.0, +87.0] | s0 +62.5 ± 24.5; "
        "s1 +62.5 ± 24.5 | 0.0 | significant increase" in text
    )
    assert "| greedy | s0@4, s1@4 | s0@4, s1@4 | 4 | 62.5 % | 12.5 % | +50.0 ± 40.0 | [+10.0, +90.0] | " \
           "s0 +50.0 ± 56.6; s1 +66.7 ± 65.3 | 11.8 |" in text  # fmt: skip
    assert "| RAO | sampled | not run |" in text  # never as zero
    assert (
        "| greedy | s0@4, s1@4 | s0@4, s1@4 | 4 | 62.5 % | 12.5 % | +50.0 ± 40.0 | [+10.0, +90.0] |" in text
    )
    assert "RL changed held-out sampled success by +62.5 ± 24.5 pp (0.0 % -> 62.5 %; 4 tasks, seeds s0@4, s1@4; " \
           "each seed: s0 +62.5 ± 24.5; s1 +62.5 ± 24.5): significant increase" in text  # fmt: skip
    assert (
        "SERA − RAO at the last step, greedy: +50.0 pp, 95 % interval [+10.0, +90.0] over 4 tasks (each seed: "
        "s0 +50.0 ± 56.6; s1 +66.7 ± 65.3): SERA higher" in text
    )
    assert "SERA − RAO, sampled: not shown" in text
    # optimizer table: per-stage grad norms (grad_norm/<stage>, else grad_norm), ratio max; the skipped round
    # is left out (4 steps in 5 rounds), root success over the 4 trained rounds
    assert "| run | root success, first / last 5 steps | grad_norm/execution (mean/max) | grad_norm/delegation " \
           "(mean/max) | grad_norm/rubric (mean/max) | loss/ratio_max (max) |" in text  # fmt: skip
    assert "| SERA s0 | 0.500 / 0.500 | 0.3 / 0.4 | 0.05 / 0.05 | 0.01 / 0.01 | 2.5 |" in text
    assert "| RAO s0 | - | - | - | - | - |" in text


def test_training_curve_and_band(run_dir, bench_module):
    pl = bench_module("plot_learning")
    run = pl.load(run_dir)["sera"][0]
    c = pl.train_curve(run, w=2)
    assert c["x"] == [0, 1, 2, 3] and c["y"] == [0.25, 0.5, 0.5, 0.75]
    assert c["roll"] == pytest.approx([0.25, 0.375, 0.5, 0.625])
    # the last window (rounds 3 and 4): 16 tasks x 8 rollouts, 10 tasks all successes, 6 all failures, by hand:
    # p = 80/128 = 0.625, CR1 variance 16/15 * (10 * 3^2 + 6 * 5^2) / 128^2 = 1/64, n_eff = p(1-p) * 64 = 15
    def wilson(p, n, z=1.96):
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return centre - half, centre + half

    assert (c["lo"][3], c["hi"][3]) == pytest.approx(wilson(0.625, 15))
    naive = wilson(0.625, 128)  # the 128 rollouts as independent draws: what the band was before
    assert c["hi"][3] - c["lo"][3] > 2 * (naive[1] - naive[0])
    assert c["hi"][0] - c["lo"][0] > c["hi"][3] - c["lo"][3]  # one step's 8 tasks: a wider band
    without = dict(run, tasks_by_round={})  # no trees.jsonl: no band, never a made-up one
    assert all(math.isnan(v) for v in pl.train_curve(without, w=2)["lo"])
    png = run_dir / "l.png"
    pl.figure(pl.load(run_dir), png, "t")
    assert png.stat().st_size > 10_000


def test_missing_method_and_helpers(tmp_path, bench_module):
    pl = bench_module("plot_learning")
    make_run(tmp_path / "rl_sera" / "s0", {0: [1, 0, 0, 0]})  # step 0 only: nothing after it yet
    res = pl.load(tmp_path)
    text = pl.markdown(res, tmp_path)
    assert (
        "| RAO | not run | not run |" in text
        and "| SERA s0 | 0 (0) | 25.0 % [4.6, 69.9] (n=4) | not run |" in text
    )
    assert "SERA, greedy: not shown" in text and "SERA − RAO, greedy: not shown" in text
    assert pl.improvement(res["sera"], "greedy") is None and pl.sera_minus_rao(res, "greedy") is None
    assert pl.load(tmp_path / "nothing") == {}
    dec = {"mean": -0.3, "se": 0.1}
    assert pl.verdict(dec).startswith("significant decrease") and pl.verdict(
        {"mean": 0.1, "se": float("nan")}
    )
    assert pl.pool([{"a": 1.0, "b": 0.0}, {"a": 0.0}]) == {"a": 0.5, "b": 0.0}
    row = {"eval/success": 0.0, "eval/success_lo": 0.0, "eval/success_hi": 0.16, "eval/n_tasks": 20,
           "eval/sampled_success": 0.5, "eval/sampled_lo": 0.3, "eval/sampled_hi": 0.7}  # a row's Wilson bounds
    assert (pl.eval_point([], row)["lo"], pl.eval_point([], row)["hi"]) == (0.0, 0.16)
    assert (pl.eval_point([], row, "sampled")["lo"], pl.eval_point([], row, "sampled")["hi"]) == (0.3, 0.7)
    assert doctest.testmod(pl, optionflags=doctest.ELLIPSIS).failed == 0


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
