"""A run that does not fit its GPU stops with one line naming the setting to lower (issue #54), not a CUDA
out-of-memory traceback.

On a CPU the error is raised where torch raises it (the engine's decoding step, the training step's forward,
the optimizer's creation) and the tests check the line, the exit code and that nothing trained; the
``cuda_*`` tests cap this process's GPU memory (``torch.cuda.set_per_process_memory_fraction``) so that real
CUDA allocations fail, and skip without CUDA.

Run: ``python -m pytest -n 0 tests/test_out_of_memory.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.run.trainer_memory import DoesNotFit, OutOfMemory
from common.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = "needs CUDA (the GPU memory cap is a CUDA allocator setting); the CPU tests simulate the error"


def simulated_oom(*args, **kwargs):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated by the test)")


def tiny_run(tmp_path: Path, **kw) -> TrainConfig:
    """A level-0 run of a few seconds: the test model, one Execution step, short replies."""
    base = dict(
        env="textcraft", model="tiny", out=str(tmp_path / "run"), steps=1, schedule="execution:1",
        tasks_per_step=1, rollouts_per_task=2, max_new_tokens=12, rubric_max_new_tokens=12,
        score_max_new_tokens=12, max_steps=2, n_tasks=8, oracle_mix=0.0,
    )  # fmt: skip
    return TrainConfig.make(**{**base, **kw})


def test_the_engine_running_out_of_memory_stops_the_run_in_one_line(tmp_path, monkeypatch):
    """Out of memory in a decoding step: every caller of that batch gets the error, every later call fails at
    once with it (no agent waits on a model that cannot decode), and the round stops the run before training
    with the line naming --max-batch-size, --rollouts-per-task and --max-new-tokens."""
    from common.policy.hf import HFPolicy
    from level0_single_process.train import train

    steps = []

    def step(self, batch, feed):
        steps.append(len(batch.rows))
        simulated_oom()

    monkeypatch.setattr(HFPolicy, "_step", step)
    cfg = tiny_run(tmp_path)
    with pytest.raises(OutOfMemory) as info:
        train(cfg, progress=False)
    line = str(info.value)
    assert "\n" not in line and line.startswith("CUDA out of memory while generating (")
    assert f"{steps[0]} model calls decoding together" in line
    for setting in ("--max-batch-size (32", "--rollouts-per-task (2)", "--max-new-tokens (12)"):
        assert setting in line, line
    assert len(steps) == 1  # the first step failed; every later call got the same error without decoding
    out = Path(cfg.out)
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()  # nothing trained


def test_a_training_step_out_of_memory_says_what_to_lower(monkeypatch):
    """Out of memory in the step's forward or backward: the gradients so far go, and the line names the datum
    length (--max-prompt-tokens, --max-new-tokens) and LoRA (what makes the optimizer state ~1% of the model's)."""
    import level0_single_process.train as level0
    from common.policy.models import load_model
    from common.rl.batch import StageBatch
    from common.rl.datums import Datum
    from common.run.optim import make_optimizer

    st = json.loads((ROOT / "tests/fixtures/rl_fixture.json").read_text())["stages"]["execution"]
    batch = StageBatch("execution", [Datum(**d) for d in st["datums"]], list(st["weights"]))
    cfg = TrainConfig.make(model="tiny")
    model, _ = load_model("tiny", dtype="float32")
    opt = make_optimizer(model, cfg.optim)
    calls = []

    def forward_then_oom(model, datum):
        calls.append(1)
        if len(calls) == 2:
            simulated_oom()
        return level0.token_logprobs(model(input_ids=torch.tensor([datum.prompt_ids + datum.output_ids])).logits[:, -len(datum.output_ids) - 1 : -1], torch.tensor([datum.output_ids]))  # fmt: skip

    monkeypatch.setattr(level0, "datum_logprobs", forward_then_oom)
    with pytest.raises(OutOfMemory) as info:
        level0.train_on_batch(model, opt, batch, cfg)
    line = str(info.value)
    longest = max(len(d.prompt_ids) + len(d.output_ids) for d in batch.with_gradient()[0])
    assert line.startswith(f"CUDA out of memory in the training step (datums of up to {longest} tokens)")
    assert "--max-prompt-tokens (2048)" in line and "--max-new-tokens (256)" in line and "--lora-rank 8" in line
    assert all(p.grad is None for p in model.parameters()) and not model.training  # nothing half-summed kept
    lora = TrainConfig.make(model="tiny", lora_rank=4)
    assert "--lora-rank" not in str(level0.training_oom(lora, 10, "cpu"))  # a LoRA run is told the lengths only


def test_sera_train_prints_the_line_and_exits_2(tmp_path, monkeypatch):
    """What a user sees: ``sera train`` ends with the one ``error:`` line and exit code 2 (bad settings for
    this card), no traceback; a set-up that cannot hold the optimizer state names LoRA."""
    from typer.testing import CliRunner

    import level0_single_process.train as level0
    from common.policy.hf import HFPolicy
    from sera.cli import app

    args = ["train", "--model", "tiny", "--steps", "1", "--max-new-tokens", "12", "--rubric-max-new-tokens", "12",
            "--score-max-new-tokens", "12", "--max-steps", "2", "--tasks-per-step", "1", "--n-tasks", "8"]  # fmt: skip
    monkeypatch.setattr(HFPolicy, "_step", simulated_oom)
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "a")], prog_name="sera")
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, (r.exit_code, r.stderr[-3000:], r.stdout[-2000:])
    assert lines[0].startswith("error: CUDA out of memory while generating") and "--max-batch-size" in lines[0]
    assert "Traceback" not in r.stdout + r.stderr
    monkeypatch.undo()
    monkeypatch.setattr(level0, "make_optimizer", simulated_oom)
    r = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "b")], prog_name="sera")
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1, (r.exit_code, r.stderr[-3000:])
    assert "loading the model and its optimizer state" in lines[0] and "--lora-rank 8" in lines[0]


def test_a_cuda_device_without_an_index_names_the_current_card():
    """``"cuda"`` -> the current card (torch 2.11's ``get_per_process_memory_fraction`` refuses it: on 2026-12-07
    every CUDA run stopped there), ``"cuda:1"`` -> 1; on a GPU the budget of plain ``"cuda"`` is the card's."""
    from common.memory import cuda_index, gpu_budget_gib

    assert cuda_index("cuda:1") == 1 and cuda_index(torch.device("cuda", 0)) == 0
    assert gpu_budget_gib("cpu") == 0.0
    if torch.cuda.is_available():
        assert cuda_index("cuda") == torch.cuda.current_device()
        total = torch.cuda.get_device_properties(0).total_memory / 2**30
        assert 0 < gpu_budget_gib("cuda") <= total + 1e-6


def test_weights_and_optimizer_state_over_the_card_are_refused_before_they_are_made(monkeypatch):
    """The planner's arithmetic (``static_bytes``: weights, and per trainable weight its gradient, fp32 master
    and AdamW moments; plus the CUDA context) against what the process may use: over it, one line at once."""
    import common.run.trainer_memory as tm
    from common.policy.models import load_model

    model, _ = load_model("tiny", dtype="float32")
    cfg = TrainConfig.make(model="tiny")
    tm.check_weights_fit(model, cfg, "cpu")  # off CUDA: nothing to check
    n = sum(p.numel() for p in model.parameters())
    need = (tm.FIXED_OVERHEAD + tm.static_bytes(n, n, 4)) / tm.GIB
    monkeypatch.setattr(tm, "gpu_budget_gib", lambda device: need + 0.01)
    tm.check_weights_fit(model, cfg, "cuda")  # fits
    monkeypatch.setattr(tm, "gpu_budget_gib", lambda device: need - 0.01)
    with pytest.raises(DoesNotFit, match=rf"need ~{need:.1f} GiB, more than the .* GiB .*--lora-rank 8"):
        tm.check_weights_fit(model, cfg, "cuda")


# ---------------------------------------------------------------------------------------------------------
# On a GPU: real CUDA allocations under a cap.
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture
def capped():
    """``cap(extra_bytes)``: this process may hold what it holds now plus ``extra_bytes`` on GPU 0; lifted after."""
    if not torch.cuda.is_available():
        pytest.skip(NO_CUDA)
    total = torch.cuda.get_device_properties(0).total_memory

    def cap(extra: int) -> None:
        torch.cuda.set_per_process_memory_fraction(min(1.0, (torch.cuda.memory_reserved(0) + extra) / total), 0)

    yield cap
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    torch.cuda.empty_cache()


def test_cuda_engine_out_of_memory_under_a_cap(capped):
    """A prefill that cannot fit the cap: every caller gets the engine's line, and so does the next call."""
    from common.policy.base import GenerationRequest, SamplingParams
    from common.policy.hf import EngineOutOfMemory, HFPolicy

    policy = HFPolicy("tiny", dtype="float32", device="cuda", max_batch_size=16)
    long = "word " * 3000
    reqs = [GenerationRequest([{"role": "user", "content": f"{i} {long}"}], SamplingParams(64)) for i in range(16)]
    policy.generate_batch(reqs[:1])  # works uncapped
    capped(8 << 20)
    with pytest.raises(EngineOutOfMemory, match="CUDA out of memory while decoding 16 model calls together"):
        policy.generate_batch(reqs)
    with pytest.raises(EngineOutOfMemory):
        policy.generate_batch(reqs[:1])  # sticky: the run stops on it


def test_cuda_training_step_out_of_memory_under_a_cap(capped):
    import level0_single_process.train as level0
    from common.policy.models import load_model
    from common.rl.batch import StageBatch
    from common.rl.datums import Datum
    from common.run.optim import make_optimizer

    st = json.loads((ROOT / "tests/fixtures/rl_fixture.json").read_text())["stages"]["execution"]
    batch = StageBatch("execution", [Datum(**d) for d in st["datums"]], list(st["weights"]))
    cfg = TrainConfig.make(model="tiny")
    model, _ = load_model("tiny", dtype="float32", device="cuda")
    opt = make_optimizer(model, cfg.optim)
    capped(1 << 20)
    with pytest.raises(OutOfMemory, match=r"CUDA out of memory in the training step .*held .* GiB of the"):
        level0.train_on_batch(model, opt, batch, cfg)


def test_cuda_capped_sera_train_says_so_in_one_line(tmp_path):
    """``sera train`` in a process capped below what its weights and optimizer state need: one line, exit 2."""
    if not torch.cuda.is_available():
        pytest.skip(NO_CUDA)
    total = torch.cuda.get_device_properties(0).total_memory
    code = (
        "import sys, torch; torch.cuda.set_per_process_memory_fraction({!r}); "
        "sys.argv = ['sera', 'train', '--model', 'tiny', '--steps', '1', '--out', {!r}]; "
        "from sera.cli import app; app()"
    ).format((256 << 20) / total, str(tmp_path / "run"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "GiB" in errors[0] and ("--lora-rank" in errors[0] or "--max-" in errors[0]), errors[0]
