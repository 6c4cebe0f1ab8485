"""The optimizer's state on the disk between steps (issue #38.7, `--optimizer-state disk`, the CPU default).

A bf16 model's fp32 masters and AdamW moments are 1.6 GB for SmolLM2-135M, and only a step and a checkpoint
read them; the quick start kept them in RAM through every rollout. Offloaded, they live in one file per
parameter; a step reads, updates and rewrites one parameter at a time. What must hold: the same steps bit for
bit, nothing of them left in RAM between steps, checkpoints that survive the next step (hard links to files
that are replaced, never rewritten), either checkpoint form loading into either optimizer, a damaged file
found on --resume, and a level-0 run that resumes exactly across the two forms.

Run: ``python -m pytest tests/test_optimizer_offload.py -q``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from common.run.checkpoint import RunState, TorchCheckpointer
from common.run.optim import make_optimizer, place_optimizer_state
from common.train_config import OptimConfig


def bf16_model_and_optimizer(offload: Path | None = None):
    from common.policy.models import load_model

    model, _ = load_model("tiny", dtype="bfloat16", seed=0)
    opt = make_optimizer(model, OptimConfig(dtype="bfloat16", lr=1e-3))
    if offload is not None:
        opt.offload(offload)
    return model, opt


def step(model, opt, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)
    return opt.clip_and_step(grad_clip=1.0)


def same_weights(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def masters_and_moments(opt) -> list[torch.Tensor]:
    """Every master and moment of an in-RAM optimizer, in order."""
    out = []
    for m in opt.masters:
        st = opt.inner.state.get(m, {})
        out += [m.detach()] + [st[k] for k in ("exp_avg", "exp_avg_sq") if k in st]
    return out


def digest(directory: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(directory.iterdir())}


def test_offloaded_steps_equal_steps_in_ram_bit_for_bit_and_leave_nothing_in_ram(tmp_path):
    ram_model, ram = bf16_model_and_optimizer()
    disk_model, disk = bf16_model_and_optimizer(tmp_path / "state")
    n_params = sum(m.numel() for m in ram.masters)
    files = sorted((tmp_path / "state").iterdir())
    assert len(files) == len(ram.masters) and sum(f.stat().st_size for f in files) == 4 * n_params  # masters
    for seed in range(3):
        norms = step(ram_model, ram, seed), step(disk_model, disk, seed)
        assert norms[0] == norms[1], seed
        assert same_weights(ram_model, disk_model), seed
        # between steps: one float per master and moment in RAM, gradients freed, the rest in the files
        assert all(m.untyped_storage().nbytes() == 4 and m.grad is None for m in disk.masters)
        assert all(t.untyped_storage().nbytes() == 4 for t in masters_and_moments(disk))
        assert sum(f.stat().st_size for f in (tmp_path / "state").iterdir()) == 3 * 4 * n_params
    # the files hold exactly the in-RAM optimizer's masters and moments
    loaded_model, loaded = bf16_model_and_optimizer()
    loaded.load_state_dict(disk.state_dict(into=tmp_path / "ckpt"), tmp_path / "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(masters_and_moments(ram), masters_and_moments(loaded), strict=True))
    assert same_weights(ram_model, loaded_model)
    disk.close()
    assert not (tmp_path / "state").exists()


def test_a_checkpoint_links_the_files_and_the_next_step_leaves_it_unchanged(tmp_path):
    model, opt = bf16_model_and_optimizer(tmp_path / "run" / "optimizer_state")
    step(model, opt, 0)
    ckpt = TorchCheckpointer(tmp_path / "run", keep=2)
    ckpt.save(RunState(step=1), model, opt, {"lr": 1e-3})
    saved = tmp_path / "run" / "checkpoints" / "step_000001" / "optimizer_state"
    before = digest(saved)
    assert len(before) == len(opt.masters)
    assert all(f.stat().st_nlink == 2 for f in saved.iterdir())  # linked, not copied
    n = sum(p.numel() for p in model.parameters())
    state_pt = (tmp_path / "run" / "checkpoints" / "step_000001" / "state.pt").stat().st_size
    assert 2 * n < state_pt < 2 * n + 200_000  # the bf16 weights; the masters and moments are the files
    step(model, opt, 1)
    assert digest(saved) == before  # the step replaced its working files; the checkpoint's are the old ones
    assert all(f.stat().st_nlink == 1 for f in saved.iterdir())


@pytest.mark.parametrize("saved_from", ["ram", "disk"])
@pytest.mark.parametrize("loaded_into", ["ram", "disk"])
def test_either_checkpoint_form_resumes_either_optimizer_exactly(tmp_path, saved_from, loaded_into):
    ref_model, ref = bf16_model_and_optimizer()
    model, opt = bf16_model_and_optimizer(tmp_path / "a" / "optimizer_state" if saved_from == "disk" else None)
    for seed in range(2):
        step(ref_model, ref, seed), step(model, opt, seed)
    TorchCheckpointer(tmp_path / "a").save(RunState(step=2), model, opt, {"lr": 1e-3})
    model2, opt2 = bf16_model_and_optimizer()
    place_optimizer_state(opt2, loaded_into, tmp_path / "b" / "optimizer_state", "cpu")
    state = TorchCheckpointer(tmp_path / "a").load_latest(model2, opt2, {"lr": 1e-3})
    assert state is not None and state.step == 2
    assert same_weights(ref_model, model2)
    for seed in (2, 3):  # the moments and step counts came back too: the next steps are the same
        assert step(ref_model, ref, seed) == step(model2, opt2, seed)
        assert same_weights(ref_model, model2), seed


def test_a_damaged_optimizer_file_is_named_and_the_checkpoint_before_it_used(tmp_path, capsys):
    model, opt = bf16_model_and_optimizer(tmp_path / "run" / "optimizer_state")
    ckpt = TorchCheckpointer(tmp_path / "run", keep=2)
    for s in (1, 2):
        step(model, opt, s)
        ckpt.save(RunState(step=s), model, opt, {"lr": 1e-3})
    damaged = tmp_path / "run" / "checkpoints" / "step_000002" / "optimizer_state" / "0001.bin"
    damaged.unlink()  # a link of its own (the working file is another name for the old contents)
    damaged.write_bytes(b"\0" * 100)
    model2, opt2 = bf16_model_and_optimizer(tmp_path / "run2" / "optimizer_state")
    state = ckpt.load_latest(model2, opt2, {"lr": 1e-3})
    out = capsys.readouterr().out
    assert "step_000002" in out and "optimizer_state/0001.bin has 100 bytes" in out, out
    assert state is not None and state.step == 1 and "newest intact checkpoint" in out


def test_fp32_weights_have_nothing_to_offload(tmp_path):
    from common.policy.models import load_model

    model, _ = load_model("tiny", dtype="float32", seed=0)
    opt = make_optimizer(model, OptimConfig(lr=1e-3))
    place_optimizer_state(opt, "disk", tmp_path / "state", "cpu")
    assert opt.offload_dir is None and not (tmp_path / "state").exists()
    ram_model, ram = bf16_model_and_optimizer()
    place_optimizer_state(ram, "auto", tmp_path / "gpu", "cuda")  # auto on a GPU: in RAM
    assert ram.offload_dir is None


@pytest.mark.slow
def test_a_level0_run_on_disk_resumes_in_ram_exactly(tmp_path):
    """A bf16 level-0 run (auto on a CPU: the state on the disk) stopped after step 1 and resumed with
    --optimizer-state memory ends where the same run without a stop ends, bit for bit; the working files are
    gone at the end and the checkpoint holds its own."""
    from level0_single_process.train import train
    from tests.test_level0 import REPEATABLE, small_config

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one fixed reduction order for both runs
    try:
        args = dict(schedule="execution:1", tasks_per_step=1, max_new_tokens=12, lr=1e-3, dtype="bfloat16")
        whole = small_config(tmp_path / "whole", "textcraft", steps=2, **args, **REPEATABLE)
        train(whole, progress=False)
        cut = small_config(tmp_path / "cut", "textcraft", steps=1, **args, **REPEATABLE)
        train(cut, progress=False)
        from common.train_config import TrainConfig

        train(TrainConfig.make(cut, steps=2, resume=True, optimizer_state="memory"), progress=False)
    finally:
        torch.set_num_threads(threads)
    for run in (whole, cut):
        out = Path(run.out)
        assert not (out / "optimizer_state").exists()
        assert json.loads((out / "config.json").read_text())["optim"]["dtype"] == "bfloat16"
    a, b = (torch.load(Path(r.out) / "checkpoints/step_000002/state.pt", weights_only=False) for r in (whole, cut))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert "offloaded" in a["optimizer"] and "offloaded" not in b["optimizer"]  # the resumed run kept it in RAM
    assert len(list((Path(whole.out) / "checkpoints/step_000002/optimizer_state").iterdir())) == len(
        b["optimizer"]["masters"]
    )
