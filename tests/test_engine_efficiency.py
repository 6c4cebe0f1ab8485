"""Trainer efficiency helpers (``level1_batched/efficiency.py``) == level 1's reference log-probs.

On CPU the varlen attention runs its per-datum sdpa fallback, so this pins the packing bookkeeping
(cumulative lengths, kept positions, the grid) and the chunked head, values AND gradients, against
``level1_batched.train.packed_logprobs`` on the seeded tiny model in float32. The CUDA kernel path is
measured on the H200 (bench/bench_train_gpu.py), not in CI.
Run: ``pytest tests/test_engine_efficiency.py``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from common.policy.models import build_tiny_model
from common.rl.datums import Datum
from common.rl.loss import token_logprobs
from level1_batched.efficiency import (
    apply_efficiency,
    chunked_token_logprobs,
    cu_seqlens,
    fast_packed_logprobs,
)


def _datums(vocab: int) -> list[Datum]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (p, o) in enumerate([(5, 7), (3, 2), (9, 11), (4, 1)]):
        seq = torch.randint(0, vocab, (p + o,), generator=g).tolist()
        out.append(Datum(seq[:p], seq[p:], [0.0] * o, [1] * o, 0.5, 0, i, True, "t"))
    return out


def test_cu_seqlens():
    assert cu_seqlens([2, 5], "cpu").tolist() == [0, 2, 7]
    assert cu_seqlens([2, 5], "cpu").dtype == torch.int32


def test_chunked_logprobs_equal_full_logprobs_and_grads():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(10, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (10,), generator=g)
    full = token_logprobs((hidden @ weight.t()).unsqueeze(0), targets.unsqueeze(0))[0]  # [10]
    chunked = chunked_token_logprobs(hidden, weight, targets, chunk=3)  # 4 chunks
    assert torch.allclose(full, chunked, atol=1e-5)
    gh, gw = torch.autograd.grad(full.sum() * 0.7, (hidden, weight))
    ch, cw = torch.autograd.grad(chunked.sum() * 0.7, (hidden, weight))
    assert torch.allclose(gh, ch, atol=1e-5) and torch.allclose(gw, cw, atol=1e-5)


@pytest.mark.parametrize(
    "checkpointing,fraction,compiled",
    [(False, 1.0, False), (True, 1.0, False), (True, 0.5, False), (False, 1.0, True)],
)
def test_fast_packed_logprobs_equal_reference(checkpointing, fraction, compiled):
    from level1_batched.train import packed_logprobs

    ref_model, _ = build_tiny_model(0, num_layers=4)
    fast_model = apply_efficiency(
        copy.deepcopy(ref_model),
        checkpointing=checkpointing,
        checkpoint_fraction=fraction,
        compile_layers=compiled,
    )
    flags = [layer.gradient_checkpointing for layer in fast_model.model.layers]
    assert flags == (
        [False] * 4 if not checkpointing else [True] * 4 if fraction == 1.0 else [True, True, False, False]
    )
    ref_model.train()
    fast_model.train()
    datums = _datums(ref_model.config.vocab_size)
    ref = packed_logprobs(ref_model, datums)  # [D, T_max]
    fast = fast_packed_logprobs(fast_model, datums, chunk=5)  # [D, T_max]
    diff = float((ref - fast).detach().abs().max())
    print(f"max |fast - reference| log-prob: {diff:.2e}")
    assert ref.shape == fast.shape and diff < 1e-4
    w = torch.linspace(-1, 1, ref.numel()).view_as(ref)
    (ref * w).sum().backward()
    (fast * w).sum().backward()
    pairs = list(zip(ref_model.parameters(), fast_model.parameters(), strict=True))
    gdiff = max(float((a.grad - b.grad).abs().max()) for a, b in pairs)
    scale = max(float(a.grad.abs().max()) for a, _ in pairs)
    print(f"max |fast - reference| gradient: {gdiff:.2e} (largest gradient entry {scale:.2e})")
    assert gdiff < 1e-5 * scale  # float32 reassociation only


def test_fast_path_refuses_a_plain_model():
    model, _ = build_tiny_model(0)
    with pytest.raises(ValueError, match="apply_efficiency"):
        fast_packed_logprobs(model, _datums(model.config.vocab_size))


def test_level1_options_of_the_fast_trainer_are_checked():
    from level1_batched.config import Level1Config

    with pytest.raises(ValueError, match="need --fast-trainer"):
        Level1Config(compile_layers=True)
    with pytest.raises(ValueError, match="checkpoint-fraction must be in"):
        Level1Config(engine="vllm", fast_trainer=True, checkpoint_fraction=1.5)
    cfg = Level1Config(engine="vllm", fast_trainer=True, checkpoint_fraction=0.0, compile_layers=True)
    assert cfg.compile_layers and cfg.checkpoint_fraction == 0.0
    # compiled layers: the default of the fast trainer on CUDA only; --no-compile-layers keeps them off there
    assert Level1Config(engine="vllm").resolved(cuda=True).compile_layers is True
    assert Level1Config(engine="vllm").resolved(cuda=False).compile_layers is False
    assert Level1Config(engine="vllm", fast_trainer=False).resolved(cuda=True).compile_layers is False
    assert Level1Config(engine="vllm", compile_layers=False).resolved(cuda=True).compile_layers is False


@pytest.mark.parametrize("stage", ["execution", "delegation", "rubric"])
def test_cuda_default_trainer_equals_the_reference_on_the_fixture(stage, monkeypatch):
    """The trainer level 1 runs on CUDA by default (``Level1Config(engine="vllm").resolved(cuda=True)``: the
    fast path, no activation checkpointing, 32K-token rows, compiled decoder layers) gives level 0's loss and
    gradient on the recorded fixture (the tiny model on CPU stands in, inductor's CPU backend compiles it; the
    varlen kernel and the GPU compile are measured on the H200). The three stages' fixtures have different
    packed lengths, so the compiled layers also meet new shapes as in RL steps."""
    import json
    from dataclasses import replace
    from pathlib import Path

    from common.policy.models import load_model
    from common.run.trainer_memory import GIB, model_shape, plan_trainer
    from level0_single_process.train import accumulate_gradients
    from level1_batched.config import Level1Config
    from level1_batched.efficiency import trainer_budget_gib
    from level1_batched.packing import accumulate_gradients_packed

    cfg = Level1Config(engine="vllm").resolved(cuda=True)
    assert (cfg.fast_trainer, cfg.checkpoint_fraction, cfg.max_tokens_per_microbatch) == (True, None, None)
    assert cfg.compile_layers is True
    fx = json.loads((Path(__file__).parent / "fixtures" / "rl_fixture.json").read_text())["stages"][stage]
    datums, weights = [Datum(**d) for d in fx["datums"]], fx["weights"]
    ref, _ = load_model("tiny", dtype="float32", seed=0)
    # sized as size_trainer sizes it on an 80 GiB card the run has alone (engine at 0.3): rows of 32K, no checkpointing
    n = sum(p.numel() for p in ref.parameters())
    budget = trainer_budget_gib(80.0, 1.0, cfg.gpu_memory_utilization, None, 0.0) * GIB
    plan = plan_trainer(model_shape(ref.config), budget, n, n, dtype_bytes=2)
    cfg = replace(cfg, checkpoint_fraction=plan.checkpoint_fraction, max_tokens_per_microbatch=plan.tokens)
    assert (cfg.checkpoint_fraction, cfg.max_tokens_per_microbatch) == (0.0, 32768)
    fast = apply_efficiency(
        copy.deepcopy(ref), checkpoint_fraction=cfg.checkpoint_fraction, compile_layers=cfg.compile_layers
    )
    m_ref = accumulate_gradients(ref.train(), datums, weights)
    import torch._dynamo as dynamo

    # a failed compile raises here (runs fall back to eager with a warning instead: suppress_errors)
    monkeypatch.setattr(dynamo.config, "suppress_errors", False)
    m_fast = accumulate_gradients_packed(fast.train(), datums, weights, cfg.max_tokens_per_microbatch)
    assert m_fast["train/microbatches"] == 1  # every datum of the step in one packed row
    assert m_fast["loss/cispo"] == pytest.approx(m_ref["loss/cispo"], rel=1e-5, abs=1e-7)
    assert m_ref["loss/cispo"] == pytest.approx(fx["golden"]["loss"], rel=1e-5, abs=1e-7)
    pairs = list(zip(ref.parameters(), fast.parameters(), strict=True))
    gdiff = max(float((a.grad - b.grad).abs().max()) for a, b in pairs)
    scale = max(float(a.grad.abs().max()) for a, _ in pairs)
    assert gdiff < 1e-5 * scale
