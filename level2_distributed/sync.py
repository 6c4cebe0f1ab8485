"""Weight sync: after an optimizer step, the servers get the trainer's new weights.

Two ways, one contract (the servers end with exactly the trainer's weights and the new policy version):

* ``broadcast`` (default): trainer rank 0 and the servers form their OWN process group (member 0 = trainer
  rank 0, members 1..S = the servers), separate from the trainers' FSDP group. For each tensor, every
  trainer rank takes part in the all-gather of its shards (FSDP2 ``full_tensor``), then rank 0 broadcasts
  the full tensor, cast to the serving dtype, to every server at once. NCCL on GPUs (GPU-to-GPU over NVLink
  / InfiniBand, no CPU copy), gloo on CPU. Cost: one all-gather + one broadcast of the model per step.
* ``disk`` (fallback, e.g. when the servers cannot join a group: another cluster, a firewall): rank 0
  writes ``model.safetensors`` + ``config.json`` and every server reloads them (SGLang:
  ``/update_weights_from_disk``). Slower (a write and S reads of the model), but needs only a shared path.

Broadcast moves BUCKETS (``--sync-bucket-mb``, default 1 GB as AReaL's chunks; verl uses 512 MB): all ranks
all-gather a bucket's tensors (each shard cast to the serving dtype first), then rank 0 sends them; each
server loads a bucket as it arrives (one request per bucket to an engine process or SGLang), so no side
holds a second full copy of the model. Disk writes the serving dtype too.

What it simplifies: within a bucket the tensors still go one broadcast each (SGLang's
``update_weights_from_distributed`` receives tensor by tensor; newer SGLang can take one flat buffer per
bucket), and sync is blocking (the next rollout waits for it; see --max-staleness).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

TIMEOUT = timedelta(minutes=10)


def make_sync_group(host: str, port: int, rank: int, size: int, device: torch.device, timeout_s: float = 0):
    """A standalone process group (its own TCP store; it does not touch the default group)."""
    timeout = timedelta(seconds=timeout_s) if timeout_s else TIMEOUT
    store = dist.TCPStore(host, port, size, rank == 0, timeout=timeout)
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, opts)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def init_named_group(
    backend: str, host: str, port: int, rank: int, size: int, group_name: str, timeout_s: float = 0
):
    """The weight-update group as SGLang builds its side of it (``init_custom_process_group`` in
    ``sglang/srt/utils``, called by ``ModelRunner.init_weights_update_group``): a ``tcp://`` rendezvous,
    the store wrapped in ``PrefixStore(group_name, store)``, then torch's ``_new_process_group_helper``
    (which prefixes again per group and backend). Trainer rank 0 must build the SAME group, or the two
    sides look for each other's keys under different names and the broadcast never completes (the raw
    ``TCPStore`` of :func:`make_sync_group` does not meet SGLang's). Returns the process group (use
    ``dist.broadcast(t, src=0, group=pg)``)."""
    import inspect

    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    timeout = timedelta(seconds=timeout_s) if timeout_s else TIMEOUT
    store, rank, size = next(rendezvous(f"tcp://{host}:{port}", rank, size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    params = inspect.signature(_new_process_group_helper).parameters  # pg_options became backend_options
    opts = {"backend_options": None} if "backend_options" in params else {"pg_options": None}
    pg, _ = _new_process_group_helper(size, rank, [], Backend(backend), store, group_name=group_name, timeout=timeout,
                                      **opts)  # fmt: skip
    _world.pg_group_ranks[pg] = {i: i for i in range(size)}
    return pg


class NamedGroup:
    """A group from :func:`init_named_group` behind the ``group.broadcast(t, 0).wait()`` calls of this module."""

    def __init__(self, pg) -> None:
        self.pg = pg

    def broadcast(self, tensor: torch.Tensor, src: int):
        return dist.broadcast(tensor, src=src, group=self.pg, async_op=True)


BUCKET_MB = 1024
"""Default bucket size of a weight sync (``--sync-bucket-mb``): AReaL sends 1 GB chunks, verl 512 MB buckets."""


def plan_buckets(specs: list[tuple[str, list[int], str]], dtype: str, bucket_bytes: int) -> list[list[int]]:
    """Split the tensors of ``specs`` (in order) into buckets of at most ``bucket_bytes`` in ``dtype`` (a tensor
    larger than that is a bucket of its own). The trainer gathers and sends one bucket at a time and each
    server loads it as it arrives, so neither side holds more than one bucket beyond the model.

    >>> specs = [("a", [4, 4], "float32"), ("b", [4], "float32"), ("c", [64], "float32"), ("d", [2], "float32")]
    >>> plan_buckets(specs, "bfloat16", 40)
    [[0, 1], [2], [3]]
    """
    size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    buckets: list[list[int]] = []
    used = 0
    for i, (_, shape, _) in enumerate(specs):
        n = size * int(torch.Size(shape).numel())
        if not buckets or used + n > bucket_bytes:
            buckets.append([])
            used = 0
        buckets[-1].append(i)
        used += n
    return buckets


def broadcast_tensor(group, tensor: torch.Tensor) -> None:
    """Send ``tensor`` from member 0 to every member (blocking)."""
    group.broadcast(tensor, 0).wait()


def receive_tensors(group, specs: list[tuple[str, list[int], str]], device: torch.device, dtype: str):
    """Yield ``(name, tensor)`` for every spec as member 0 broadcasts them (same order as the sender)."""
    target = getattr(torch, dtype)
    for name, shape, _ in specs:
        buf = torch.empty(shape, dtype=target, device=device)
        group.broadcast(buf, 0).wait()
        yield name, buf


def get_all(refs: list[Any]) -> list[Any]:
    """``ray.get(refs)``, but an actor's failure raises at once: when one FSDP rank dies, the others block in
    a collective forever, and a plain ``ray.get`` would wait for them first."""
    import ray

    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ray.get(done)  # raises RayActorError if that actor died
    return ray.get(refs)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def setup_broadcast(trainers: list[Any], servers: list[Any], group_name: str = "", timeout_s: float = 0) -> None:
    """Form the sync group: trainer rank 0 + every server (called once, then after any restart).
    ``group_name`` (SGLang servers): build it as SGLang does (:func:`init_named_group`). ``timeout_s``: the
    servers' side of the group fails after it, as the trainer's (``--collective-timeout-s``; SGLang's API
    has no such field: its own default)."""
    import ray

    host, port = ray.get([trainers[0].node_ip.remote(), trainers[0].free_port.remote()])  # rank 0's node
    size = 1 + len(servers)
    refs = [t.join_sync_group.remote(host, port, size, group_name) for t in trainers]
    refs += [s.join_sync_group.remote(host, port, i + 1, size, timeout_s) for i, s in enumerate(servers)]
    get_all(refs)


def sync_weights(
    trainers: list[Any], servers: list[Any], mode: str, version: int, disk_path: str, dtype: str,
    bucket_mb: float = BUCKET_MB,
) -> dict[str, float]:  # fmt: skip
    """Move the trainers' weights, in the serving ``dtype``, to every server and set the servers' version:
    ``broadcast`` in buckets of ``bucket_mb`` (:func:`plan_buckets`), or ``disk``. Returns timings."""
    import ray

    t0 = time.perf_counter()
    m: dict[str, float] = {}
    if mode == "broadcast":
        specs = ray.get(trainers[0].weight_specs.remote())
        buckets = plan_buckets(specs, dtype, int(bucket_mb * 2**20))
        recv = [s.receive_broadcast.remote(specs, version, dtype, buckets) for s in servers]
        send = [t.broadcast_weights.remote(dtype, buckets) for t in trainers]
        get_all(send + recv)
        m["sync/buckets"] = float(len(buckets))
    else:
        get_all([t.save_for_disk.remote(disk_path, dtype) for t in trainers])
        get_all([s.load_from_disk.remote(disk_path, version) for s in servers])
    return {"time/sync_s": time.perf_counter() - t0, "sync/version": float(version), **m}
