"""Level 2 trainer ranks: meta-device build + own-shard load, level 1's fast trainer, the HF export.

One gang of 2 gloo FSDP2 ranks on a SAVED ``tiny-tied`` directory (a model with files, so the meta path
runs), with ``fast_trainer`` (varlen attention + chunked head; root replicated):

* each rank read only its slices of the safetensors file (the replicated root + half of the layers), and
  the gathered weights are
  the saved ones bit for bit (tied head included);
* a dry-run step's loss and gradient norm equal level 1's packed loss on one plain process (rel 1e-4);
* the HF export (``save_for_disk(..., tokenizer=True)``) loads with ``from_pretrained`` (tied, equal).
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


def test_meta_load_fast_trainer_and_hf_export(local_ray, tmp_path):
    from transformers import AutoModelForCausalLM

    from common.policy.models import load_model
    from level1_batched.packing import accumulate_gradients_packed
    from level1_batched.vllm_engine import save_model
    from level2_distributed.train import deal_microbatches
    from level2_distributed.trainer import TrainerRank

    ref, tok = load_model("tiny-tied", dtype="float32", seed=0)
    src = save_model(ref, tok, tmp_path / "src")
    file_bytes = (Path(src) / "model.safetensors").stat().st_size
    cfg = TrainConfig.make(model=src, dtype="float32", seed=0)
    cls = ray.remote(TrainerRank).options(num_cpus=0)
    gang = [cls.remote(r, 2, cfg, True, 4096, fast_trainer=True) for r in range(2)]
    try:
        host, port = ray.get([gang[0].node_ip.remote(), gang[0].free_port.remote()])
        ray.get([a.setup.remote(f"{host}:{port}") for a in gang])
        reports = ray.get([a.report.remote() for a in gang])
        print("load reports:", reports, "file bytes", file_bytes)
        assert all(r["meta"] == 1.0 for r in reports)
        # the fast trainer keeps the root (tied embedding/head, final norm) whole on every rank; the decoder
        # layers are sharded: each rank reads the root + about half of the layers' bytes
        layer_bytes = sum(p.numel() * 4 for n, p in ref.named_parameters() if ".layers." in n)
        root_bytes = sum(p.numel() * 4 for n, p in ref.named_parameters() if ".layers." not in n)
        for r in reports:
            assert root_bytes + 0.4 * layer_bytes <= r["bytes_read"] <= root_bytes + 0.6 * layer_bytes
        assert sum(r["bytes_read"] for r in reports) == pytest.approx(2 * root_bytes + layer_bytes, rel=1e-3)
        full = ray.get([a.full_state_dict.remote() for a in gang])[0]
        want = {k: v for k, v in ref.state_dict().items() if k != "lm_head.weight"}
        assert full.keys() == want.keys() and all(torch.equal(full[k], want[k]) for k in want)

        st = json.loads(FIXTURE.read_text())["stages"]["execution"]
        datums, weights = [Datum(**d) for d in st["datums"]], st["weights"]
        n = float(sum(d.num_trained_tokens for d in datums))
        lengths = [len(d.prompt_ids) + len(d.output_ids) for d in datums]
        dealt = deal_microbatches(lengths, sum(lengths) // 2 + max(lengths), 2)
        parts = ray.get([a.train_step.remote([([datums[i] for i in mb], [weights[i] for i in mb]) for mb in mbs],
                                             n, dry_run=True) for a, mbs in zip(gang, dealt, strict=True)])  # fmt: skip
        ref.train()
        m = accumulate_gradients_packed(ref, datums, weights, 10**9)
        norm = float(torch.nn.utils.clip_grad_norm_(list(ref.parameters()), 1e9))
        loss = sum(p["loss/cispo"] for p in parts)
        print(f"fast FSDP2 world 2: loss {loss:.8g} vs level 1 {m['loss/cispo']:.8g}; grad norm "
              f"{parts[0]['grad_norm']:.8g} vs {norm:.8g}")  # fmt: skip
        assert loss == pytest.approx(m["loss/cispo"], rel=1e-4, abs=1e-7)
        assert parts[0]["grad_norm"] == pytest.approx(norm, rel=1e-4)
        assert parts[0]["grad_norm"] == parts[1]["grad_norm"]

        out = tmp_path / "export"
        ray.get([a.save_for_disk.remote(str(out), "float32", True) for a in gang])
        back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
        assert back.lm_head.weight.data_ptr() == back.get_input_embeddings().weight.data_ptr()
        assert all(torch.equal(back.state_dict()[k], want[k]) for k in want)
        assert (out / "tokenizer.json").exists() or (out / "tokenizer_config.json").exists()
    finally:
        for a in gang:
            ray.kill(a)
