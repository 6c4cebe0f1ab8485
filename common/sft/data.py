"""Oracle trees -> supervised examples, token-exact in the chat format the trainer's policy sees.

The examples are not re-formatted text: the REAL runtime (``common.agent.runtime.run_root``) runs with the
environment's scripted oracle behind :class:`RecordingTeacher`, a policy that answers each request with the
oracle's text and records the token ids an :class:`~common.policy.hf.HFPolicy` on the same tokenizer would
have used: ``prompt_ids`` from ``engine.prompt_for`` (the one prompt rule of every local engine: chat
template + generation prompt + the context cap) and ``output_ids`` = the reply's tokens, followed by EOS
unless the reply ends in one of the request's stop strings (where generation would have stopped without
one). The runtime also fits every prompt with the same tokenizer (it reads ``policy.tokenizer``). So an
example is exactly ``(what the model is sent, what it should answer)``, and the loss mask is "the answer".

Every role is covered: agent steps (``act``: CodeAct cells / actions, delegations included, since the
oracle delegates), rubrics written before a child runs (the oracle's 4-item rubric naming the delegated
goal) and scores of children against their frozen rubric (success = the child's REAL outcome). So that
scoring examples contain failures too, ``child_noise`` of the children are played by a *flawed* writer
(chosen per tree and agent, at every step of that agent); those steps are tagged ``noise`` and never become
examples. In TextCraft the flawed writer is the oracle itself with one realistic mistake per agent
(:class:`FlawedOracle`: a wrong ingredient amount, or a ``finish`` that claims the targets are crafted when
they are not), so a failed child reads like a successful one (same look-up cell, thoughts, code template
and finish message) and only its observations and final inventory show the failure: the scorer has to read
the outcome. (Children played by the random policy, the earlier design and still the writer in the other
environments, announce themselves with ``<thought>Random step.</thought>``: in those data that string
predicted the label perfectly, and a scorer SFT'd on them called 358 of 359 failed RL children successful;
docs/fidelity/sft.md.)

    trees = oracle_trees("textcraft", tasks, tokenizer, max_context_tokens=8192, rollout=RuntimeConfig())
    examples = [e for t in trees for e in tree_examples(t)]

Simplifications: rollouts run one tree at a time (the oracle is fast: ~0.1 s per tree); scripted rubric
and score texts are templates (``common.policy.scripted``), not free-form judgements.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from common.agent.runtime import RuntimeConfig, run_root
from common.agent.tree import CallRecord, Tree
from common.policy.base import Completion, GenerationRequest, Policy
from common.policy.engine import prompt_for

TEACHER, NOISE = "teacher", "noise"
"""``finish_reason`` of a recorded oracle reply (trained) and of a random child step (never trained)."""


def _u01(*parts: object) -> float:
    """A deterministic uniform number in [0, 1) from ``parts``."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") / 2**64


def reply_ids(tokenizer: Any, text: str, stop: Iterable[str], eos_id: int) -> list[int]:
    """The output ids a local engine would have produced for ``text``: its tokens, then EOS unless the text
    ends in a stop string (generation stops right after a stop string, with no EOS)."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if not any(s and text.endswith(s) for s in stop):
        ids.append(int(eos_id))
    return ids


class RecordingTeacher(Policy):
    """Answers with ``teacher``'s text, records HFPolicy-exact token ids (module docstring).

    ``noise`` (a policy) writes ``child_noise`` of the steps of agents at depth >= 1, tagged ``noise``."""

    name = "recording-teacher"
    trainable = False

    def __init__(
        self,
        teacher: Policy,
        tokenizer: Any,
        max_context_tokens: int,
        noise: Policy | None = None,
        child_noise: float = 0.0,
        seed: int = 0,
    ):
        self.teacher, self.tokenizer, self.noise = teacher, tokenizer, noise
        self.max_context_tokens, self.child_noise, self.seed = int(max_context_tokens), child_noise, seed
        self.eos_id = tokenizer.eos_token_id
        if self.eos_id is None:
            raise ValueError("the tokenizer defines no EOS token")

    async def generate(self, request: GenerationRequest) -> Completion:
        tag, source = TEACHER, self.teacher
        depth = request.meta.get("depth", 0) or 0
        if request.role == "act" and depth >= 1 and self.noise is not None and self.child_noise > 0:
            key = (self.seed, str(request.meta.get("node_id")))  # per agent: noisy at every step
            if _u01("noise", *key) < self.child_noise:
                tag, source = NOISE, self.noise
        text = (await source.generate(request)).text
        prompt_ids, truncated = prompt_for(self.tokenizer, request, self.max_context_tokens)  # == HFPolicy
        output_ids = reply_ids(self.tokenizer, text, request.sampling.stop, self.eos_id)
        return Completion(
            text=text,
            prompt_ids=prompt_ids,
            output_ids=output_ids,
            finish_reason=tag,
            prompt_truncated=truncated,
        )


class FlawedOracle(Policy):
    """TextCraft: the oracle's replies with one mistake per agent (``oracle.FLAWS``, picked by a hash of
    ``(seed, node_id)``; ``oracle.flawed_reply``). Acting only: the noise writer of failed children."""

    name = "flawed-oracle"
    trainable = False

    def __init__(self, look_up: bool = True, seed: int = 0):
        self.look_up, self.seed = look_up, seed

    def flaw(self, node_id: str) -> str:
        """The mistake agent ``node_id`` makes in this tree."""
        from common.envs.textcraft.oracle import FLAWS

        return FLAWS[int(_u01("flaw", self.seed, node_id) * len(FLAWS))]

    async def generate(self, request: GenerationRequest) -> Completion:
        from common.envs.textcraft.oracle import flawed_reply

        if request.role != "act" or request.session is None:
            raise ValueError("FlawedOracle only writes agent steps (role 'act' with a session)")
        flaw = self.flaw(str(request.meta.get("node_id")))
        return Completion(text=flawed_reply(request.session, flaw, self.look_up), finish_reason="scripted")


def oracle_trees(
    env_name: str,
    tasks: list[dict[str, Any]],
    tokenizer: Any,
    max_context_tokens: int,
    rollout: RuntimeConfig,
    *,
    seed: int = 0,
    trees_per_task: int = 1,
    child_noise: float = 0.0,
    look_up: bool = False,
) -> list[Tree]:
    """One oracle tree per task and per ``trees_per_task`` (rollout seed ``hash(seed, task, r)``), run by the
    real runtime with the training rollout settings (Execution-stage shape: rubrics on, K=1). ``look_up``
    (TextCraft): every agent first looks its recipes up (``oracle.lookup_reply``). TextCraft cells run in
    the CodeAct worker's fixed-order mode: siblings act in one order, so the same seed gives the same trees."""
    from common.policy import make_policy
    from common.run.data import hash_seed
    from common.run.rollout import make_env_with_prompts, stage_runtime_config

    # the training texts, as RL sees them; sibling cells in one fixed order, so a seed gives the same data
    env = make_env_with_prompts(env_name, rollout.prompts_dir, "worker-ordered")
    extra = {"look_up": True} if look_up and env_name == "textcraft" else {}
    teacher = make_policy("oracle", env=env_name, delegate=True, **extra)
    noise = None
    if child_noise > 0:
        noise = FlawedOracle(look_up, seed) if env_name == "textcraft" else make_policy("random", seed=seed)
    policy = RecordingTeacher(teacher, tokenizer, max_context_tokens, noise, child_noise, seed)
    trees = []
    for i, task in enumerate(tasks):
        for r in range(trees_per_task):
            rcfg = stage_runtime_config(env_name, rollout, "execution", True, hash_seed(seed, i, r))
            policy.seed = rcfg.seed  # which children are noisy differs from tree to tree
            if isinstance(noise, FlawedOracle):
                noise.seed = rcfg.seed  # and which mistake each makes
            trees.append(asyncio.run(run_root(task, env, policy, rcfg)))
    return trees


@dataclass
class SFTExample:
    """One supervised example: the model is sent ``prompt_ids`` and should answer ``output_ids``."""

    prompt_ids: list[int]
    output_ids: list[int]
    role: str
    """act | rubric | score."""
    depth: int
    task_id: str
    node_id: str

    @property
    def input_ids(self) -> list[int]:
        """prompt + reply: the sequence the trainer feeds the model."""
        return self.prompt_ids + self.output_ids

    @property
    def loss_mask(self) -> list[int]:
        """1 on the reply's tokens (the assistant's), 0 on the prompt (aligned with ``input_ids``)."""
        return [0] * len(self.prompt_ids) + [1] * len(self.output_ids)


def _calls(tree: Tree) -> Iterable[tuple[Any, CallRecord]]:
    for node in tree.nodes.values():
        for step in node.steps:
            yield node, step.call
        for call in (node.rubric_call, node.score_call):
            if call is not None:
                yield node, call


def tree_examples(tree: Tree, roles: Iterable[str] = ("act", "rubric", "score")) -> list[SFTExample]:
    """The oracle-written calls of ``tree`` (roles in ``roles``) as examples; random noise steps and calls
    without token ids are skipped."""
    roles = set(roles)
    out = []
    for node, call in _calls(tree):
        if call.role not in roles or call.finish_reason != TEACHER or not call.output_ids:
            continue
        out.append(
            SFTExample(
                list(call.prompt_ids),
                list(call.output_ids),
                call.role,
                node.depth,
                tree.task_id,
                node.node_id,
            )
        )
    return out


def write_examples(path: Path, examples: list[SFTExample]) -> None:
    """One JSON object per line (atomic: written to a temporary file, then renamed)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        for e in examples:
            f.write(json.dumps(asdict(e)) + "\n")
    tmp.replace(path)


def read_examples(path: Path) -> list[SFTExample]:
    """The examples written by :func:`write_examples`."""
    return [SFTExample(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def summary(examples: list[SFTExample], trees: list[Tree]) -> dict[str, float]:
    """Counts for the log: examples and tokens per role, and how many scored children failed."""
    out: dict[str, float] = {"data/trees": len(trees), "data/root_success": 0.0}
    if trees:
        out["data/root_success"] = sum(bool(t.success) for t in trees) / len(trees)
    for role in ("act", "rubric", "score"):
        ex = [e for e in examples if e.role == role]
        out[f"data/{role}_examples"] = len(ex)
        out[f"data/{role}_tokens"] = sum(len(e.output_ids) for e in ex)
    scored = [n for t in trees for n in t.nodes.values() if n.score_call is not None]
    out["data/scored_children"] = len(scored)
    out["data/scored_failures"] = sum(not n.success for n in scored)
    return out


@lru_cache(maxsize=4)
def shuffled_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    """A permutation of ``range(n)`` fixed by ``(seed, epoch)`` (resumable without saving it)."""
    return tuple(sorted(range(n), key=lambda i: _u01("order", seed, epoch, i)))


def batch_at(n: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Example indices of optimizer step ``step``: epochs of a seeded permutation, read in order."""
    out = []
    start = step * batch_size
    for k in range(start, start + batch_size):
        epoch, pos = divmod(k, n)
        out.append(shuffled_order(n, seed, epoch)[pos])
    return out


def prompt_fingerprint(tokenizer: Any, n_tasks: int = 4) -> str:
    """The texts an SFT adapter learns, as one hash: sha256 (first 16 hex digits) of every act, rubric and
    score example (prompt and reply token ids) of oracle trees on the first ``n_tasks`` easy TextCraft
    ``train`` tasks (seed 0, child noise 0.5, look-up on) with the quick start's agent sizes
    (``common.train_config.laptop_rollout``), rendered by the code that calls it. Any change to the prompt
    templates, the observation layout, the chat format or the agent sizes changes it. The shipped adapter
    records the fingerprint of the code it was made with (``record.json``: ``prompt_fingerprint``), and a
    test compares it with today's: a change that leaves the adapter trained on other texts fails until the
    adapter is re-made (the 2026-12-06 re-audit found the adapter of 2026-12-03 trained on an old layout).
    ``tiny`` shares SmolLM2's tokenizer, so either gives SmolLM2's fingerprint."""
    from common.run.data import task_pool
    from common.train_config import laptop_rollout

    tasks = task_pool("textcraft", None, n_tasks, 0, "easy")
    trees = oracle_trees("textcraft", tasks, tokenizer, 8192, laptop_rollout(), seed=0, child_noise=0.5, look_up=True)
    h = hashlib.sha256()
    for e in (e for t in trees for e in tree_examples(t)):
        h.update(json.dumps([e.role, e.prompt_ids, e.output_ids]).encode())
    return h.hexdigest()[:16]


__all__ = [
    "NOISE",
    "FlawedOracle",
    "TEACHER",
    "RecordingTeacher",
    "SFTExample",
    "batch_at",
    "oracle_trees",
    "prompt_fingerprint",
    "read_examples",
    "reply_ids",
    "summary",
    "tree_examples",
    "write_examples",
]
