"""Level 2 on a cluster, on CPU: placement groups on a SIMULATED 2 x 8-GPU cluster, and recovery from a
collective timeout (the NCCL-timeout case, injected with gloo).

* ``ray.cluster_utils.Cluster`` starts two raylets that declare 8 GPUs each (no GPU exists): with the
  paper's 8 trainer ranks + 8 servers, :class:`~level2_distributed.placement.Placement` puts all 8 trainer
  ranks on one node and all 8 servers on the other, each actor on a GPU of its own;
* ``actor_env`` carries the driver's NCCL / gloo variables into the actors;
* two gloo FSDP ranks with a 3-s collective timeout; rank 1 hangs in its step (fault injection), rank 0's
  next collective times out: the driver gets a ``RayTaskError`` that :func:`recoverable` classes as a
  restart (like a dead actor), while an ordinary error in a task is not.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="level 2 needs Ray: pip install 'ray[default]'")

ROOT = Path(__file__).resolve().parents[1]


def test_placement_on_a_simulated_2x8_cluster(monkeypatch):
    from ray.cluster_utils import Cluster

    from level2_distributed.placement import Placement, actor_env

    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth-test")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 8})
    cluster.add_node(num_cpus=1, num_gpus=8)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        cluster.wait_for_nodes()

        @ray.remote(num_cpus=0, num_gpus=1)
        class Probe:
            def where(self):
                return (
                    ray.get_runtime_context().get_node_id(),
                    tuple(ray.get_gpu_ids()),
                    os.environ.get("NCCL_SOCKET_IFNAME"),
                )

        place = Placement(8, 8)
        env = {"env_vars": actor_env()}
        trainers = [Probe.options(runtime_env=env, **place.trainer(r)).remote() for r in range(8)]
        servers = [Probe.options(runtime_env=env, **place.server(i)).remote() for i in range(8)]
        t, s = ray.get([a.where.remote() for a in trainers]), ray.get([a.where.remote() for a in servers])
        print("trainers:", t, "\nservers:", s)
        assert len({n for n, _, _ in t}) == 1 and len({n for n, _, _ in s}) == 1  # one node each
        assert t[0][0] != s[0][0]  # ... and not the same node
        assert len({g for _, g, _ in t}) == 8 and len({g for _, g, _ in s}) == 8  # a GPU each
        assert {e for _, _, e in t + s} == {"eth-test"}  # NCCL settings reached the actors
        for a in trainers + servers:
            ray.kill(a)
        place.remove()
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_collective_timeout_is_recovered_like_a_dead_actor(tmp_path, monkeypatch):
    import json

    from common.rl.datums import Datum
    from common.train_config import TrainConfig
    from level2_distributed.placement import recoverable
    from level2_distributed.train import deal_microbatches
    from level2_distributed.trainer import TrainerRank

    if ray.is_initialized():
        ray.shutdown()
    marker = tmp_path / "hang_fired"
    monkeypatch.setenv("SERA_L2_FAULT", f"1:7:{marker}:hang")  # rank 1 hangs in round 7's step
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "SERA_L2_FAULT": os.environ["SERA_L2_FAULT"]}})  # fmt: skip
    try:
        cfg = TrainConfig.make(model="tiny", dtype="float32", seed=0)
        cls = ray.remote(TrainerRank).options(num_cpus=0)
        gang = [cls.remote(r, 2, cfg, False, 4096, collective_timeout_s=3.0) for r in range(2)]
        host, port = ray.get([gang[0].node_ip.remote(), gang[0].free_port.remote()])
        ray.get([a.setup.remote(f"{host}:{port}") for a in gang])
        st = json.loads((ROOT / "tests" / "fixtures" / "rl_fixture.json").read_text())["stages"]["execution"]
        datums, weights = [Datum(**d) for d in st["datums"]], st["weights"]
        lengths = [len(d.prompt_ids) + len(d.output_ids) for d in datums]
        dealt = deal_microbatches(lengths, sum(lengths) // 2 + max(lengths), 2)
        n = float(sum(d.num_trained_tokens for d in datums))
        refs = [a.train_step.remote([([datums[i] for i in mb], [weights[i] for i in mb]) for mb in mbs], n,
                                    round=7) for a, mbs in zip(gang, dealt, strict=True)]  # fmt: skip
        with pytest.raises(ray.exceptions.RayTaskError) as info:
            ray.get(refs[0], timeout=120)
        print("rank 0 failed with:", type(info.value.cause).__name__, str(info.value.cause)[:200])
        assert marker.exists(), "the hang never fired"
        assert recoverable(info.value)  # the driver restarts from the last checkpoint, as for a dead actor
        bad = ray.remote(lambda: int("x")).remote()
        with pytest.raises(ray.exceptions.RayTaskError) as other:
            ray.get(bad)
        assert not recoverable(other.value)  # a bug is not retried
        for a in gang:
            ray.kill(a)
    finally:
        ray.shutdown()
