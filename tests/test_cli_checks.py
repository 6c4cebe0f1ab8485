"""The first hour, third pass (issue #38): every value range-checked, damaged checkpoints survived, an
unwritable --out and a broken optional package named, a changed --resume refused option by option, a second
writer refused, and a run that stops before --steps exiting 3.

Bad input: exit 2, one line starting with ``error:``, nothing loaded, nothing written. The checks that load
nothing run in this process (``cli``); the end-to-end ones as a user types them (``sera``).

Run: ``python -m pytest tests/test_cli_checks.py -q``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def sera(*args: str, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "sera", *args],
        cwd=ROOT, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def cli(*args: str):
    """``sera ARGS`` in this process; the result has ``returncode``, ``stdout`` and ``stderr``."""
    from typer.testing import CliRunner

    from sera.cli import app

    try:
        runner = CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        runner = CliRunner()
    r = runner.invoke(app, list(args), prog_name="sera")
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def one_line_error(proc, *needles: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model (or its tokenizer) fails the test."""
    import common.policy.models as models

    def boom(*a, **k):
        raise AssertionError("a model was loaded")

    for name in ("load_model", "load_tokenizer", "prepare_model"):
        monkeypatch.setattr(models, name, boom)


# ---- 1. every numeric and enumerated setting: one line naming the option and its range -------------------
RANGE_CASES = [
    # (command + options, what the line must say)
    (["train", "--grad-clip", "-1"], "--grad-clip must be > 0 (got -1.0)"),
    (["train", "--grad-clip", "0"], "--grad-clip must be > 0"),
    (["train", "--temperature", "-0.5"], "--temperature must be >= 0 (got -0.5)"),
    (["train", "--score-noise", "2"], "--score-noise must be in [0, 1] (got 2.0)"),
    (["train", "--max-depth", "-1"], "--max-depth must be >= 0 (got -1)"),
    (["train", "--lr", "0"], "--lr must be > 0 (got 0.0)"),
    (["train", "--lr", "-1e-5"], "--lr must be > 0"),
    (["train", "--lr", "nan"], "--lr must be > 0 (got nan)"),
    (["train", "--beta1", "1"], "--beta1 must be in [0, 1) (got 1.0)"),
    (["train", "--beta2", "-0.1"], "--beta2 must be in [0, 1)"),
    (["train", "--weight-decay", "-0.01"], "--weight-decay must be >= 0"),
    (["train", "--method", "sera2"], "--method must be one of rao, rao_d, sera_wo_d_rt, sera_wo_d, sera"),
    (["train", "--dtype", "fp8"], "--dtype must be one of auto, float32, bfloat16 (got 'fp8')"),
    (["train", "--env", "minecraft"], "--env must be one of textcraft, textworld"),
    (["train", "--difficulty", "impossible"], "--difficulty must be one of"),
    (["train", "--rubric-max-new-tokens", "0"], "--rubric-max-new-tokens must be >= 1"),
    (["train", "--score-max-new-tokens", "0"], "--score-max-new-tokens must be >= 1"),
    (["train", "--branch-score-max-new-tokens", "0"], "--branch-score-max-new-tokens must be >= 1"),
    (["train", "--max-envs-per-rollout", "0"], "--max-envs-per-rollout must be >= 1"),
    (["train", "--max-prompt-tokens", "0"], "--max-prompt-tokens must be >= 1"),
    (["train", "--step-timeout-s", "0"], "--step-timeout-s must be > 0"),
    (["train", "--cancel-grace-s", "-1"], "--cancel-grace-s must be >= 0"),
    (["train", "--seed", "-1"], "--seed must be >= 0"),
    (["train", "--keep-checkpoints", "-1"], "--keep-checkpoints must be >= 0 (got -1)"),
    (["train", "--level", "1", "--keep-checkpoints", "-2"], "--keep-checkpoints must be >= 0 (got -2)"),
    (["train", "--oracle-mix", "-0.1", "--score-noise", "1.5"], "--oracle-mix must be in [0, 1] (got -0.1); --score-noise"),
    (["train", "--level", "1", "--gpu-memory-utilization", "0"], "--gpu-memory-utilization must be in (0, 1]"),
    (["train", "--level", "1", "--gpu-share", "1.5"], "--gpu-share must be in (0, 1]"),
    (["train", "--level", "1", "--gpu-share", "0.2", "--gpu-memory-utilization", "0.3"],
     "leaves nothing of --gpu-share 0.2 for the trainer"),
    (["train", "--level", "2", "--collective-timeout-s", "0"], "--collective-timeout-s must be > 0"),
    (["train", "--level", "2", "--server-gpu-memory-utilization", "1.5"], "--server-gpu-memory-utilization must be in (0, 1]"),
    (["train", "--level", "2", "--trainer-gpus", "-2"], "--trainer-gpus must be -1 (auto) or >= 0 (got -2.0)"),
    (["train", "--lora-rank", "-1"], "--lora-rank must be >= 0 (got -1)"),
    (["train", "--lora-alpha", "0"], "--lora-alpha must be > 0"),
    (["train", "--depth-weight-cap", "0.5"], "--depth-weight-cap must be 0 (off) or >= 1 (got 0.5)"),
    (["train", "--stage-grad-clip", "planning:1"], "--stage-grad-clip: 'planning:1' is not STAGE:CLIP"),
    (["train", "--stage-grad-clip", "rubric:0"], "--stage-grad-clip: 'rubric:0' is not STAGE:CLIP"),
    (["train", "--eval-samples", "-1"], "--eval-samples must be >= 0"),
    (["train", "--level", "2", "--lora-rank", "4"], "--lora-rank: levels 0 and 1 only"),
    (["sft", "--lr", "0"], "--lr must be > 0"),
    (["sft", "--grad-clip", "-1"], "--grad-clip must be > 0"),
    (["sft", "--weight-decay", "-1"], "--weight-decay must be >= 0"),
    (["sft", "--loss-mean", "median"], "--loss-mean must be one of token, example (got 'median')"),
    (["sft", "--dtype", "auto"], "--dtype must be one of float32, bfloat16"),
    (["sft", "--temperature", "-1"], "--temperature must be >= 0"),
    (["sft", "--max-depth", "-1"], "--max-depth must be >= 0"),
    (["eval", "--tasks", "T", "--temperature", "-0.5"], "--temperature must be >= 0 (got -0.5)"),
    (["eval", "--tasks", "T", "--max-depth", "-1"], "--max-depth must be >= 0"),
    (["eval", "--tasks", "T", "--engine", "sglang"], "--engine must be one of hf, vllm (got 'sglang')"),
    (["eval", "--tasks", "T", "--selection-mode", "best"], "--selection-mode must be one of first, random"),
    (["eval", "--tasks", "T", "--env", "minecraft"], "--env must be one of textcraft, textworld, textworld-cooking"),
    (["eval", "--tasks", "T", "--max-forks-per-task", "0"], "--max-forks-per-task must be >= 1"),
    (["rollout", "--temperature", "-1"], "--temperature must be >= 0"),
    (["rollout", "--max-depth", "-1"], "--max-depth must be >= 0"),
    (["rollout", "--env", "minecraft"], "--env must be one of"),
    (["data", "textcraft", "--n", "0"], "--n must be >= 1 (got 0)"),
    (["data", "textworld", "--n", "-1"], "--n must be >= 1"),
    (["data", "textworld-cooking", "--seed", "-1"], "--seed must be >= 0"),
    (["view", "LOG", "--last", "0"], "--last must be >= 1"),
]  # fmt: skip


@pytest.mark.parametrize("argv,needle", RANGE_CASES, ids=[" ".join(a) for a, _ in RANGE_CASES])
def test_a_value_out_of_range_is_one_line_naming_the_option_and_range(argv, needle, tmp_path, no_model):
    target = tmp_path / "target"
    argv = [str(tmp_path / "t.jsonl") if a == "T" else a for a in argv]
    argv = [str(tmp_path / "log.jsonl") if a == "LOG" else a for a in argv]
    (tmp_path / "t.jsonl").write_text("")
    (tmp_path / "log.jsonl").write_text("")
    flag = {"rollout": "--log", "view": None}.get(argv[0], "--out")
    if argv[0] == "data":
        target = tmp_path / "tasks.jsonl"
    r = cli(*argv, *([flag, str(target)] if flag else []))
    one_line_error(r, needle)
    assert not target.exists()  # nothing written


def test_a_bad_value_is_one_line_as_a_user_types_it(tmp_path):
    """The same through the installed entry point (a subprocess): exit 2, one line, no run directory."""
    r = sera("train", "--grad-clip", "-1", "--temperature", "-0.5", "--out", str(tmp_path / "run"))
    one_line_error(r, "--temperature must be >= 0 (got -0.5)", "--grad-clip must be > 0 (got -1.0)")
    assert not (tmp_path / "run").exists()


def test_python_callers_get_the_same_checks():
    from common.agent.runtime import RuntimeConfig
    from common.eval import EvalConfig
    from common.train_config import OptimConfig, TrainConfig

    with pytest.raises(ValueError, match=r"--beta2 must be in \[0, 1\)"):
        OptimConfig(beta2=1.0)
    with pytest.raises(ValueError, match="--max-depth must be >= 0"):
        RuntimeConfig(max_depth=-1)
    with pytest.raises(ValueError, match="--score-noise must be in"):
        TrainConfig.make(score_noise=-0.5)
    with pytest.raises(ValueError, match="--method must be one of"):
        TrainConfig.make(method="nope")
    with pytest.raises(ValueError, match="--temperature must be >= 0"):
        EvalConfig(tasks="t", out="o", temperature=-1)
    # the edges are allowed: greedy, no delegation, no weight decay, beta 0
    TrainConfig.make(temperature=0.0, max_depth=0, weight_decay=0.0, beta1=0.0, score_noise=1.0)


def test_help_still_names_the_choices():
    proc = sera("train", "--help", env={"COLUMNS": "200"})
    assert "rao|rao_d|sera_wo_d_rt|sera_wo_d|sera" in proc.stdout  # a long list opens the help text (#52.7)


# ---- 2. a damaged checkpoint: named, and the newest intact one used ---------------------------------------
def small_model_and_optimizer(seed: int):
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def saved_run(out: Path, steps: int = 2):
    """``steps`` checkpoints of a small model (the weights differ per step), config ``{"lr": 1e-3}``."""
    import torch

    from common.run.checkpoint import RunState, TorchCheckpointer

    model, opt = small_model_and_optimizer(0)
    ckpt = TorchCheckpointer(out, keep=2)  # the default keeps only the newest: nothing to fall back to
    weights = {}
    for step in range(1, steps + 1):
        with torch.no_grad():
            model.weight.add_(1.0)
        ckpt.save(RunState(round=step, step=step, cursor=step), model, opt, {"lr": 1e-3})
        weights[step] = model.weight.detach().clone()
    return ckpt, weights


def test_a_damaged_newest_checkpoint_is_named_and_the_one_before_it_used(tmp_path, capsys):
    import torch

    ckpt, weights = saved_run(tmp_path)
    damaged = tmp_path / "checkpoints" / "step_000002" / "state.pt"
    os.truncate(damaged, 1000)  # `truncate -s 1000 RUN/checkpoints/step_000002/state.pt`
    model, opt = small_model_and_optimizer(1)
    state = ckpt.load_latest(model, opt, {"lr": 1e-3})
    assert state.step == 1 and state.round == 1
    assert torch.equal(model.weight, weights[1])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    assert str(damaged) in lines[0] and "is damaged" in lines[0]
    assert "step_000001" in lines[1] and "newest intact checkpoint" in lines[1]
    os.truncate(tmp_path / "checkpoints" / "step_000001" / "state.pt", 10)  # every checkpoint damaged
    with pytest.raises(SystemExit, match="every checkpoint in .* is damaged .*step_000002, step_000001"):
        ckpt.load_latest(model, opt, {"lr": 1e-3})


def test_a_crash_while_writing_a_checkpoint_leaves_the_ones_before_it_whole(tmp_path, monkeypatch):
    import torch

    from common.run.checkpoint import RunState

    ckpt, weights = saved_run(tmp_path, steps=1)
    real_save = torch.save

    def crash(obj, path):  # half the file written, then the process dies
        real_save(obj, path)
        os.truncate(path, os.path.getsize(path) // 2)
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    model, opt = small_model_and_optimizer(0)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(RunState(round=2, step=2, cursor=2), model, opt, {"lr": 1e-3})
    monkeypatch.setattr(torch, "save", real_save)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000001"]
    state = ckpt.load_latest(model, opt, {"lr": 1e-3})
    assert state.step == 1 and torch.equal(model.weight, weights[1])


@pytest.mark.slow
def test_resume_of_a_run_with_a_damaged_checkpoint_continues(tmp_path):
    """End to end (level 0, the test model): a 2-step run, its step-2 checkpoint truncated; --resume names
    the file, resumes from step 1 and writes step 2 again."""
    run = tmp_path / "run"
    args = ["train", "--model", "tiny", "--out", str(run), "--max-steps", "3", "--max-new-tokens", "16",
            "--rubric-max-new-tokens", "16", "--oracle-mix", "0.7", "--score-noise", "0.3", "--difficulty",
            "medium", "--n-tasks", "16", "--max-task-replacements", "3", "--tasks-per-step", "1",
            "--schedule", "execution:1", "--max-idle-rounds", "6",
            "--keep-checkpoints", "2"]  # fmt: skip
    # one task a step, every step an Execution one: the checkpoints are the point, not the round's size or stage
    first = sera(*args, "--steps", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    assert (run / "checkpoints" / "step_000002").is_dir(), first.stdout[-2000:]
    damaged = run / "checkpoints" / "step_000002" / "state.pt"
    os.truncate(damaged, 1000)
    again = sera(*args, "--steps", "2", "--resume")  # step 2 is redone from step 1's checkpoint
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{damaged} is damaged" in again.stdout
    assert "newest intact checkpoint" in again.stdout and "Traceback" not in again.stderr
    import torch

    assert torch.load(damaged, weights_only=False)["run"]["step"] == 2  # written again, whole


# ---- 3. an unwritable --out, a broken (not missing) ray: one line before anything loads --------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--model", "tiny"],
        ["sft", "--model", "tiny"],
        ["eval", "--tasks", "T", "--policy", "oracle"],
    ],
    ids=["train", "sft", "eval"],
)
def test_an_unwritable_out_is_one_line_before_anything_loads(argv, tmp_path, monkeypatch, no_model):
    """A read-only mount or an immutable directory (``chattr +i``; root ignores chmod, so os.access stands
    in for both here): exit 2, one line naming --out, nothing loaded or written."""
    (tmp_path / "t.jsonl").write_text("")
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: Path(p) != readonly and real(p, mode, **k))
    argv = [str(tmp_path / "t.jsonl") if a == "T" else a for a in argv]
    for out in (readonly, readonly / "run"):
        line = one_line_error(cli(*argv, "--out", str(out)), f"--out {out} is not writable", "read-only")
        assert (str(readonly) in line.split("writable", 1)[1]) == (out != readonly)
    assert list(readonly.iterdir()) == []


def test_a_broken_ray_is_one_line_for_level_2(tmp_path):
    """``ray`` present but raising on import (a missing shared library): exit 2, one line naming it."""
    fake = tmp_path / "site" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("libray.so: cannot open shared object file")\n')
    r = sera("train", "--level", "2", "--model", "tiny", "--out", str(tmp_path / "run"),
             env={"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}"})  # fmt: skip
    one_line_error(r, "--level 2", "ray", "fails to import", "libray.so", "[distributed]")
    assert not (tmp_path / "run").exists()


def test_an_immutable_out_is_one_line(tmp_path, no_model):
    """The same with a real ``chattr +i`` directory, where the file system allows it (root, ext4/xfs/...)."""
    import shutil

    locked = tmp_path / "locked"
    locked.mkdir()
    if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(locked)]).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        one_line_error(cli("train", "--model", "tiny", "--out", str(locked)), "is not writable")
        one_line_error(
            cli("data", "textcraft", "--n", "2", "--out", str(locked / "t.jsonl")), "is not writable"
        )
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    assert list(locked.iterdir()) == []


# ---- 4. --resume with changed options; a second writer ----------------------------------------------------
def a_checkpointed_run(run: Path, **settings) -> Path:
    """A run directory as a tier leaves it: config.json and a checkpoint directory."""
    from dataclasses import asdict

    from common.train_config import TrainConfig

    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    cfg = TrainConfig.make(model="tiny", out=str(run), **settings)
    (run / "config.json").write_text(json.dumps({**asdict(cfg), "init_weights": {"adapter": None}}, indent=2))
    (run / "metrics.jsonl").write_text('{"round": 0, "step": 1}\n')
    return run


def test_resume_with_changed_options_is_one_line_per_option_before_anything_loads(tmp_path, no_model):
    run = a_checkpointed_run(tmp_path / "run", lr=1e-5)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    r = cli(
        "train", "--model", "tiny", "--out", str(run), "--resume", "--lr", "0.001", "--temperature", "0.5"
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines), lines
    assert lines[0].startswith("error: --lr: 1e-05 in the run, 0.001 now") and str(run) in lines[0]
    assert lines[1].startswith("error: --temperature: 1.0 in the run, 0.5 now")
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # the same options pass the check (a longer --steps too: the step target may change)
    from common.train_config import TrainConfig
    from sera.cli import _check_resumed_config

    _check_resumed_config(TrainConfig.make(model="tiny", out=str(run), lr=1e-5, steps=9, resume=True), run)


def test_a_second_run_on_a_directory_being_written_is_refused(tmp_path, no_model):
    run = a_checkpointed_run(tmp_path / "run")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from common.run.checkpoint import "
         "lock_out; lock_out(Path(sys.argv[1])); print('locked', flush=True); time.sleep(120)", str(run)],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        for extra in (["--resume"], ["--overwrite"], []):
            one_line_error(
                cli("train", "--model", "tiny", "--out", str(run), *extra), "another running process"
            )
    finally:
        holder.kill()
        holder.wait()
    assert (run / "config.json").exists()  # --overwrite deleted nothing


# ---- 5. a run that stops before --steps exits 3, saying why ------------------------------------------------
def test_a_run_that_stops_before_its_steps_exits_3_with_the_reason(tmp_path):
    """No round of the oracle-written replies has signal (every rollout succeeds: no LOO advantage), so the
    run stops after --max-idle-rounds rounds: exit 3, the reason and the command that continues it."""
    run = tmp_path / "run"
    r = sera("train", "--model", "tiny", "--out", str(run), "--steps", "2", "--max-steps", "2",
             "--max-new-tokens", "12", "--rubric-max-new-tokens", "16", "--oracle-mix", "1",
             "--max-idle-rounds", "1")  # fmt: skip
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("stopped before --steps 2: 1 rounds in a row without an optimizer step"), last
    assert "--max-idle-rounds" in last and last.endswith("--resume)") and "Traceback" not in r.stderr
    assert (run / "metrics.jsonl").exists()  # its outputs are kept


def test_the_learning_driver_counts_exit_3_as_stopped_early_not_failed():
    # learning.sh and tiny_set.sh run their phases through bench/phase.sh's run_phase
    for script in ("bench/phase.sh", "bench/h200_warmstart_call.sh"):
        text = (ROOT / script).read_text()
        assert "[ $rc -eq 3 ]" in text and "stopped before --steps" in text, script
    for script in ("bench/learning.sh", "bench/tiny_set.sh"):
        assert 'source "$(dirname "$0")/phase.sh"' in (ROOT / script).read_text(), script


def test_a_range_error_is_said_before_torch_is_imported():
    """``sera train --steps 0`` checks its input without importing torch (or transformers): the line comes in
    about a second, not after torch's ~3-s import (``common.rl``'s torch module is imported on first use)."""
    code = (
        "import sys; sys.argv = ['sera', 'train', '--steps', '0']\n"
        "from sera.cli import app\n"
        "try:\n    app()\nexcept SystemExit as e:\n    code = e.code\n"
        "print('EXIT', code, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert r.stdout.strip().splitlines()[-1] == "EXIT 2 False False", (r.stdout, r.stderr[-2000:])
    assert r.stderr.strip().splitlines() == ["error: --steps must be >= 1 (got 0)"], r.stderr
    from common.rl import cispo_loss, token_logprobs  # the lazily imported names still resolve

    assert callable(cispo_loss) and callable(token_logprobs)
