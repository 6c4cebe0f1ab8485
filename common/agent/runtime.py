"""The recursive agent runtime (SPEC.md §1, §3 and §5 test-time selection), shared by every tier.

``await run_root(task, env, policy, config)`` runs one root rollout and returns a recorded :class:`Tree`:

1. The root agent gets the task's system prompt and first message and takes up to ``max_steps`` steps
   (one model call = one step). Each reply goes to the environment session, whose observation becomes
   the next user message.
2. When a reply delegates, the session calls the runtime's *launch hook* once per launch (siblings
   launched in one step run concurrently; together they are one delegation event). The hook
   a. refuses launches past ``max_depth`` with an explanatory string (the caller paid its step),
   b. asks the policy for a rubric in a fresh chat, parses it and FREEZES it on the child node,
   c. runs the child agent on the same live world with its own step budget (recursively),
   d. asks the policy to score the finished child against the frozen rubric (fresh chat, greedy),
   e. returns the child's result to the parent's session, which turns it into text.
3. Counterfactual branches (Rubric-stage rollouts, ``counterfactual_k > 1``): at a delegation, the live
   world is snapshotted, branches 1..K-1 of the same child (same goal, same frozen rubric) run on
   isolated forks of the snapshot, branch 0 runs on the live world (so its final state is the one the
   parent continues from, i.e. it is "committed"). Every branch gets a verified label and a score.
4. Test-time selection (``best_of_n > 1``): every delegation runs n candidates on forks, scores them with
   one frozen rubric, and commits the best fork to the live world (ties and failures -> candidate 0).

Exceptions inside an agent end that agent with a recorded error (reward 0), never the process.

What this simplifies: one asyncio event loop per rollout; concurrency across rollouts is the caller's
job (``asyncio.gather`` of several ``run_root``), batching across agents is the policy backend's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from common.agent.rubric import (
    RubricContext,
    RubricParseError,
    ScoreParseError,
    build_rubric_messages,
    build_score_messages,
    parse_rubric,
    parse_score,
    serialise_trajectory,
)
from common.agent.tree import CallRecord, Node, Step, Tree
from common.envs.base import AgentSession, ChildResult, Environment, LaunchRequest, World
from common.policy.base import Completion, GenerationRequest, Policy, SamplingParams


@dataclass
class RuntimeConfig:
    """How one recursive rollout runs (SPEC.md §1, §3, §5)."""

    max_steps: int = 20
    """Step budget of every agent (root and children); one model call is one step."""
    max_depth: int = 3
    """A launch from depth d is allowed iff d + 1 <= max_depth."""
    max_prompt_tokens: int = 10_240
    """Prompt cap per call (10,240 TextCraft, 13,312 TextWorld); older turns are dropped to fit."""
    max_new_tokens: int = 512
    """Output cap per agent step (512 TextCraft, 3,072 TextWorld)."""
    temperature: float = 1.0
    """Sampling temperature of agent steps (0 = greedy, the evaluation protocol)."""
    stop: tuple[str, ...] = ()
    """Stop strings of agent steps (TextCraft: ``</python>``)."""
    use_rubrics: bool = True
    """Write a rubric before each child and score it after (False: RAO, binary per-node rewards)."""
    rubric_max_new_tokens: int = 1024
    """Output cap of a rubric-generation call."""
    rubric_temperature: float = 1.0
    """Rubrics are sampled (the rubric writer is trained); scoring is always greedy."""
    score_max_new_tokens: int = 1024
    """Output cap of a scoring call."""
    counterfactual_k: int = 1
    """Branches per delegation in Rubric-stage rollouts (1 = off; 4 in level 0, 8 in the paper)."""
    max_envs_per_rollout: int = 16
    """Environment budget for counterfactual branches per root rollout (16 = 2 groups of K=8)."""
    best_of_n: int = 1
    """Test-time selection: candidates per delegation (1 = off; the paper reports N=2)."""
    seed: int = 0
    """Base seed passed to the policy per call (combined with the node id and step)."""

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


Judge = Callable[[LaunchRequest, Node, AgentSession, World], Awaitable[bool]]
"""Labels a counterfactual branch: did the child complete its assigned goal? (programmatic by default)"""


async def programmatic_judge(request: LaunchRequest, node: Node, session: AgentSession, world: World) -> bool:
    """The default label: the environment's own check of the child's goal (TextCraft: finish called and
    the targets crafted; TextWorld-Sync: the delegated dish progressed as asked)."""
    return bool(session.success())


@dataclass
class _AgentState:
    """Runtime-private state of a running agent (never serialised)."""

    node: Node
    session: AgentSession
    world: World
    messages: list[dict[str, str]] = field(default_factory=list)
    reply: str = ""
    step_index: int = 0
    launched: list[str] = field(default_factory=list)
    refused: int = 0
    n_children: int = 0
    in_branch: bool = False


class _Rollout:
    """All state of one root rollout."""

    def __init__(self, env: Environment, policy: Policy, cfg: RuntimeConfig, task: dict, judge: Judge):
        self.env, self.policy, self.cfg, self.task, self.judge = env, policy, cfg, task, judge
        self.tree = Tree(
            task_id=str(task.get("id", task.get("task_id", ""))), env=env.name, config_hash=cfg.hash()
        )
        self.envs_used = 1
        self.n_groups = 0
        self.commit_locks: dict[int, asyncio.Lock] = {}

    # ---- model calls ---------------------------------------------------------------------------
    async def call(
        self,
        role: str,
        messages: list[dict[str, str]],
        sampling: SamplingParams,
        session: AgentSession | None,
        meta: dict[str, Any],
    ) -> CallRecord:
        t0 = time.perf_counter()
        comp: Completion = await self.policy.generate(
            GenerationRequest(messages=messages, sampling=sampling, role=role, session=session, meta=meta)
        )
        return CallRecord(
            role=role,
            messages=[dict(m) for m in messages],
            text=comp.text,
            prompt_ids=list(comp.prompt_ids),
            output_ids=list(comp.output_ids),
            logprobs=list(comp.logprobs),
            sampling=asdict(sampling),
            finish_reason=comp.finish_reason,
            prompt_truncated=comp.prompt_truncated,
            seconds=time.perf_counter() - t0,
        )

    def act_sampling(self, node: Node, step: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.cfg.max_new_tokens,
            temperature=self.cfg.temperature,
            stop=self.cfg.stop,
            seed=_seed(self.cfg.seed, node.node_id, step),
        )

    # ---- agents --------------------------------------------------------------------------------
    async def run_agent(self, st: _AgentState) -> None:
        node, session = st.node, st.session
        t0 = time.perf_counter()
        try:
            st.messages = [
                {"role": "system", "content": session.system_prompt()},
                {"role": "user", "content": session.first_user_message()},
            ]
            for i in range(node.max_steps):
                st.step_index, st.launched, st.refused = i, [], 0
                call = await self.call(
                    "act",
                    st.messages,
                    self.act_sampling(node, i),
                    session,
                    {"node_id": node.node_id, "depth": node.depth, "step": i},
                )
                st.reply = call.text
                result = await session.step(call.text)
                node.steps.append(
                    Step(
                        index=i,
                        call=call,
                        observation=result.observation,
                        launched=list(st.launched),
                        refused_launches=st.refused,
                    )
                )
                st.messages = st.messages + [
                    {"role": "assistant", "content": call.text},
                    {"role": "user", "content": result.observation},
                ]
                if result.error:
                    node.error = result.error
                    break
                if result.done:
                    node.finished = result.finish_message is not None
                    node.finish_message = result.finish_message
                    break
        except Exception as e:  # an agent's crash ends that agent only (reward 0), never the process
            node.error = f"{type(e).__name__}: {e}"
        node.finished = node.finished or bool(getattr(session, "finished", False))
        if node.finish_message is None:
            node.finish_message = getattr(session, "finish_message", None)
        try:
            node.success = bool(session.success()) and node.error is None
        except Exception as e:
            node.success, node.error = False, node.error or f"{type(e).__name__}: {e}"
        node.seconds = time.perf_counter() - t0

    def new_child_node(self, parent: _AgentState, request: LaunchRequest, suffix: str = "") -> Node:
        parent.n_children += 1
        child_id = f"{parent.node.node_id}.{parent.n_children}{suffix}"
        node = Node(
            node_id=child_id,
            parent_id=parent.node.node_id,
            depth=parent.node.depth + 1,
            fork_step=parent.step_index,
            goal=request.goal,
            max_steps=request.max_steps,
            committed=not parent.in_branch,
        )
        self.tree.nodes[child_id] = node
        return node

    def start_child(
        self, parent: _AgentState, node: Node, request: LaunchRequest, world: World, in_branch: bool
    ) -> _AgentState:
        st = _AgentState(node=node, session=None, world=world, in_branch=in_branch)  # type: ignore[arg-type]
        st.session = self.env.child_session(
            world, parent.session, request, node.node_id, self.launch_hook(st)
        )
        return st

    # ---- rubrics and scores --------------------------------------------------------------------
    async def write_rubric(self, parent: _AgentState, request: LaunchRequest, node: Node) -> Any:
        ctx = RubricContext(
            parent_task=parent.node.goal,
            parent_depth=parent.node.depth,
            child_depth=parent.node.depth + 1,
            fork_step=parent.step_index,
            parent_messages=list(parent.messages),
            parent_action=parent.reply,
            pre_call_state=parent.world.describe(),
            delegated_goal=request.goal,
            child_tools=self.env.tools_description or self.env.name,
            child_max_steps=request.max_steps,
            delegated_context=request.context,
        )
        sampling = SamplingParams(
            max_new_tokens=self.cfg.rubric_max_new_tokens,
            temperature=self.cfg.rubric_temperature,
            seed=_seed(self.cfg.seed, node.node_id, -1),
        )
        call = await self.call(
            "rubric",
            build_rubric_messages(ctx),
            sampling,
            parent.session,
            {"node_id": node.node_id, "depth": node.depth},
        )
        node.rubric_call = call
        try:
            rubric = parse_rubric(call.text)
        except RubricParseError as e:
            node.rubric_error = str(e)
            return None
        node.rubric = rubric.to_dict()
        return rubric

    async def score_child(self, rubric: Any, request: LaunchRequest, child: _AgentState) -> None:
        node = child.node
        if rubric is None:
            return
        messages = build_score_messages(
            rubric, request.goal, serialise_trajectory(node), child.world.describe()
        )
        sampling = SamplingParams(max_new_tokens=self.cfg.score_max_new_tokens, temperature=0.0)
        call = await self.call(
            "score",
            messages,
            sampling,
            child.session,
            {"node_id": node.node_id, "depth": node.depth, "child_success": node.success},
        )
        node.score_call = call
        try:
            score = parse_score(call.text)
        except ScoreParseError as e:
            node.score_error = str(e)
            return
        node.score, node.score_success = float(score.final_score), bool(score.success)

    # ---- delegation ----------------------------------------------------------------------------
    def launch_hook(self, parent: _AgentState):
        async def launch(request: LaunchRequest) -> ChildResult:
            if parent.node.depth + 1 > self.cfg.max_depth:
                parent.refused += 1
                return ChildResult(
                    request=request,
                    returned=False,
                    refused=True,
                    error=(
                        f"Launch refused: this agent is at depth {parent.node.depth} and the maximum depth is "
                        f"{self.cfg.max_depth}, so it cannot delegate. Do the work yourself."
                    ),
                )
            request = LaunchRequest(
                goal=request.goal,
                context=request.context,
                max_steps=min(request.max_steps, self.cfg.max_steps),
                targets=request.targets,
            )
            if self.cfg.best_of_n > 1 and not parent.in_branch:
                return await self.launch_best_of_n(parent, request)
            k = self.cfg.counterfactual_k
            if k > 1 and not parent.in_branch and self.envs_used + (k - 1) <= self.cfg.max_envs_per_rollout:
                return await self.launch_counterfactual(parent, request, k)
            return await self.launch_one(parent, request)

        return launch

    async def launch_one(self, parent: _AgentState, request: LaunchRequest) -> ChildResult:
        node = self.new_child_node(parent, request)
        parent.launched.append(node.node_id)
        rubric = await self.write_rubric(parent, request, node) if self.cfg.use_rubrics else None
        child = self.start_child(parent, node, request, parent.world, parent.in_branch)
        await self.run_agent(child)
        if self.cfg.use_rubrics:
            await self.score_child(rubric, request, child)
        return _result(request, node)

    async def launch_counterfactual(self, parent: _AgentState, request: LaunchRequest, k: int) -> ChildResult:
        """K branches of one child from one snapshot; branch 0 is the live one (committed)."""
        self.envs_used += k - 1
        self.n_groups += 1
        group = f"g{self.n_groups}"
        snapshot = parent.world.fork()
        worlds = [parent.world] + [snapshot.fork() for _ in range(k - 1)]
        nodes = [self.new_child_node(parent, request, suffix="" if b == 0 else f"~b{b}") for b in range(k)]
        parent.launched.append(nodes[0].node_id)
        rubric = await self.write_rubric(parent, request, nodes[0]) if self.cfg.use_rubrics else None
        children = []
        for b, (node, world) in enumerate(zip(nodes, worlds, strict=True)):
            node.branch_group, node.branch_index, node.committed = group, b, b == 0
            if b > 0:  # one rubric per group, written from the pre-delegation context only
                node.rubric, node.rubric_error = nodes[0].rubric, nodes[0].rubric_error
            children.append(self.start_child(parent, node, request, world, in_branch=b > 0))
        await asyncio.gather(*(self.run_agent(c) for c in children))
        for c in children:
            c.node.branch_label = await self.judge(request, c.node, c.session, c.world)
            if self.cfg.use_rubrics:
                await self.score_child(rubric, request, c)
        return _result(request, nodes[0])

    async def launch_best_of_n(self, parent: _AgentState, request: LaunchRequest) -> ChildResult:
        """Test-time selection: n candidates on forks, one frozen rubric, commit the best."""
        n = self.cfg.best_of_n
        # Candidates of sibling launches on one world run one group at a time, so commits never interleave.
        async with self.commit_locks.setdefault(id(parent.world), asyncio.Lock()):
            self.n_groups += 1
            group = f"bo{self.n_groups}"
            snapshot = parent.world.fork()
            worlds = [snapshot.fork() for _ in range(n)]
            nodes = [
                self.new_child_node(parent, request, suffix="" if b == 0 else f"~c{b}") for b in range(n)
            ]
            rubric = await self.write_rubric(parent, request, nodes[0]) if self.cfg.use_rubrics else None
            children = []
            for b, (node, world) in enumerate(zip(nodes, worlds, strict=True)):
                node.branch_group, node.branch_index = group, b
                if b > 0:
                    node.rubric, node.rubric_error = nodes[0].rubric, nodes[0].rubric_error
                children.append(self.start_child(parent, node, request, world, in_branch=False))
            await asyncio.gather(*(self.run_agent(c) for c in children))
            for c in children:
                if self.cfg.use_rubrics:
                    await self.score_child(rubric, request, c)
            scores = [c.node.score if c.node.score is not None else -1.0 for c in children]
            best = max(range(n), key=lambda b: (scores[b], -b))  # ties -> lowest index
            if scores[best] <= scores[0]:
                best = 0
            for b, c in enumerate(children):
                c.node.committed = b == best
                if b != best:
                    _mark_subtree_uncommitted(self.tree, c.node.node_id)
            parent.world.commit(worlds[best])
            parent.launched.append(nodes[best].node_id)
            return _result(request, nodes[best])


def _result(request: LaunchRequest, node: Node) -> ChildResult:
    return ChildResult(
        request=request,
        returned=node.finished,
        message=node.finish_message or "",
        steps_used=node.steps_used,
        error=node.error,
    )


def _mark_subtree_uncommitted(tree: Tree, node_id: str) -> None:
    for n in tree.nodes.values():
        if n.node_id == node_id or n.node_id.startswith(node_id + "."):
            n.committed = False


def _seed(base: int, node_id: str, step: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{base}/{node_id}/{step}".encode()).digest()[:4], "little")


async def run_root(
    task: dict[str, Any],
    env: Environment,
    policy: Policy,
    config: RuntimeConfig | None = None,
    judge: Judge = programmatic_judge,
) -> Tree:
    """Run one root rollout of ``task`` and return its recorded tree (see the module docstring)."""
    cfg = config or RuntimeConfig()
    t0 = time.perf_counter()
    ro = _Rollout(env, policy, cfg, task, judge)
    world = env.make_world(task)
    root = Node(
        node_id="0",
        parent_id=None,
        depth=0,
        fork_step=None,
        goal=str(task.get("goal") or task.get("task_description") or ""),
        max_steps=int(task.get("max_steps") or cfg.max_steps),
    )
    root.max_steps = min(root.max_steps, cfg.max_steps)
    ro.tree.nodes[root.node_id] = root
    st = _AgentState(node=root, session=None, world=world)  # type: ignore[arg-type]
    st.session = env.root_session(world, task, ro.launch_hook(st))
    await ro.run_agent(st)
    try:
        ro.tree.success = bool(world.root_success()) and root.error is None
    except Exception as e:
        ro.tree.success, root.error = False, root.error or f"{type(e).__name__}: {e}"
    root.success = ro.tree.success
    ro.tree.seconds = time.perf_counter() - t0
    ro.tree.meta = {
        "counterfactual_groups": ro.n_groups if cfg.counterfactual_k > 1 else 0,
        "envs_used": ro.envs_used,
    }
    return ro.tree


def run_root_sync(
    task: dict[str, Any],
    env: Environment,
    policy: Policy,
    config: RuntimeConfig | None = None,
    judge: Judge = programmatic_judge,
) -> Tree:
    """Blocking wrapper of :func:`run_root` for scripts and the CLI."""
    return asyncio.run(run_root(task, env, policy, config, judge))
