"""bench/tiny_set.sh (RL on 8 fixed train tasks, several variants side by side) and its summary
bench/plot_tiny_set.py: the commands it builds (a stand-in interpreter records them), the VARIANTS syntax, the
summary's numbers on fabricated runs (worked out by hand), and a CPU dry run with the tiny model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE = """#!/usr/bin/env bash
echo "VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-} $*" >> "$FAKE_LOG"
"""
DEFAULT_KNOBS = (
    "MODEL",
    "ENGINE",
    "METHOD",
    "STEPS",
    "VARIANTS",
    "SCHEDULE",
    "RL_EXTRA",
    "PARALLEL",
    "GPU_MEM",
    "GPU_TOTAL_GIB",
)


def fake_call(tmp_path: Path, out: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    fake, log = tmp_path / "fake_python", tmp_path / "calls.txt"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    log.write_text("")
    base = {k: v for k, v in os.environ.items() if k not in DEFAULT_KNOBS}
    done = subprocess.run(["bash", "bench/tiny_set.sh", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={**base, "PYTHON": str(fake), "FAKE_LOG": str(log), **env}, timeout=60)  # fmt: skip
    return done, log.read_text().splitlines()


def runs(lines: list[str]) -> dict[str, str]:
    return {Path(x.split(" --out ")[1].split()[0]).name: x for x in lines if " -m sera train " in x}


def test_tiny_set_commands(tmp_path: Path):
    out = tmp_path / "tiny"
    done, lines = fake_call(tmp_path, out, ENGINE="vllm", GPU_TOTAL_GIB="80")
    assert done.returncode == 0, done.stderr
    assert "SLOTS=3 SHARE=0.2 RUN_GIB=16" in done.stdout  # full fine-tuning variants: 16 GiB each (gpu_fit.tsv)
    assert any("data textcraft --split train --n 8 --seed 0 --difficulty easy" in x and f"--out {out}/train8.jsonl" in x
               for x in lines)  # fmt: skip
    r = runs(lines)
    assert sorted(r) == ["full_1e-5", "full_clip", "lora_1e-4"]
    for name, line in r.items():
        for flag in ("--level 1", "--model smollm2", "--init-adapter auto", "--method rao", f"--tasks {out}/train8.jsonl",
                     "--tasks-per-step 8", "--rollouts-per-task 8", "--steps 60", "--resume", "--engine vllm",
                     "--gpu-share 0.2", "--kv-cache-gib 4", f"--out {out}/{name}"):  # fmt: skip
            assert f" {flag} " in f"{line} ", f"{flag} not in {line}"
        assert line.startswith(f"VLLM_CACHE_ROOT={out}/vllm_cache/{name} ")
        assert "--eval-tasks" not in line  # no held-out evaluation
    assert r["lora_1e-4"].endswith(
        f"--lora-rank 16 --lr 1e-4 --out {out}/lora_1e-4"
    )  # the variant's flags last
    assert r["full_clip"].endswith(f"--lr 1e-5 --grad-clip 0.05 --out {out}/full_clip")
    assert (out / "variants.txt").read_text().splitlines() == [
        "full_1e-5\t--lr 1e-5", "full_clip\t--lr 1e-5 --grad-clip 0.05", "lora_1e-4\t--lora-rank 16 --lr 1e-4"]  # fmt: skip
    assert all((out / f"{n}.done").exists() for n in r)
    # knobs: a method with a schedule, a variant without flags, the tiny model on the CPU (no GPU share)
    out2 = tmp_path / "tiny2"
    done, lines = fake_call(tmp_path, out2, ENGINE="hf", MODEL="tiny", METHOD="sera", SCHEDULE="execution:1",
                            STEPS="3", VARIANTS=" plain | x.y:--lr 1e-3 ")  # fmt: skip
    r = runs(lines)
    assert sorted(r) == ["plain", "x.y"], lines
    assert all("--method sera --schedule execution:1" in x and "--init-adapter none" in x for x in r.values())
    assert all("--gpu-share" not in x and "--steps 3" in x for x in r.values())
    assert r["x.y"].endswith(f"--lr 1e-3 --out {out2}/x.y") and r["plain"].endswith(
        f"--resume --out {out2}/plain"
    )


@pytest.mark.parametrize("variants", ["a b:--lr 1", "a:--lr 1|a:--lr 2", "data:--lr 1", "|"])
def test_tiny_set_refuses_bad_variants(tmp_path: Path, variants: str):
    done, lines = fake_call(tmp_path, tmp_path / "t", VARIANTS=variants, ENGINE="hf")
    assert done.returncode == 2 and "VARIANTS" in done.stderr and lines == []  # nothing ran


def write_run(d: Path, successes: list[float], steps: int, extra_rows=()) -> None:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"tasks_per_step": 8, "rollouts_per_task": 8, "steps": steps}))
    rows = [{"round": i, "step": i, "stage": "execution", "reward/root_success": s, "train/skipped": 0.0,
             "grad_norm": 0.1 * (i + 1)} for i, s in enumerate(successes)]  # fmt: skip
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows, *extra_rows]))
    # the tiny set: the same 8 tasks every round, 8 rollouts each; task j succeeds iff j < 8 x the round's rate
    trees = [{"task_id": f"t{j}", "success": j < 8 * s, "meta": {"round": i, "step": i}}
             for i, s in enumerate(successes) for j in range(8) for _ in range(8)]  # fmt: skip
    (d / "trees.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trees))


def test_tiny_set_summary_by_hand(tmp_path: Path, bench_module):
    ts = bench_module("plot_tiny_set")
    (tmp_path / "variants.txt").write_text("a\t--lr 1e-5\nb\t--lr 1e-4\nc\t--lr 3e-4\n")
    skipped = {"round": 6, "step": 6, "stage": "execution", "reward/root_success": 0.0, "train/skipped": 1.0}
    write_run(tmp_path / "a", [0.25, 0.5, 0.5, 0.75, 0.25, 1.0], 8, [skipped])
    write_run(tmp_path / "b", [0.0, 0.0], 8)
    write_run(tmp_path / "d", [0.5, 0.5, 0.5], 3)  # a run directory not in variants.txt: listed after them
    rows = ts.load(tmp_path, target=0.5, window=3)
    assert [(n, f) for n, f, _ in rows] == [
        ("a", "--lr 1e-5"),
        ("b", "--lr 1e-4"),
        ("c", "--lr 3e-4"),
        ("d", ""),
    ]
    a, b, c, d = (s for _, _, s in rows)
    # a: rolling means over 3 steps .25, .375, .4167, .5833, .5, .6667; full windows from step 2 on
    assert a["curve"]["roll"] == pytest.approx([0.25, 0.375, 1.25 / 3, 1.75 / 3, 0.5, 2 / 3])
    assert (a["steps"], a["rounds"], a["planned"]) == (6, 7, 8)  # the skipped round is not a step
    assert a["reach"] == 3 and a["best"] == pytest.approx(2 / 3) and a["best_step"] == 5
    # the best window, steps 3-5 (rates .75, .25, 1): per task over its 24 rollouts t0-t1 24, t2-t5 16, t6-t7 8
    # successes; p = 128/192 = 2/3, CR1 variance 8/7 * (2 * 8^2 + 2 * 8^2) / 192^2, n_eff = p(1-p) / it = 28:
    # Wilson at 28 (a task's rollouts are one unit), not at 192 independent draws
    p, n, z = 2 / 3, 28, 1.96
    assert (2 / 9) / (8 / 7 * 256 / 192**2) == pytest.approx(28)
    centre, half = (
        (p + z * z / (2 * n)) / (1 + z * z / n),
        z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n),
    )
    assert a["best_band"] == (pytest.approx(centre - half), pytest.approx(centre + half))
    assert a["grad_norm"] == (pytest.approx(0.35), pytest.approx(0.6))
    assert b["reach"] is None and b["best"] is None and b["steps"] == 2  # no full window of 3 steps
    assert c is None
    assert d["reach"] == 2 and d["best"] == pytest.approx(0.5)  # reaching = at least the target
    assert ts.summarise(ts.load_run(tmp_path / "d"), 0.51, 3)["reach"] is None
    text = ts.markdown(rows, tmp_path, 0.5, 3)
    assert f"| a | `--lr 1e-5` | 6 of 8 (7) | 0.250 -> 1.000 | 0.667 | 0.667 (step 5) [{centre - half:.3f}, " \
           f"{centre + half:.3f}] | step 3 | 0.35 / 0.6 | - | - |" in text  # fmt: skip
    assert (
        "| b | `--lr 1e-4` | 2 of 8 (2) | 0.000 -> 0.000 | 0.000 | - (fewer than 3 steps) | not reached |"
        in text
    )
    assert "| c | `--lr 3e-4` | not run |" in text  # never as zero
    assert "- a: the rolling mean reached 0.5 at step 3" in text
    assert "- b: the rolling mean did not reach 0.5 in 2 steps (no full window of 3 steps yet)" in text
    png = tmp_path / "t.png"
    ts.figure(rows, png, 0.5, 3)
    assert png.stat().st_size > 10_000


@pytest.mark.slow
def test_tiny_set_cpu_dry_run(tmp_path: Path):
    """The header's CPU dry run: two variants, 2 steps each, resumable (a second call redoes nothing)."""
    out = tmp_path / "tiny"
    env = {**os.environ, "PYTHON": sys.executable, "MODEL": "tiny", "ENGINE": "hf", "STEPS": "2",
           "TASKS_PER_STEP": "2", "ROLLOUTS": "2", "AGENT": "--max-steps 2 --max-new-tokens 12",
           "CALLS": "--rubric-max-new-tokens 16 --score-max-new-tokens 16", "VARIANTS": "a:--lr 1e-3|b:--lr 1e-3 --grad-clip 0.05",
           "RL_EXTRA": "--codeact-executor worker-ordered --oracle-mix 0.7", "OMP_NUM_THREADS": "1"}  # fmt: skip
    done = subprocess.run(["bash", "bench/tiny_set.sh", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert len((out / "train8.jsonl").read_text().splitlines()) == 8
    for name, clip in (("a", 1.0), ("b", 0.05)):
        cfg = json.loads((out / name / "config.json").read_text())
        assert cfg["optim"]["grad_clip"] == clip and cfg["tasks"] == str(out / "train8.jsonl")
        rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
        assert sum(not r["train/skipped"] for r in rows if "stage" in r) == 2
        assert not any("eval/success" in r for r in rows)
    table = (out / "tiny_set.md").read_text()
    assert (
        "| a | `--lr 1e-3` | 2 of 2 (" in table and "| b | `--lr 1e-3 --grad-clip 0.05` | 2 of 2 (" in table
    )
    assert (out / "tiny_set.png").stat().st_size > 10_000
    again = subprocess.run(["bash", "bench/tiny_set.sh", str(out)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert again.returncode == 0 and again.stdout.count("done earlier") == 3  # data, a, b
