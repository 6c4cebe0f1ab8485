"""The recursive runtime's own overhead per agent step (target: under 2 ms).

    python bench/bench_runtime.py

Two measurements, side by side in one run:
* a constant policy on TextWorld-Sync (`<action>look around</action>` until the budget ends): the policy
  and the environment cost microseconds, so time per step is almost all runtime overhead (recording,
  message bookkeeping, the async machinery);
* the oracle on TextCraft / TextWorld-Sync with delegation (rubric + score calls included): the full
  cost of a step with a scripted policy, an upper bound of the overhead.
The environment's own step time is measured separately and subtracted for the first figure.
"""

from __future__ import annotations

import asyncio
import time

from common.agent.runtime import RuntimeConfig, run_root
from common.envs import make_env
from common.envs.textcraft.oracle import oracle_reply as tc_oracle
from common.envs.textcraft.tasks import generate_tasks as tc_tasks
from common.envs.textworld_sync.oracle import oracle_reply as tw_oracle
from common.envs.textworld_sync.tasks import generate_tasks as tw_tasks
from common.envs.textworld_sync.world import SyncWorld
from common.policy.base import Completion, GenerationRequest, Policy
from common.policy.scripted import OraclePolicy


class Constant(Policy):
    async def generate(self, request: GenerationRequest) -> Completion:
        return Completion(
            text="<action>look around</action>", prompt_ids=[1], output_ids=[2], logprobs=[-0.1]
        )


def per_step(trees) -> tuple[float, int]:
    steps = sum(
        n.steps_used + (n.rubric_call is not None) + (n.score_call is not None)
        for t in trees
        for n in t.nodes.values()
    )
    return sum(t.seconds for t in trees) / max(1, steps), steps


async def rollouts(env_name, tasks, policy, cfg):
    env = make_env(env_name)
    return [await run_root(t, env, policy, cfg) for t in tasks]


def main() -> None:
    tw = tw_tasks("test", 28, seed=0)
    tc = tc_tasks("val", 40, seed=0)
    # environment-only cost of the constant action
    w = SyncWorld(tw[0])
    t0 = time.perf_counter()
    for _ in range(2000):
        w.fork().step("0", "look around")
    env_us = (time.perf_counter() - t0) / 2000 * 1e6

    rows = []
    trees = asyncio.run(rollouts("textworld", tw, Constant(), RuntimeConfig(max_steps=20)))
    s, n = per_step(trees)
    rows.append(
        (
            "constant policy, TextWorld-Sync",
            s * 1e3,
            n,
            f"{s * 1e6 - env_us:.0f} µs after the env's {env_us:.0f} µs",
        )
    )
    trees = asyncio.run(
        rollouts("textworld", tw, OraclePolicy(lambda x: tw_oracle(x, delegate=True)), RuntimeConfig())
    )
    s, n = per_step(trees)
    rows.append(
        ("oracle + delegation, TextWorld-Sync", s * 1e3, n, "incl. oracle planning and rubric/score calls")
    )
    trees = asyncio.run(
        rollouts("textcraft", tc, OraclePolicy(lambda x: tc_oracle(x, delegate=True)), RuntimeConfig())
    )
    s, n = per_step(trees)
    rows.append(("oracle + delegation, TextCraft", s * 1e3, n, "incl. CodeAct worker cells, oracle planning"))
    print(f"{'workload':40s} {'ms/step':>8s} {'steps':>7s}  note")
    for name, ms, n, note in rows:
        print(f"{name:40s} {ms:8.3f} {n:7d}  {note}")
    print(f"target: runtime overhead < 2 ms per agent step -> {'met' if rows[0][1] < 2 else 'MISSED'}")


if __name__ == "__main__":
    main()
