"""The recorded recursive agent tree: everything training, evaluation and the viewer need.

A root rollout produces one :class:`Tree`. Nodes are agents (root depth 0); a child records its
``parent_id`` and ``fork_step`` (the parent's step index at which it was launched). Several launches
in one parent step form one *delegation event* ``(parent_id, fork_step)``. Every model call is a
:class:`CallRecord` with exact token ids and behaviour log-probs; the rubric and score calls of a child
are stored on the child (they are separate chats from the agent's own steps).

The whole tree serialises to plain JSON (``Tree.to_dict`` / ``Tree.from_dict``) with a schema version;
``common.agent.log`` appends one tree per line to the offline log.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1


@dataclass
class CallRecord:
    """One model call, token-exact."""

    role: str
    """``act`` (an agent step), ``rubric`` (rubric generation) or ``score`` (scoring a child)."""
    messages: list[dict[str, str]]
    """The chat sent (after context truncation)."""
    text: str
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = "stop"
    prompt_truncated: bool = False
    seconds: float = 0.0
    ended: float = field(default_factory=time.time)
    """Wall-clock time (``time.time()``) the record was made; the runtime makes it when the call returns,
    so the call was in flight during ``[ended - seconds, ended]`` (``time/scoring_s`` unions these)."""


@dataclass
class Step:
    """One agent step: the model's reply and what the environment answered."""

    index: int
    call: CallRecord
    observation: str
    launched: list[str] = field(default_factory=list)
    """Ids of the child nodes launched during this step (one delegation event when non-empty)."""
    refused_launches: int = 0
    """Launches refused in this step (depth limit)."""
    cell_output: str = ""
    """What the step's cell printed (TextCraft: the captured stdout, where a raising cell's traceback lands,
    as in IPython); "" when the environment reports none. Read by the error filter of
    :mod:`common.rl.filters`; trees written before this field load with ""."""
    cell_error: str = ""
    """The step's error slot (TextCraft: the cell's stderr, or the text of an error raised before the cell
    ran, such as a syntax error); "" when there was none. Read by :mod:`common.rl.filters`."""


@dataclass
class Node:
    """One agent of the tree."""

    node_id: str
    parent_id: str | None
    depth: int
    fork_step: int | None
    """The parent's step index when this child was launched (None for the root)."""
    goal: str
    max_steps: int
    steps: list[Step] = field(default_factory=list)
    finished: bool = False
    finish_message: str | None = None
    error: str | None = None
    success: bool = False
    """Environment-judged: the root's task success, or the child's own goal (programmatic check)."""
    rubric: dict[str, Any] | None = None
    """The frozen, parsed rubric (None for the root, or when parsing failed)."""
    rubric_call: CallRecord | None = None
    rubric_error: str | None = None
    score: float | None = None
    """The rubric score s in [0, 1] (None for the root or when scoring failed)."""
    score_success: bool | None = None
    score_call: CallRecord | None = None
    score_error: str | None = None
    branch_group: str | None = None
    """Counterfactual group id when this node is one of K branches of one delegation."""
    branch_index: int | None = None
    """0 = the branch committed to the live world; 1..K-1 = training-only branches."""
    branch_label: bool | None = None
    """Verified success label of a counterfactual branch (programmatic or judge)."""
    committed: bool = True
    """False for nodes that ran on an uncommitted fork (counterfactual or losing best-of-n candidate)."""
    seconds: float = 0.0

    @property
    def steps_used(self) -> int:
        return len(self.steps)


@dataclass
class Tree:
    """One root rollout."""

    task_id: str
    env: str
    nodes: dict[str, Node] = field(default_factory=dict)
    root_id: str = "0"
    success: bool = False
    """Root success judged by the environment only."""
    seconds: float = 0.0
    config_hash: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    # ---- structure -------------------------------------------------------------------------------
    @property
    def root(self) -> Node:
        return self.nodes[self.root_id]

    def children(self, node_id: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.parent_id == node_id]

    def committed_nodes(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.committed]

    def leaves(self, committed_only: bool = True) -> list[Node]:
        """Nodes without children (a node with no children is its own single leaf)."""
        nodes = self.committed_nodes() if committed_only else list(self.nodes.values())
        parents = {n.parent_id for n in nodes if n.parent_id is not None}
        return [n for n in nodes if n.node_id not in parents]

    def delegation_events(self, committed_only: bool = True) -> dict[tuple[str, int], list[str]]:
        """``(parent_id, fork_step) -> [child ids]`` for every delegation event."""
        events: dict[tuple[str, int], list[str]] = {}
        for n in self.nodes.values():
            if n.parent_id is None or (committed_only and not n.committed):
                continue
            events.setdefault((n.parent_id, int(n.fork_step or 0)), []).append(n.node_id)
        return events

    def depth_max(self) -> int:
        return max(n.depth for n in self.committed_nodes())

    # ---- serialisation ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schema_version"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Tree:
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(f"tree schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
        nodes = {}
        for nid, nd in d["nodes"].items():
            nd = dict(nd)
            nd["steps"] = [Step(**{**s, "call": CallRecord(**s["call"])}) for s in nd.get("steps", [])]
            for key in ("rubric_call", "score_call"):
                if nd.get(key) is not None:
                    nd[key] = CallRecord(**nd[key])
            nodes[nid] = Node(**nd)
        fields = {k: v for k, v in d.items() if k not in ("nodes", "schema_version")}
        return cls(nodes=nodes, **fields)
