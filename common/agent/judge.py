"""Success labels for counterfactual branches (SPEC.md §4): did the child complete its assigned goal?

Three pluggable judges, all with the runtime's ``Judge`` signature
``async judge(request, node, session, world) -> bool | None``; ``None`` means "no verdict" (the model's
answer did not parse): the branch is dropped from its ranking group and a RAO child from the execution
batch, as the public code does (``skip_gradient_update`` on a failed judge), never counted as a failure.

* ``programmatic`` — the environment's own check of the child's goal (TextCraft: finish called and the
  targets crafted on top of what was held; TextWorld-Sync: the delegated dish's progress). Offline, exact
  for TextCraft; for TextWorld-Sync it is a documented progress check, not the paper's judge.
* ``policy`` — the policy itself asked, in a fresh greedy chat, as a strict binary evaluator.
* ``openai:URL#MODEL`` — an external OpenAI-compatible model as the strict evaluator (the paper's setup
  used a large hosted model on TextWorld).

``make_judge(spec, policy)`` builds one from a string (the ``--judge`` option of the trainers).
"""

from __future__ import annotations

import json
import re

from common.agent.runtime import Judge, programmatic_judge
from common.agent.tree import Node
from common.envs.base import AgentSession, LaunchRequest, World
from common.policy.base import GenerationRequest, Policy, SamplingParams

JUDGE_SYSTEM = (
    "You are a strict evaluator. A parent agent delegated a goal to a sub-agent. Read the goal, the "
    "sub-agent's trajectory and the final state, and decide whether the sub-agent COMPLETED the goal it "
    "was assigned, fully, for its parent. Partial progress is a failure. Answer with one JSON object: "
    '{"success": true|false, "reason": "..."}.'
)


def judge_messages(request: LaunchRequest, node: Node, world: World) -> list[dict[str, str]]:
    from common.agent.rubric import serialise_trajectory

    user = (
        f"Delegated goal:\n{request.goal}\n\nSub-agent trajectory:\n{serialise_trajectory(node)}\n\n"
        f"Final environment state:\n{world.describe()}\n\nDid the sub-agent complete its goal?"
    )
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def parse_verdict(text: str) -> bool | None:
    """``success`` from the judge's JSON object; ``None`` when there is no JSON object with a boolean
    ``success`` (the caller drops the branch instead of calling it a failure).

    >>> parse_verdict('{"success": true, "reason": "done"}'), parse_verdict('{"success": false}')
    (True, False)
    >>> parse_verdict("yes"), parse_verdict(""), parse_verdict('{"success": "yes"}')
    (None, None, None)
    """
    match = re.search(r"\{.*\}", text, flags=re.S)
    if match:
        try:
            obj = json.loads(match.group(0))
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("success"), bool):
            return obj["success"]
    return None


def model_judge(policy: Policy) -> Judge:
    """A judge that asks ``policy`` (greedy, 256 tokens) for a binary verdict."""

    async def judge(request: LaunchRequest, node: Node, session: AgentSession, world: World) -> bool | None:
        comp = await policy.generate(
            GenerationRequest(
                messages=judge_messages(request, node, world),
                role="score",
                sampling=SamplingParams(max_new_tokens=256, temperature=0.0),
                session=session,
                meta={"judge": True, "child_success": bool(session.success())},
            )
        )
        return parse_verdict(comp.text)

    return judge


def make_judge(spec: str, policy: Policy | None = None) -> Judge:
    """``programmatic`` | ``policy`` | ``openai:URL#MODEL``."""
    if spec == "programmatic":
        return programmatic_judge
    if spec == "policy":
        if policy is None:
            raise ValueError("judge 'policy' needs the training policy")
        return model_judge(policy)
    if spec.startswith("openai:"):
        from common.policy import make_policy

        return model_judge(make_policy(spec))
    raise ValueError(f"unknown judge {spec!r}; use programmatic, policy or openai:URL#MODEL")
