"""Level 2's weight sync and gradient memory at scale, on CPU (issue #40 item 5).

* Broadcast sync moves bf16 tensors in buckets of ``--sync-bucket-mb``: two FSDP ranks (gloo) gather each
  bucket (the shards cast to bf16 first), rank 0 sends it, the server loads it as it arrives: the server
  ends with the trainer's weights in bf16 bit for bit, and never loaded more than one bucket at once
  (``largest_load_bytes``). The group creation is followed by a barrier of the FSDP ranks (world 2 here).
* Disk sync writes the serving dtype (bf16), not the fp32 masters.
* Gradients accumulate SHARDED: at world 2 with several micro-batches per rank, no rank holds a full
  unsharded gradient between backwards (``mem/unsharded_grads_gib`` = 0; the deferred reduce-scatter kept a
  full fp32 copy on every rank), and the accumulated gradient equals world 1's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="level 2 needs Ray: pip install 'ray[default]'")

from common.rl.datums import Datum  # noqa: E402
from common.train_config import TrainConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "rl_fixture.json"


def stage(name: str):
    st = json.loads(FIXTURE.read_text())["stages"][name]
    return [Datum(**d) for d in st["datums"]], st["weights"]


def gang(world: int) -> list:
    from level2_distributed.trainer import TrainerRank

    cfg = TrainConfig.make(model="tiny", dtype="float32", seed=0)
    cls = ray.remote(TrainerRank).options(num_cpus=0)
    actors = [cls.remote(r, world, cfg, False, 4096) for r in range(world)]
    host, port = ray.get([actors[0].node_ip.remote(), actors[0].free_port.remote()])
    ray.get([a.setup.remote(f"{host}:{port}") for a in actors], timeout=120)
    return actors


def deal(datums, weights, world, max_tokens):
    from level2_distributed.train import deal_microbatches

    lengths = [len(d.prompt_ids) + len(d.output_ids) for d in datums]
    return [
        [([datums[i] for i in mb], [weights[i] for i in mb]) for mb in mbs]
        for mbs in deal_microbatches(lengths, max_tokens, world)
    ]


def step(trainers, datums, weights):
    n = float(sum(d.num_trained_tokens for d in datums))
    limit = max(len(d.prompt_ids) + len(d.output_ids) for d in datums)
    ray.get([t.train_step.remote(mb, n) for t, mb in zip(trainers, deal(datums, weights, len(trainers), limit),
                                                          strict=True)], timeout=120)  # fmt: skip


def test_plan_buckets_splits_in_order_and_gives_big_tensors_their_own():
    from level2_distributed.sync import plan_buckets

    specs = [(str(i), [n], "float32") for i, n in enumerate([100, 100, 300, 50, 50, 50])]
    assert plan_buckets(specs, "bfloat16", 400) == [[0, 1], [2], [3, 4, 5]]
    assert plan_buckets(specs, "float32", 400) == [[0], [1], [2], [3, 4], [5]]
    assert plan_buckets(specs, "bfloat16", 10**9) == [[0, 1, 2, 3, 4, 5]]


@pytest.mark.timeout(300)
def test_bucketed_bf16_broadcast_and_bf16_disk_sync_at_world_2(local_ray, tmp_path):
    from safetensors import safe_open

    from level2_distributed.servers import HFServer
    from level2_distributed.sync import plan_buckets, setup_broadcast, sync_weights

    trainers = gang(2)
    server = ray.remote(HFServer).options(num_cpus=0, max_concurrency=8).remote("tiny", "bfloat16", 0, 2)
    try:
        datums, weights = stage("execution")
        step(trainers, datums, weights)
        setup_broadcast(trainers, [server], "", timeout_s=120)  # rank 0 + the server; then the FSDP barrier
        bucket_mb = 0.25
        specs = ray.get(trainers[0].weight_specs.remote())
        buckets = plan_buckets(specs, "bfloat16", int(bucket_mb * 2**20))
        m = sync_weights(trainers, [server], "broadcast", 1, str(tmp_path / "w"), "bfloat16", bucket_mb)
        assert m["sync/buckets"] == len(buckets) > 2
        want = ray.get([t.full_state_dict.remote() for t in trainers])[0]
        got = ray.get(server.weights.remote())
        for k, v in want.items():
            assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], v.to(torch.bfloat16)), k
        info = ray.get(server.info.remote())
        biggest = max(2 * torch.Size(s[1]).numel() for s in specs)
        print(f"{len(buckets)} buckets of <= {bucket_mb} MB; the server's largest load {info['largest_load_bytes']} "
              f"bytes (largest tensor {biggest})")  # fmt: skip
        assert info["version"] == 1 and info["largest_load_bytes"] <= max(bucket_mb * 2**20, biggest)
        assert info["largest_load_bytes"] < sum(2 * torch.Size(s[1]).numel() for s in specs) / 2

        step(trainers, *stage("rubric"))
        sync_weights(trainers, [server], "disk", 2, str(tmp_path / "w"), "bfloat16")
        with safe_open(str(tmp_path / "w" / "model.safetensors"), "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
        want = ray.get([t.full_state_dict.remote() for t in trainers])[0]
        got = ray.get(server.weights.remote())
        for k, v in want.items():
            assert torch.equal(got[k], v.to(torch.bfloat16)), k
    finally:
        for a in [*trainers, server]:
            ray.kill(a)


@pytest.mark.timeout(300)
def test_accumulated_gradients_stay_sharded_and_match_world_1(local_ray):
    one, two = gang(1), gang(2)
    try:
        for name in ("execution", "rubric"):
            datums, weights = stage(name)
            n = float(sum(d.num_trained_tokens for d in datums))
            limit = max(len(d.prompt_ids) + len(d.output_ids) for d in datums)
            grads, unsharded = {}, {}
            for label, actors in (("world 1", one), ("world 2", two)):
                mbs = deal(datums, weights, len(actors), limit)
                if label == "world 2":
                    assert all(len(r) >= 2 for r in mbs), [len(r) for r in mbs]  # accumulation on every rank
                parts = ray.get([a.train_step.remote(mb, n, dry_run=True, return_grads=True)
                                 for a, mb in zip(actors, mbs, strict=True)], timeout=120)  # fmt: skip
                grads[label] = parts[0]["grads"]
                unsharded[label] = [p["mem/unsharded_grads_gib"] for p in parts]
            print(name, "micro-batches per rank at world 2:", len(deal(datums, weights, 2, limit)[0]),
                  "unsharded gradient GiB held between backwards:", unsharded)  # fmt: skip
            assert unsharded["world 2"] == [0.0, 0.0]
            g1, g2 = grads["world 1"], grads["world 2"]
            for k in g1:
                assert float((g2[k] - g1[k]).abs().max()) <= 1e-4 * float(g1[k].abs().max()) + 1e-12, (
                    name,
                    k,
                )
    finally:
        for a in one + two:
            ray.kill(a)
