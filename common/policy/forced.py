"""Teacher forcing: scripted text with the model's own token ids and log-probs (a warm-start aid).

A random-init or tiny model never succeeds, so every group has zero variance and RL has no signal.
``TeacherForcedPolicy`` mixes the model's own samples with replies written by a scripted policy (the
environment's oracle) that are *teacher-forced* through the model: the text is tokenised once, and the
behaviour log-probs are the model's log-probs of those tokens. The completion is then token-exact and
trainable like any other; the data are off-policy (CISPO's clipped ratio is what keeps that stable).

Used by the level-0 ``--oracle-mix`` option and by the tests that need every stage to produce datums
with a tiny model. ``oracle_mix=0`` is pure on-policy RL and the default everywhere.

Choices are deterministic per request (hash of the request's seed and role), so reruns and resumed runs
make the same choices. ``score_noise`` flips the oracle scorer's verdict with that probability, so rubric
groups are not perfectly ranked (otherwise every ranking reward is 0 and the Rubric stage is silent).
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import replace

from common.policy.base import Completion, GenerationRequest, Policy
from common.policy.context import build_prompt_ids


def _u01(*parts: object) -> float:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") / 2**64


class TeacherForcedPolicy(Policy):
    """``oracle_mix`` of replies come from ``teacher`` (teacher-forced through ``model``), the rest are
    sampled by ``model`` (an :class:`~common.policy.hf.HFPolicy`)."""

    name = "teacher-forced"
    trainable = True

    def __init__(
        self,
        model: Policy,
        teacher: Policy,
        oracle_mix: float = 0.5,
        score_noise: float = 0.0,
        seed: int = 0,
        max_prompt_tokens: int | None = None,
    ):
        if not 0.0 <= oracle_mix <= 1.0:
            raise ValueError(f"oracle_mix must be in [0, 1], got {oracle_mix}")
        self.model, self.teacher = model, teacher
        self.oracle_mix, self.score_noise, self.seed = oracle_mix, score_noise, seed
        self.max_prompt_tokens = max_prompt_tokens
        self.counts = {"model": 0, "teacher": 0}

    async def generate(self, request: GenerationRequest) -> Completion:
        key = (
            self.seed,
            request.sampling.seed,
            request.role,
            str(request.meta.get("node_id")),
            request.meta.get("step"),
            len(request.messages),
        )
        if _u01("mix", *key) >= self.oracle_mix:
            self.counts["model"] += 1
            return await self.model.generate(request)
        self.counts["teacher"] += 1
        if (
            request.role == "score"
            and "child_success" in request.meta
            and _u01("flip", *key) < self.score_noise
        ):
            request = replace(
                request, meta={**request.meta, "child_success": not request.meta["child_success"]}
            )
        text = (await self.teacher.generate(request)).text
        return await self.force(request, text)

    async def force(self, request: GenerationRequest, text: str) -> Completion:
        """Tokenise ``text`` as the reply to ``request`` and score it with the model (token-exact). A model
        whose ``score_logprobs`` is a coroutine (level 2's router: a remote call) is awaited, so the other
        agents' coroutines run meanwhile."""
        tok = self.model.tokenizer
        cap = self.max_prompt_tokens or max(
            1, self.model.max_context_tokens - request.sampling.max_new_tokens
        )
        prompt_ids, truncated = build_prompt_ids(tok, request.messages, cap)
        # Scripted replies are not cut at max_new_tokens: a truncated program would just be a syntax error.
        output_ids = tok.encode(text, add_special_tokens=False)
        logprobs = self.model.score_logprobs(prompt_ids, output_ids)
        if inspect.isawaitable(logprobs):
            logprobs = await logprobs
        return Completion(
            text=text,
            prompt_ids=prompt_ids,
            output_ids=output_ids,
            logprobs=logprobs,
            finish_reason="teacher",
            prompt_truncated=truncated,
        )
