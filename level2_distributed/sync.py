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

What it simplifies: tensors go one by one (real systems bucket them into ~1 GB flat buffers to cut the
per-call latency), and sync is blocking (the next rollout waits for it; see --max-staleness).
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


def setup_broadcast(trainers: list[Any], servers: list[Any]) -> None:
    """Form the sync group: trainer rank 0 + every server (called once, then after any restart)."""
    import ray

    host, port = ray.get([trainers[0].node_ip.remote(), trainers[0].free_port.remote()])  # rank 0's node
    size = 1 + len(servers)
    refs = [t.join_sync_group.remote(host, port, size) for t in trainers]
    refs += [s.join_sync_group.remote(host, port, i + 1, size) for i, s in enumerate(servers)]
    ray.get(refs)


def sync_weights(
    trainers: list[Any], servers: list[Any], mode: str, version: int, disk_path: str, dtype: str
) -> dict[str, float]:
    """Move the trainers' weights to every server and set the servers' version. Returns timings."""
    import ray

    t0 = time.perf_counter()
    if mode == "broadcast":
        specs = ray.get(trainers[0].weight_specs.remote())
        recv = [s.receive_broadcast.remote(specs, version, dtype) for s in servers]
        send = [t.broadcast_weights.remote(dtype) for t in trainers]
        get_all(send + recv)
    else:
        get_all([t.save_for_disk.remote(disk_path) for t in trainers])
        get_all([s.load_from_disk.remote(disk_path, version) for s in servers])
    return {"time/sync_s": time.perf_counter() - t0, "sync/version": float(version)}
