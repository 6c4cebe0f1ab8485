"""The real level-2 ``train()`` on a simulated two-node Ray cluster, on CPU (issue #40 item 6).

Ray's ``cluster_utils.Cluster`` starts a head node and a second raylet on another loopback address
(``127.0.0.2``), each declaring 2 GPUs (there are none: every actor falls back to CPU and gloo). With whole
"GPUs" per actor, ``train()`` takes the cluster path: placement groups (trainers STRICT_PACK per node, the
servers in a PACK group after them), the FSDP rendezvous at trainer rank 0's node, the weight-sync group
across the node boundary.

* Split, 2 FSDP ranks + 2 hf servers, trainer rank 1 killed in the middle of round 1's step
  (``SERA_L2_FAULT``): the trainers land on one node and the servers on the other, the run restarts once
  (fresh placement groups and actors, the step-1 checkpoint) and ends with the uninterrupted run's rounds.
* Colocated, 4 ranks (a trainer rank and its hf engine per "GPU"): the ranks span both nodes (one STRICT_PACK
  group per node), one FSDP group across them.

* ``--out`` not shared by a node: an actor on the second node with its own mount namespace (a tmpfs over
  --out: a node-local disk) is named by ``check_shared_out`` before the first round (root only).

What this cannot show: NCCL (gloo is synchronous on CPU), GPU memory, a real network between nodes
(level2_distributed/README.md lists what has run on GPUs).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="level 2 needs Ray: pip install 'ray[default]'")

ROOT = Path(__file__).resolve().parents[1]
BASE = dict(
    env="textcraft", model="tiny", steps=2, schedule="execution:1", tasks_per_step=1, rollouts_per_task=2,
    max_steps=3, max_new_tokens=12, rubric_max_new_tokens=16, oracle_mix=0.7, score_noise=0.3,
    difficulty="medium", n_tasks=16, max_task_replacements=3, max_idle_rounds=6,
    codeact_executor="worker-ordered",
)  # fmt: skip
"""tests/test_level2.py's 2-step run."""


@pytest.fixture()
def two_nodes():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 2})
    cluster.add_node(num_cpus=1, num_gpus=2, node_ip_address="127.0.0.2")
    try:
        ray.init(address=cluster.address, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo"}})  # fmt: skip
        cluster.wait_for_nodes()
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def watch_starts(monkeypatch) -> list[dict]:
    """Record, at every ``System.start``, the node of every trainer rank and server."""
    from level2_distributed.train import System

    starts: list[dict] = []
    start = System.start

    def spy(self):
        start(self)

        def where(actor):
            return ray.get(actor.__ray_call__.remote(lambda _self: ray.util.get_node_ip_address()))

        starts.append({"trainers": [where(t) for t in self.trainers], "servers": [where(s) for s in self.servers],
                       "placement": self.placement is not None})  # fmt: skip

    monkeypatch.setattr(System, "start", spy)
    return starts


@pytest.mark.timeout(240)
def test_split_run_on_two_nodes_with_a_trainer_rank_killed_mid_step(two_nodes, tmp_path, monkeypatch):
    import time

    from common.train_config import TrainConfig
    from level2_distributed.config import Level2Config
    from level2_distributed.train import train

    starts = watch_starts(monkeypatch)
    marker = tmp_path / "fault_fired"
    monkeypatch.setenv("SERA_L2_FAULT", f"1:1:{marker}")  # rank 1 dies in round 1, after its backward
    l2 = Level2Config(trainers=2, servers=2, server_engine="hf", trainer_gpus=1, server_gpus=1,
                      server_batch_size=2, collective_timeout_s=60)  # fmt: skip
    t0 = time.perf_counter()
    history = train(TrainConfig.make(**BASE, out=str(tmp_path / "run")), l2, progress=False)
    took = time.perf_counter() - t0
    print(f"split 2+2 on two nodes, a rank killed: {took:.0f} s; starts {starts}")
    assert marker.exists(), "the fault never fired"
    assert history[-1]["fault/restarts"] == 1 and len(starts) == 2
    for s in starts:
        assert s["placement"]
        assert len(set(s["trainers"])) == 1 and len(set(s["servers"])) == 1  # each kind packed on one node
        assert set(s["trainers"]) != set(s["servers"])  # ... and the two kinds on different nodes
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(len(rows)))  # nothing lost or counted twice
    assert max(r["step"] for r in rows) == 1 and rows[-1]["dp/world_size"] == 2
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "run.json").exists()
    assert not (tmp_path / "run" / ".sera_shared_out").exists()  # the shared-out check ran and cleaned up
    assert took < 120


@pytest.mark.timeout(240)
def test_colocated_run_across_both_nodes(two_nodes, tmp_path, monkeypatch):
    import time

    from common.train_config import TrainConfig
    from level2_distributed.config import Level2Config
    from level2_distributed.train import train

    starts = watch_starts(monkeypatch)
    l2 = Level2Config(trainers=4, colocate=True, server_engine="hf", trainer_gpus=1, server_batch_size=2,
                      collective_timeout_s=60)  # fmt: skip
    t0 = time.perf_counter()
    history = train(TrainConfig.make(**BASE, out=str(tmp_path / "run")), l2, progress=False)
    took = time.perf_counter() - t0
    print(f"colocated x4 across two nodes: {took:.0f} s; nodes {starts}")
    assert len(starts) == 1 and starts[0]["placement"]
    nodes = starts[0]["trainers"]
    assert sorted(nodes.count(ip) for ip in set(nodes)) == [2, 2]  # 2 ranks on each node, one FSDP group
    assert [h["step"] for h in history if not h["train/skipped"]] == [0, 1]
    assert history[-1]["dp/world_size"] == 4 and history[-1]["fault/restarts"] == 0
    assert took < 120
    assert os.path.exists(tmp_path / "run" / "model" / "model.safetensors")


@ray.remote(num_cpus=0)
class NodeLocalDisk:
    """An actor whose ``directory`` is a private, empty tmpfs (its own mount namespace): what a node whose
    --out is a local disk, not the shared one, sees. Needs root (unshare + mount); the test skips otherwise."""

    def __init__(self, directory: str | None) -> None:
        import ctypes

        if directory is None:  # a plain actor: sees the driver's files
            return
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        libc.mount(b"none", b"/", None, 0x40000 | 0x4000, None)  # MS_PRIVATE | MS_REC: nothing leaks out
        if libc.mount(b"none", directory.encode(), b"tmpfs", 0, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount tmpfs on {directory}")

    def listing(self, directory: str) -> list[str]:
        return os.listdir(directory)


@pytest.mark.timeout(120)
def test_an_out_directory_not_shared_by_a_node_is_refused_before_the_first_round(two_nodes, tmp_path):
    """``check_shared_out`` (called by train() right after the actors start): a marker written under --out by
    the driver must be read by every actor; an actor on the second node with a node-local --out is named."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from level2_distributed.train import SHARED_OUT_MARKER, check_shared_out

    if os.geteuid() != 0:
        pytest.skip("simulating a node-local disk needs root (a mount namespace with a tmpfs over --out)")
    nodes = [n for n in ray.nodes() if n["Alive"]]
    other = next(n for n in nodes if n["NodeManagerAddress"] == "127.0.0.2")  # the second raylet
    head = next(n for n in nodes if n is not other)

    def on(node, directory):
        where = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        return NodeLocalDisk.options(scheduling_strategy=where).remote(directory)

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("")
    shared = [on(head, None), on(other, None)]
    check_shared_out(shared, out)  # both see the driver's directory: no error
    assert not (out / SHARED_OUT_MARKER).exists()  # the marker is removed again
    local = on(other, str(out))
    try:
        assert ray.get(local.listing.remote(str(out))) == []  # it really sees another (empty) directory
    except ray.exceptions.RayActorError as exc:
        pytest.skip(f"no mount namespace for an actor here: {exc}")
    with pytest.raises(ValueError, match=r"--out .* is not shared with node\(s\) 127\.0\.0\.2: .*same path"):
        check_shared_out([*shared, local], out)
    assert sorted(os.listdir(out)) == ["metrics.jsonl"]  # nothing of the check is left behind
