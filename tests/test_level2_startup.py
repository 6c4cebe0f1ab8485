"""Level 2 start-up at cluster scale, on CPU (issue #40 item 1).

* A model given as a hub id that is in the local HF cache (``--model Qwen/Qwen3-4B-Instruct-2507`` on the
  cluster; here the tiny model saved under ``sera-test/tiny-llama`` in a fake cache with the hub's
  snapshot layout) loads on every FSDP trainer rank (each rank reads its own slices from the snapshot's
  safetensors: the meta-device path) with the weights of a plain ``from_pretrained``, and a vLLM server
  takes the model's own context length (``max_position_embeddings`` of the snapshot's config, not the
  4,096-token fallback).
* ``--paper-cluster`` keeps ``--server-engine vllm``; with the default engine it picks SGLang, and the CLI's
  pre-flight check (on the resolved config) refuses that engine before Ray starts when SGLang cannot run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray", reason="level 2 needs Ray: pip install 'ray[default]'")

ROOT = Path(__file__).resolve().parents[1]
HUB_ID = "sera-test/tiny-llama"
CONTEXT = 12288
"""The fake hub model's ``max_position_embeddings`` (neither the 4,096 fallback nor the tiny model's 8,192)."""


@pytest.fixture()
def fake_hub(tmp_path, monkeypatch):
    """An HF hub cache holding ``sera-test/tiny-llama`` (``models--sera-test--tiny-llama/snapshots/<rev>`` +
    ``refs/main``), as ``huggingface-cli download`` leaves it; HF_HUB_CACHE points at it."""
    import huggingface_hub.constants as hc

    from common.policy.models import load_model

    cache = tmp_path / "hub"
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--sera-test--tiny-llama"
    snap = repo / "snapshots" / rev
    model, tok = load_model("tiny", dtype="float32", seed=0)
    model.config.max_position_embeddings = CONTEXT
    model.save_pretrained(snap)
    tok.save_pretrained(snap)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    return snap, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_cached_hub_id_resolves_to_its_snapshot_and_gives_vllm_its_context(fake_hub):
    from common.policy.models import check_model_name, resolve_model_path
    from level1_batched.vllm_engine import _config_value, model_dir

    snap, _ = fake_hub
    assert check_model_name(HUB_ID) == "hf-cache"
    assert Path(resolve_model_path(HUB_ID)) == snap
    # what VLLMEngine computes for max_model_len (level1_batched/vllm_engine.py: the model directory's config)
    assert Path(model_dir(HUB_ID)) == snap
    assert int(_config_value(model_dir(HUB_ID), "max_position_embeddings")) == CONTEXT


@pytest.mark.timeout(180)
def test_every_trainer_rank_loads_a_hub_id_from_the_cache(fake_hub):
    """Two FSDP ranks (Ray actors, gloo) build ``sera-test/tiny-llama`` on the meta device and read only their
    own slices from the snapshot; the gathered weights are the saved model's, bit for bit."""
    from common.train_config import TrainConfig
    from level2_distributed.placement import actor_env
    from level2_distributed.trainer import TrainerRank

    _, want = fake_hub
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # fmt: skip
    try:
        env = actor_env()
        assert env.get("HF_HUB_CACHE"), "the actors must see the driver's HF cache"
        cfg = TrainConfig.make(model=HUB_ID, dtype="float32", seed=0)
        cls = ray.remote(TrainerRank).options(num_cpus=0, runtime_env={"env_vars": env})
        ranks = [cls.remote(r, 2, cfg, False, 4096) for r in range(2)]
        host, port = ray.get([ranks[0].node_ip.remote(), ranks[0].free_port.remote()])
        ray.get([t.setup.remote(f"{host}:{port}") for t in ranks], timeout=120)
        reports = ray.get([t.report.remote() for t in ranks])
        assert all(r["meta"] == 1.0 for r in reports), reports  # the meta-device path, own slices only
        total = sum(v.numel() * v.element_size() for v in want.values())
        assert all(0 < r["bytes_read"] < total for r in reports), (reports, total)
        got = ray.get([t.full_state_dict.remote() for t in ranks])[0]
        for k, v in want.items():
            if k in got:
                assert torch.equal(got[k], v), k
    finally:
        ray.shutdown()


def test_paper_cluster_keeps_the_users_server_engine():
    from level2_distributed.config import Level2Config

    assert Level2Config(paper_cluster=True, server_engine="vllm").resolved().server_engine == "vllm"
    assert Level2Config(paper_cluster=True, server_engine="hf").resolved().server_engine == "hf"
    r = Level2Config(paper_cluster=True).resolved()
    assert (r.server_engine, r.trainers, r.servers, r.ray_address) == ("sglang", 8, 8, "auto")


def test_a_shared_gpu_in_split_mode_needs_disk_sync():
    """``--trainer-gpus 0.5 --server-gpus 0.5`` can put a trainer rank and a server on one GPU; the broadcast
    group would then hold two ranks on one device (NCCL refuses): one clear error, the ways out named."""
    from level2_distributed.config import Level2Config

    with pytest.raises(ValueError, match=r"--trainer-gpus 0.5 --server-gpus 0.5: .*--weight-sync disk"):
        Level2Config(trainer_gpus=0.5, server_gpus=0.5)
    with pytest.raises(ValueError, match=r"^--server-gpus 0.25: "):
        Level2Config(trainer_gpus=1, server_gpus=0.25)
    Level2Config(trainer_gpus=0.5, server_gpus=0.5, weight_sync="disk")  # no NCCL group: allowed
    Level2Config(trainer_gpus=0.5, colocate=True)  # one process per GPU: no group between ranks
    Level2Config(trainer_gpus=1, server_gpus=1)


def test_cli_refuses_paper_clusters_sglang_before_ray_starts(tmp_path, monkeypatch):
    """``--paper-cluster`` resolves to SGLang servers; without SGLang in this interpreter and without
    ``--server-python`` the CLI stops with one line before Ray starts (the pre-flight check reads the
    RESOLVED config); ``--server-engine vllm`` is checked for vLLM the same way."""
    import importlib.util
    import sys

    from typer.testing import CliRunner

    from sera.cli import app

    for pkg in ("sglang", "vllm"):
        if importlib.util.find_spec(pkg) is not None:
            monkeypatch.setitem(sys.modules, pkg, None)  # hidden: counts as missing (sera.cli.installed)
    assert not ray.is_initialized()
    out = tmp_path / "run"
    r = CliRunner().invoke(
        app, ["train", "--level", "2", "--paper-cluster", "--model", "tiny", "--out", str(out)]
    )
    assert r.exit_code != 0
    text = " ".join(r.output.split())
    assert (
        "--server-engine sglang (--paper-cluster's engine) without --server-python needs the sglang" in text
    )
    r = CliRunner().invoke(app, ["train", "--level", "2", "--paper-cluster", "--server-engine", "vllm",
                                 "--model", "tiny", "--out", str(out)])  # fmt: skip
    assert r.exit_code != 0 and "--server-engine vllm without --server-python needs the vllm" in " ".join(
        r.output.split()
    )
    assert not ray.is_initialized() and not out.exists()
    r = CliRunner().invoke(app, ["train", "--level", "2", "--paper-cluster", "--server-engine", "vllm",
                                 "--print-config"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["level2"]["server_engine"] == "vllm"
