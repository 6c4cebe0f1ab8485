"""Level 2 with a TIED model (``tiny-tied``: input embedding == LM head, as SmolLM2 and Qwen3-4B).

A tied model's ``state_dict()`` names ``lm_head.weight`` although ``named_parameters()`` lists only
``model.embed_tokens.weight``; level 2 used to crash at the step-0 sync of ``--model smollm2``
(``KeyError: update_weights: the model has no tensors named ['lm_head.weight']``). Checked here:

* the engine accepts the alias (``HFPolicy.update_weights`` with ``state_dict()`` names);
* FSDP2 trainer -> hf server, by broadcast (gloo group) and by disk reload: the server ends with the
  trainer's weights bit for bit, its head still tied, its log-probs the trainer's (``LOGP_TOL``), and the
  sync check's weight fingerprints equal (different after a step that is not synced yet);
* the HF export of the trained model loads with ``from_pretrained`` and is still tied.

The colocated (in-process) and vLLM paths have their own files (test_level2_colocate.py,
test_level2_vllm.py), also with ``tiny-tied``.
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
MODEL = "tiny-tied"
LOGP_TOL = 1e-4
"""Server vs trainer log-probs with bit-identical fp32 weights (different kernels / summation order)."""


def execution_batch() -> tuple[list[Datum], list[float]]:
    st = json.loads(FIXTURE.read_text())["stages"]["execution"]
    return [Datum(**d) for d in st["datums"]], st["weights"]


def trainer_gang(world: int) -> list:
    from level2_distributed.trainer import TrainerRank

    cfg = TrainConfig.make(model=MODEL, dtype="float32", seed=0, lr=1e-3)
    cls = ray.remote(TrainerRank).options(num_cpus=0)
    actors = [cls.remote(r, world, cfg, False, 4096) for r in range(world)]
    host, port = ray.get([actors[0].node_ip.remote(), actors[0].free_port.remote()])
    ray.get([a.setup.remote(f"{host}:{port}") for a in actors])
    return actors


def step(trainers: list, datums: list[Datum], weights: list[float]) -> None:
    from level2_distributed.train import deal_microbatches

    n = float(sum(d.num_trained_tokens for d in datums))
    lengths = [len(d.prompt_ids) + len(d.output_ids) for d in datums]
    dealt = deal_microbatches(lengths, 4096, len(trainers))
    ray.get([t.train_step.remote([([datums[i] for i in mb], [weights[i] for i in mb]) for mb in mbs], n)
             for t, mbs in zip(trainers, dealt, strict=True)])  # fmt: skip


def test_engine_accepts_the_tied_alias():
    from common.policy.hf import HFPolicy
    from common.policy.models import load_model

    policy = HFPolicy(MODEL, dtype="float32", device="cpu")
    other, _ = load_model(MODEL, dtype="float32", seed=1)
    sd = other.state_dict()
    assert "lm_head.weight" in sd and "lm_head.weight" not in dict(other.named_parameters())
    policy.update_weights(list(sd.items()), version=1)
    emb = policy.model.get_input_embeddings().weight
    assert policy.model.lm_head.weight is emb and torch.equal(emb, other.get_input_embeddings().weight)
    with pytest.raises(KeyError, match="no tensors named"):
        policy.update_weights([("lm_head.bias", torch.zeros(3))], version=2)


def test_broadcast_and_disk_sync_with_a_tied_model(local_ray, tmp_path):
    from level2_distributed.servers import HFServer
    from level2_distributed.sync import setup_broadcast, sync_weights

    trainers = trainer_gang(2)
    server = ray.remote(HFServer).options(num_cpus=0, max_concurrency=8).remote(MODEL, "float32", 0, 4)
    try:
        datums, weights = execution_batch()
        d = datums[0]
        specs = ray.get(trainers[0].weight_specs.remote())
        assert [s[0] for s in specs].count("model.embed_tokens.weight") == 1
        assert "lm_head.weight" not in [s[0] for s in specs]  # the alias is not sent twice
        before = ray.get(server.score_logprobs.remote(d.prompt_ids, d.output_ids))

        def weight_gap() -> float:  # the sync check's sync/weight_gap (System.weight_gap)
            from common.policy.engine import fingerprint_gap

            want = ray.get([t.weights_fingerprint.remote("float32") for t in trainers])[0]  # every rank
            return fingerprint_gap(ray.get(server.engine_fingerprint.remote()), want)

        assert weight_gap() == 0.0  # both loaded the same model; the tied head counted once on both sides
        for version, mode in ((1, "broadcast"), (2, "disk")):
            step(trainers, datums, weights)
            assert weight_gap() > 1e-9, mode  # trained, not synced yet: the fingerprints tell
            if mode == "broadcast":
                setup_broadcast(trainers, [server])
            sync_weights(trainers, [server], mode, version, str(tmp_path / "w"), "float32")
            full = ray.get([t.full_state_dict.remote() for t in trainers])[0]  # a collective: every rank
            got = ray.get(server.weights.remote())
            assert all(torch.equal(got[k], full[k]) for k in full), mode
            assert torch.equal(got["lm_head.weight"], got["model.embed_tokens.weight"])  # still tied
            after, want, _ = ray.get([server.score_logprobs.remote(d.prompt_ids, d.output_ids)]
                                     + [t.score_logprobs.remote(d.prompt_ids, d.output_ids) for t in trainers])  # fmt: skip
            diff = max(abs(a - b) for a, b in zip(after, want, strict=True))
            moved = max(abs(a - b) for a, b in zip(after, before, strict=True))
            print(f"tied {mode}: max |server - trainer| log-prob {diff:.1e}, moved {moved:.1e}")
            assert diff <= LOGP_TOL and moved > 1e-3
            assert ray.get(server.info.remote())["version"] == version
            assert weight_gap() == 0.0, mode  # the same values in the same order: equal sums, bit for bit
    finally:
        for a in [*trainers, server]:
            ray.kill(a)
