"""Colocated mode (``--colocate``) on CPU: a trainer rank and its engine in ONE actor, two gloo ranks.

After a step, ``sleep`` -> in-process sync -> ``wake`` (no-ops on CPU: the hf engine has nothing to
offload; what is checked is that the driver's calls happen and the weights / log-probs): every rank's
engine holds the trainer's gathered weights bit for bit (tied head still tied), its log-probs equal the
trainer's within ``LOGP_TOL``, and a generation reports the new version. Then a 1-step level-2 run with
``--colocate`` end to end (router over the ranks' engines, the loop's sleep/sync/wake).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="level 2 needs Ray: pip install 'ray[default]'")

from common.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from common.rl.datums import Datum  # noqa: E402
from common.train_config import TrainConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOGP_TOL = 1e-4


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # fmt: skip
    yield ray
    ray.shutdown()


def test_colocated_ranks_sync_their_engines_in_process(local_ray):
    from level2_distributed.colocate import ColocatedRank
    from level2_distributed.train import deal_microbatches

    cfg = TrainConfig.make(model="tiny-tied", dtype="float32", seed=0, lr=1e-3)
    cls = ray.remote(ColocatedRank).options(num_cpus=0, max_concurrency=16)
    gang = [cls.remote(r, 2, cfg, False, 4096) for r in range(2)]
    try:
        host, port = ray.get([gang[0].node_ip.remote(), gang[0].free_port.remote()])
        ray.get([a.setup.remote(f"{host}:{port}") for a in gang])
        ray.get([a.setup_engine.remote("hf", "float32", 4) for a in gang])
        st = json.loads((ROOT / "tests" / "fixtures" / "rl_fixture.json").read_text())["stages"]["execution"]
        datums, weights = [Datum(**d) for d in st["datums"]], st["weights"]
        lengths = [len(d.prompt_ids) + len(d.output_ids) for d in datums]
        dealt = deal_microbatches(lengths, sum(lengths) // 2 + max(lengths), 2)
        n = float(sum(d.num_trained_tokens for d in datums))
        d = datums[0]
        before = ray.get(gang[0].score_logprobs.remote(d.prompt_ids, d.output_ids))
        ray.get([a.sleep.remote() for a in gang])
        ray.get([a.train_step.remote([([datums[i] for i in mb], [weights[i] for i in mb]) for mb in mbs], n)
                 for a, mbs in zip(gang, dealt, strict=True)])  # fmt: skip
        secs = ray.get([a.sync_engine.remote(1) for a in gang])
        ray.get([a.wake.remote() for a in gang])
        full = ray.get([a.full_state_dict.remote() for a in gang])[0]
        for a in gang:
            got = ray.get(a.engine_weights.remote())
            assert all(torch.equal(got[k], full[k]) for k in full)
            assert torch.equal(got["lm_head.weight"], got["model.embed_tokens.weight"])
            assert ray.get(a.engine_calls.remote()) == {"sleep": 1, "wake": 1}
        eng = ray.get([a.score_logprobs.remote(d.prompt_ids, d.output_ids) for a in gang])
        want = ray.get([a.trainer_logprobs.remote(d.prompt_ids, d.output_ids) for a in gang])[0]
        diff = max(abs(x - y) for e in eng for x, y in zip(e, want, strict=True))
        moved = max(abs(x - y) for x, y in zip(eng[0], before, strict=True))
        print(
            f"colocated sync {max(secs):.3f}s: max |engine - trainer| log-prob {diff:.1e}, moved {moved:.1e}"
        )
        assert diff <= LOGP_TOL and moved > 1e-3
        req = GenerationRequest(
            messages=[{"role": "user", "content": "hi"}], sampling=SamplingParams(4, temperature=0)
        )
        completion, version = ray.get(gang[1].generate.remote(req))
        assert version == 1 and len(completion.output_ids) == 4
    finally:
        for a in gang:
            ray.kill(a)


def test_colocated_level2_run(local_ray, tmp_path):
    from level2_distributed.config import Level2Config
    from level2_distributed.train import train

    cfg = TrainConfig.make(env="textcraft", model="tiny-tied", steps=1, schedule="execution:1", tasks_per_step=1,
                           rollouts_per_task=2, max_steps=2, max_new_tokens=8, rubric_max_new_tokens=8,
                           oracle_mix=0.7, score_noise=0.3, difficulty="medium", n_tasks=8, max_idle_rounds=4,
                           codeact_executor="worker-ordered", out=str(tmp_path / "run"))  # fmt: skip
    l2 = Level2Config(trainers=1, colocate=True, server_batch_size=2, activation_checkpointing=False,
                      sync_check=True)  # fmt: skip
    history = train(cfg, l2, progress=False)
    checks = [h["sync/weight_gap"] for h in history if "sync/weight_gap" in h]
    assert checks and all(g == 0.0 for g in checks)  # the engine holds the trainer's weights, bit for bit
    assert history and history[-1]["step"] == 0 and history[-1]["offpolicy/gap_max"] == 0.0
    assert history[-1]["servers"] == 1 and history[-1]["offpolicy/completions"] > 0
    assert (tmp_path / "run" / "model" / "model.safetensors").exists()  # the HF export
