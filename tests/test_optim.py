"""Mixed precision that trains (issue #11.1): bf16 compute with fp32 master weights in the optimizer.

At the paper's lr 3e-6 an in-place bf16 AdamW update rounds away; the master copy must move everywhere,
and a short bf16 run must follow the fp32 run's direction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from common.run.optim import MasterWeightAdamW, make_optimizer
from common.train_config import OptimConfig

ROOT = Path(__file__).resolve().parents[1]


def tiny(dtype: str):
    from common.policy.models import load_model

    model, _ = load_model("tiny", dtype=dtype, seed=0)
    return model


def fake_grads(model, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)


def test_one_bf16_step_at_paper_lr_moves_every_master_weight():
    model = tiny("bfloat16")
    opt = make_optimizer(model, OptimConfig(dtype="bfloat16"))
    assert opt.low_precision and all(m.dtype == torch.float32 for m in opt.masters)
    before = [m.detach().clone() for m in opt.masters]
    fake_grads(model)
    opt.clip_and_step(grad_clip=1e9)
    changed = [bool((m != b).all()) for m, b in zip(opt.masters, before, strict=True)]
    print(f"master tensors with every element changed: {sum(changed)}/{len(changed)}")
    assert all(changed)


def test_pure_bf16_adamw_rounds_the_update_away():
    """The failure the masters fix: plain AdamW on bf16 parameters leaves most weights unchanged."""
    model = tiny("bfloat16")
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-6, weight_decay=0.017, betas=(0.9, 0.95))
    fake_grads(model)
    opt.step()
    moved = sum(int((p != b).sum()) for p, b in zip(model.parameters(), before, strict=True))
    total = sum(p.numel() for p in model.parameters())
    print(f"pure bf16: {moved / total:.2%} of the weights changed")
    assert moved / total < 0.2


def test_fp32_masters_are_the_parameters():
    model = tiny("float32")
    opt = make_optimizer(model, OptimConfig())
    assert not opt.low_precision and opt.masters[0] is next(model.parameters())


PROMPT_TAIL = 128
"""Prompt tokens kept per fixture datum in the bf16-vs-fp32 run (see :func:`_per_datum_change`)."""


def _per_datum_change(dtype: str, steps: int = 3, lr: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """Train the tiny model on the fixture's Execution datums; return how each datum's mean log-prob moved
    (measured in fp32) and the advantages. Weight space is the wrong place to compare: Adam's sign-like
    step moves noise-dominated coordinates either way; what training must preserve is the policy change.

    Each datum keeps the last ``PROMPT_TAIL`` tokens of its prompt (the trained outputs whole): bf16 on a CPU
    is slow and the full ~1,000-token prompts took 194 s on CI; the gap between the runs is the same (measured,
    all 6 datums, 3 steps: cosine 0.999993 / gain ratio 0.900 with the full prompts, 0.999981 / 0.912 with
    128 prompt tokens)."""
    from common.policy.models import load_model
    from common.rl.datums import Datum
    from level0_single_process.train import accumulate_gradients, datum_logprobs

    fx = json.loads((ROOT / "tests/fixtures/rl_fixture.json").read_text())["stages"]["execution"]
    datums = [Datum(**{**d, "prompt_ids": d["prompt_ids"][-PROMPT_TAIL:]}) for d in fx["datums"]]

    def mean_logps(model) -> torch.Tensor:  # [D], in fp32
        m32, _ = load_model("tiny", dtype="float32", seed=0)
        m32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        with torch.no_grad():
            return torch.tensor(
                [
                    float((datum_logprobs(m32, d)[0] * torch.tensor(d.loss_mask)).sum() / sum(d.loss_mask))
                    for d in datums
                ]
            )

    model = tiny(dtype)
    before = mean_logps(model)
    opt = MasterWeightAdamW(list(model.parameters()), OptimConfig(lr=lr, dtype=dtype))
    for _ in range(steps):
        model.train()
        opt.zero_grad()
        accumulate_gradients(model, datums, fx["weights"])
        opt.clip_and_step(1.0)
    return mean_logps(model) - before, torch.tensor([d.advantage for d in datums])


@pytest.mark.slow
def test_a_short_bf16_run_tracks_the_fp32_run():
    d32, adv = _per_datum_change("float32")
    d16, _ = _per_datum_change("bfloat16")
    cos = float(torch.nn.functional.cosine_similarity(d32, d16, dim=0))
    j32, j16 = float((adv * d32).mean()), float((adv * d16).mean())
    print(f"per-datum log-prob change, bf16 vs fp32: cosine {cos:.6f}; objective gain {j16:.4f} vs {j32:.4f}")
    assert j32 > 0  # the update improves the objective at all
    assert cos > 0.99 and 0.8 < j16 / j32 < 1.25


def test_state_dict_round_trip_restores_masters():
    model = tiny("bfloat16")
    opt = make_optimizer(model, OptimConfig(dtype="bfloat16"))
    fake_grads(model)
    opt.clip_and_step(1.0)
    state = opt.state_dict()
    model2 = tiny("bfloat16")
    opt2 = make_optimizer(model2, OptimConfig(dtype="bfloat16"))
    opt2.load_state_dict(state)
    assert all(torch.equal(x, y) for x, y in zip(opt.masters, opt2.masters, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(model.parameters(), model2.parameters(), strict=True))


# ---- AdamW itself, the clip and the fp32 reduction (issue #20 item 11: surviving mutants) -------------
def _linear(dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)).to(dtype)


def _grads(model, step: int, scale: float = 1.0) -> list[torch.Tensor]:
    """Deterministic fp32 gradients of step ``step`` (one per parameter)."""
    g = torch.Generator().manual_seed(1000 + step)
    return [scale * torch.randn(p.shape, generator=g) for p in model.parameters()]


def _reference(model) -> tuple[list[torch.Tensor], torch.optim.AdamW]:
    """fp32 copies of the parameters under torch's AdamW with the paper's settings, written out."""
    ref = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    return ref, torch.optim.AdamW(ref, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.017)


PAPER_LIKE = OptimConfig(lr=1e-3)  # the paper's betas (0.9, 0.95) and weight decay 0.017; a visible lr


def test_fp32_step_is_torch_adamw_with_the_paper_betas_exactly():
    model = _linear(torch.float32)
    opt = MasterWeightAdamW(list(model.parameters()), PAPER_LIKE)
    ref, ref_opt = _reference(model)
    for step in range(4):
        opt.zero_grad()
        ref_opt.zero_grad()
        for p, r, g in zip(model.parameters(), ref, _grads(model, step), strict=True):
            p.grad, r.grad = g.clone(), g.clone()
        norm = opt.clip_and_step(grad_clip=1.0)
        ref_norm = float(torch.nn.utils.clip_grad_norm_(ref, 1.0))
        ref_opt.step()
        assert norm == ref_norm
        assert all(torch.equal(p, r) for p, r in zip(model.parameters(), ref, strict=True)), step


def test_bf16_masters_are_fp32_adamw_on_the_same_grads():
    """bf16 model + fp32 masters: the masters follow torch's fp32 AdamW fed the same (bf16) gradients
    bit for bit, and the model holds the masters rounded to bf16."""
    model = _linear(torch.bfloat16)
    opt = MasterWeightAdamW(list(model.parameters()), PAPER_LIKE)
    ref, ref_opt = _reference(model)
    for step in range(4):
        opt.zero_grad()
        ref_opt.zero_grad()
        for p, r, g in zip(model.parameters(), ref, _grads(model, step, scale=0.3), strict=True):
            p.grad = g.to(torch.bfloat16)
            r.grad = p.grad.float().clone()  # never an alias (fp32: .float() is the same tensor)
        norm = opt.clip_and_step(grad_clip=1.0)
        ref_norm = float(torch.nn.utils.clip_grad_norm_(ref, 1.0))
        ref_opt.step()
        assert norm == ref_norm
        assert all(torch.equal(m, r) for m, r in zip(opt.masters, ref, strict=True)), step
        assert all(torch.equal(p, r.to(torch.bfloat16)) for p, r in zip(model.parameters(), ref, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_gradient_spike_is_clipped_on_the_fp32_masters(dtype):
    """A spike (norm ~1e4) between normal steps: clipped to norm 1 on the fp32 master gradients, so Adam's
    second moment is not blown up and the later steps match torch's AdamW after an fp32 clip exactly.
    Clipping the bf16 model gradients instead (in place, before or after they reach the masters) fails."""
    model = _linear(dtype)
    opt = MasterWeightAdamW(list(model.parameters()), PAPER_LIKE)
    ref, ref_opt = _reference(model)
    for step, scale in enumerate([0.1, 1e4, 0.1, 0.1]):
        opt.zero_grad()
        ref_opt.zero_grad()
        for p, r, g in zip(model.parameters(), ref, _grads(model, step, scale), strict=True):
            p.grad = g.to(dtype)
            r.grad = p.grad.float().clone()  # never an alias (fp32: .float() is the same tensor)
        norm = opt.clip_and_step(grad_clip=1.0)
        ref_norm = float(torch.nn.utils.clip_grad_norm_(ref, 1.0))
        ref_opt.step()
        assert norm == ref_norm, step
        assert (norm > 1e3) == (scale > 1)  # the spike's pre-clip norm is reported
        masters = opt.masters if opt.low_precision else list(model.parameters())
        assert all(torch.equal(m, r) for m, r in zip(masters, ref, strict=True)), step


def test_level0_sums_bf16_datum_gradients_in_fp32():
    """Level 0 with a bf16 model: the step's gradient on the fp32 masters equals the fp32 sum of the
    per-datum bf16 gradients exactly (a running sum in bf16 is about 1 % off)."""
    from common.rl.datums import Datum
    from level0_single_process.train import accumulate_gradients

    g = torch.Generator().manual_seed(0)
    datums = [  # short synthetic datums (bf16 on a CPU is slow): 8 prompt, 6 output tokens
        Datum(
            prompt_ids=torch.randint(5, 200, (8,), generator=g).tolist(),
            output_ids=torch.randint(5, 200, (6,), generator=g).tolist(),
            behaviour_logprobs=[-5.0] * 6,
            loss_mask=[1] * 6,
            advantage=(-1.0) ** k * (0.25 + 0.1 * k),
            depth=0,
            trajectory_id=f"t{k}",
            traj_start=True,
            stage="execution",
        )
        for k in range(6)
    ]
    weights = [1.0] * len(datums)
    model = tiny("bfloat16")

    class Recorder:  # takes each datum's bf16 gradient off the model, as the optimizer would
        def __init__(self):
            self.parts: list[list[torch.Tensor | None]] = []

        def accumulate_model_grads(self):
            self.parts.append([None if p.grad is None else p.grad.float() for p in model.parameters()])
            model.zero_grad(set_to_none=True)

    rec = Recorder()
    accumulate_gradients(model, datums, weights, optimizer=rec)
    assert len(rec.parts) == len(datums)
    reference = []  # the fp32 sum, datum by datum
    for grads in zip(*rec.parts, strict=True):
        acc = None
        for g in grads:
            if g is not None:
                acc = g.clone() if acc is None else acc + g
        reference.append(acc)
    opt = make_optimizer(model, OptimConfig(dtype="bfloat16"))
    accumulate_gradients(model, datums, weights, optimizer=opt)
    assert all(p.grad is None for p in model.parameters())  # moved onto the fp32 masters
    pairs = [(m.grad, r) for m, r in zip(opt.masters, reference, strict=True) if r is not None]
    assert pairs and all(torch.equal(g, r) for g, r in pairs)
    model.zero_grad(set_to_none=True)
    accumulate_gradients(model, datums, weights)  # without the optimizer: a running sum in bf16
    bf16_off = max(
        float((p.grad.float() - r).norm() / r.norm())
        for p, r in zip(model.parameters(), reference, strict=True)
        if r is not None and r.norm() > 0
    )
    print(f"a bf16 running sum is {bf16_off:.2%} off the fp32 sum (worst tensor)")
    assert bf16_off > 1e-3
