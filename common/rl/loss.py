"""The CISPO policy loss and the token log-prob helper (SPEC.md §4).

    L = -(1/|M|) * sum_{t in M} sg(clip(rho_t, 0, clip_max)) * w * A * log pi_theta(y_t)
    rho_t = exp(log pi_theta(y_t) - log pi_behaviour(y_t))

CISPO clips the importance *weight* and stops its gradient, so every trained token keeps a gradient
(unlike PPO's clipped objective, which zeroes the gradient of clipped tokens). No KL, no entropy bonus.
The mean is over all trained tokens of the optimizer step ("token-mean"); pass ``num_tokens`` when a
step is split into micro-batches or data-parallel ranks so that every piece divides by the same total.

This file imports torch only (never torch.distributed).
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[..., ids]`` per position, computed in float32.

    ``logits[b, t]`` must already be the distribution that produced ``ids[b, t]`` (i.e. shift the model
    output by one position before calling). Uses ``logit - logsumexp`` so no [B, T, V] log-softmax is
    materialised.

    Shapes: logits [B, T, V], ids [B, T] -> [B, T].

    >>> logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0]]])          # [1, 2, 2]
    >>> token_logprobs(logits, torch.tensor([[1, 0]])).round(decimals=4)
    tensor([[-0.6931, -0.1269]])
    """
    logits = logits.float()  # [B, T, V]
    picked = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)  # [B, T]
    return picked - torch.logsumexp(logits, dim=-1)  # [B, T]


def cispo_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_max: float = 5.0,
    weights: torch.Tensor | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO loss over a padded batch of datums.

    Args (shapes):
        logp: [B, T] log pi_theta of the sampled tokens (requires grad).
        behaviour_logp: [B, T] log-probs the sampler reported for the same tokens.
        advantages: [B] (one advantage per datum) or [B, T].
        mask: [B, T] 1 on trained tokens, 0 on padding / untrained tokens.
        clip_max: upper clip of the importance ratio (lower clip is 0).
        weights: optional [B] per-datum weights (the depth weights ``w_d``).
        num_tokens: the denominator ``|M|``; default ``mask.sum()`` of this call. Give the trained-token
            count of the whole optimizer step when the step is split into several calls.

    Returns ``(loss, metrics)`` with metrics ``loss/cispo``, ``loss/clip_frac`` (fraction of trained
    tokens with rho > clip_max), ``loss/ratio_mean`` / ``loss/ratio_max`` (mean / largest rho over trained
    tokens), ``loss/abs_log_ratio`` (mean |log rho|: ~0 when the sampler and the trainer agree, the first
    alarm of an off-policy gap), ``loss/tokens``.

    >>> logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    >>> loss, m = cispo_loss(logp, torch.tensor([[-1.0, -2.0]]), torch.tensor([0.5]), torch.ones(1, 2))
    >>> loss.item()   # -(1/2) * (1 * 0.5 * -1 + 1 * 0.5 * -2) = 0.75
    0.75
    >>> loss.backward(); logp.grad    # d/dlogp_t = -(1/2) * rho_t * A
    tensor([[-0.2500, -0.2500]])
    """
    on = mask.bool()  # [B, T]
    mask = on.to(logp.dtype)  # [B, T]
    if advantages.dim() == 1:
        advantages = advantages[:, None]  # [B, 1]
    advantages = advantages.to(logp.dtype).expand_as(logp)  # [B, T]
    if weights is not None:
        advantages = advantages * weights.to(logp.dtype)[:, None]  # [B, T]  w_d * A
    log_ratio = logp.detach() - behaviour_logp.to(logp.dtype)  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]  rho_t (no grad)
    clipped = ratio.clamp(0.0, clip_max)  # [B, T]  sg(clip(rho_t, 0, clip_max))
    # torch.where, not "* mask": padding may hold -inf / NaN log-probs, and inf * 0 = NaN.
    per_token = torch.where(on, -clipped * advantages * logp, 0.0)  # [B, T]
    n_mask = mask.sum()
    denom = n_mask.clamp(min=1.0) if num_tokens is None else torch.as_tensor(float(num_tokens))
    loss = per_token.sum() / denom  # scalar
    with torch.no_grad():
        n = n_mask.clamp(min=1.0)
        metrics = {
            "loss/cispo": float(loss.detach()),
            "loss/clip_frac": float((on & (ratio > clip_max)).sum() / n),
            "loss/ratio_mean": float(torch.where(on, ratio, 0.0).sum() / n),
            "loss/ratio_max": float(torch.where(on, ratio, 0.0).max()) if on.any() else 0.0,
            "loss/abs_log_ratio": float(torch.where(on, log_ratio.abs(), 0.0).sum() / n),
            "loss/tokens": float(n_mask),
        }
    return loss, metrics


class RatioStats:
    """The behaviour/trainer ratio metrics of a whole optimizer step, from the per-call metrics of
    :func:`cispo_loss` (one call per datum at level 0, per micro-batch at level 1): token-weighted means of
    rho and |log rho|, the largest rho. ``totals()`` are the sums a data-parallel step adds over ranks
    (``from_totals`` turns them back into the metrics, with the max taken over ranks separately).

    >>> s = RatioStats()
    >>> s.add({"loss/tokens": 2.0, "loss/ratio_mean": 1.0, "loss/abs_log_ratio": 0.0, "loss/ratio_max": 1.0})
    >>> s.add({"loss/tokens": 6.0, "loss/ratio_mean": 2.0, "loss/abs_log_ratio": 0.5, "loss/ratio_max": 3.0})
    >>> s.metrics()
    {'loss/ratio_mean': 1.75, 'loss/abs_log_ratio': 0.375, 'loss/ratio_max': 3.0}
    """

    def __init__(self) -> None:
        self.tokens = 0.0
        self.ratio = 0.0
        self.abs_log = 0.0
        self.max = 0.0

    def add(self, m: dict[str, float]) -> None:
        n = m["loss/tokens"]
        self.tokens += n
        self.ratio += m["loss/ratio_mean"] * n
        self.abs_log += m["loss/abs_log_ratio"] * n
        self.max = max(self.max, m["loss/ratio_max"])

    def totals(self) -> list[float]:
        """``[tokens, sum rho, sum |log rho|]`` of the tokens scored here."""
        return [self.tokens, self.ratio, self.abs_log]

    @staticmethod
    def from_totals(totals: list[float], ratio_max: float) -> dict[str, float]:
        tokens, ratio, abs_log = totals
        n = max(tokens, 1.0)
        return {"loss/ratio_mean": ratio / n, "loss/abs_log_ratio": abs_log / n, "loss/ratio_max": ratio_max}

    def metrics(self) -> dict[str, float]:
        return self.from_totals(self.totals(), self.max)
