"""Where the actors go on a GPU cluster: Ray placement groups, and the environment the actors inherit.

* Trainer ranks are PACKED per node: ``ceil(T / G)`` placement groups of up to ``G`` one-GPU bundles
  (``G`` = GPUs of the largest node), each ``STRICT_PACK`` (all its bundles on one node), so FSDP's
  all-gathers and reduce-scatters stay on NVLink within a node and cross nodes only between groups.
* Servers take the GPUs left: one ``PACK`` group of ``S`` one-GPU bundles, created after the trainers'.
  On the paper's 2 x 8 H200 cluster: 8 trainer ranks on one node, 8 servers on the other
  (tests/test_level2_placement.py checks it on a simulated 2 x 8 cluster: Ray's ``cluster_utils``
  with GPU resources declared, no GPUs).
* Colocated mode (``--colocate``): one actor per GPU holds a trainer rank AND its engine, so only the
  trainers' groups exist.
* No placement groups when the actors take no whole GPU (a CPU run, or fractional GPUs with
  ``--weight-sync disk``): Ray's default scheduling then.

:func:`actor_env`: the driver's NCCL / gloo / InfiniBand / UCX settings (``NCCL_*``, ``TORCH_NCCL_*``,
``GLOO_*``, ``UCX_*``, ``NVSHMEM_*``, ``CUDA_DEVICE_MAX_CONNECTIONS``), the engines' knobs (``VLLM_*``,
``SGLANG_*``, but not the driver node's addresses), the HF cache / offline / token variables and the project's
own go to every actor (Ray starts actor processes with the raylet's environment, not the driver's).

What it simplifies: one node size is assumed for packing (the largest); no topology inside a node (which
GPUs share an NVSwitch or a NIC) is taken into account.
"""

from __future__ import annotations

import math
import os
from typing import Any

PASS_ENV = ("SERA_L2_FAULT", "SERA_L2_THREADS", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
            "HF_TOKEN", "SERA_CACHE", "CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF")  # fmt: skip
"""Variables the actors inherit from the driver (fault injection, threads, model caches and offline mode: a
hub id resolves to the cache's snapshot on every node; the CUDA allocator)."""
PASS_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "UCX_", "NVSHMEM_", "TORCH_DIST", "VLLM_", "SGLANG_")
"""Prefixes of the settings the actors inherit: collective communication (NCCL_IB_HCA, NCCL_SOCKET_IFNAME,
GLOO_SOCKET_IFNAME, ...) and the engines' knobs (VLLM_USE_FLASHINFER_SAMPLER, SGLANG_...). On a cluster an actor
on another node sees that node's raylet environment, not the driver's, unless it is passed here."""
NODE_LOCAL = ("VLLM_HOST_IP", "VLLM_PORT", "VLLM_DP_MASTER_IP", "VLLM_DP_MASTER_PORT")
"""Addresses that belong to the driver's node: never passed (an actor elsewhere would bind another node's IP)."""


def actor_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's variables an actor must see.

    >>> actor_env({"NCCL_IB_HCA": "mlx5", "HOME": "/root", "SERA_CACHE": "/c", "GLOO_SOCKET_IFNAME": "eth0"})
    {'NCCL_IB_HCA': 'mlx5', 'SERA_CACHE': '/c', 'GLOO_SOCKET_IFNAME': 'eth0'}
    >>> actor_env({"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_HOST_IP": "10.0.0.1", "HF_TOKEN": "t", "PATH": "/bin"})
    {'VLLM_USE_FLASHINFER_SAMPLER': '0', 'HF_TOKEN': 't'}
    """
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items()
            if (k in PASS_ENV or k.startswith(PASS_PREFIXES)) and k not in NODE_LOCAL}  # fmt: skip


def group_sizes(
    trainers: int, servers: int, gpus_per_node: int, colocate: bool = False
) -> dict[str, list[int]]:
    """Bundle counts of the placement groups: trainers in per-node packs, servers in one group.

    >>> group_sizes(8, 8, 8)
    {'trainers': [8], 'servers': [8]}
    >>> group_sizes(12, 4, 8)
    {'trainers': [8, 4], 'servers': [4]}
    >>> group_sizes(4, 4, 4, colocate=True)
    {'trainers': [4], 'servers': []}
    """
    g = max(1, gpus_per_node)
    packs = [min(g, trainers - i * g) for i in range(math.ceil(trainers / g))]
    return {"trainers": packs, "servers": [] if colocate or servers == 0 else [servers]}


def gpus_per_node() -> int:
    import ray

    return int(max((n.get("Resources", {}).get("GPU", 0) for n in ray.nodes() if n.get("Alive")), default=0))


class Placement:
    """The placement groups of one System start; ``trainer(i)`` / ``server(j)`` give an actor's options."""

    def __init__(self, trainers: int, servers: int, colocate: bool = False, timeout_s: float = 600) -> None:
        import ray
        from ray.util.placement_group import placement_group

        sizes = group_sizes(trainers, servers, gpus_per_node(), colocate)
        self.trainer_groups = [
            placement_group([{"GPU": 1}] * n, strategy="STRICT_PACK") for n in sizes["trainers"]
        ]
        ray.get([pg.ready() for pg in self.trainer_groups], timeout=timeout_s)  # trainers first: whole nodes
        self.server_groups = [placement_group([{"GPU": 1}] * n, strategy="PACK") for n in sizes["servers"]]
        ray.get([pg.ready() for pg in self.server_groups], timeout=timeout_s)
        self.pack = max(sizes["trainers"], default=1)

    def _strategy(self, pg: Any, index: int) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=index,
            placement_group_capture_child_tasks=True)}  # fmt: skip

    def trainer(self, rank: int) -> dict[str, Any]:
        return self._strategy(self.trainer_groups[rank // self.pack], rank % self.pack)

    def server(self, index: int) -> dict[str, Any]:
        return self._strategy(self.server_groups[0], index)

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self.trainer_groups + self.server_groups:
            remove_placement_group(pg)
        self.trainer_groups, self.server_groups = [], []


def recoverable(exc: BaseException) -> bool:
    """Does this failure mean "restart the actors from the last checkpoint"? A dead actor (RayActorError), a
    dead engine process behind a live server actor (``servers.EngineProcessDied``),
    or a collective that failed or timed out inside a live one (NCCL / gloo: RayTaskError wrapping a
    DistBackendError, a DistError or a RuntimeError saying it timed out / lost its peer): the group is
    then unusable, exactly as if a member had died. Any other error is a bug and propagates.

    >>> recoverable(ValueError("bad config"))
    False
    >>> recoverable(RuntimeError("[gloo] Timed out waiting 5000ms for recv operation to complete"))
    True
    """
    import re

    try:
        from ray.exceptions import RayActorError, RayTaskError
    except ImportError:  # the doctest without Ray
        RayActorError = RayTaskError = ()  # type: ignore[assignment,misc]  # noqa: N806
    if RayActorError and isinstance(exc, RayActorError):
        return True
    cause = exc.cause if RayTaskError and isinstance(exc, RayTaskError) else exc  # type: ignore[union-attr]
    names = {t.__name__ for t in type(cause).__mro__}
    if names & {"DistBackendError", "DistError", "DistNetworkError", "DistStoreError", "EngineProcessDied"}:
        return True
    text = f"{cause}"
    return isinstance(cause, RuntimeError) and bool(
        re.search(
            r"timed out|timeout|NCCL error|Connection closed by peer|Connection reset|ProcessGroup",
            text,
            re.I,
        )
    )
