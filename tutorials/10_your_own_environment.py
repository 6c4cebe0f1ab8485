# %% [markdown]
# # Tutorial 10 — your own environment: a toy world, plugged in, rolled out and trained
#
# An environment implements the contract of `common/envs/base.py`: a **World** (shared state with
# `fork`/`commit`/`root_success`/`describe`), **AgentSessions** (one per agent: prompts, `step(reply)`,
# `success`) and an **Environment** factory. The runtime, the rewards and the trainers use nothing else.
#
# The toy: one shared integer. The root must move it to a target; an agent replies `<action>inc</action>`,
# `<action>dec</action>`, `<delegate>N</delegate>` (a child agent must add N) or `<finish>...</finish>`.
#
#     python tutorials/10_your_own_environment.py     # ~1 min on 2 cores

# %%
import re

from common.envs.base import AgentSession, Environment, LaunchRequest, StepResult, World

PROMPT = ("Move the shared number to your target. Reply with exactly one of <action>inc</action>, "
          "<action>dec</action>, <delegate>N</delegate> (a helper adds N) or <finish>message</finish>.")  # fmt: skip


class NumberWorld(World):
    def __init__(self, value: int, target: int):
        self.value, self.target = value, target

    def fork(self) -> "NumberWorld":
        return NumberWorld(self.value, self.target)

    def commit(self, branch: "NumberWorld") -> None:
        self.value = branch.value

    def root_success(self) -> bool:
        return self.value == self.target

    def describe(self) -> str:
        return f"value={self.value} target={self.target}"


class NumberSession(AgentSession):
    def __init__(self, world, add, agent_id, depth, launch, max_steps=6):
        self.world, self.target, self.launch = world, world.value + add, launch
        self.agent_id, self.depth, self.max_steps = agent_id, depth, max_steps
        self.steps_used, self.finished, self.finish_message = 0, False, None

    def system_prompt(self) -> str:
        return PROMPT

    def first_user_message(self) -> str:
        return f"The number is {self.world.value}; your target is {self.target}."

    async def step(self, reply: str) -> StepResult:
        self.steps_used += 1
        m = re.search(r"<(action|delegate|finish)>(.*?)</\1>", reply, re.S)
        kind, arg = (m.group(1), m.group(2).strip()) if m else (None, "")
        if kind == "finish":
            self.finished, self.finish_message = True, arg
            return StepResult("finished", done=True, finish_message=arg)
        if kind == "action" and arg in ("inc", "dec"):
            self.world.value += 1 if arg == "inc" else -1
        elif kind == "delegate" and re.fullmatch(r"-?\d+", arg):
            n = int(arg)
            res = await self.launch(LaunchRequest(goal=f"Add {n} to the number.", targets={"add": n}, max_steps=6))
            note = "the helper finished" if res.returned else f"the helper did not finish ({res.error})"
            return StepResult(f"{note}. The number is {self.world.value}.", done=self.steps_used >= self.max_steps)
        else:
            return StepResult(f"Invalid reply. {PROMPT}", done=self.steps_used >= self.max_steps)
        return StepResult(f"The number is {self.world.value}.", done=self.steps_used >= self.max_steps)

    def success(self) -> bool:
        return self.world.value == self.target


class NumberEnv(Environment):
    name = "number"
    tools_description = "The helper can reply <action>inc</action>, <action>dec</action> or <finish>."

    def make_world(self, task):
        return NumberWorld(task["start"], task["target"])

    def root_session(self, world, task, launch):
        return NumberSession(world, task["target"] - task["start"], "0", 0, launch)

    def child_session(self, world, parent, request, agent_id, launch):
        return NumberSession(world, request.targets["add"], agent_id, parent.depth + 1, launch)


# %% [markdown]
# ## Plugging it in
# `register_env(spec, factory)` puts it in the registry: `make_env("number")` builds it, and the trainers
# read its rules (zero-variance rule, stop strings, how eval averages tiers) from its `EnvSpec`. The runtime
# itself only needs the environment object: `run_root(task, env, policy, cfg)`.

# %%
import asyncio

from common.agent.runtime import RuntimeConfig, run_root
from common.envs import EnvSpec, env_spec, make_env, register_env
from common.policy.scripted import OraclePolicy

register_env(EnvSpec("number", (), 4, "keep", False, "task_weighted"), NumberEnv)
assert env_spec("number").zero_variance == "keep" and isinstance(make_env("number"), NumberEnv)


def scripted_reply(session: NumberSession) -> str:
    """The toy's oracle: the root hands all but one step to a helper; everyone else walks to the target."""
    gap = session.target - session.world.value
    if session.depth == 0 and abs(gap) > 1 and session.steps_used == 0:
        return f"<delegate>{gap - (1 if gap > 0 else -1)}</delegate>"
    return "<finish>done</finish>" if gap == 0 else f"<action>{'inc' if gap > 0 else 'dec'}</action>"


task = {"start": 2, "target": 6}
oracle = OraclePolicy(scripted_reply)
tree = asyncio.run(run_root(task, make_env("number"), oracle, RuntimeConfig(temperature=0.0)))
root, kids = tree.root, tree.children("0")
print("root success", tree.success, "| root steps", len(root.steps), "| child", kids[0].node_id,
      "steps", len(kids[0].steps), "score", kids[0].score)  # fmt: skip
assert tree.success and len(kids) == 1 and kids[0].success and kids[0].score == 1.0
assert len(kids[0].steps) == 4  # 3 x inc + finish

# %% [markdown]
# ## Training it for two steps with the tiny model
# Two rollouts per round: one written by the oracle (teacher-forced through the model, so it carries token
# ids and behaviour log-probs) and one sampled by the random-init `tiny` model itself (it fails). The
# group is mixed, so the Execution stage has signal; `train_on_batch` is level 0's step. We check that
# each step raises the surrogate objective sum(w A log pi) / |M| on its own batch.

# %%
import torch

from common.policy.forced import TeacherForcedPolicy
from common.policy.hf import HFPolicy
from common.policy.models import load_model
from common.rl.batch import build_stage_batch
from common.run.optim import make_optimizer
from common.train_config import TrainConfig
from level0_single_process.train import datum_logprobs, train_on_batch

torch.set_num_threads(1)
model, tok = load_model("tiny", dtype="float32", seed=0)
cfg = TrainConfig.make(model="tiny", lr=1e-4)
opt = make_optimizer(model, cfg.optim)
rcfg = RuntimeConfig(max_steps=4, max_new_tokens=12, max_prompt_tokens=1024, rubric_max_new_tokens=16,
                     score_max_new_tokens=16, temperature=1.0)  # fmt: skip


def objective(batch) -> float:
    """sum_t w A log pi(y_t) / |M| (the CISPO surrogate at ratio 1)."""
    with torch.no_grad():
        n = sum(d.num_trained_tokens for d in batch.datums)
        return sum(float((datum_logprobs(model, d)[0] * torch.tensor(d.loss_mask)).sum()) * w * d.advantage
                   for d, w in zip(batch.datums, batch.weights, strict=True)) / n  # fmt: skip


for step in range(2):
    sampler = HFPolicy(model, tok, seed=step)
    trees = [asyncio.run(run_root(task, NumberEnv(), TeacherForcedPolicy(sampler, oracle, oracle_mix=mix), rcfg))
             for mix in (1.0, 0.0)]  # fmt: skip
    batch = build_stage_batch("execution", [trees], zero_variance=env_spec("number").zero_variance)
    before = objective(batch)
    m = train_on_batch(model, opt, batch, cfg)
    after = objective(batch)
    print(f"step {step}: roots {[t.success for t in trees]}, {len(batch.datums)} datums, loss {m['loss/cispo']:.4f}, "
          f"grad norm {m['grad_norm']:.3f}, objective {before:.4f} -> {after:.4f}")  # fmt: skip
    assert [t.success for t in trees] == [True, False] and after > before
print(f"TUTORIAL10 last_objective_gain {after - before:.4f}")

# %% [markdown]
# ## GPU notes
# Nothing in the environment changes on a GPU: it runs in the driver process next to the agents. Only the
# policy moves (`hf:MODEL` on the GPU, or a vLLM/SGLang server). Keep `step()` cheap: the built-in worlds
# cost microseconds per step (bench/RESULTS.md, "TextWorld-Sync vs real TextWorld": 58,226 steps/s), so
# generation, not the environment, sets the speed; a slow world (real TextWorld: 220 steps/s, 264 ms per
# fork) makes counterfactual branches expensive.
