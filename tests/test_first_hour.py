"""The first hour with `sera`, second pass: no lost runs, optional packages named in one line, grouped help,
a clean Ctrl-C, and the numbers the docs quote.

* a run directory that holds any output (metrics only, no checkpoint) is never replaced without --overwrite;
* --resume of an empty directory says so in one line;
* every command path that imports an optional package (ray, textworld, vllm, tensorboard, sglang) fails with
  that package hidden in one line naming its extra, exit 2, before any model loads;
* `sera train --help` / `sera sft --help` are grouped in panels, the basics first (wide and narrow terminals);
* SIGINT of a short `sera train` / `sera eval` exits 130 and prints what was saved and the command that resumes.

Run: ``python -m pytest tests/test_first_hour.py -q``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def sera(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "sera", *args],
        cwd=ROOT, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def cli(*args: str):
    """``sera ARGS`` in this process (no interpreter start: for the checks that load nothing); the result
    has ``returncode`` and ``stderr`` like a CompletedProcess."""
    from typer.testing import CliRunner

    from sera.cli import app

    try:
        runner = CliRunner(mix_stderr=False)  # click < 8.2
    except TypeError:
        runner = CliRunner()
    r = runner.invoke(app, list(args), prog_name="sera")
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def one_line_error(proc, *needles: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    from common.data import write_jsonl
    from common.envs.textcraft.tasks import generate_tasks

    d = tmp_path_factory.mktemp("first_hour")
    write_jsonl(d / "tc.jsonl", generate_tasks(split="val", n=2, seed=0))
    write_jsonl(d / "tc_many.jsonl", generate_tasks(split="val", n=400, seed=0))
    return d


# ---- 1. a run directory with output is never replaced without --overwrite -------------------------------
def a_run_without_checkpoint(d: Path) -> Path:
    """What the default CPU run leaves: logs and a plot, no checkpoint (no step updated the weights)."""
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text('{"round": 0, "step": 0}\n{"round": 1, "step": 0}\n')
    (d / "trees.jsonl").write_text('{"meta": {"round": 0}}\n')
    (d / "curves.png").write_bytes(b"png")
    (d / "config.json").write_text("{}")
    return d


def test_rerun_over_a_run_with_metrics_only_is_refused_naming_resume_and_overwrite(tmp_path):
    run = a_run_without_checkpoint(tmp_path / "level0")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    proc = sera("train", "--model", "tiny", "--out", str(run))
    one_line_error(proc, str(run), "already holds a run", "--resume", "--overwrite", "2 logged rounds")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # nothing touched
    # the tiers' own entry (Python callers, torchrun) refuses the same way
    from common.run.checkpoint import prepare_out

    with pytest.raises(SystemExit, match="--overwrite"):
        prepare_out(run, resume=False)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_rerun_over_a_checkpointed_run_names_resume_and_overwrite(tmp_path):
    run = a_run_without_checkpoint(tmp_path / "run")
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    one_line_error(cli("sft", "--model", "tiny", "--out", str(run)), "pass --resume", "--overwrite")


def test_overwrite_deletes_a_run_but_never_a_directory_that_is_not_one(tmp_path, monkeypatch):
    from common.run.checkpoint import check_run_dir, clear_run_dir

    run = a_run_without_checkpoint(tmp_path / "run")
    assert check_run_dir(run, resume=False, overwrite=True) is None
    clear_run_dir(run)
    assert [p.name for p in run.iterdir()] == [".lock"]  # the lock of this process stays
    assert check_run_dir(run, resume=False) is None  # now free to start
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "thesis.tex").write_text("years of work")
    with pytest.raises(ValueError, match="does not look like a run directory"):
        clear_run_dir(notes)
    assert (notes / "thesis.tex").exists()
    monkeypatch.chdir(run)
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="current directory"):
        clear_run_dir(Path("."))
    one_line_error(cli("train", "--out", str(run), "--resume", "--overwrite"), "contradict")


# ---- 2. --resume with nothing to resume says so ---------------------------------------------------------
def test_resume_of_an_empty_directory_says_so_in_one_line(tmp_path, capsys):
    from common.run.checkpoint import prepare_out

    for out in (tmp_path / "missing", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        prepare_out(out, resume=True)
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 1 and "--resume" in lines[0] and "fresh" in lines[0], lines
    run = a_run_without_checkpoint(tmp_path / "logs_only")
    prepare_out(run, resume=True)  # logs, no checkpoint: starts over, and says so
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "no checkpoint" in lines[0] and "step 0" in lines[0], lines
    (tmp_path / "ckpt" / "checkpoints" / "step_000003").mkdir(parents=True)
    prepare_out(tmp_path / "ckpt", resume=True)  # a real resume: no note
    assert capsys.readouterr().out == ""


# ---- 3. optional packages: one line naming the extra, exit 2, before any model loads ---------------------
HARNESS = r"""
import contextlib, io, json, sys
import common.policy.models as models

def no_model(*a, **k):
    raise AssertionError("a model was loaded")

models.load_model = models.load_tokenizer = models.prepare_model = no_model
from sera.cli import app

results = {}
for case_id, package, argv in json.loads(sys.argv[1]):
    hidden = {k: v for k, v in sys.modules.items() if k == package or k.startswith(package + ".")}
    for k in hidden:
        del sys.modules[k]
    sys.modules[package] = None  # `import package` now raises ModuleNotFoundError
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            app(argv, prog_name="sera")
        code = 0
    except SystemExit as e:
        code = e.code
    except BaseException as e:
        code, err = "raised", io.StringIO(f"{type(e).__name__}: {e}")
    finally:
        del sys.modules[package]
        sys.modules.update(hidden)
    results[case_id] = {"code": code, "stderr": err.getvalue(), "stdout": out.getvalue()}
print(json.dumps(results))
"""

OPTIONAL_CASES = [
    # (id, hidden package, argv, the install hint the line must name)
    ("train-level2", "ray", ["train", "--level", "2", "--model", "tiny"], "[distributed]"),
    ("train-level2-sglang", "sglang", ["train", "--level", "2", "--server-engine", "sglang"], "[sglang]"),
    ("train-level2-vllm", "vllm", ["train", "--level", "2", "--server-engine", "vllm"], "pip install vllm"),
    ("train-level1-vllm", "vllm", ["train", "--level", "1", "--engine", "vllm"], "pip install vllm"),
    ("train-tensorboard", "tensorboard", ["train", "--model", "tiny", "--tensorboard"], "[tensorboard]"),
    ("train-textworld", "textworld", ["train", "--env", "textworld", "--model", "tiny"], "[textworld]"),
    ("sft-textworld", "textworld", ["sft", "--env", "textworld", "--model", "tiny"], "[textworld]"),
    (
        "eval-engine-vllm",
        "vllm",
        ["eval", "--tasks", "TC", "--policy", "hf:tiny", "--engine", "vllm"],
        "pip install vllm",
    ),
    ("eval-policy-vllm", "vllm", ["eval", "--tasks", "TC", "--policy", "vllm:tiny"], "pip install vllm"),
    ("eval-cooking", "textworld", ["eval", "--env", "textworld-cooking", "--tasks", "TC"], "[textworld]"),
    ("rollout-policy-vllm", "vllm", ["rollout", "--policy", "vllm:tiny"], "pip install vllm"),
    ("rollout-cooking", "textworld", ["rollout", "--env", "textworld-cooking"], "[textworld]"),
    ("rollout-textworld-generated", "textworld", ["rollout", "--env", "textworld"], "[textworld]"),
    ("data-textworld", "textworld", ["data", "textworld", "--n", "1"], "[textworld]"),
    ("data-textworld-cooking", "textworld", ["data", "textworld-cooking", "--n", "1"], "[textworld]"),
]

OPTIONAL_IMPORT = re.compile(
    r"^\s*(?:import|from)\s+(ray|textworld|vllm|sglang|torch\.utils\.tensorboard)\b|[\"']sglang\.launch_server[\"']",
    re.M,
)
IMPORT_SITES = {
    # every module that imports an optional package -> the cases above that reach it
    "common/envs/textworld_sync/tasks.py": ["train-textworld", "sft-textworld", "rollout-textworld-generated",
                                            "data-textworld"],
    "common/envs/textworld_cooking/games.py": ["data-textworld-cooking", "rollout-cooking", "eval-cooking"],
    "common/envs/textworld_cooking/env.py": ["rollout-cooking", "eval-cooking"],
    "common/run/metrics.py": ["train-tensorboard"],
    "level1_batched/vllm_engine.py": ["train-level1-vllm", "eval-engine-vllm", "eval-policy-vllm",
                                      "rollout-policy-vllm", "train-level2-vllm"],
    "level2_distributed/sync.py": ["train-level2"],
    "level2_distributed/trainer.py": ["train-level2"],
    "level2_distributed/servers.py": ["train-level2", "train-level2-sglang"],
    "level2_distributed/train.py": ["train-level2"],
    "level2_distributed/placement.py": ["train-level2"],
}  # fmt: skip


@pytest.fixture(scope="module")
def hidden_runs(task_files, tmp_path_factory):
    """Every case in one interpreter (one torch import instead of fifteen), each with its package hidden."""
    out = tmp_path_factory.mktemp("hidden")
    cases = []
    for i, (case_id, package, argv, _hint) in enumerate(OPTIONAL_CASES):
        argv = [str(task_files / "tc.jsonl") if a == "TC" else a for a in argv]
        flag = "--log" if argv[0] == "rollout" else "--out"
        target = out / f"{i}.jsonl" if argv[0] in ("data", "rollout") else out / f"run{i}"
        cases.append((case_id, package, [*argv, flag, str(target)]))
    proc = subprocess.run(
        [sys.executable, "-c", HARNESS, json.dumps(cases)],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), out


@pytest.mark.parametrize("case_id,package,argv,hint", OPTIONAL_CASES, ids=[c[0] for c in OPTIONAL_CASES])
def test_missing_optional_package_is_one_line_naming_its_extra(hidden_runs, case_id, package, argv, hint):
    results, out = hidden_runs
    r = results[case_id]
    lines = r["stderr"].strip().splitlines()
    assert r["code"] == 2, r
    assert len(lines) == 1 and lines[0].startswith("error:"), r["stderr"]
    assert f"the {package} package" in lines[0] and hint in lines[0], lines[0]
    assert not any(p.name.startswith("run") and any(p.iterdir()) for p in out.iterdir() if p.is_dir())


def test_every_module_importing_an_optional_package_has_a_hidden_package_case():
    """A new import of an optional package needs a CLI check and a case above (else: a traceback again)."""
    sites = set()
    for top in ("common", "level0_single_process", "level1_batched", "level2_distributed", "sera"):
        for path in (ROOT / top).rglob("*.py"):
            if OPTIONAL_IMPORT.search(path.read_text()):
                sites.add(path.relative_to(ROOT).as_posix())
    new = sites - set(IMPORT_SITES)
    assert not new, f"modules importing an optional package without a case here (add a CLI check): {new}"
    known = {c[0] for c in OPTIONAL_CASES}
    assert all(set(v) <= known for v in IMPORT_SITES.values())


def test_a_late_missing_optional_import_is_still_one_line():
    """The safety net: a ModuleNotFoundError of an optional package no check caught (here raised inside the
    command, also when wrapped in a RuntimeError) becomes the same one line, exit 2."""
    import typer

    from sera.cli import friendly

    def deep():
        try:
            import ray  # noqa: F401
        except ImportError as e:
            raise RuntimeError("could not start the servers") from e

    hidden = sys.modules.pop("ray", None)
    sys.modules["ray"] = None  # type: ignore[assignment]
    try:
        with pytest.raises(typer.Exit) as exc:
            friendly(deep)()
    finally:
        del sys.modules["ray"]
        if hidden is not None:
            sys.modules["ray"] = hidden
    assert exc.value.exit_code == 2


# ---- 5. help in panels, the basics first ---------------------------------------------------------------
TRAIN_PANELS = ["Run", "Model and rollout", "RL and optimizer", "Logging, checkpoints and held-out eval",
                "Level 1 (--level 1 only)", "Level 2 (--level 2 only)"]  # fmt: skip


@pytest.fixture(scope="module")
def helps():
    """``{(command, columns): help text}``: rich panels at 120 columns, click's plain layout at 80."""
    out = {}
    for command, columns in (("train", "120"), ("train", "80"), ("eval", "120")):
        proc = sera(command, "--help", env={"COLUMNS": columns, "TERMINAL_WIDTH": columns})
        assert proc.returncode == 0, proc.stderr
        out[command, columns] = proc.stdout
    return out


@pytest.mark.parametrize("columns", ["120", "80"])
def test_train_help_is_grouped_in_panels_basics_first(helps, columns):
    text = helps["train", columns]
    heads = [re.sub(r"[╭─\s]+", " ", line).strip(" ╮:") for line in text.splitlines()
             if line.startswith("╭─") or re.match(r"^[A-Z][^ ].*:$", line)]  # fmt: skip
    assert [h for h in heads if h in TRAIN_PANELS] == TRAIN_PANELS, heads
    text = text[text.index("Run"):]  # the options (the description above them opens with examples, #38.9)
    positions = {flag: text.index(flag) for flag in ("--level", "--model", "--steps", "--out", "--resume",
                                                     "--overwrite", "--max-steps", "--lr", "--tensorboard",
                                                     "--engine ", "--trainers")}  # fmt: skip
    assert positions["--resume"] < positions["--max-steps"] < positions["--lr"] < positions["--tensorboard"]
    assert positions["--tensorboard"] < positions["--engine "] < positions["--trainers"]


def test_every_train_and_sft_option_sits_in_a_named_panel():
    import typer

    from sera.cli import app

    group = typer.main.get_command(app)
    for name in ("train", "sft"):
        params = [p for p in group.commands[name].params if p.name != "help"]
        loose = [p.name for p in params if not getattr(p, "rich_help_panel", None)]
        assert loose == [], f"sera {name}: options outside a panel: {loose}"
        first = [p.name for p in params[:4]]
        assert "model" in first, first


def test_helps_say_how_resuming_works(helps):
    train = " ".join(helps["train", "80"].split())
    assert "same command plus --resume" in train and "without --overwrite" in train and "Ctrl-C" in train
    ev = " ".join(re.sub(r"[│╭╮╰╯─]", " ", helps["eval", "120"]).split())
    assert "the same command resumes" in ev and "--resume is accepted" in ev


# ---- 6. Ctrl-C says what was saved and how to resume ---------------------------------------------------
def interrupt(args: list[str], ready, timeout: float = 90, program: tuple[str, ...] = ("-m", "sera")):
    """Start ``python PROGRAM ARGS`` (``sera ARGS``), wait for ``ready()``, send SIGINT (as Ctrl-C does),
    return the finished run (a CompletedProcess)."""
    # A suite started in the background (`cmd &` in a shell without job control) inherits SIGINT ignored,
    # and Python then installs no KeyboardInterrupt handler: give the child the default disposition, as a
    # terminal's Ctrl-C finds it.
    proc = subprocess.Popen(
        [sys.executable, *program, *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    t0 = time.time()
    while not ready() and proc.poll() is None and time.time() - t0 < timeout:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_another_signal_after_the_resume_line_still_exits_130_with_its_output(sig):
    """After the resume line (``interrupted``) a second Ctrl-C or SIGTERM in the teardown ends the process at
    once with exit 130 and its buffered output written, not a traceback or death by SIGINT (-2)."""
    code = (
        "import os, signal, sys, time\n"
        "from sera.cli import exit_at_once_on_another_signal\n"
        "sys.stdout.write('buffered, not flushed')\n"  # stdout is a pipe: block-buffered
        "exit_at_once_on_another_signal()\n"
        f"os.kill(os.getpid(), signal.{sig})\n"
        "time.sleep(30)\n"
        "print('never')\n"
    )
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert r.returncode == 130 and time.time() - t0 < 20, (r.returncode, r.stderr[-2000:])
    assert r.stdout == "buffered, not flushed" and "Traceback" not in r.stderr


def test_ctrl_c_of_a_short_train_run_prints_the_resume_command(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--model", "tiny", "--steps", "50", "--max-new-tokens", "8", "--codeact-executor",
            "worker-ordered", "--resume", "--out", str(out)]  # fmt: skip
    done = interrupt(args, lambda: (out / "config.json").exists())  # the model loaded, the loop started
    assert done.returncode == 130, done.stderr[-3000:]
    assert done.stdout.splitlines()[0] == f"--resume: {out} holds no run yet; starting a fresh one there"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    said = done.stderr.strip().splitlines()
    assert said[-2].startswith("interrupted: ") and str(out) in said[-2], said
    resume = said[-1].removeprefix("resume with: ").split("   ")[0]
    assert resume == (f"sera train --model tiny --steps 50 --max-new-tokens 8 --codeact-executor worker-ordered "
                      f"--out {out} --resume"), resume  # fmt: skip


def test_a_tiers_own_entry_point_is_the_sera_command(tmp_path):
    """``python level0_single_process/train.py`` runs ``sera train --level 0`` as a program (the tier does not
    import the CLI, issue #24): its help, from any directory, and a Ctrl-C that names the tier's command."""
    script = subprocess.run([sys.executable, str(ROOT / "level0_single_process" / "train.py"), "--help"],
                            cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert script.returncode == 0 and "--codeact-executor" in script.stdout, script.stderr[-3000:]
    out = tmp_path / "run"
    args = ["--model", "tiny", "--steps", "50", "--max-new-tokens", "8", "--out", str(out)]
    done = interrupt(
        args, lambda: (out / "config.json").exists(), program=("-m", "level0_single_process.train")
    )
    assert done.returncode == 130, done.stderr[-3000:]
    resume = done.stderr.strip().splitlines()[-1].removeprefix("resume with: ").split("   ")[0]
    assert resume == f"python -m level0_single_process.train {' '.join(args)} --resume", resume


def test_a_coroutine_left_unstarted_by_ctrl_c_does_not_follow_the_resume_command():
    """Seen once in CI: Ctrl-C while ``asyncio.run`` built its loop left the rollouts' coroutine unawaited, and
    its RuntimeWarning ("Enable tracemalloc ...") printed after the resume command, at exit."""
    code = (
        "import asyncio, typer\n"
        "from sera.cli import interrupted\n"
        "cycle = [asyncio.sleep(0)]; cycle.append(cycle); del cycle  # freed only by the collector\n"
        "try:\n    interrupted('nothing', 'sera train --resume')\nexcept typer.Exit as e:\n    raise SystemExit(e.exit_code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "resume with: sera train --resume", done.stderr
    assert "never awaited" not in done.stderr


def test_a_half_built_event_loop_freed_after_the_resume_line_prints_nothing():
    """Seen in CI: Ctrl-C inside ``asyncio.run``'s loop constructor left a loop without its self-pipe; freed with
    the KeyboardInterrupt's traceback, after the resume line, its ``__del__`` printed "Exception ignored in ...
    AttributeError: '_UnixSelectorEventLoop' object has no attribute '_ssock'" as the last line."""
    code = (
        "import asyncio, typer\n"
        "from sera.cli import interrupted\n"
        "def run():\n"
        "    loop = object.__new__(asyncio.SelectorEventLoop)  # its __init__ stopped before the self-pipe:\n"
        "    asyncio.base_events.BaseEventLoop.__init__(loop)  # the base part ran, no _ssock\n"
        "    interrupted('nothing', 'sera train --resume')\n"
        "try:\n    run()\nexcept typer.Exit as e:\n    code = e.exit_code  # leaving this block frees run()'s frame\n"
        "raise SystemExit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "resume with: sera train --resume", done.stderr
    assert "Exception ignored" not in done.stderr and "_ssock" not in done.stderr, done.stderr


def test_ctrl_c_message_names_the_checkpoint(tmp_path, capsys):
    import typer

    from sera.cli import _interrupted_run

    out = tmp_path / "run"
    (out / "checkpoints" / "step_000004").mkdir(parents=True)
    (out / "checkpoints" / "step_000007").mkdir(parents=True)
    rows = [
        {"round": i, "step": min(i, 7), "reward/root_success": i / 10, "loss/cispo": 0.1} for i in range(9)
    ]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(typer.Exit) as exc:
        _interrupted_run(out, f"sera train --steps 20 --out {out} --resume")
    assert exc.value.exit_code == 130
    err = capsys.readouterr().err
    assert "checkpoint of step 7" in err and "9 logged rounds" in err
    assert (
        f"(curves: {out / 'curves.png'})" in " ".join(err.split()) and (out / "curves.png").stat().st_size > 0
    )
    assert f"resume with: sera train --steps 20 --out {out} --resume\n" in err


def test_ctrl_c_of_an_eval_prints_the_same_command_and_eval_accepts_resume(task_files, tmp_path):
    out = tmp_path / "ev"
    args = ["eval", "--tasks", str(task_files / "tc_many.jsonl"), "--policy", "oracle", "--concurrency", "1",
            "--resume", "--out", str(out)]  # fmt: skip
    done = interrupt(args, lambda: len(list((out / "results").glob("*.json"))) >= 2)
    assert done.returncode == 130, done.stderr[-3000:]
    assert f"--resume: {out} holds no results yet" in done.stdout
    said = done.stderr.strip().splitlines()
    n = len(list((out / "results").glob("[0-9]*.json")))
    assert said[-2].startswith(f"interrupted: {n} finished task results saved"), said
    assert said[-1].startswith(f"resume with: sera eval --tasks {task_files / 'tc_many.jsonl'}"), said
    assert "--resume is optional" in said[-1]


# ---- 8. numbers that mislead ---------------------------------------------------------------------------
def test_viewer_does_not_say_none_next_to_visible_replies():
    sys.path.insert(0, str(ROOT / "tests"))
    from test_viewer import make_tree

    from common.agent.viewer import render_html

    page = render_html([make_tree()])
    assert "raw model outputs</h4>" not in page  # the heading now says which calls it means
    assert "no rubric or score call at this node" in page and "<p class=muted>(none)</p>" not in page


def test_bad_split_is_reported_before_the_missing_out():
    one_line_error(cli("data", "textcraft", "--split", "nope"), "--split 'nope'", "train, val")
    one_line_error(cli("data", "textworld", "--split", "nope"), "--split 'nope'", "train, dev, test")
    one_line_error(cli("data", "textcraft"), "--out is required")


# ---- 7, 8, 9. the README and tutorials/README say what a newcomer needs ---------------------------------
def test_readme_says_where_the_model_cache_is_and_which_tests_skip():
    readme = (ROOT / "README.md").read_text()
    assert "~/.cache/sera" in readme and "SERA_CACHE" in readme and "rm -rf" in readme
    assert "vLLM tests" in readme and "SERA_VLLM_PYTHON" in readme
    tutorials = (ROOT / "tutorials" / "README.md").read_text()
    assert "idle" in tutorials
