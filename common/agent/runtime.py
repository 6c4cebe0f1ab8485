"""The recursive agent runtime (SPEC.md §1, §3 and §5 test-time selection), shared by every tier.

``await run_root(task, env, policy, config)`` runs one root rollout and returns a recorded :class:`Tree`:

1. The root agent gets the task's system prompt and first message and takes up to ``max_steps`` steps
   (one model call = one step). Each reply goes to the environment session, whose observation becomes
   the next user message. Before EVERY model call (act, rubric, score) the prompt is cut to
   ``max_prompt_tokens`` by ``common.policy.context.fit_prompt`` (oldest turns first; the policy's
   tokenizer when it has one, else the public code's characters-per-token estimate), so every backend
   honours the paper's caps. The messages actually sent are what is recorded.
2. When a reply delegates, the session calls the runtime's *launch hook* once per launch (siblings
   launched in one step run concurrently; together they are one delegation event). The hook
   a. refuses launches past ``max_depth`` with an explanatory string (the caller paid its step),
   b. asks the policy for a rubric in a fresh chat, parses it and FREEZES it on the child node. The
      rubric writer sees only what the parent saw: its prompt messages at the delegating step, its
      delegating reply, and its own view of the environment (``AgentSession.visible_state()``, by
      default the parent's last observation) - never ``World.describe()``. That chat is built before the
      child starts; the call is in flight while the child runs (the child never sees the rubric), and the
      child's result goes back to its parent without waiting for it,
   c. runs the child agent on the same live world with its own step budget (recursively),
   d. asks the policy to score the finished child against the frozen rubric (fresh chat, greedy; the
      payload holds the child's trajectory and the child's own final view of the environment, both taken
      when the child ends); the score call (once the rubric is frozen) runs while the parent goes on, and
      the tree waits for every score before it ends (``_Rollout.defer`` / ``drain``),
   e. returns the child's result to the parent's session, which turns it into text.
3. Counterfactual branches (Rubric-stage rollouts, ``counterfactual_k > 1``), as the public
   ``CounterfactualCollector``: at a delegation the live world is snapshotted and ALL K branches of the
   same child (same goal, same frozen rubric) run concurrently on isolated forks of the snapshot; when
   every branch has ended, branch 0's final world is committed to the parent's world (branch 0 is the
   "committed" branch) and the parent is told branch 0's finish message (else its error, else that it
   ran out of steps or completed: :meth:`_Rollout.branch_message`) followed by
   ``Selected branch: 0; counterfactual branches collected: K.`` (``counterfactual_report.txt``). Every
   branch then gets a verified label and a score, all K judge and K score calls in one concurrent wave.
4. Test-time selection (``best_of_n > 1``, public ``TestTimeScale/textworld_bestofn``): every delegation
   reserves ``best_of_n`` forks from the task's budget (``max_forks_per_task``, 32; when it is spent the
   launch is refused with a message), clones the world ``best_of_n`` times, runs every candidate subtree
   to completion (nested delegations select the same way, bottom-up) with its agents sampled at
   ``candidate_temperature`` (1.0, even when the evaluation temperature is 0), then picks one by
   ``selection_mode`` and commits that clone to the live world:
   ``first`` = candidate 0; ``random`` = a seeded uniform pick; ``oracle`` = the first candidate the
   judge labels successful; ``rubric`` = one rubric written BEFORE the candidates run (temperature
   ``selection_rubric_temperature`` = 0), each candidate scored against it, the highest valid score
   wins. Ties, invalid scores and failures go to candidate 0 (:func:`select_candidate`).

Exceptions inside an agent end that agent with a recorded error (reward 0), never the process.

What this simplifies: one asyncio event loop per rollout; concurrency across rollouts is the caller's
job (``asyncio.gather`` of several ``run_root``), batching across agents is the policy backend's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from common.agent.prompts import load_templates, render
from common.agent.rubric import (
    RUBRIC_TEMPLATES,
    SCORE_TEMPLATES,
    Rubric,
    RubricContext,
    RubricParseError,
    ScoreParseError,
    build_rubric_messages,
    build_score_messages,
    delegated_task,
    parse_rubric,
    parse_score,
    score_budget,
    trajectory_payload,
)
from common.agent.tree import CallRecord, Node, Step, Tree
from common.envs.base import (
    AgentSession,
    ChildResult,
    Environment,
    LaunchBoundError,
    LaunchRequest,
    World,
)
from common.policy.base import Completion, GenerationRequest, Policy, SamplingParams
from common.policy.context import (
    PAPER_CAPS,
    RUBRIC_MAX_NEW_TOKENS,
    SCORE_MAX_NEW_TOKENS,
    SELECTION_SCORE_MAX_NEW_TOKENS,
    fit_prompt,
)

SelectionMode = Literal["first", "random", "oracle", "rubric"]
SELECTION_MODES: tuple[str, ...] = ("first", "random", "oracle", "rubric")
RUNTIME_TEMPLATES = {
    "counterfactual_report": frozenset({"message", "k"}),
    "fork_budget": frozenset(),
    "launch_limit": frozenset({"reason"}),
}
"""The runtime's own model-visible texts (common/agent/prompts/*.txt; ``--prompts-dir`` replaces them):
``counterfactual_report``, what a parent's launch returns after a counterfactual group (public
``CounterfactualCollector``, ``verbose=True``: branch 0's finish message, else its error, else ``Subagent
branch 0 completed.``, then the group size, no budget line); ``fork_budget``, what a parent is told when
test-time selection has no forks left for its launch (public wording); ``launch_limit``, what a launch past
``max_launches_per_step`` / ``max_agents_per_tree`` returns (ours: the public code has no such bound)."""
RUNTIME_TEMPLATES |= {
    "branch_exhausted": frozenset(),
    "branch_completed": frozenset({"branch"}),
    "branch_depth_refusal": frozenset({"max_depth"}),
}
"""Texts of a Rubric-stage rollout (public ``CounterfactualCollector``): ``branch_exhausted``, the committed
branch's message when it used its whole step budget without finishing (platoon ``halt_episode``'s error
message); ``branch_completed``, when it ended otherwise without a message or an error; ``branch_depth_refusal``,
what a launch past ``max_depth`` returns in a Rubric-stage rollout when the branch the agent runs under is at
the limit (:meth:`_Rollout.refusal_at_depth`)."""


@dataclass
class RuntimeConfig:
    """How one recursive rollout runs (SPEC.md §1, §3, §5). The one place that defines runtime fields."""

    max_steps: int = 20
    """Step budget of every agent (root and children); one model call is one step."""
    max_depth: int = 3
    """A launch from depth d is allowed iff d + 1 <= max_depth."""
    max_prompt_tokens: int = PAPER_CAPS["textcraft"].max_prompt_tokens
    """Prompt cap of every model call, enforced by the runtime for every backend; oldest turns are dropped
    first (paper: 9,728 TextCraft at evaluation / 9,600 in training, 10,240 TextWorld; ``PAPER_CAPS``)."""
    max_new_tokens: int = PAPER_CAPS["textcraft"].max_new_tokens
    """Output cap per agent step (512 TextCraft, 3,072 TextWorld)."""
    temperature: float = 1.0
    """Sampling temperature of agent steps (0 = greedy, the evaluation protocol)."""
    stop: tuple[str, ...] = ()
    """Stop strings of agent steps (TextCraft: ``</python>``)."""
    use_rubrics: bool = True
    """Write a rubric before each child and score it after (False: RAO, binary per-node rewards)."""
    rubric_max_new_tokens: int = RUBRIC_MAX_NEW_TOKENS
    """Output cap of a rubric-generation call."""
    rubric_temperature: float = 1.0
    """Rubrics are sampled in training (the rubric writer is trained); scoring is always greedy."""
    score_max_new_tokens: int = SCORE_MAX_NEW_TOKENS
    """Output cap of a scoring call."""
    branch_score_max_new_tokens: int | None = None
    """Output cap of the scoring calls of counterfactual branches (Rubric-stage rollouts); None: the same as
    ``score_max_new_tokens``. The paper profile: 512 on TextWorld, 1,024 on TextCraft (public
    ``Scripts/Main/*/sera.sh``: ``rubric_generation_ranking.max_scoring_tokens``)."""
    counterfactual_k: int = 1
    """Branches per delegation in Rubric-stage rollouts (1 = off; 4 in level 0, 8 in the paper)."""
    max_envs_per_rollout: int = 16
    """Environment budget of counterfactual branches per root rollout, the root's own included: a launch (in a
    branch too) forms a group of K new environments while fewer than this many exist (public soft cap:
    16 = 1 -> 9 -> 17, 2 groups of K=8; K=4: 4 groups)."""
    best_of_n: int = 1
    """Test-time selection: candidates per delegation (1 = off; the paper reports N=2)."""
    selection_mode: SelectionMode = "rubric"
    """Test-time selection rule: first | random | oracle (the judge's label) | rubric (the policy's score)."""
    max_forks_per_task: int = 32
    """Test-time selection: forked worlds per task (root rollout); a launch that would pass it is refused."""
    candidate_temperature: float = 1.0
    """Test-time selection: sampling temperature of every agent inside a candidate subtree."""
    selection_rubric_temperature: float = 0.0
    """Test-time selection: temperature of the one rubric written per delegation (greedy in the paper)."""
    selection_score_max_new_tokens: int = SELECTION_SCORE_MAX_NEW_TOKENS
    """Test-time selection: output cap of a candidate's scoring call (512 in the public selector)."""
    prompts_dir: str | None = None
    """A directory of prompt templates replacing the packaged rubric/score ones (``--prompts DIR``)."""
    seed: int = 0
    """Base seed passed to the policy per call (combined with the node id and step)."""
    # Public: platoon's run_episode puts each agent.act and env.step under asyncio.wait_for(timeout=...); its
    # 300 s default is overridden by every SERA caller with the configs' step_timeout: 1800
    # (Training/configs/textcraft.yaml, textworld.yaml; the TextCraft evaluator's step_timeout = 1800; sera.sh
    # gives rubric and score calls 1800 s), inside the rollout's timeout: 3600 (tree_timeout_s).
    step_timeout_s: float = 1800.0
    """Deadline of every model call (act, rubric, score) and of every environment step of an agent, the
    children it launches in that step included (the public configs' 1,800 s). A step past it ends that agent
    with an error (reward 0), its call cancelled, and the console says so in a ``[deadline]`` line. It is
    there to end hangs: on a slow machine raise it rather than lower it."""
    tree_timeout_s: float = 3600.0
    """Deadline of one root rollout (the public configs' ``timeout: 3600``; as there, two 1,800 s steps can
    fill it): past it the whole tree is cancelled and recorded with ``meta["deadline"]``; a training round
    drops and replaces its task group."""
    group_timeout_s: float = 3600.0
    """Deadline of one task group's rollouts in training (the paper's 3,600 s per group): every tree of the
    group still running then is cancelled (``meta["deadline"] = "group"``) and the group is replaced."""
    cancel_grace_s: float = 30.0
    """After a tree's deadline, how long its cancelled agents get to wind down (the paper's 30 s grace)."""
    max_launches_per_step: int = 10
    """Launches one agent may make in one step (one CodeAct cell, one TextWorld ``<delegate>`` block); past
    it a launch is refused with a message, as at the depth limit. 0: no bound (the public code has none, and
    ``--paper`` sets 0). Ours, a departure listed in every run's ``departures``: a cell looping on
    ``launch_subagent`` ran 300 children; the paper's tasks need at most a few per step."""
    max_agents_per_tree: int = 200
    """Agents (nodes) one root rollout may create, every branch and candidate counted; past it a launch is
    refused with a message. 0: no bound (the public code has none; ``--paper`` sets 0). Ours, a departure:
    bounds a tree that delegates at every step of every agent (3 launches per step at depth 3 made 820
    agents)."""

    def __post_init__(self) -> None:
        from common.config import check_choices, check_ranges

        check_choices(self)
        check_ranges(
            [
                ("max_steps", self.max_steps, 1),
                ("max_depth", self.max_depth, 0),
                ("max_prompt_tokens", self.max_prompt_tokens, 1),
                ("max_new_tokens", self.max_new_tokens, 1),
                ("temperature", self.temperature, 0),
                ("rubric_max_new_tokens", self.rubric_max_new_tokens, 1),
                ("rubric_temperature", self.rubric_temperature, 0),
                ("score_max_new_tokens", self.score_max_new_tokens, 1),
                (
                    "branch_score_max_new_tokens",
                    1 if self.branch_score_max_new_tokens is None else self.branch_score_max_new_tokens,
                    1,
                ),
                ("counterfactual_k", self.counterfactual_k, 1),
                ("max_envs_per_rollout", self.max_envs_per_rollout, 1),
                ("best_of_n", self.best_of_n, 1),
                ("max_forks_per_task", self.max_forks_per_task, 1),
                ("candidate_temperature", self.candidate_temperature, 0),
                ("selection_rubric_temperature", self.selection_rubric_temperature, 0),
                ("selection_score_max_new_tokens", self.selection_score_max_new_tokens, 1),
                ("cancel_grace_s", self.cancel_grace_s, 0),
                ("max_launches_per_step", self.max_launches_per_step, 0),
                ("max_agents_per_tree", self.max_agents_per_tree, 0),
            ],
            positives=[
                (n, getattr(self, n)) for n in ("step_timeout_s", "tree_timeout_s", "group_timeout_s")
            ],
        )
        if self.best_of_n > 1 and self.max_forks_per_task < self.best_of_n:
            raise ValueError(
                f"max_forks_per_task={self.max_forks_per_task} is below best_of_n={self.best_of_n}: "
                "not even one delegation could be selected"
            )
        if self.prompts_dir:  # a bad template fails here, with its file:line, not inside every rollout
            load_templates({**RUBRIC_TEMPLATES, **SCORE_TEMPLATES, **RUNTIME_TEMPLATES}, self.prompts_dir)

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


Judge = Callable[[LaunchRequest, Node, AgentSession, World], Awaitable[bool | None]]
"""Labels a branch: did the child complete its assigned goal? (programmatic by default; None = no verdict)"""


async def programmatic_judge(request: LaunchRequest, node: Node, session: AgentSession, world: World) -> bool:
    """The default label: the environment's own check of the child's goal (TextCraft: finish called and
    the targets crafted; TextWorld-Sync: the delegated dish progressed as asked)."""
    return bool(session.success())


def select_candidate(
    mode: str, scores: Sequence[float | None], labels: Sequence[bool | None], rng: random.Random
) -> int:
    """The committed candidate of one test-time selection group (public ``rubric_selector.py``).

    ``scores``: each candidate's rubric score (None = invalid or not scored); ``labels``: each candidate's
    judge label (None = not judged). Ties, invalid scores and failures go to candidate 0.

    >>> rng = random.Random(0)
    >>> select_candidate("rubric", [0.2, 0.9], [None, None], rng), select_candidate("rubric", [0.5, 0.5], [], rng)
    (1, 0)
    >>> select_candidate("rubric", [None, None], [], rng), select_candidate("oracle", [], [False, True, True], rng)
    (0, 1)
    """
    if mode == "first":
        return 0
    if mode == "random":
        return rng.randrange(max(len(scores), len(labels)))
    if mode == "oracle":
        return next((i for i, ok in enumerate(labels) if ok is True), 0)
    if mode != "rubric":
        raise ValueError(f"unknown selection mode {mode!r}; choose one of {', '.join(SELECTION_MODES)}")
    valid = [(s, i) for i, s in enumerate(scores) if s is not None]
    if not valid:
        return 0
    top = max(s for s, _ in valid)
    return min(i for s, i in valid if s == top)


@dataclass
class _AgentState:
    """Runtime-private state of a running agent (never serialised)."""

    node: Node
    session: AgentSession
    world: World
    temperature: float = 1.0
    """Sampling temperature of this agent's steps (candidates of test-time selection: 1.0)."""
    messages: list[dict[str, str]] = field(default_factory=list)
    """The full chat so far (the prompt of the next step before the cap)."""
    sent: list[dict[str, str]] = field(default_factory=list)
    """The messages actually sent at the current step (after the cap): what the agent saw."""
    last_observation: str = ""
    reply: str = ""
    task_text: str = ""
    """A child's whole task: its goal and the context its parent passed (:func:`delegated_task`); the
    scorer's delegated task and ``task_goal``, and the ``[Parent Task]`` of its own children."""
    step_index: int = 0
    launched: list[str] = field(default_factory=list)
    refused: int = 0
    n_children: int = 0
    in_branch: bool = False
    attempts: int = 0
    """Launches asked for in step ``attempts_step`` (refused ones included): ``max_launches_per_step``."""
    attempts_step: int = -1


class _Rollout:
    """All state of one root rollout."""

    def __init__(self, env: Environment, policy: Policy, cfg: RuntimeConfig, task: dict, judge: Judge):
        self.env, self.policy, self.cfg, self.task, self.judge = env, policy, cfg, task, judge
        self.tokenizer = getattr(policy, "tokenizer", None)
        self.tree = Tree(
            task_id=str(task.get("id", task.get("task_id", ""))), env=env.name, config_hash=cfg.hash()
        )
        self.envs_used = 1
        self.n_groups = 0
        self.forks_used = 0
        self.fork_refusals = 0
        self.truncated_calls = 0
        self.commit_locks: dict[int, asyncio.Lock] = {}
        self.pending: list[asyncio.Future] = []  # deferred score calls (defer / drain)
        self.texts = load_templates(RUNTIME_TEMPLATES, cfg.prompts_dir)

    async def within(self, work: Awaitable[Any], timeout: float, late: str) -> Any:
        """``await work`` for at most ``timeout`` s, in this task (as ``asyncio.timeout``: no new task, so
        sibling agents interleave exactly as without a deadline), but what is in flight is reported BEFORE
        it is cancelled: past the deadline, :meth:`report_stuck` with ``late``, cancel, raise ``TimeoutError``."""
        task = asyncio.current_task()
        fired = False

        def expire() -> None:
            nonlocal fired
            fired = True
            self.report_stuck(late)
            task.cancel()

        timer = asyncio.get_running_loop().call_later(timeout, expire)
        try:
            return await work
        except asyncio.CancelledError:
            if not fired:  # cancelled from above (Ctrl-C, a deadline further up): not ours to turn
                raise
            uncancel = getattr(task, "uncancel", None)  # Python >= 3.11: this cancel is handled here
            if uncancel is not None:
                uncancel()
            raise asyncio.TimeoutError(late) from None
        finally:
            timer.cancel()

    async def run_with_deadline(self, work: Awaitable[None], timeout: float) -> bool:
        """Run ``work`` (a root agent) for at most ``timeout`` s; True when it finished in time."""
        try:
            await self.within(work, timeout, f"tree past its deadline ({timeout:.0f} s)")
        except asyncio.TimeoutError:
            return False
        return True

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
        sent, _, truncated = fit_prompt(messages, self.prompt_cap(sampling.max_new_tokens), self.tokenizer)
        self.truncated_calls += int(truncated)
        request = GenerationRequest(messages=sent, sampling=sampling, role=role, session=session, meta=meta)
        late = f"{role} call of node {meta.get('node_id')} past {self.cfg.step_timeout_s:g} s"
        try:
            comp: Completion = await self.within(self.policy.generate(request), self.cfg.step_timeout_s, late)
        except asyncio.TimeoutError:
            raise DeadlineError(
                f"the {role} call did not return within {self.cfg.step_timeout_s:g} s (--step-timeout-s)"
            ) from None
        return CallRecord(
            role=role,
            messages=[dict(m) for m in sent],
            text=comp.text,
            prompt_ids=list(comp.prompt_ids),
            output_ids=list(comp.output_ids),
            logprobs=list(comp.logprobs),
            sampling=asdict(sampling),
            finish_reason=comp.finish_reason,
            prompt_truncated=truncated or comp.prompt_truncated,
            seconds=time.perf_counter() - t0,
        )

    def report_stuck(self, reason: str) -> None:
        """A deadline fired: the policy (``CountingPolicy`` in the training loops) writes what is in flight
        to the run directory."""
        dump = getattr(self.policy, "report_stuck", None)
        if callable(dump):
            try:
                dump(f"{self.tree.task_id}: {reason}")
            except Exception:  # noqa: BLE001 - a diagnostic never ends a rollout
                pass

    def act_sampling(self, st: _AgentState, step: int) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.cfg.max_new_tokens,
            temperature=st.temperature,
            stop=self.cfg.stop,
            seed=_seed(self.cfg.seed, st.node.node_id, step),
        )

    # ---- agents --------------------------------------------------------------------------------
    async def run_agent(self, st: _AgentState) -> None:
        node, session = st.node, st.session
        t0 = time.perf_counter()
        try:
            first = session.first_user_message()
            st.messages = [
                {"role": "system", "content": session.system_prompt()},
                {"role": "user", "content": first},
            ]
            st.last_observation = first
            for i in range(node.max_steps):
                if getattr(session, "done", False):  # the shared world ended (another agent finished it)
                    break
                st.step_index, st.launched, st.refused = i, [], 0
                refresh = getattr(session, "refresh_first_message", None)  # TextWorld evaluation (public)
                fresh = refresh() if refresh is not None else None
                if fresh is not None:
                    st.messages = [st.messages[0], {"role": "user", "content": fresh}, *st.messages[2:]]
                call = await self.call(
                    "act",
                    st.messages,
                    self.act_sampling(st, i),
                    session,
                    {"node_id": node.node_id, "depth": node.depth, "step": i},
                )
                st.sent, st.reply = call.messages, call.text
                late = f"step {i} of node {node.node_id} past {self.cfg.step_timeout_s:g} s"
                try:
                    result = await self.within(session.step(call.text), self.cfg.step_timeout_s, late)
                except asyncio.TimeoutError:  # the public loop records no step for it: no datum
                    raise DeadlineError(
                        f"step {i}: the environment step (its children included) did not finish within "
                        f"{self.cfg.step_timeout_s:g} s (--step-timeout-s)"
                    ) from None
                node.steps.append(
                    Step(
                        index=i,
                        call=call,
                        observation=result.observation,
                        launched=list(st.launched),
                        refused_launches=st.refused,
                        # the cell's output and error slot (TextCraft sets them): the error-step filter
                        cell_output=str(result.info.get("cell_output") or ""),
                        cell_error=str(result.info.get("cell_error") or ""),
                    )
                )
                rebuild = getattr(session, "assistant_turn", None)  # e.g. TextCraft: from the parsed parts
                st.messages = st.messages + [
                    {"role": "assistant", "content": rebuild(call.text) if rebuild else call.text},
                    {"role": "user", "content": result.observation},
                ]
                st.last_observation = result.observation
                if result.error:
                    node.error = result.error
                    break
                if result.done:
                    node.finished = result.finish_message is not None
                    node.finish_message = result.finish_message
                    break
        except asyncio.CancelledError:  # a deadline above this agent (its parent's step, its tree) cut it
            node.error = (
                node.error or "cancelled: a deadline above this agent (its parent's step or its tree)"
            )
            node.seconds = time.perf_counter() - t0
            raise
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
        self,
        parent: _AgentState,
        node: Node,
        request: LaunchRequest,
        world: World,
        in_branch: bool,
        temperature: float | None = None,
    ) -> _AgentState:
        st = _AgentState(
            node=node,
            session=None,  # type: ignore[arg-type]
            world=world,
            in_branch=in_branch,
            temperature=parent.temperature if temperature is None else temperature,
            task_text=delegated_task(request.goal, request.context, self.cfg.prompts_dir),
        )
        st.session = self.env.child_session(
            world, parent.session, request, node.node_id, self.launch_hook(st)
        )
        st.session.counterfactual_rollout = self.cfg.counterfactual_k > 1
        # public current_branch: a counterfactual branch runs at its own depth; an ordinary child (launched
        # once the environment budget is spent) keeps the depth of the branch (or root) it runs under
        counterfactual = self.cfg.counterfactual_k > 1 and node.branch_group is not None
        st.session.branch_depth = node.depth if counterfactual else getattr(parent.session, "branch_depth", 0)
        return st

    # ---- rubrics and scores --------------------------------------------------------------------
    @staticmethod
    def visible_state(st: _AgentState) -> Any:
        """The environment as agent ``st`` sees it (never hidden state): the session's own
        ``visible_state()``, else its last observation."""
        state = st.session.visible_state() if hasattr(st.session, "visible_state") else None
        return {"observation": st.last_observation} if state is None else state

    def final_state(self, child: _AgentState, stage: str) -> Any:
        """The score payload's ``final_environment_state``: the child's own view at its end
        (:meth:`visible_state`). Exception: an Execution-stage child (``stage == "execution"``) that ended
        without a non-empty finish message, in an environment whose session sets
        ``score_state_needs_finish = True``, gets ``{}`` (public TextCraft ``adapters/textcraft.py:
        final_state_from_trajectory`` reads the inventory of the step where ``finish()`` got a message, else
        returns ``{}``). Counterfactual branches (``"branch"``: public, the branch's snapshot) and test-time
        candidates (``"selection"``) always get the view."""
        if stage == "execution" and getattr(child.session, "score_state_needs_finish", False):
            if not child.node.finish_message:
                return {}
        return self.visible_state(child)

    def prompt_cap(self, max_new_tokens: int) -> int:
        """The prompt cap of a call that may write ``max_new_tokens``: an agent step's context
        (``max_prompt_tokens + max_new_tokens``) less this call's output cap, at least 1 (public
        ``three_stage_train/policy_client.py: ArealPolicyClient.generate_batch``: ``max_prompt_tokens +
        default_completion_tokens - max_completion_tokens``). An agent step gets ``max_prompt_tokens``; a
        1,024-token rubric call of a paper TextCraft run 9,600 + 512 - 1,024 = 9,088."""
        return max(1, self.cfg.max_prompt_tokens + self.cfg.max_new_tokens - max_new_tokens)

    def branch_message(self, node: Node) -> str:
        """What a counterfactual group tells the parent about its committed branch (public
        ``CounterfactualCollector``: the finish message, else the error message, else ``Subagent branch i
        completed.``). A branch that used its whole step budget without finishing carries platoon's budget
        warning as its error message (``episode/loop.py: halt_episode``): ``branch_exhausted.txt``."""
        if node.finish_message:
            return node.finish_message
        if node.error:
            return node.error
        if node.steps_used >= node.max_steps:
            return self.texts["branch_exhausted"]
        return render(self.texts["branch_completed"], branch=node.branch_index or 0)

    def refusal_at_depth(self, parent: _AgentState) -> Callable[[LaunchRequest, int, int], str] | None:
        """How a launch past ``max_depth`` is refused: ``(request, depth, max_depth) -> text``. The
        environment's own ``session.depth_refusal`` (public: the step-budget tracker's ``Not enough budget
        to launch subagent ...``), except in a Rubric-stage rollout (``counterfactual_k > 1``) when the
        depth of the branch the agent runs under (``session.branch_depth``, public ``current_branch``: the
        root's 0 or a counterfactual branch's own depth; an ordinary child keeps its parent's) has reached
        ``max_depth``: every launch first reaches the public ``CounterfactualCollector``, which then refuses
        with its own text, the session's ``counterfactual_depth_refusal`` when it has one (public TextWorld
        ``textworld_two_stage_rollout.py``), else ``branch_depth_refusal.txt`` (public TextCraft
        ``counterfactual.py``). An ordinary agent deeper than its branch passes the collector's check (its
        launch falls through to ``launch_subagent_default``) and meets the tracker's refusal."""
        branch_depth = getattr(parent.session, "branch_depth", 0)
        if self.cfg.counterfactual_k <= 1 or branch_depth + 1 <= self.cfg.max_depth:
            return getattr(parent.session, "depth_refusal", None)
        own = getattr(parent.session, "counterfactual_depth_refusal", None)
        text = self.texts["branch_depth_refusal"]
        return own or (lambda _request, _depth, max_depth: render(text, max_depth=max_depth))

    def rubric_messages(
        self,
        parent: _AgentState,
        request: LaunchRequest,
        selection_index: int | None = None,
    ) -> list[dict[str, str]]:
        """The rubric writer's chat, built NOW from what the parent sees before its child runs (the parent's
        prompt messages at the delegating step, its reply, its own view of the environment).
        ``selection_index``: at test time, which delegation of the parent's step this is; the metadata
        then numbers the fork step ``step * 100 + index`` and names the parent ``parent_agent_id`` (public
        ``evaluator.py`` / ``rubric_selector.py``)."""
        ctx = RubricContext(
            parent_task=parent.task_text or parent.node.goal,
            parent_depth=parent.node.depth,
            child_depth=parent.node.depth + 1,
            fork_step=parent.step_index
            if selection_index is None
            else parent.step_index * 100 + selection_index,
            parent_messages=list(parent.sent),
            parent_action=parent.reply,
            pre_call_state=self.visible_state(parent),
            delegated_goal=request.goal,
            child_tools=self.env.tools_description or self.env.name,
            child_max_steps=request.max_steps,
            delegated_context=request.context,
            parent_agent_id=parent.node.node_id,
            test_time=selection_index is not None,
        )
        return build_rubric_messages(ctx, self.cfg.prompts_dir)

    async def rubric_call(
        self,
        messages: list[dict[str, str]],
        session: AgentSession,
        request: LaunchRequest,
        node: Node,
        temperature: float,
    ) -> Rubric | None:
        """Ask for the rubric of ``messages`` (:meth:`rubric_messages`), parse it and freeze it on ``node``."""
        sampling = SamplingParams(
            max_new_tokens=self.cfg.rubric_max_new_tokens,
            temperature=temperature,
            seed=_seed(self.cfg.seed, node.node_id, -1),
        )
        try:
            call = await self.call(
                "rubric",
                messages,
                sampling,
                session,
                {"node_id": node.node_id, "depth": node.depth, "goal": request.goal},
            )
        except DeadlineError as e:  # no rubric: the child runs unscored, as after an unparseable one
            node.rubric_error = str(e)
            return None
        node.rubric_call = call
        try:
            rubric = parse_rubric(call.text)
        except RubricParseError as e:
            node.rubric_error = str(e)
            return None
        node.rubric = rubric.to_dict()
        return rubric

    async def write_rubric(
        self,
        parent: _AgentState,
        request: LaunchRequest,
        node: Node,
        temperature: float,
        selection_index: int | None = None,
    ) -> Rubric | None:
        """:meth:`rubric_messages` then :meth:`rubric_call`, one after the other (test-time selection)."""
        messages = self.rubric_messages(parent, request, selection_index)
        return await self.rubric_call(messages, parent.session, request, node, temperature)

    async def run_beside_rubric(
        self, parent: _AgentState, request: LaunchRequest, node: Node, work: Awaitable[None]
    ) -> Rubric | None:
        """Run ``work`` (the child, or its K branches) while the rubric of ``node`` is being written.

        The rubric's chat is built first, from the parent's view before the child runs, and the child never
        sees the rubric, so the rubric is as frozen as when it was written first: the two calls only stop
        waiting for each other (the rubric call and the child's first act call are in flight together).
        Without rubrics (RAO) just ``work``."""
        if not self.cfg.use_rubrics:
            await work
            return None
        rubric = self.start_rubric(parent, request, node)
        try:
            await asyncio.sleep(0)  # the rubric call goes out first, then the child's first act call
            await work
            return await rubric
        finally:
            if not rubric.done():  # the child failed or was cancelled: so is its rubric
                rubric.cancel()
                await asyncio.gather(rubric, return_exceptions=True)

    def start_rubric(self, parent: _AgentState, request: LaunchRequest, node: Node) -> asyncio.Future:
        """The rubric call of ``node`` as a task, its chat built now from the parent's view (before the child
        starts); the task's result is the frozen :class:`Rubric` or None."""
        messages = self.rubric_messages(parent, request)
        return asyncio.ensure_future(
            self.rubric_call(messages, parent.session, request, node, self.cfg.rubric_temperature)
        )

    def defer(self, node: Node, work: Awaitable[None]) -> None:
        """Start ``work`` (a score call whose chat is already built) and go on: the parent continues while
        it runs; :meth:`drain` collects it before the tree ends. An exception lands on ``node.score_error``."""

        async def guarded() -> None:
            try:
                await work
            except Exception as e:  # noqa: BLE001 - a failed score leaves the child unscored, as a bad one
                node.score_error = f"{type(e).__name__}: {e}"

        self.pending.append(asyncio.ensure_future(guarded()))

    async def drain(self, cancel: bool = False) -> None:
        """Wait for every deferred call (:meth:`defer`), or with ``cancel`` end them; cancelled while waiting
        (a deadline), it cancels the rest too."""
        try:
            while self.pending and not cancel:
                await self.pending.pop(0)
        finally:
            for t in self.pending:
                t.cancel()
            if self.pending:
                await asyncio.gather(*self.pending, return_exceptions=True)
            self.pending.clear()

    def score_view(
        self, request: LaunchRequest, child: _AgentState, max_new_tokens: int, stage: str
    ) -> Callable[[Rubric], list[dict[str, str]]]:
        """What the scorer sees of the finished ``child``, taken NOW (its trajectory and its own final view of
        the environment, which the parent's next steps may change): a function of the rubric that builds
        the scorer's chat."""
        traj_chars, field_chars = score_budget(self.prompt_cap(max_new_tokens))
        task = child.task_text or request.goal
        payload = trajectory_payload(child.node, traj_chars, field_chars, task_goal=task)
        state = self.final_state(child, stage)
        return lambda rubric: build_score_messages(rubric, task, payload, state, self.cfg.prompts_dir, field_chars)

    def score_messages(
        self, rubric: Rubric, request: LaunchRequest, child: _AgentState, max_new_tokens: int, stage: str
    ) -> list[dict[str, str]]:
        """The scorer's chat for the finished ``child``, built now (:meth:`score_view`)."""
        return self.score_view(request, child, max_new_tokens, stage)(rubric)

    async def score_child(
        self,
        rubric: Rubric | None,
        request: LaunchRequest,
        child: _AgentState,
        max_new_tokens: int,
        stage: str = "execution",
        messages: list[dict[str, str]] | None = None,
    ) -> None:
        """``stage``: ``execution`` (one child), ``branch`` (a counterfactual branch) or ``selection`` (a
        test-time candidate); it picks the final state (:meth:`final_state`). ``messages``: the chat
        :meth:`score_messages` built when the child ended (default: built now)."""
        node = child.node
        if rubric is None:
            return
        if messages is None:
            messages = self.score_messages(rubric, request, child, max_new_tokens, stage)
        sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
        try:
            call = await self.call(
                "score",
                messages,
                sampling,
                child.session,
                {
                    "node_id": node.node_id,
                    "depth": node.depth,
                    "child_success": node.success,
                    "n_items": len(rubric.items),
                },
            )
        except DeadlineError as e:  # unscored, as after an unparseable score
            node.score_error = str(e)
            return
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
            if parent.attempts_step != parent.step_index:  # the first launch of this step
                parent.attempts_step, parent.attempts = parent.step_index, 0
            parent.attempts += 1
            limit = self.launch_limit(parent)
            if limit is not None:
                parent.refused += 1
                self.tree.meta["refused_by_bound"] = self.tree.meta.get("refused_by_bound", 0) + 1
                cap = self.cfg.max_launches_per_step  # 0: no per-step bound (the tree bound refused)
                if cap and parent.attempts > 2 * cap:  # a loop: stop it where it runs
                    raise LaunchBoundError(limit)
                return ChildResult(request=request, returned=False, refused=True, error=limit)
            if parent.node.depth + 1 > self.cfg.max_depth:
                parent.refused += 1
                refusal = self.refusal_at_depth(parent)  # the environment's own text, or the Rubric stage's
                return ChildResult(
                    request=request,
                    returned=False,
                    refused=True,
                    error=refusal(request, parent.node.depth, self.cfg.max_depth)
                    if refusal
                    else (
                        f"Launch refused: this agent is at depth {parent.node.depth} and the maximum depth is "
                        f"{self.cfg.max_depth}, so it cannot delegate. Do the work yourself."
                    ),
                )
            request = LaunchRequest(
                goal=request.goal,
                context=request.context,
                max_steps=request.max_steps  # public TextWorld training: the asked budget, uncapped
                if getattr(parent.session, "uncapped_child_budgets", False)
                else min(request.max_steps, self.cfg.max_steps),
                targets=request.targets,
            )
            if self.cfg.best_of_n > 1 and not parent.in_branch:
                return await self.launch_best_of_n(parent, request)
            k = self.cfg.counterfactual_k
            # public CounterfactualEnvironmentBudget.reserve: any launch, inside branches too, forms a group
            # while fewer than max_envs_per_rollout environments exist (soft cap: the last group may cross it)
            if k > 1 and self.envs_used < self.cfg.max_envs_per_rollout:
                return await self.launch_counterfactual(parent, request, k)
            return await self.launch_one(parent, request)

        return launch

    def launch_limit(self, parent: _AgentState) -> str | None:
        """The refusal text when a launch passes ``max_launches_per_step`` or ``max_agents_per_tree``
        (``launch_limit.txt``), else None (always None with both at 0, the public form)."""
        per_step, per_tree = self.cfg.max_launches_per_step, self.cfg.max_agents_per_tree  # 0: no bound
        if per_step and parent.attempts > per_step:
            what = f"this agent already launched {per_step} sub-agents in this step"
        elif per_tree and len(self.tree.nodes) >= per_tree:
            what = f"this task already has {self.cfg.max_agents_per_tree} agents"
        else:
            return None
        return render(self.texts["launch_limit"], reason=what)

    async def launch_one(self, parent: _AgentState, request: LaunchRequest) -> ChildResult:
        node = self.new_child_node(parent, request)
        parent.launched.append(node.node_id)
        child = self.start_child(parent, node, request, parent.world, parent.in_branch)
        if not self.cfg.use_rubrics:  # RAO
            await self.run_agent(child)
            if self.judge is not programmatic_judge:  # RAO with --judge: the verdict is the child's reward
                node.branch_label = await self.judge(request, node, child.session, child.world)
                self.tree.meta["judged_children"] = True
            return _result(request, node)
        # The rubric is written from the parent's view while the child runs; the child's result goes back to
        # the parent as soon as the child ends; the score call waits for the rubric and runs while the parent
        # goes on (the tree drains it before it ends).
        rubric = self.start_rubric(parent, request, node)
        try:
            await asyncio.sleep(0)  # the rubric call goes out first, then the child's first act call
            await self.run_agent(child)
        except BaseException:
            rubric.cancel()
            await asyncio.gather(rubric, return_exceptions=True)
            raise
        tokens = self.cfg.score_max_new_tokens
        view = self.score_view(request, child, tokens, "execution")  # the child's end, as it is now

        async def score_once_frozen() -> None:
            frozen = await rubric
            if frozen is not None:
                await self.score_child(frozen, request, child, tokens, "execution", view(frozen))

        self.defer(node, score_once_frozen())
        return _result(request, node)

    async def launch_counterfactual(self, parent: _AgentState, request: LaunchRequest, k: int) -> ChildResult:
        """K branches of one child, each on its own fork of one snapshot (public ``CounterfactualCollector``);
        branch 0's final world is then committed to the parent's world."""
        self.envs_used += k  # every branch, branch 0 included, runs on a new environment (public: +K)
        self.n_groups += 1
        group = f"g{self.n_groups}"
        snapshot = parent.world.fork()
        worlds = [snapshot.fork() for _ in range(k)]
        nodes = [self.new_child_node(parent, request, suffix="" if b == 0 else f"~b{b}") for b in range(k)]
        parent.launched.append(nodes[0].node_id)
        children = []
        for b, (node, world) in enumerate(zip(nodes, worlds, strict=True)):
            node.branch_group, node.branch_index = group, b
            node.committed = b == 0 and not parent.in_branch  # inside an uncommitted branch: uncommitted
            # branch 0 continues its parent's line; the others (and everything under them) are branches
            in_branch = parent.in_branch or b > 0
            children.append(self.start_child(parent, node, request, world, in_branch=in_branch))
        # one rubric per group, written from the pre-delegation context while the branches run
        branches = asyncio.gather(*(self.run_agent(c) for c in children))
        rubric = await self.run_beside_rubric(parent, request, nodes[0], branches)
        for node in nodes[1:]:
            node.rubric, node.rubric_error = nodes[0].rubric, nodes[0].rubric_error
        parent.world.commit(worlds[0])  # the parent continues from branch 0's final state

        async def label(c: _AgentState) -> None:
            c.node.branch_label = await self.judge(request, c.node, c.session, c.world)

        jobs = [label(c) for c in children]
        if self.cfg.use_rubrics:
            tokens = self.cfg.branch_score_max_new_tokens or self.cfg.score_max_new_tokens
            jobs += [self.score_child(rubric, request, c, tokens, "branch") for c in children]
        await asyncio.gather(*jobs)  # one wave; each result lands on its own node (order-independent)
        head = nodes[0]
        report = render(self.texts["counterfactual_report"], message=self.branch_message(head), k=k)
        return replace(_result(request, head), report=report)

    async def launch_best_of_n(self, parent: _AgentState, request: LaunchRequest) -> ChildResult:
        """Test-time selection (module docstring, item 4): n candidates on clones, commit one."""
        cfg, n = self.cfg, self.cfg.best_of_n
        # Sibling launches on one world select one group at a time (the public evaluator runs them in
        # order), so a commit never lands between another group's fork and its commit.
        async with self.commit_locks.setdefault(id(parent.world), asyncio.Lock()):
            if self.forks_used + n > cfg.max_forks_per_task:
                self.fork_refusals += 1
                parent.refused += 1
                budget = self.texts["fork_budget"]
                return ChildResult(request=request, returned=False, refused=True, error=budget)
            self.forks_used += n
            self.n_groups += 1
            group = f"bo{self.n_groups}"
            nodes = [
                self.new_child_node(parent, request, suffix="" if b == 0 else f"~c{b}") for b in range(n)
            ]
            rubric = None
            if cfg.selection_mode == "rubric":  # written once, from the parent's view, before any candidate
                index = sum(  # earlier delegations of this step (their groups are done: the lock)
                    1
                    for n in self.tree.nodes.values()
                    if n.parent_id == parent.node.node_id
                    and n.fork_step == parent.step_index
                    and n.branch_index == 0
                )
                rubric = await self.write_rubric(
                    parent, request, nodes[0], cfg.selection_rubric_temperature, selection_index=index
                )
            worlds = [parent.world.fork() for _ in range(n)]
            children = []
            for b, (node, world) in enumerate(zip(nodes, worlds, strict=True)):
                node.branch_group, node.branch_index = group, b
                if b > 0:
                    node.rubric, node.rubric_error = nodes[0].rubric, nodes[0].rubric_error
                children.append(
                    self.start_child(
                        parent, node, request, world, in_branch=False, temperature=cfg.candidate_temperature
                    )
                )
            await asyncio.gather(*(self.run_agent(c) for c in children))  # whole subtrees: bottom-up
            if rubric is not None:
                await asyncio.gather(
                    *(
                        self.score_child(rubric, request, c, cfg.selection_score_max_new_tokens, "selection")
                        for c in children
                    )
                )
            if cfg.selection_mode == "oracle":
                labels = await asyncio.gather(
                    *(self.judge(request, c.node, c.session, c.world) for c in children)
                )
                for c, y in zip(children, labels, strict=True):
                    c.node.branch_label = y
            rng = random.Random(_seed(cfg.seed, nodes[0].node_id, -2))
            best = select_candidate(
                cfg.selection_mode,
                [c.node.score for c in children],
                [c.node.branch_label for c in children],
                rng,
            )
            for b, c in enumerate(children):
                c.node.committed = b == best
                if b != best:
                    _mark_subtree_uncommitted(self.tree, c.node.node_id)
            parent.world.commit(worlds[best])
            parent.launched.append(nodes[best].node_id)
            return _result(request, nodes[best])


class DeadlineError(TimeoutError):
    """A model call or an agent step ran past ``step_timeout_s``: it ends that agent (recorded error)."""


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
    deadline: float | None = None,
) -> Tree:
    """Run one root rollout of ``task`` and return its recorded tree (see the module docstring).

    ``deadline`` (a ``time.monotonic()`` instant, e.g. its task group's): the tree is cancelled at the
    earlier of it and ``tree_timeout_s``; a cancelled tree comes back recorded, with ``meta["deadline"]``."""
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
    st = _AgentState(node=root, session=None, world=world, temperature=cfg.temperature)  # type: ignore[arg-type]
    # the session states the budget the run enforces (the prompt must not promise 20 steps when 3 are allowed)
    st.session = env.root_session(world, {**task, "max_steps": root.max_steps}, ro.launch_hook(st))
    st.session.counterfactual_rollout = cfg.counterfactual_k > 1  # the public collector's texts apply
    timeout = cfg.tree_timeout_s if deadline is None else min(cfg.tree_timeout_s, deadline - time.monotonic())

    async def root_then_scores() -> None:  # the deferred score calls belong to the tree (and its deadline)
        try:
            await ro.run_agent(st)
        except BaseException:  # cancelled (a deadline, Ctrl-C): the scores in flight are cancelled too
            await ro.drain(cancel=True)
            raise
        await ro.drain()

    if not await ro.run_with_deadline(root_then_scores(), max(timeout, 0.0)):
        reason = "group" if deadline is not None and timeout < cfg.tree_timeout_s else "tree"
        ro.tree.meta["deadline"] = reason
        root.error = (
            f"{reason} deadline: the rollout ran past {timeout:.0f} s and was cancelled "
            f"(--{reason}-timeout-s)"
        )
    try:
        ro.tree.success = bool(world.root_success()) and root.error is None
    except Exception as e:
        ro.tree.success, root.error = False, root.error or f"{type(e).__name__}: {e}"
    root.success = ro.tree.success
    ro.tree.seconds = time.perf_counter() - t0
    ro.tree.meta |= {  # |=: keeps "judged_children" set during the rollout
        "counterfactual_groups": ro.n_groups if cfg.counterfactual_k > 1 else 0,
        "envs_used": ro.envs_used,
        "truncated_calls": ro.truncated_calls,
    }
    if cfg.best_of_n > 1:
        ro.tree.meta.update(
            selection_groups=ro.n_groups, forks_used=ro.forks_used, fork_refusals=ro.fork_refusals
        )
    return ro.tree
