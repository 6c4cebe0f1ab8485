"""CISPO loss and token log-probs (common/rl/loss.py) vs a naive per-token loop with autograd.

Run: pytest tests/test_rl_loss.py
"""

from __future__ import annotations

import math

import pytest
import torch

from common.rl.loss import cispo_loss, token_logprobs


def naive_cispo(logp, behaviour, adv, mask, clip_max=5.0, weights=None, num_tokens=None):
    """L = -(1/|M|) sum_{t in M} sg(clip(rho_t, 0, clip_max)) * w * A * logp_t, one token at a time."""
    terms = []
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[b, t] == 0:
                continue
            rho = math.exp(logp[b, t].item() - behaviour[b, t].item())
            a = adv[b].item() if adv.dim() == 1 else adv[b, t].item()
            w = 1.0 if weights is None else weights[b].item()
            terms.append(-min(max(rho, 0.0), clip_max) * w * a * logp[b, t])
    denom = num_tokens if num_tokens is not None else max(len(terms), 1)
    return sum(terms) / denom


def random_batch(seed, B=3, T=7):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_(True)
    behaviour = logp.detach() + torch.randn(B, T, generator=g) * 1.0  # some ratios clip above 5
    adv = torch.randn(B, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    return logp, behaviour, adv, mask


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("use_weights", [False, True])
def test_cispo_loss_and_grad_match_naive(seed, per_token_adv, use_weights):
    logp, behaviour, adv, mask = random_batch(seed)
    if per_token_adv:
        adv = adv[:, None] + torch.randn(logp.shape, generator=torch.Generator().manual_seed(seed + 100))
    weights = torch.tensor([0.5, 1.0, 2.0]) if use_weights else None

    loss, metrics = cispo_loss(logp, behaviour, adv, mask, weights=weights)
    (grad,) = torch.autograd.grad(loss, logp)

    logp_ref = logp.detach().clone().requires_grad_(True)
    ref = naive_cispo(logp_ref, behaviour, adv, mask, weights=weights)
    (grad_ref,) = torch.autograd.grad(ref, logp_ref)

    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-5, atol=1e-6)
    assert (grad[mask == 0] == 0).all()  # untrained tokens get no gradient

    ratio = torch.exp(logp.detach() - behaviour)[mask.bool()]
    assert metrics["loss/clip_frac"] == pytest.approx((ratio > 5.0).float().mean().item())
    assert metrics["loss/ratio_mean"] == pytest.approx(ratio.mean().item(), rel=1e-5)
    assert metrics["loss/tokens"] == mask.sum().item()


def test_clipped_tokens_keep_their_gradient():
    # CISPO (unlike PPO) still trains a token whose ratio is clipped: gradient = -(1/|M|) * 5 * A
    logp = torch.tensor([[-1.0]], requires_grad=True)
    loss, metrics = cispo_loss(logp, torch.tensor([[-5.0]]), torch.tensor([2.0]), torch.ones(1, 1))
    loss.backward()
    assert metrics["loss/clip_frac"] == 1.0
    assert logp.grad.item() == pytest.approx(-5.0 * 2.0)


def test_num_tokens_makes_microbatches_add_up():
    logp, behaviour, adv, mask = random_batch(7, B=4)
    full, _ = cispo_loss(logp, behaviour, adv, mask)
    n = mask.sum().item()
    halves = sum(
        cispo_loss(logp[s], behaviour[s], adv[s], mask[s], num_tokens=n)[0]
        for s in (slice(0, 2), slice(2, 4))
    )
    torch.testing.assert_close(full, halves)


def test_padding_with_inf_logprobs_is_ignored():
    logp = torch.tensor([[-1.0, -2.0, 0.0]], requires_grad=True)
    behaviour = torch.tensor([[-1.0, -2.0, float("-inf")]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = cispo_loss(logp, behaviour, torch.tensor([1.0]), mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert loss.item() == pytest.approx(1.5) and metrics["loss/ratio_mean"] == pytest.approx(1.0)


def test_empty_mask_gives_zero_loss():
    logp = torch.zeros(2, 3, requires_grad=True)
    loss, metrics = cispo_loss(logp, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3))
    assert loss.item() == 0.0 and metrics["loss/tokens"] == 0.0


def test_token_logprobs_matches_naive():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g) * 4
    ids = torch.randint(0, 11, (2, 5), generator=g)
    got = token_logprobs(logits, ids)
    for b in range(2):
        for t in range(5):
            ref = torch.log_softmax(logits[b, t].double(), dim=-1)[ids[b, t]]
            assert got[b, t].item() == pytest.approx(ref.item(), abs=1e-5)
    assert token_logprobs(logits.bfloat16(), ids).dtype == torch.float32
