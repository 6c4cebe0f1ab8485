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


def _per_datum_change(dtype: str, steps: int = 3, lr: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """Train the tiny model on the fixture's Execution datums; return how each datum's mean log-prob moved
    (measured in fp32) and the advantages. Weight space is the wrong place to compare: Adam's sign-like
    step moves noise-dominated coordinates either way; what training must preserve is the policy change."""
    from common.policy.models import load_model
    from common.rl.datums import Datum
    from level0_single_process.train import accumulate_gradients, datum_logprobs

    fx = json.loads((ROOT / "tests/fixtures/rl_fixture.json").read_text())["stages"]["execution"]
    datums = [Datum(**d) for d in fx["datums"]]

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
