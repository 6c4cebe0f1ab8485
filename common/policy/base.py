"""The one async interface every policy backend implements.

A policy turns a chat (a list of ``{"role", "content"}`` messages) into a :class:`Completion` that records
*exactly* what training needs: the prompt token ids, the output token ids and the sampler's log-probs of
those output tokens (token-in, token-out: training never re-tokenises text, SPEC.md §1).

Backends (``common/policy``): ``hf`` (a local transformers model), ``openai`` (any OpenAI-compatible
server), level 1's in-process vLLM engine (``engine.Engine`` is the interface of the trainable ones:
weight updates, policy version, sleep/wake), and scripted ones (``oracle``, ``random``, ``replay``) that produce text without a model. Scripted
backends return empty token lists; the trainer refuses to train on them.

Every request names its *role*: ``act`` (an agent step), ``rubric`` (writing a rubric) or ``score``
(scoring a child against a frozen rubric). Scripted policies may read ``request.session`` (the agent's
environment session) to plan; model backends ignore it.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["act", "rubric", "score"]


@dataclass
class SamplingParams:
    """How to sample one completion."""

    max_new_tokens: int = 512
    """Cap on generated tokens for this call (SPEC: 512 TextCraft, 3,072 TextWorld; rubric/score 1,024)."""
    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 = off)."""
    stop: tuple[str, ...] = ()
    """Stop strings; generation ends after the first one (the stop string is kept in the output)."""
    seed: int | None = None
    """Per-request seed where the backend supports it."""
    ignore_eos: bool = False
    """Generate exactly ``max_new_tokens`` (EOS does not stop; stop strings still do). Benchmarks only."""


@dataclass
class GenerationRequest:
    """One model call."""

    messages: list[dict[str, str]]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    role: Role = "act"
    session: Any = None
    """The environment session of the calling agent (scripted policies only; never serialised)."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form tags (agent id, depth) copied into the record."""


@dataclass
class Completion:
    """One model call's result, token-exact."""

    text: str
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """Behaviour log-probs of ``output_ids`` (same length): the raw model's ``log_softmax(logits)`` of each
    sampled token (T = 1, no top-p; the distribution the trainer scores, see ``engine.py``); empty for
    scripted policies."""
    finish_reason: str = "stop"
    """``stop`` (EOS or stop string), ``length`` (hit max_new_tokens) or ``scripted``."""
    prompt_truncated: bool = False
    """True when old turns were dropped to fit the prompt cap."""


class Policy(ABC):
    """Async policy. ``generate_many`` defaults to concurrent ``generate`` calls; batched backends override."""

    name: str = "policy"
    trainable: bool = False
    """True when completions carry token ids and log-probs usable for training."""

    @abstractmethod
    async def generate(self, request: GenerationRequest) -> Completion:
        """One completion for one request."""

    async def generate_many(self, requests: list[GenerationRequest]) -> list[Completion]:
        return list(await asyncio.gather(*(self.generate(r) for r in requests)))

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release resources (servers, threads)."""
