"""bench/learning.sh (held-out file -> SERA / RAO runs per seed from the shipped warm start, with in-run held-out
evals -> figure): the commands it builds (a stand-in interpreter records them), and, with the tiny model on the
CPU, that it resumes after a kill -9 in every phase: the same command, run again, finishes the job with nothing
lost or doubled (the point is the bookkeeping: phase markers, checkpoints, truncated logs, evaluation
directories, not learning).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KNOBS = {
    "PYTHON": sys.executable,
    "MODEL": "tiny",
    "ENGINE": "hf",
    "SEEDS": "0",
    "RL_STEPS": "2",
    "RL_TURNS": "1 2",
    "N_EVAL": "1",
    "EVAL_EVERY": "1",
    "EVAL_SAMPLES": "0",  # until `sera train --eval-samples` lands: the flag is then left out
    "N_TASKS": "8",
    "TASKS_PER_STEP": "1",
    "ROLLOUTS": "2",
    "SCHEDULE": "execution:1,delegation:1,rubric:1",
    "BATCH": "8",
    "RL_LR": "1e-3",
    "AGENT": "--max-steps 2 --max-new-tokens 12",
    "CALLS": "--rubric-max-new-tokens 16 --score-max-new-tokens 16",
    "RL_EXTRA": "--codeact-executor worker-ordered --oracle-mix 0.7 --score-noise 0.3 --max-task-replacements 3",
    "OMP_NUM_THREADS": "1",
}
PHASES = ["rl_sera_s0_1", "rl_rao_s0_1", "rl_sera_s0_2", "rl_rao_s0_2"]

FAKE = """#!/usr/bin/env bash
# A stand-in interpreter: records its arguments (and the vLLM cache it was given), exits with FAKE_RC for
# `sera train` (0 otherwise)
echo "VLLM_CACHE_ROOT=${VLLM_CACHE_ROOT:-} $*" >> "$FAKE_LOG"
case " $* " in *" sera train "*) exit "${FAKE_RC:-0}" ;; esac
"""


def fake_call(tmp_path: Path, out: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run learning.sh once with the stand-in interpreter; its recorded command lines (this call's only)."""
    fake, log = tmp_path / "fake_python", tmp_path / "calls.txt"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    log.write_text("")
    base = {k: v for k, v in os.environ.items() if k not in KNOBS}  # the script's own defaults
    done = subprocess.run(["bash", "bench/learning.sh", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={**base, "PYTHON": str(fake), "FAKE_LOG": str(log), **env}, timeout=60)  # fmt: skip
    return done, log.read_text().splitlines()


def train_calls(lines: list[str]) -> dict[str, str]:
    """The `sera train` lines by their --out (relative to OUT)."""
    res = {}
    for line in lines:
        if " -m sera train " in line:
            out = line.split(" --out ")[1].split()[0]
            res["/".join(Path(out).parts[-2:])] = line
    return res


def test_learning_commands_and_defaults(tmp_path: Path):
    out = tmp_path / "learn"
    done, lines = fake_call(tmp_path, out, ENGINE="vllm", GPU_TOTAL_GIB="80")
    assert done.returncode == 0, done.stdout + done.stderr
    # sized to the card (bench/gpu_fit.py): full fine-tuning runs of 16 GiB (gpu_fit.tsv), all 4 at once on 80 GiB
    assert "SLOTS=4 SHARE=0.2 RUN_GIB=16" in done.stdout, done.stdout
    data = [x for x in lines if " data textcraft " in x]
    assert any("--split train --n 256 --seed 0 --difficulty easy" in x for x in data)
    assert any("--split val --n 147 --seed 0 --difficulty easy" in x for x in data)  # all easy val tasks
    runs = train_calls(lines)
    assert sorted(runs) == ["rl_rao/s0", "rl_rao/s1", "rl_sera/s0", "rl_sera/s1"]
    caches = set()
    for name, line in runs.items():
        method, seed = name.split("/")
        args = line.split()
        caches.add(args[0])
        for flag in ("--level 1", "--model smollm2", "--init-adapter auto", "--tasks-per-step 8",
                     "--rollouts-per-task 8", f"--tasks {out}/tc_train_easy.jsonl", "--lr 1e-5", "--steps 40",
                     f"--eval-tasks {out}/tc_val_easy.jsonl", "--eval-every 40", "--eval-limit 147",
                     "--eval-samples 2", "--resume", "--engine vllm", f"--seed {seed[1:]}",
                     f"--method {method[3:]}", "--gpu-share 0.2", "--kv-cache-gib 4"):  # fmt: skip
            assert f" {flag} " in f"{line} ", f"{flag} not in {line}"
        assert ("--schedule execution:16,delegation:2,rubric:2" in line) == (method == "rl_sera"), line
        assert "--n-tasks" not in line  # one train file for every seed, not a pool per --seed
    assert len(caches) == 4  # a vLLM compile cache per run
    for p in ("rl_sera_s0_40", "rl_rao_s1_40", "data", "data_train"):
        assert (out / f"{p}.done").exists()
    # a second call: everything done, nothing runs again
    done, lines = fake_call(tmp_path, out, ENGINE="vllm", GPU_TOTAL_GIB="80")
    assert not train_calls(lines) and done.stdout.count("done earlier") == 6


def test_learning_runs_only_as_many_at_once_as_fit_the_card(tmp_path: Path):
    """Issue #49: 4 LoRA runs of 16 GiB on a 40 GiB card: 2 at once (the stand-in interpreter records how
    many `sera train` ran together: never more than 2); a card one run does not fit: refused in one line,
    nothing started."""
    fake, log, live = tmp_path / "fake_python", tmp_path / "calls.txt", tmp_path / "live"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'echo "x $*" >> "$FAKE_LOG"\n'
        'case " $* " in *" sera train "*)\n'
        '  ( flock 9; n=$(( $(cat "$LIVE" 2>/dev/null || echo 0) + 1 )); echo $n > "$LIVE"; echo "live $n" >> "$FAKE_LOG" ) 9> "$LIVE.lock"\n'
        "  sleep 0.5\n"
        '  ( flock 9; echo $(( $(cat "$LIVE") - 1 )) > "$LIVE" ) 9> "$LIVE.lock" ;;\n'
        "esac\n"
    )
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k not in KNOBS}
    env = {**base, "PYTHON": str(fake), "FAKE_LOG": str(log), "LIVE": str(live), "ENGINE": "vllm",
           "RL_EXTRA": "--lora-rank 4", "GPU_TOTAL_GIB": "40"}  # fmt: skip
    done = subprocess.run(["bash", "bench/learning.sh", str(tmp_path / "a")], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SLOTS=2 SHARE=0.4 RUN_GIB=16" in done.stdout
    lines = log.read_text().splitlines()
    assert len(train_calls(lines)) == 4
    assert max(int(x.split()[1]) for x in lines if x.startswith("live ")) <= 2
    assert all(" --gpu-share 0.4 " in x for x in lines if " -m sera train " in x)
    log.write_text("")
    done = subprocess.run(["bash", "bench/learning.sh", str(tmp_path / "b")], cwd=ROOT, capture_output=True,
                          text=True, env={**env, "GPU_TOTAL_GIB": "12"}, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert "one run needs 16 GiB and this card has 12.0 GiB" in done.stderr
    assert not train_calls(log.read_text().splitlines())


def test_learning_knobs_and_exit_codes(tmp_path: Path):
    out = tmp_path / "learn"
    knobs = {"ENGINE": "hf", "MODEL": "tiny", "SEEDS": "3", "EVAL_SAMPLES": "0", "RL_STEPS": "6",
             "SERA_EXTRA": "--depth-weight-cap 2", "RAO_EXTRA": "--grad-clip 0.05", "RL_EXTRA": "--beta2 0.99"}  # fmt: skip
    done, lines = fake_call(
        tmp_path, out, FAKE_RC="3", **knobs
    )  # rc 3: stopped before --steps, counts as done
    runs = train_calls(lines)
    assert sorted(runs) == ["rl_rao/s3", "rl_sera/s3"], lines
    sera, rao = runs["rl_sera/s3"], runs["rl_rao/s3"]
    for line in (sera, rao):
        assert "--init-adapter none" in line and "--eval-samples" not in line and "--gpu-share" not in line
        assert "--beta2 0.99" in line and "--eval-every 6" in line and "--steps 6" in line
    assert "--depth-weight-cap 2" in sera and "--depth-weight-cap" not in rao
    assert "--grad-clip 0.05" in rao and "--grad-clip" not in sera
    assert (out / "rl_sera_s3_6.done").exists() and "stopped before --steps" in (
        out / "times.txt"
    ).read_text()
    # a failed run (rc 1) is not marked done: the next call runs it again
    out2 = tmp_path / "learn2"
    fake_call(tmp_path, out2, FAKE_RC="1", **knobs)
    assert not (out2 / "rl_rao_s3_6.done").exists() and (out2 / "data.done").exists()
    _, lines = fake_call(tmp_path, out2, **knobs)
    assert sorted(train_calls(lines)) == ["rl_rao/s3", "rl_sera/s3"]
    # the budget: no run starts with less than 30 s left
    _, lines = fake_call(tmp_path, tmp_path / "learn3", BUDGET_S="10", **knobs)
    assert [x for x in lines if "plot_learning" not in x] == []  # only the (empty) summary is drawn
    assert "rl_sera_s3_6: not started (budget" in (tmp_path / "learn3" / "times.txt").read_text()


def start(out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", "bench/learning.sh", str(out)],
        cwd=ROOT,
        env={**os.environ, **KNOBS},
        start_new_session=True,  # its own process group: the kill takes the phase's python with it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def kill_during(out: Path, phase: str, after_s: float = 2.0, limit_s: float = 600) -> None:
    """Start the driver, wait until ``phase`` starts, let it run ``after_s`` seconds, then kill -9 it all."""
    times = out / "times.txt"
    seen = len(times.read_text()) if times.exists() else 0  # only this call's lines count
    proc, t0 = start(out), time.time()
    while proc.poll() is None and time.time() - t0 < limit_s:
        if times.exists() and f"{phase}: start" in times.read_text()[seen:]:
            time.sleep(after_s)
            break
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_learning_driver_resumes_after_a_kill_in_every_phase(tmp_path: Path):
    out = tmp_path / "learn"
    for phase in PHASES:
        kill_during(out, phase)
    done = subprocess.run(
        ["bash", "bench/learning.sh", str(out)], cwd=ROOT, env={**os.environ, **KNOBS}, timeout=900,
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for phase in ["data", "data_train", *PHASES]:
        assert (out / f"{phase}.done").exists(), f"{phase} not finished: {(out / 'times.txt').read_text()}"
    log = (out / "times.txt").read_text()
    for phase in PHASES:  # every phase was killed once, started again and finished
        assert log.count(f"{phase}: start") >= 2 and f"{phase}: rc=0" in log, log
    for method in ("sera", "rao"):
        run = out / f"rl_{method}" / "s0"
        m = rows(run / "metrics.jsonl")
        evals = [r["step"] for r in m if "eval/success" in r]
        assert evals == [0, 1, 2], f"{method}: held-out evals {evals} (one per step, none doubled or lost)"
        rounds = [r["round"] for r in m if "stage" in r]
        assert rounds == list(range(len(rounds))), f"{method}: rounds {rounds}"
        assert sum(not r["train/skipped"] for r in m if "stage" in r) == 2
        assert (run / "checkpoints" / "step_000002" / "state.pt").exists()
        assert json.loads((run / "config.json").read_text())["init_weights"]["init_adapter"] == "none"
        for step in (0, 1, 2):
            assert len(list((run / "evals" / f"step_{step:05d}" / "results").glob("*.json"))) == 1
    table = (out / "learning.md").read_text()
    assert (
        "| SERA s0 | 2 (" in table and "| RAO s0 | 2 (" in table and "| SERA | greedy | s0@2 | 1 |" in table
    )
    assert (out / "learning.png").stat().st_size > 10_000


def test_a_run_directory_has_one_writer(tmp_path: Path):
    """A second process writing the same run directory (say, a phase that outlived a killed driver) is refused
    while the first lives; once it is gone the directory is free again."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from common.run.checkpoint import "
         "prepare_out; prepare_out(Path(sys.argv[1]), resume=True); print('held', flush=True); time.sleep(60)",
         str(tmp_path / "run")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        lines = iter(holder.stdout.readline, "")  # prepare_out may first say it starts a fresh run
        assert any(line.strip() == "held" for line in lines)
        from common.run.checkpoint import prepare_out

        with pytest.raises(SystemExit, match="being written by another running process"):
            prepare_out(tmp_path / "run", resume=True)
    finally:
        holder.kill()
        holder.wait()
    prepare_out(tmp_path / "run", resume=True)  # the lock died with its process


def test_import_keeps_one_log_section_per_window_and_replaces_a_repacked_one(tmp_path: Path):
    """bench/h200_learning.sh import: each GPU window's driver log and times are one section, named by the
    window (cmp/window.txt): a window of SEEDS=1 after one of SEEDS=0, or a continuation of the same seeds,
    is appended; a later pack of a window already imported replaces its own section and no other."""
    import tarfile

    def pack(name: str, window: str, seed: int, log: str) -> Path:
        src = tmp_path / f"src_{name}"
        run = src / "cmp" / "rl_sera" / f"s{seed}"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/root_success": 0.5}) + "\n")
        (src / "cmp.log").write_text(log)
        (src / "cmp" / "times.txt").write_text(f"times of {name}\n")
        (src / "cmp" / "window.txt").write_text(window + "\n")
        tgz = tmp_path / f"{name}.tgz"
        with tarfile.open(tgz, "w:gz") as tar:
            tar.add(src, arcname=".")
        return tgz

    def imp(tgz: Path, d: Path) -> None:
        done = subprocess.run(["bash", "bench/h200_learning.sh", "import", str(tgz), str(d)], cwd=ROOT,
                              capture_output=True, text=True, env={**os.environ, "PY": sys.executable}, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr

    d = tmp_path / "learning"
    imp(pack("w1a", "W1", 0, "window 1, first pack\n"), d)
    imp(pack("w1b", "W1", 0, "window 1, last pack\n"), d)  # the same window packed again: replaces
    assert (d / "cmp.log").read_text() == "=== window W1 (import of w1b.tgz) ===\nwindow 1, last pack\n"
    imp(pack("w2", "W2", 1, "window 2\n"), d)  # another seed: appended
    imp(pack("w3a", "W3", 0, "window 3, first pack\n"), d)  # seed 0 continued in a third window: appended
    imp(pack("w3b", "W3", 0, "window 3, last pack\n"), d)  # ... and packed again: only its section changes
    assert (d / "cmp.log").read_text() == (
        "=== window W1 (import of w1b.tgz) ===\nwindow 1, last pack\n"
        "=== window W2 (import of w2.tgz) ===\nwindow 2\n"
        "=== window W3 (import of w3b.tgz) ===\nwindow 3, last pack\n"
    )
    assert (d / "times.txt").read_text() == (
        "=== window W1 (import of w1b.tgz) ===\ntimes of w1b\n=== window W2 (import of w2.tgz) ===\ntimes of w2\n"
        "=== window W3 (import of w3b.tgz) ===\ntimes of w3b\n"
    )
    assert not (d / "window.txt").exists()
    assert (d / "rl_sera" / "s0" / "metrics.jsonl").exists()
    assert (d / "rl_sera" / "s1" / "metrics.jsonl").exists()


def test_a_checkpoint_over_one_file_goes_back_in_parts_and_is_put_in_place_whole(tmp_path: Path):
    """bench/h200_learning.sh ckpt / place: a checkpoint larger than the largest file a job hands back leaves in
    parts with its sha256, as many runs as one job's return holds (the rest named for the next job); place joins
    the parts, checks them, puts state.pt where `sera train --resume` looks and the imported logs beside it; a
    damaged part is refused and nothing is put in place."""
    k = tmp_path / "K"
    blobs = {}
    for m, s in (("sera", "s0"), ("rao", "s0"), ("rao", "s1")):
        c = k / "cmp" / f"rl_{m}" / s / "checkpoints"
        (c / "step_000005").mkdir(parents=True)
        (c / "step_000005" / "state.pt").write_bytes(b"old")
        (c / "step_000020").mkdir()
        blobs[(m, s)] = os.urandom(2500)
        (c / "step_000020" / "state.pt").write_bytes(blobs[(m, s)])
    env = {
        **os.environ,
        "PY": sys.executable,
        "K": str(k),
        "PART_BYTES": "1000",
        "SNAP": str(tmp_path / "snap"),
    }

    def sh(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "bench/h200_learning.sh", *args], cwd=ROOT, capture_output=True, text=True,
                              env={**env, **extra}, timeout=120)  # fmt: skip

    out = tmp_path / "out"
    done = sh("ckpt", OUT=str(out))  # 3 runs x (3 parts + 1 sha256) = 12 files: two runs fit 8
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left for the next job (this one's return is full): rl_sera/s0" in done.stdout
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"rl_rao_{s}_step_000020.pt{x}" for s in ("s0", "s1")
                     for x in (".part.aa", ".part.ab", ".part.ac", ".sha256")]  # fmt: skip
    assert all(p.stat().st_size <= 1000 for p in out.glob("*.part.*"))
    assert sh("ckpt", "rl_sera/s0", OUT=str(tmp_path / "out2")).returncode == 0  # the next job: the one left
    for p in (tmp_path / "out2").iterdir():
        (out / p.name).write_bytes(p.read_bytes())

    logs = tmp_path / "imported"  # what `import` made of the first window, as committed
    for m, s in blobs:
        (logs / f"rl_{m}" / s).mkdir(parents=True)
        (logs / f"rl_{m}" / s / "metrics.jsonl").write_text(f'{{"step": 19, "run": "{m}{s}"}}\n')
    k2 = tmp_path / "K2"  # the next machine
    done = sh("place", str(out), str(logs), K=str(k2))
    assert done.returncode == 0, done.stdout + done.stderr
    for (m, s), blob in blobs.items():
        run = k2 / "cmp" / f"rl_{m}" / s
        assert (run / "checkpoints" / "step_000020" / "state.pt").read_bytes() == blob
        assert json.loads((run / "metrics.jsonl").read_text())["run"] == f"{m}{s}"

    (logs / "rl_sera" / "s0" / "metrics.jsonl").write_text('{"step": 25, "run": "newer"}\n')
    done = sh("place", str(out), str(logs), K=str(k2))  # again on the same machine: its own logs stay
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((k2 / "cmp" / "rl_sera" / "s0" / "metrics.jsonl").read_text())["run"] == "seras0"

    part = out / "rl_rao_s1_step_000020.pt.part.ab"
    part.write_bytes(part.read_bytes()[:-1] + b"x")  # one byte changed in transit
    k3 = tmp_path / "K3"
    done = sh("place", str(out), K=str(k3))
    assert done.returncode == 2 and "rl_rao_s1_step_000020.pt: a part is missing or damaged" in done.stdout
    assert not (k3 / "cmp" / "rl_rao" / "s1").exists()
