"""The first hour, fourth pass (issue #52): evaluating the run you trained, a moved run that resumes, a
damaged checkpoint with a way forward.

* ``sera eval --run RUN`` (and ``--policy hf:RUN``, ``hf:RUN/checkpoints/step_N``) evaluates a run's
  checkpoint, for every tier's layout (level 0 and 1 ``state.pt``, full or LoRA; ``sera sft``; level 2's DCP
  shards): the exported model holds exactly the checkpoint's weights;
* a run directory moved (``mv run run2``, ``cp -a``) resumes with ``--out run2 --resume``;
* a checkpoint is kept until the next one reads back; every checkpoint damaged: the line names the file and
  the ways on.

Run: ``python -m pytest tests/test_first_hour_fourth.py -q``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
TINY_RUN = ["--model", "tiny", "--max-steps", "3", "--max-new-tokens", "16", "--rubric-max-new-tokens", "16",
            "--oracle-mix", "0.7", "--score-noise", "0.3", "--difficulty", "medium", "--n-tasks", "16",
            "--max-task-replacements", "3", "--tasks-per-step", "2", "--max-idle-rounds", "6"]  # fmt: skip
"""A level-0 run of the test model that takes an optimizer step in its first round (~20 s on a CPU core)."""


def sera(*args: str, timeout: float = 600):
    return subprocess.run(
        [sys.executable, "-m", "sera", *args],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A level-0 run with one checkpoint (step 1), and a 2-task file."""
    from common.data import write_jsonl
    from common.envs.textcraft.tasks import generate_tasks

    d = tmp_path_factory.mktemp("fourth")
    write_jsonl(d / "val.jsonl", generate_tasks(split="val", n=2, seed=0))
    r = sera("train", *TINY_RUN, "--steps", "1", "--out", str(d / "run"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (d / "run" / "checkpoints" / "step_000001" / "state.pt").is_file(), r.stdout[-2000:]
    return d


def weights_of(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


# ---- 2. train -> evaluate -> view ------------------------------------------------------------------------
def test_eval_of_the_run_just_trained_is_one_command(trained, tmp_path):
    """``sera eval --run RUN --tasks T``: the run's environment, its newest checkpoint's exact weights, the
    report in RUN/eval/T_step_N; ``--policy hf:RUN`` and ``hf:RUN/checkpoints/step_N`` are the same model;
    ``sera view`` draws the eval directory."""
    import torch

    run = tmp_path / "run"
    shutil.copytree(trained / "run", run)
    tasks = str(trained / "val.jsonl")
    flags = ["--tasks", tasks, "--limit", "1", "--max-steps", "2", "--max-new-tokens", "8"]
    r = sera("eval", "--run", str(run), *flags)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"[eval] run {run} (level 0, every weight, model tiny): step 1" in r.stdout, r.stdout[-2000:]
    out = run / "eval" / "val_step_000001"
    report = json.loads((out / "report.json").read_text())
    assert report["n_tasks"] == 1, report
    manifest = json.loads((out / "manifest.json").read_text())
    exported = run / "export" / "step_000001"
    assert manifest["policy"] == f"hf:{exported}" and manifest["env"] == "textcraft"
    saved = torch.load(run / "checkpoints" / "step_000001" / "state.pt", weights_only=False)["model"]
    got = weights_of(exported)
    assert set(got) == set(saved) and all(torch.equal(got[k], saved[k].float()) for k in saved)
    before = (exported / "model.safetensors").stat().st_mtime_ns
    from common.config import Given
    from common.eval import EvalConfig
    from sera.cli import _run_policy

    for spec in (f"hf:{run}", f"hf:{run / 'checkpoints' / 'step_000001'}"):  # the same model, not exported again
        cfg = _run_policy(EvalConfig(tasks=tasks, policy=spec, out=str(tmp_path / "e")), Given({"policy", "tasks"}))
        assert cfg.policy == f"hf:{exported}" and cfg.run == str(run / "checkpoints" / "step_000001")
    assert (exported / "model.safetensors").stat().st_mtime_ns == before
    from typer.testing import CliRunner

    from sera.cli import app

    view = CliRunner().invoke(app, ["view", str(out)], prog_name="sera")
    assert view.exit_code == 0 and "root success" in view.stdout, view.stdout[-2000:]


def test_eval_run_refuses_what_is_not_a_run_in_one_line(trained, tmp_path):
    from typer.testing import CliRunner

    from sera.cli import app  # noqa: F401 - the commands are registered on import

    tasks = str(trained / "val.jsonl")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "llama"}')
    empty_run = tmp_path / "empty"
    empty_run.mkdir()
    (empty_run / "config.json").write_text('{"model": "tiny", "env": "textcraft"}')
    cases = [
        (["--run", str(model_dir)], "is not a training run"),
        (["--run", str(empty_run)], "without a checkpoint yet"),
        (["--run", str(tmp_path / "nowhere")], "does not exist"),
        (["--run", str(trained / "run"), "--policy", "oracle"], "give --run RUN or --policy, not both"),
    ]
    for args, needle in cases:
        r = CliRunner().invoke(app, ["eval", *args, "--tasks", tasks], prog_name="sera")
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and needle in lines[0], (args, r.stderr)
    assert not (trained / "run" / "export").exists()


def tiny_checkpoint(run: Path, layout: str):
    """A run directory of ``layout`` holding one checkpoint of the test model with changed weights (a
    trained LoRA adapter for the LoRA layouts): ``(RunCheckpoint, the weights the export must hold)``."""
    import torch

    from common.policy.lora import TrainedWeights, add_lora, merged_copy_weights
    from common.policy.models import load_model
    from common.run.checkpoint import RunState, TorchCheckpointer
    from common.run.export import find_run_checkpoint
    from common.sft.config import SFTConfig
    from common.train_config import TrainConfig

    lora = layout in ("level1-lora", "sft-lora")
    cfg = (SFTConfig if layout.startswith("sft") else TrainConfig)(model="tiny", seed=3, lora_rank=2 if lora else 0)
    config = asdict(cfg)
    if layout.startswith("level1"):
        config["level1"] = {"engine": "hf"}
    if layout == "level2":
        config["level2"] = {"trainers": 1}
    model, _ = load_model("tiny", dtype="float32", seed=3)
    if lora:
        model = add_lora(model, 2, cfg.lora_alpha, 3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not lora or "lora_B" in name:
                p.add_(0.01 * torch.randn_like(p))
    want = merged_copy_weights(model) if lora else {k: v.clone() for k, v in model.state_dict().items()}
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config))
    if layout == "level2":  # level 2's DCP shards (written here by one process) + run.json
        import torch.distributed.checkpoint as dcp

        step = run / "checkpoints" / "step_000004"
        dcp.save({"model": model.state_dict(), "optim": {}}, checkpoint_id=str(step))
        (step / "run.json").write_text(json.dumps({"run": asdict(RunState(4, 4, 8)), "config": config}))
    else:
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        trained = TrainedWeights(model) if lora else model
        TorchCheckpointer(run).save(RunState(4, 4, 8), trained, opt, config)
    return find_run_checkpoint(run), want


@pytest.mark.parametrize("layout", ["level0", "level1-lora", "sft-lora", "level2"])
def test_every_tiers_checkpoint_exports_to_its_exact_model(layout, tmp_path):
    """Full fine-tuning (every weight in the checkpoint), LoRA (the adapter, merged on the base), level 2's
    DCP shards: the exported directory loads as ``hf:DIR`` and holds the checkpoint's weights."""
    import torch

    from common.policy.models import load_model
    from common.run.export import export_run_model
    from level2_distributed.checkpoint import dcp_model_state

    ck, want = tiny_checkpoint(tmp_path / "run", layout)
    assert ck.step == 4 and ck.form == ("dcp" if layout == "level2" else "torch")
    assert ck.lora_rank == (2 if "lora" in layout else 0) and ck.level == {"level1-lora": 1, "level2": 2}.get(layout, 0)
    model_dir = export_run_model(ck, dcp_model_state)
    assert model_dir == tmp_path / "run" / "export" / "step_000004"
    model, _ = load_model(str(model_dir), dtype="float32")
    got = model.state_dict()
    assert set(want) <= set(got)
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    assert worst < 1e-6, worst
    base, _ = load_model("tiny", dtype="float32", seed=3)
    assert any(not torch.equal(base.state_dict()[k], got[k]) for k in want)  # trained, not the base


def test_a_checkpoint_rewritten_after_an_export_is_exported_again(tmp_path):
    import torch

    from common.run.checkpoint import RunState, TorchCheckpointer
    from common.run.export import export_run_model, find_run_checkpoint

    ck, _ = tiny_checkpoint(tmp_path / "run", "level0")
    first = export_run_model(ck)
    state = torch.load(ck.checkpoint / "state.pt", weights_only=False)
    model = torch.nn.Module()
    state["model"]["model.norm.weight"] = state["model"]["model.norm.weight"] + 1.0
    model.state_dict = lambda: state["model"]  # the same checkpoint step written again with other weights
    TorchCheckpointer(tmp_path / "run").save(RunState(4, 4, 8), model, torch.optim.SGD([torch.zeros(1)], lr=1), ck.config)
    again = export_run_model(find_run_checkpoint(tmp_path / "run"))
    assert again == first
    assert torch.equal(weights_of(again)["model.norm.weight"], state["model"]["model.norm.weight"])


# ---- 4. a moved run resumes; a damaged checkpoint has a way forward ---------------------------------------
@pytest.mark.parametrize("how", ["mv", "cp -a"])
def test_a_moved_run_resumes_at_its_new_place(trained, tmp_path, how):
    """``mv run run2 && sera train ... --out run2 --resume`` continues the run (its --out is where it lives,
    not a setting of it); so does a ``cp -a`` copy, whose original stays as it was."""
    src = tmp_path / "run"
    shutil.copytree(trained / "run", src)
    moved = tmp_path / "run2"
    if how == "mv":
        src.rename(moved)
    else:
        subprocess.run(["cp", "-a", str(src), str(moved)], check=True)
    r = sera("train", *TINY_RUN, "--steps", "2", "--out", str(moved), "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--out" not in r.stderr and (moved / "checkpoints" / "step_000002").is_dir(), r.stdout[-2000:]
    rounds = [json.loads(line)["round"] for line in (moved / "metrics.jsonl").read_text().splitlines()]
    assert rounds == list(range(len(rounds))) and len(rounds) >= 2  # continued, nothing lost or repeated
    assert json.loads((moved / "config.json").read_text())["out"] == str(moved)
    if how == "cp -a":
        assert sorted(p.name for p in (src / "checkpoints").iterdir()) == ["step_000001"]


def test_the_out_a_run_was_made_with_is_not_compared_on_resume():
    from common.run.checkpoint import config_differences

    assert config_differences({"out": "run", "lr": 1e-3}, {"out": "run2", "lr": 1e-3}) == []
    assert config_differences({"out": "run", "lr": 1e-3}, {"out": "run2", "lr": 2e-3}) == [
        "--lr: 0.001 in the run, 0.002 now"
    ]


def test_the_older_checkpoint_stays_until_the_new_one_reads_back(tmp_path, monkeypatch):
    """The default keeps one checkpoint: the older one is deleted only once the newer one loads back, so a
    write the disk got wrong never leaves a run without a checkpoint."""
    import torch

    import common.run.checkpoint as checkpoint
    from common.run.checkpoint import RunState, TorchCheckpointer

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = TorchCheckpointer(tmp_path, keep=1)
    ckpt.save(RunState(1, 1, 1), model, opt, {})
    real = checkpoint.readable

    def garbled(path):  # the new file as a failing disk might leave it
        os.truncate(path / "state.pt", 100)
        real(path)

    monkeypatch.setattr(checkpoint, "readable", garbled)
    with pytest.raises(Exception):  # noqa: B017 - whatever torch raises for a torn archive
        ckpt.save(RunState(2, 2, 2), model, opt, {})
    assert (tmp_path / "checkpoints" / "step_000001" / "state.pt").is_file()
    monkeypatch.setattr(checkpoint, "readable", real)
    assert ckpt.load_latest(model, opt, {}).step == 1  # the damaged step 2 named, step 1 used
    ckpt.save(RunState(2, 2, 2), model, opt, {})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000002"]


def test_every_checkpoint_damaged_names_the_file_and_the_ways_on(tmp_path, capsys):
    import torch

    from common.run.checkpoint import RunState, TorchCheckpointer

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    ckpt = TorchCheckpointer(tmp_path / "run")
    ckpt.save(RunState(1, 1, 1), model, opt, {})
    damaged = tmp_path / "run" / "checkpoints" / "step_000001" / "state.pt"
    os.truncate(damaged, 1000)
    with pytest.raises(SystemExit) as exc:
        ckpt.load_latest(model, opt, {})
    said = str(exc.value)
    assert f"{damaged} is damaged" in capsys.readouterr().out
    assert "every checkpoint in" in said and "step_000001" in said
    assert "another --out" in said and "--overwrite" in said
    assert f"mv {tmp_path / 'run' / 'checkpoints'} {tmp_path / 'run' / 'checkpoints.damaged'}" in said


# ---- 3. a stop is never swallowed --------------------------------------------------------------------------
def stop_each(runs: list[tuple[list[str], object, float, int]], timeout: float = 240):
    """Per ``(ARGS, ready, delay, sig)``: start ``sera ARGS``, wait for ``ready()``, then ``delay`` seconds, send
    ``sig``; per run the finished process (a CompletedProcess) and the seconds from the signal to its end.

    The runs are staggered: the next one starts once the one before is ready, so its start-up (imports, the
    model load: ~6 s of one core) overlaps the one before's delay and its stop instead of following them. At
    most two are alive at once (one thread each: ``OMP_NUM_THREADS=1``); each run's clock is its own: one
    polling loop notes each moment (ready, signal, end) within 0.05 s of when it happens."""
    import signal as signals
    import tempfile
    import time

    procs: list[subprocess.Popen] = []
    files, started_at, ready_at, sent_at, ended_at = [], {}, {}, {}, {}
    try:
        while len(ended_at) < len(runs):
            now = time.time()
            k = len(procs)  # the next run starts once the one before is ready and the one before that ended
            if k < len(runs) and (k == 0 or k - 1 in ready_at or k - 1 in ended_at) and (k < 2 or k - 2 in ended_at):
                out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
                files.append((out, err))
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "sera", *runs[k][0]], cwd=ROOT, env=ENV, stdout=out, stderr=err, text=True,
                    preexec_fn=lambda: signals.signal(signals.SIGINT, signals.SIG_DFL),
                ))  # fmt: skip
                started_at[k] = now
            for i, proc in enumerate(procs):
                if i in ended_at:
                    continue
                _, ready, delay, sig = runs[i]
                if i not in ready_at and ready():
                    ready_at[i] = now
                if i not in sent_at and proc.poll() is not None:  # ended before its signal: fail with what it said
                    files[i][0].seek(0), files[i][1].seek(0)
                    raise AssertionError((proc.returncode, files[i][0].read(), files[i][1].read()))
                if i not in sent_at and (i in ready_at and now >= ready_at[i] + delay or now - started_at[i] > timeout):
                    proc.send_signal(sig)
                    sent_at[i] = now
                if i in sent_at and proc.poll() is not None:
                    ended_at[i] = now
                elif i in sent_at and now - sent_at[i] > timeout:
                    proc.kill()
                    proc.wait()
                    ended_at[i] = now
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    done = []
    for i, proc in enumerate(procs):
        files[i][0].seek(0), files[i][1].seek(0)
        stdout, stderr = files[i][0].read(), files[i][1].read()
        files[i][0].close(), files[i][1].close()
        done.append((subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), ended_at[i] - sent_at[i]))
    return done


SIGNAL_DELAYS = (0.0, 0.6, 1.3, 2.1, 3.0, 4.2, 5.5, 7.0, 9.0, 11.5)
"""Seconds after the run's config.json appears (the model is loaded, round 0 starts): the rollouts, the
scoring, the training step, the checkpoint and the next round of the test model's run on a loaded CPU."""


def test_a_kill_at_any_moment_of_a_round_stops_the_run_with_its_resume_line(tmp_path):
    """SIGTERM (every other one SIGINT) at moments spread over the first rounds of a level-0 run: every time
    exit 130 within seconds, the resume line last, nothing printed after it (no heartbeat, no "Exception
    ignored"), and never a run that carried on to finish its steps."""
    import signal as signals

    runs = []
    for i, delay in enumerate(SIGNAL_DELAYS):
        out = tmp_path / f"run{i}"
        args = ["train", *TINY_RUN, "--steps", "40", "--out", str(out)]
        sig = signals.SIGINT if i % 3 == 2 else signals.SIGTERM
        runs.append((args, lambda out=out: (out / "config.json").exists(), delay, sig))
    slowest = 0.0
    for (_, _, delay, sig), (done, took) in zip(runs, stop_each(runs), strict=True):
        said = done.stderr.strip().splitlines()
        where = f"delay {delay} s, {sig.name}: rc {done.returncode}, {took:.1f} s\n{done.stderr[-2500:]}"
        assert done.returncode == 130, where
        assert said[-1].startswith("resume with: ") and said[-2].startswith("interrupted: "), where
        assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, where
        assert "[heartbeat]" not in done.stdout.split("interrupted:")[-1], where
        assert "done:" not in done.stdout, where
        slowest = max(slowest, took)
    assert slowest < 60, slowest  # the watchdog ends it 10 s on at the latest; the margin is for a loaded machine


SWALLOWING = """
import sys, time, weakref
from sera.cli import interrupted, last_resort, stop_on_signals

stop_on_signals()
last_resort(lambda: "nothing", lambda: "sera train --resume")


class Thing:
    pass


def busy_callback(ref):  # the main thread spends nearly all its time in weakref callbacks, where Python
    t = time.perf_counter()  # prints an exception raised in them ("Exception ignored in ...") and carries on
    while time.perf_counter() - t < 0.05:
        pass


print("ready", flush=True)
try:
    end = time.time() + float(sys.argv[1])
    while time.time() < end:
        thing = Thing()
        ref = weakref.ref(thing, busy_callback)
        del thing
    print("finished", flush=True)
except KeyboardInterrupt:
    try:
        interrupted("nothing", "sera train --resume")
    except BaseException as e:
        raise SystemExit(getattr(e, "exit_code", 1))
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_swallowed_by_a_weakref_callback_is_raised_again(sig, tmp_path):
    """A loop that spends its time in weakref callbacks (where the audit's swallowed KeyboardInterrupt
    landed): the first KeyboardInterrupt is lost there, the watchdog interrupts again until one lands, or
    ends the process itself with the resume line. Before #52: "Exception ignored ... KeyboardInterrupt",
    then "finished", exit 0."""
    import signal as signals
    import time

    script = tmp_path / "swallow.py"
    script.write_text(SWALLOWING)
    proc = subprocess.Popen(
        [sys.executable, str(script), "60"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=lambda: signals.signal(signals.SIGINT, signals.SIG_DFL),
    )  # fmt: skip
    assert proc.stdout.readline() == "ready\n"
    time.sleep(1.0)
    sent = time.time()
    proc.send_signal(getattr(signals, sig))
    stdout, stderr = proc.communicate(timeout=120)
    took = time.time() - sent
    assert proc.returncode == 130 and "finished" not in stdout, (proc.returncode, stdout, stderr[-2000:])
    assert stderr.strip().splitlines()[-1] == "resume with: sera train --resume", stderr[-2000:]
    assert took < 60, took  # 10 s on the watchdog ends it; the margin is for a loaded machine


def test_the_engine_stops_decoding_a_call_nobody_waits_for():
    """A call cut by its deadline (its caller cancelled) leaves the running batch at the next step instead of
    decoding to its token limit: an eval that printed its report kept a core busy for 2 minutes (issue #52)."""
    import asyncio

    from common.policy.base import GenerationRequest, SamplingParams
    from common.policy.hf import HFPolicy

    pol = HFPolicy("tiny", dtype="float32", device="cpu", max_batch_size=8, max_wait_ms=5)

    def req(n: int) -> GenerationRequest:  # no EOS stop: the tiny model decodes to the limit
        return GenerationRequest(messages=[{"role": "user", "content": "go"}],
                                 sampling=SamplingParams(max_new_tokens=n, temperature=0.0, stop=()))  # fmt: skip

    async def main() -> int:
        short = asyncio.ensure_future(pol.generate(req(8)))
        cut = asyncio.ensure_future(pol.generate(req(4000)))
        await short
        cut.cancel()  # what a deadline does to the call
        for _ in range(600):  # the engine's thread ends its batch
            await asyncio.sleep(0.05)
            if not pol.queue._executor._work_queue.qsize() and pol._lock.acquire(blocking=False):
                pol._lock.release()
                break
        return len(short.result().output_ids)

    assert asyncio.run(main()) <= 8
    assert pol.stats["generated_tokens"] < 400, pol.stats  # not 4,000 for the cut call


def test_a_stop_request_ends_the_engines_batch_and_every_call_in_it():
    """Ctrl-C / kill: the engine's thread hands every caller :class:`common.stop.Stopped` at its next step and
    decodes nothing more (the process ends when it says it does)."""
    import asyncio

    from common import stop
    from common.policy.base import GenerationRequest, SamplingParams
    from common.policy.hf import HFPolicy

    pol = HFPolicy("tiny", dtype="float32", device="cpu", max_batch_size=8, max_wait_ms=5)
    long = GenerationRequest(messages=[{"role": "user", "content": "go"}],
                             sampling=SamplingParams(max_new_tokens=4000, temperature=0.0, stop=()))  # fmt: skip

    async def main():
        calls = [asyncio.ensure_future(pol.generate(long)) for _ in range(3)]
        while pol.stats["generated_tokens"] < 30:
            await asyncio.sleep(0.02)
        stop.request()
        stop.acknowledge()  # as the CLI does: nothing is raised into this loop, the calls end on their own
        return await asyncio.gather(*calls, return_exceptions=True)

    try:
        results = asyncio.run(main())
    finally:
        stop.reset()
    assert all(isinstance(r, stop.Stopped) for r in results), results
    assert pol.stats["generated_tokens"] < 400, pol.stats


# ---- 7. what a user reads ----------------------------------------------------------------------------------
def test_curves_draw_a_round_without_an_update_as_a_gap_with_a_legend(tmp_path):
    """curves.png against the round: a round without an optimizer step is no zero loss (a gap in the
    training panels, a hollow marker in the rollout ones), never a vertical line at one step; a legend says
    which marker is which."""
    import math

    from common.run.metrics import NO_UPDATE, curve_points, plot_curves

    rows = [
        {"round": 0, "step": 0, "reward/root_success": 0.5, "loss/cispo": 0.2, "grad_norm": 1.5},
        {"round": 1, "step": 1, "reward/root_success": 0.0, **NO_UPDATE},
        {"round": 2, "step": 1, "reward/root_success": 0.25, "loss/cispo": -0.1, "grad_norm": 0.7},
        {"round": 3, "step": 2, "eval/success": 0.5},  # an evaluation row: in no panel
    ]
    xs, ys, took = curve_points(rows, "loss/cispo")
    assert xs == [0, 1, 2] and ys[0] == 0.2 and math.isnan(ys[1]) and ys[2] == -0.1
    assert took == [True, False, True]
    xs, ys, took = curve_points(rows, "reward/root_success")
    assert xs == [0, 1, 2] and ys == [0.5, 0.0, 0.25] and took == [True, False, True]  # a real 0 success
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    labels = plot_curves(metrics, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert labels[0] == "round with an optimizer step" and labels[1].startswith("round without an update")


def test_a_slow_round_leaves_a_few_heartbeat_lines_in_a_log_not_one_per_beat(capsys):
    """In a log (no terminal) the heartbeat of one long phase prints at 1, 3, 7, 15 ... beats, not every beat
    (37 of the ~50 lines a quick start left were heartbeats); each line still says where the round is."""
    import time

    from common.run.progress import LiveStats, RunProgress

    bar = RunProgress(False, 1, 0, LiveStats(), heartbeat_s=0.2)
    bar.phase("execution rollouts")
    time.sleep(3.0)  # 15 beats: lines due at 0.2, 0.6, 1.4 and 3.0 s
    bar.close()
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[heartbeat]")]
    assert 1 <= len(lines) <= 4, lines
    assert lines[0].startswith("[heartbeat] execution rollouts for ")


def test_train_help_is_shorter_and_its_help_column_wide(tmp_path):
    """``sera train --help`` at 120 columns: each option's first sentence in a help column of 70+ characters
    (it was ~37, squeezed by a long choice list in the type column and a ``--no-x`` column), well under the
    551 lines it had; a flag that is off by default has no ``--no-`` twin; long choice lists open the text."""
    import re

    env = {**ENV, "COLUMNS": "120", "TERMINAL_WIDTH": "120"}
    r = subprocess.run([sys.executable, "-m", "sera", "train", "--help"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) < 360, len(lines)
    starts = [m.start(2) for line in lines if (m := re.match(r"│ (--[][a-z0-9-]+ +\S+ +)(\S)", line))]
    assert starts and 120 - max(starts) >= 70, max(starts)  # where the help text begins
    assert "--no-resume" not in r.stdout and "--no-paper" not in r.stdout
    assert "--[no-]engine-process " in r.stdout  # on by default: its negation on the same line
    assert "rao|rao_d|sera_wo_d_rt|sera_wo_d|sera: Method preset" in r.stdout
