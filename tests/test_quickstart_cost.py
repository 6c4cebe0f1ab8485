"""What the quick start costs (issue #38.7): level 0's training keeps little beside its weights and optimizer
state, checkpoints keep only the newest N, and the same gradients and steps come out.

The quick start peaked at 7.1 GB RSS: one ~2K-token datum's activations (1-2 GB) and a full set of model
gradients sat beside the fp32 master weights and AdamW moments, and what the rollouts freed on the engine's
thread stayed in that thread's malloc arena. Now: activation checkpointing, gradients moved onto the masters
during the backward pass, one master stepped (and its gradient freed) at a time, ``malloc_trim`` between the
phases (bench/RESULTS.md, "The quick start's cost"). Each piece is checked here for what it must not change.

Run: ``python -m pytest tests/test_quickstart_cost.py -q``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def fixture_datums(n: int = 2, prompt_tail: int = 256):
    """``n`` Execution datums of the recorded fixture (prompt cut to its last ``prompt_tail`` tokens)."""
    from common.rl.datums import Datum

    fx = json.loads((ROOT / "tests/fixtures/rl_fixture.json").read_text())["stages"]["execution"]
    datums = [Datum(**{**d, "prompt_ids": d["prompt_ids"][-prompt_tail:]}) for d in fx["datums"]]
    picked = [i for i, d in enumerate(datums) if d.advantage != 0][:n]
    return [datums[i] for i in picked], [fx["weights"][i] for i in picked]


def model_and_optimizer(dtype: str, lean: bool):
    from common.policy.models import load_model
    from common.run.optim import make_optimizer
    from common.train_config import OptimConfig
    from level0_single_process.train import lean_training

    model, _ = load_model("tiny", dtype=dtype, seed=0)
    opt = make_optimizer(model, OptimConfig(dtype=dtype, lr=1e-3))
    if lean:
        lean_training(model, opt)
    return model, opt


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lean_training_gives_the_same_gradients_and_step(dtype):
    """Activation checkpointing + gradients moved in the backward pass: the fp32 master gradients of a batch,
    the gradient norm and the weights after the step are bit-identical to the plain path."""
    from level0_single_process.train import accumulate_gradients

    datums, weights = fixture_datums()
    results = {}
    for lean in (False, True):
        model, opt = model_and_optimizer(dtype, lean)
        model.train()
        opt.zero_grad()
        m = accumulate_gradients(model, datums, weights, opt)
        grads = [g.grad.clone() for g in opt.masters]
        assert all(p.grad is None for p in model.parameters()) or dtype == "float32"
        norm = opt.clip_and_step(1.0)
        results[lean] = (m["loss/cispo"], grads, norm, [p.detach().clone() for p in model.parameters()])
        assert all(g.grad is None for g in opt.masters)  # freed after the step, not kept into the rollouts
        assert all(p.grad is None for p in model.parameters())
    (loss0, g0, n0, w0), (loss1, g1, n1, w1) = results[False], results[True]
    assert loss0 == loss1 and n0 == n1 and n0 > 0
    assert all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(w0, w1, strict=True))


def saved_bytes(model, datum) -> int:
    """Bytes the autograd graph of one datum's log-probs keeps for the backward pass (what the activations
    cost; counted by storage, so views of one tensor count once)."""
    from level0_single_process.train import datum_logprobs

    seen: dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor):
        s = t.untyped_storage()
        if s.data_ptr() not in weights:  # a parameter or a view of one (the head's W^T) is no activation
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp = datum_logprobs(model, datum)
    lp.sum().backward()
    return sum(seen.values())


def test_activation_checkpointing_keeps_a_fraction_of_the_activations():
    """A deeper random-init model (8 layers of width 256: the layers, not the LM head, dominate, as in
    SmolLM2's 30) on a datum of 1,024 prompt and 16 output tokens (few outputs: the LM head's [T, V] logits are
    kept either way): the lean path keeps < 1/4 of the bytes the plain one keeps for the backward pass (each
    layer's input instead of every intermediate)."""
    from types import SimpleNamespace

    from common.policy.models import build_tiny_model
    from common.run.optim import make_optimizer
    from common.train_config import OptimConfig
    from level0_single_process.train import lean_training

    (full,), _ = fixture_datums(1, prompt_tail=1024)
    datum = SimpleNamespace(prompt_ids=full.prompt_ids, output_ids=full.output_ids[:16])
    kept = {}
    for lean in (False, True):
        model, _ = build_tiny_model(0, num_layers=8, hidden_size=256)
        if lean:
            lean_training(model, make_optimizer(model, OptimConfig()))
        kept[lean] = saved_bytes(model.train(), datum)
    plain, lean = kept[False], kept[True]
    print(f"kept for the backward pass: plain {plain / 2**20:.1f} MiB, lean {lean / 2**20:.1f} MiB")
    assert lean < plain / 4


def test_generation_is_not_checkpointed():
    """Checkpointing acts in train() only: the same model generates (eval) with its KV cache as before."""
    from common.policy.base import GenerationRequest, SamplingParams
    from common.policy.hf import HFPolicy
    from common.policy.models import load_tokenizer

    model, _ = model_and_optimizer("float32", lean=True)
    policy = HFPolicy(model.eval(), load_tokenizer("tiny"), dtype="float32", device="cpu")
    req = GenerationRequest(messages=[{"role": "user", "content": "hi"}], sampling=SamplingParams(8, 0.0))
    lean = policy.generate_batch([req])[0]
    plain_model, _ = model_and_optimizer("float32", lean=False)
    plain = HFPolicy(plain_model.eval(), load_tokenizer("tiny"), dtype="float32", device="cpu")
    assert lean.output_ids == plain.generate_batch([req])[0].output_ids
    assert lean.logprobs == plain.generate_batch([req])[0].logprobs


def test_release_memory_trims_the_c_heap_on_linux():
    """glibc (Linux): malloc_trim runs; elsewhere a no-op that says so."""
    from common.memory import peak_rss_gb, release_memory

    assert release_memory() is (os.uname().sysname == "Linux")
    assert 0.05 < peak_rss_gb() < 64


# ---- checkpoints: only the newest N ------------------------------------------------------------------------
def save_steps(out: Path, keep: int, steps: int):
    from common.run.checkpoint import RunState, TorchCheckpointer

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = TorchCheckpointer(out, keep=keep)
    for step in range(1, steps + 1):
        ckpt.save(RunState(round=step, step=step, cursor=step), model, opt, {"lr": 1e-3})
    return ckpt, model, opt


@pytest.mark.parametrize("keep,left", [(1, [3]), (2, [2, 3]), (0, [1, 2, 3])])
def test_only_the_newest_checkpoints_are_kept(tmp_path, keep, left):
    save_steps(tmp_path, keep, 3)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == [f"step_{s:06d}" for s in left]  # no temp directory left either


def test_the_default_keeps_one_checkpoint(tmp_path):
    from common.run.checkpoint import TorchCheckpointer
    from common.train_config import TrainConfig

    assert TrainConfig().keep_checkpoints == 1 and TorchCheckpointer(tmp_path).keep == 1
    with pytest.raises(ValueError, match="keep must be >= 0"):
        TorchCheckpointer(tmp_path, keep=-1)


def test_the_older_checkpoint_goes_only_after_the_newer_is_written(tmp_path, monkeypatch):
    """keep=1: a crash while step 2 is written leaves step 1 whole (and the run resumes from it)."""
    from common.run.checkpoint import RunState

    ckpt, model, opt = save_steps(tmp_path, 1, 1)
    real_save = torch.save

    def crash(obj, path):
        real_save(obj, path)
        os.truncate(path, os.path.getsize(path) // 2)
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(RunState(round=2, step=2, cursor=2), model, opt, {"lr": 1e-3})
    monkeypatch.setattr(torch, "save", real_save)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000001"]
    assert ckpt.load_latest(model, opt, {"lr": 1e-3}).step == 1


def test_resume_may_change_how_many_checkpoints_are_kept():
    from common.run.checkpoint import config_differences

    assert config_differences({"lr": 1e-3, "keep_checkpoints": 1}, {"lr": 1e-3, "keep_checkpoints": 3}) == []
    assert config_differences({"lr": 1e-3}, {"lr": 1e-3, "keep_checkpoints": 1}) == []  # a run from before it


def test_a_level0_run_keeps_one_checkpoint_and_resumes_from_it(tmp_path, capsys):
    """Two steps of the test model with the quick start's schedule: one checkpoint left (step 2), and the run
    says (first and last) that its steps were Execution-stage steps only and where all three stages train;
    --resume with --steps 3 continues it."""
    from common.train_config import TrainConfig
    from level0_single_process.train import train

    flat = dict(model="tiny", out=str(tmp_path / "run"), max_steps=2, max_new_tokens=8,
                oracle_mix=0.7, difficulty="medium", n_tasks=8, max_task_replacements=3, max_idle_rounds=6,
                max_batch_size=1)  # fmt: skip
    train(TrainConfig.make(steps=2, **flat), progress=False)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_000002"]
    lines = capsys.readouterr().out.splitlines()
    note = [i for i, line in enumerate(lines) if "Execution-stage steps only" in line]
    assert len(note) == 2 and lines[note[0] - 1].startswith("[level0]"), lines
    assert note[1] == len(lines) - 2 and lines[-1].startswith("done: 2 optimizer steps")  # beside the outputs
    assert "steps 0-1 are Execution-stage steps only" in lines[note[1]]
    assert "tutorials/06_level0_training.py" in lines[note[1]] and (ROOT / "tutorials/06_level0_training.py").is_file()
    train(TrainConfig.make(steps=3, resume=True, keep_checkpoints=2, **flat), progress=False)
    left = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert left == ["step_000002", "step_000003"]
