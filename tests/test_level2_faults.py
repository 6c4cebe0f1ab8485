"""Level 2's faults at scale and its rollout path, on CPU (issue #40 items 3 and 4).

Faults:
* a server actor that dies (``ray.kill``: no ``shutdown``) takes its engine process with it: the engine
  (``engine_server`` under ``--server-python``, hf engine) is ended by its watcher (``reaper.py``) within
  seconds and its port closes;
* a restart whose start fails recoverably is retried (up to ``MAX_RESTARTS`` in all);
* a dead server gets no more calls from the router (its agents move to live servers);
* ``System.stop`` waits for hung servers once, in total, not 30 s each in turn.

Rollout path:
* the router keeps one agent's calls on one server and spreads new agents;
* ``Router.score_logprobs`` is a coroutine (the driver's event loop runs on while it waits) and spreads
  over the servers;
* the server actors' blocking methods are coroutines (a plain method of an async actor runs on its event
  loop and stalls the generations in flight: checked on Ray, below).
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="level 2 needs Ray: pip install 'ray[default]'")

ROOT = Path(__file__).resolve().parents[1]


def gone(pid: int) -> bool:
    from level2_distributed.reaper import _stat

    st = _stat(pid)
    return st is None or st[0] == "Z"


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(180)
def test_a_killed_server_actor_takes_its_engine_process_with_it(local_ray):
    from level2_distributed.servers import EngineProcessServer

    server = (
        ray.remote(EngineProcessServer)
        .options(num_cpus=0, max_concurrency=8)
        .remote("tiny", "float32", 0, 2, "hf", server_python=sys.executable)
    )
    info = ray.get(server.engine_process.remote(), timeout=150)
    assert port_open(info["port"]) and not gone(info["pid"])
    ray.kill(server, no_restart=True)  # a crash: nobody calls shutdown
    t0 = time.time()
    while time.time() - t0 < 15 and not (gone(info["pid"]) and not port_open(info["port"])):
        time.sleep(0.2)
    took = time.time() - t0
    print(f"engine process ended {took:.1f} s after its actor was killed")
    assert gone(info["pid"]) and not port_open(info["port"]), "the engine outlived its actor"
    assert took < 10
    t0 = time.time()
    while time.time() - t0 < 5 and not gone(info["reaper"]):
        time.sleep(0.1)
    assert gone(info["reaper"])  # the watcher exits once its engine is gone


@ray.remote(num_cpus=0, max_concurrency=100)
class FakeServer:
    """Answers at once (``generate``) or after ``delay`` s (``score_logprobs``); counts calls."""

    def __init__(self, index: int, delay: float = 0.0) -> None:
        self.index, self.delay, self.calls = index, delay, 0

    async def generate(self, request):
        from common.policy.base import Completion

        self.calls += 1
        await asyncio.sleep(0.01)
        return Completion("x", [1], [2], [-0.5]), 0

    async def score_logprobs(self, prompt_ids, output_ids):
        await asyncio.sleep(self.delay)
        return [float(self.index)] * len(output_ids)

    def count(self) -> int:
        return self.calls


def request(session):
    from common.policy.base import GenerationRequest

    return GenerationRequest(messages=[{"role": "user", "content": "hi"}], session=session)


def test_router_keeps_an_agents_calls_on_one_server_and_avoids_a_dead_one(local_ray):
    from level2_distributed.servers import Router

    servers = [FakeServer.remote(i) for i in range(3)]
    router = Router(servers, None, 4096)
    agents = [object() for _ in range(6)]

    async def turns(n):
        for _ in range(n):  # every agent's turns, the agents interleaved (as concurrent agents are)
            await asyncio.gather(*(router.generate(request(a)) for a in agents))

    picked = []
    pick = router.pick

    def spy(key=None):
        i = pick(key)
        picked.append((key, i))
        return i

    router.pick = spy
    asyncio.run(turns(3))
    by_agent = {}
    for key, i in picked:
        by_agent.setdefault(key, set()).add(i)
    assert len(by_agent) == 6 and all(len(s) == 1 for s in by_agent.values()), by_agent  # one server each
    assert sorted(ray.get([s.count.remote() for s in servers])) == [6, 6, 6]  # 2 agents per server
    victim = router.affinity[id(agents[0])]
    router.take_records()
    ray.kill(servers[victim], no_restart=True)
    errors = []

    async def after_kill():
        for _ in range(2):
            for a in agents:
                try:
                    await router.generate(request(a))
                except Exception as exc:  # noqa: BLE001 - the one call that finds the dead server
                    errors.append(exc)

    asyncio.run(after_kill())
    assert len(errors) == 1 and router.failure is errors[0] and router.dead == {victim}
    assert all(r.server != victim for r in router.records)  # nothing went to it after
    assert router.affinity[id(agents[0])] != victim  # its agent moved to a live server
    router.dead = set(range(3))
    with pytest.raises(type(errors[0])):  # no server left: the failure, at once
        asyncio.run(router.generate(request(agents[1])))


def test_router_score_logprobs_is_a_coroutine_that_spreads(local_ray):
    """While one teacher-forced score waits (0.6 s), the driver's event loop keeps running; two at once go to
    two servers."""
    from level2_distributed.servers import Router

    servers = [FakeServer.remote(i, delay=0.6) for i in range(2)]
    ray.get([s.count.remote() for s in servers])  # started
    router = Router(servers, None, 4096)
    ticks = []

    async def ticker():
        for _ in range(30):
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.02)

    async def main():
        t = asyncio.create_task(ticker())
        got = await asyncio.gather(router.score_logprobs([1], [2, 3]), router.score_logprobs([1], [2, 3]))
        t.cancel()
        return got

    t0 = time.perf_counter()
    got = asyncio.run(main())
    assert sorted(g[0] for g in got) == [0.0, 1.0]  # one on each server
    during = [t for t in ticks if t0 < t < t0 + 0.5]
    assert len(during) >= 5, f"the event loop stalled ({len(during)} ticks in 0.5 s)"


def test_blocking_server_methods_are_coroutines():
    """On Ray's async actors a plain method runs on the event loop's thread (it would stall every generate in
    flight): the methods that block (a forward, a collective, a file) are coroutines on every server kind."""
    from level2_distributed.colocate import ColocatedRank
    from level2_distributed.servers import EngineProcessServer, HFServer, SGLangServer

    for cls in (HFServer, EngineProcessServer, SGLangServer):
        for name in ("generate", "score_logprobs", "join_sync_group", "receive_broadcast", "load_from_disk",
                     "engine_fingerprint"):
            assert inspect.iscoroutinefunction(getattr(cls, name)), (cls.__name__, name)
    for name in ("generate", "score_logprobs", "engine_fingerprint"):  # the router's calls and the sync check
        assert inspect.iscoroutinefunction(getattr(ColocatedRank, name)), name


def test_stop_waits_for_hung_servers_once_in_total(local_ray):
    from common.train_config import TrainConfig
    from level2_distributed.config import Level2Config
    from level2_distributed.train import System

    @ray.remote(num_cpus=0, max_concurrency=4)
    class Hung:
        async def shutdown(self):
            await asyncio.sleep(120)

        def ping(self):
            return True

    system = System(TrainConfig.make(model="tiny"), Level2Config(), None)
    system.servers = [Hung.remote() for _ in range(3)]
    ray.get([s.ping.remote() for s in system.servers])
    system.stop_timeout_s = 2.0
    t0 = time.perf_counter()
    servers = list(system.servers)
    system.stop()
    took = time.perf_counter() - t0
    assert took < 2.0 + 3.0, f"stop took {took:.1f} s for 3 hung servers (2 s each in turn would be 6)"
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(servers[0].ping.remote(), timeout=30)


def test_a_restart_whose_start_fails_is_retried(tmp_path):
    from common.run.checkpoint import RunState
    from level2_distributed.servers import EngineProcessDied
    from level2_distributed.train import MAX_RESTARTS, restart

    class Flaky:
        def __init__(self, failures: int) -> None:
            self.failures, self.restarts, self.starts = failures, 0, 0

        def start(self):
            self.starts += 1
            if self.starts <= self.failures:
                raise EngineProcessDied("the new engine could not start (the old one still held the GPU)")

        def load(self, out):
            return RunState(step=1, round=2)

    s = Flaky(1)
    state = restart(s, tmp_path, EngineProcessDied("server 3 died"), log=lambda m: None)
    assert (state.step, state.round, s.restarts, s.starts) == (1, 2, 2, 2)
    s = Flaky(MAX_RESTARTS)
    with pytest.raises(EngineProcessDied, match="could not start"):
        restart(s, tmp_path, EngineProcessDied("server 3 died"), log=lambda m: None)
    assert s.restarts == MAX_RESTARTS
