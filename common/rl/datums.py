"""Training datums: one model call -> one row of the batch, with the tokens each stage trains.

A :class:`Datum` is token-exact: the prompt and output ids the sampler saw, the sampler's behaviour
log-probs, a 0/1 loss mask over the output tokens, a scalar advantage and the bookkeeping the depth
weights need. The builders take a minimal :class:`CallTokens` (the runtime's records have the same
field names, so they can be passed directly) and enforce which role each stage may train:

| stage       | calls trained        | mask                                   |
|-------------|----------------------|----------------------------------------|
| execution   | ``act``              | every output token                     |
| delegation  | ``act`` with launches | launch-statement tokens only; output cut after the last one |
| rubric      | ``rubric``           | every output token                     |

Scoring calls (``score``) are never trained: every builder refuses them.

Pure Python (no torch): collation into padded tensors is the trainer's job.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from common.rl.spans import (
    Span,
    char_spans_to_token_mask,
    common_prefix_len,
    reply_launch_spans,
    token_char_offsets,
)

Role = Literal["act", "rubric", "score"]


@dataclass
class CallTokens:
    """The token view of one recorded model call: the fields of the runtime's
    :class:`common.agent.tree.CallRecord` that the datum builders read (so the math can be tested without
    building trees)."""

    role: Role
    """``act`` = an agent step; ``rubric`` = rubric generation; ``score`` = scoring a child (never trained)."""
    prompt_ids: list[int]
    """Token ids of the prompt exactly as sent (never re-tokenised)."""
    output_ids: list[int]
    """Sampled output token ids."""
    logprobs: list[float]
    """Behaviour log-probs of ``output_ids`` reported by the sampler, one per output token."""
    text: str = ""
    """The reply text the runtime acted on (decoded ``output_ids``; a prefix of it is fine)."""
    token_offsets: list[Span | None] | None = None
    """Per-output-token char offsets into ``text`` if already known (else computed with a tokenizer)."""


@dataclass
class Datum:
    """One training row."""

    prompt_ids: list[int]
    output_ids: list[int]
    behaviour_logprobs: list[float]
    """One per output token."""
    loss_mask: list[int]
    """One 0/1 per output token; only 1-tokens enter the loss."""
    advantage: float
    """The scalar advantage of every trained token of this datum."""
    depth: int
    """Depth of the agent that made the call (root 0)."""
    trajectory_id: Hashable
    """The node (agent trajectory) the call belongs to; ``T_d`` counts distinct ids per depth."""
    traj_start: bool
    """True for the first datum of its trajectory in this batch (lets loggers count trajectories)."""
    stage: str
    """``execution``, ``delegation`` or ``rubric``."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form extras for logging (step index, task id, ...); never read by the loss."""

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        if len(self.behaviour_logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(
                f"datum lengths disagree: {n} output ids, {len(self.behaviour_logprobs)} log-probs, "
                f"{len(self.loss_mask)} mask entries (the recorder must keep one log-prob per output token)"
            )

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)


def _check_call(call: Any, allowed: tuple[str, ...], builder: str) -> None:
    if call.role == "score":
        raise ValueError(f"{builder}: scoring calls are never trained (role 'score')")
    if call.role not in allowed:
        raise ValueError(f"{builder}: expected a call with role in {allowed}, got {call.role!r}")
    if len(call.output_ids) != len(call.logprobs):
        raise ValueError(
            f"{builder}: {len(call.output_ids)} output ids but {len(call.logprobs)} behaviour log-probs; "
            "record one log-prob per sampled token"
        )


def execution_datums(
    calls: Sequence[Any], advantage: float, depth: int, trajectory_id: Hashable
) -> list[Datum]:
    """One datum per ``act`` call of a node: every output token trained (launch statements included).

    ``calls`` may be all of a node's records; ``rubric`` and ``score`` calls are skipped here (they are
    separate chats, never execution tokens). ``traj_start`` is set on the first datum.

    >>> calls = [CallTokens("act", [1, 2], [3, 4], [-0.1, -0.2]), CallTokens("score", [5], [6], [-0.3])]
    >>> [(d.output_ids, d.loss_mask, d.traj_start) for d in execution_datums(calls, 0.5, 1, "n1")]
    [([3, 4], [1, 1], True)]
    """
    out: list[Datum] = []
    for call in calls:
        if call.role != "act":
            continue
        _check_call(call, ("act",), "execution_datums")
        out.append(
            Datum(
                prompt_ids=list(call.prompt_ids),
                output_ids=list(call.output_ids),
                behaviour_logprobs=list(call.logprobs),
                loss_mask=[1] * len(call.output_ids),
                advantage=float(advantage),
                depth=depth,
                trajectory_id=trajectory_id,
                traj_start=not out,
                stage="execution",
            )
        )
    return out


@dataclass
class DelegationResult:
    """What :func:`delegation_datum` made of one ``act`` call."""

    datum: Datum | None
    status: Literal["ok", "no_launch", "unaligned"]
    """``ok``: datum built; ``no_launch``: the reply has no launch statement; ``unaligned``: the launch
    spans could not be mapped onto tokens exactly (dropped; count it)."""


def delegation_datum(
    call: Any,
    advantage: float,
    depth: int,
    trajectory_id: Hashable,
    tokenizer: Any = None,
    traj_start: bool = False,
) -> DelegationResult:
    """A datum training only the launch-statement tokens of one ``act`` call.

    Spans come from :func:`reply_launch_spans` on ``call.text``; token offsets from
    ``call.token_offsets`` or, if absent, :func:`token_char_offsets` with ``tokenizer`` (every span must
    lie where the decoded output and ``call.text`` agree, else ``unaligned``). The output is truncated right after the
    last trained token. Refused launches are trained like any other: their reward is 0.

    >>> call = CallTokens("act", [1], [10, 11, 12, 13], [-0.1, -0.2, -0.3, -0.4],
    ...                   text="<python>x = await launch_subagent(t)\\nprint(x)</python>",
    ...                   token_offsets=[(0, 8), (8, 20), (20, 37), (37, 55)])
    >>> r = delegation_datum(call, advantage=0.25, depth=0, trajectory_id="root")
    >>> r.status, r.datum.output_ids, r.datum.loss_mask
    ('ok', [10, 11, 12], [0, 1, 1])
    """
    _check_call(call, ("act",), "delegation_datum")
    spans = reply_launch_spans(call.text)
    if not spans:
        return DelegationResult(None, "no_launch")
    offsets = getattr(call, "token_offsets", None)
    if offsets is None:
        if tokenizer is None:
            raise ValueError(
                "delegation_datum: the call has no token_offsets; pass tokenizer= to compute them"
            )
        # Offsets index the decoded text; they are valid for ``call.text`` up to where the two agree
        # (the runtime may have trimmed or appended a stop string).
        decoded = tokenizer.decode(list(call.output_ids))
        agree = common_prefix_len(decoded, call.text)
        if any(e > agree for _, e in spans):
            return DelegationResult(None, "unaligned")
        offsets = token_char_offsets(tokenizer, call.output_ids)
    if len(offsets) != len(call.output_ids):
        return DelegationResult(None, "unaligned")
    mask, aligned = char_spans_to_token_mask(offsets, spans)
    if not aligned or not any(mask):
        return DelegationResult(None, "unaligned")
    last = max(t for t, m in enumerate(mask) if m)
    datum = Datum(
        prompt_ids=list(call.prompt_ids),
        output_ids=list(call.output_ids[: last + 1]),
        behaviour_logprobs=list(call.logprobs[: last + 1]),
        loss_mask=mask[: last + 1],
        advantage=float(advantage),
        depth=depth,
        trajectory_id=trajectory_id,
        traj_start=traj_start,
        stage="delegation",
    )
    return DelegationResult(datum, "ok")


def rubric_datum(
    call: Any, advantage: float, depth: int, trajectory_id: Hashable, traj_start: bool = True
) -> Datum:
    """A datum training the whole output of one rubric-generation call (never a scoring call).

    ``depth`` is the depth of the agent whose policy wrote the rubric (the delegating parent).

    >>> d = rubric_datum(CallTokens("rubric", [1, 2], [7, 8, 9], [-1.0, -1.0, -1.0]), -0.1, 0, "rubric:g0")
    >>> d.loss_mask, d.stage
    ([1, 1, 1], 'rubric')
    """
    _check_call(call, ("rubric",), "rubric_datum")
    return Datum(
        prompt_ids=list(call.prompt_ids),
        output_ids=list(call.output_ids),
        behaviour_logprobs=list(call.logprobs),
        loss_mask=[1] * len(call.output_ids),
        advantage=float(advantage),
        depth=depth,
        trajectory_id=trajectory_id,
        traj_start=traj_start,
        stage="rubric",
    )
