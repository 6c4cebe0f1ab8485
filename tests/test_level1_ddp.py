"""Level 1 end to end under torchrun: 2 processes (gloo on CPU) against 1, step by step.

``torchrun --standalone --nproc_per_node 2 -m level1_batched.train`` runs one round with the tiny model
(each rank rolls out its share of the task groups, the trees are all-gathered, each rank trains on half
the datums, gradients are summed); the same config runs in this process at world size 1. Two things are
compared, each only where it is a function of the inputs:

* the rollouts: the same task groups, and in every tree the same first call (prompt, sampling seed, reply):
  the ranks draw tasks and seeds as one process does. Whole trees are NOT compared: sibling sub-agents
  act concurrently on their tree's shared world, and the oracle of ``--oracle-mix`` plans from the live
  inventory, so whether a sibling's leftovers are there when a child plans follows the timing of the
  engine's batches (a loaded CI machine saw both outcomes, in either world size);
* the training: world 1 retrains world 2's own trees (the batch built from its trees.jsonl) on a fresh
  model; the logged datums, token count, loss and gradient norm and the checkpoint's weights must match
  to float32 accuracy (summation order differs). The parity of every stage's gradients at world size 2
  is also pinned on the recorded fixture in tests/test_level1.py.

Run: pytest tests/test_level1_ddp.py -s  (about 45 s on 2 CPU cores)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.agent.log import read_trees
from common.envs import env_spec
from common.policy.models import load_model, load_tokenizer
from common.rl.batch import build_stage_batch
from common.run.optim import make_optimizer
from common.run.setup import method_and_schedule
from common.train_config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
# tests/test_level0.py's small TextCraft config: teacher-forced oracle replies give signal. One round (one
# optimizer step): the module docstring says what is compared and why whole trees are not.
SMALL = dict(
    env="textcraft", model="tiny", steps=1, schedule="execution:1,delegation:1", tasks_per_step=2,
    rollouts_per_task=2, max_steps=3, max_new_tokens=16, rubric_max_new_tokens=16, oracle_mix=0.7,
    score_noise=0.3, difficulty="medium", n_tasks=16, max_task_replacements=1,
)  # fmt: skip


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def first_difference(ta: list, tb: list) -> str:
    """Where two runs' trees first differ (tree, node, call, role and both replies), or ``same trees``:
    printed beside the comparison, so a run on a loaded CI machine says what moved."""
    if len(ta) != len(tb):
        return f"{len(ta)} trees vs {len(tb)}"
    for i, (x, y) in enumerate(zip(ta, tb, strict=True)):
        if x.task_id != y.task_id or x.nodes.keys() != y.nodes.keys():
            return f"tree {i}: {x.task_id} with nodes {sorted(x.nodes)} vs {y.task_id} {sorted(y.nodes)}"
        for nid, na in x.nodes.items():
            nb = y.nodes[nid]
            pairs = [(f"step {s.index}", s.call, t.call) for s, t in zip(na.steps, nb.steps, strict=False)]
            pairs += [(k, getattr(na, k), getattr(nb, k)) for k in ("rubric_call", "score_call")]
            for where, ca, cb in pairs:
                if (ca is None) != (cb is None) or (
                    ca and (ca.prompt_ids, ca.output_ids) != (cb.prompt_ids, cb.output_ids)
                ):
                    role = (ca or cb).role
                    return f"tree {i} ({x.task_id}) node {nid} {where} {role}: replies {getattr(ca, 'text', None)!r} vs {getattr(cb, 'text', None)!r}"
            if len(na.steps) != len(nb.steps):
                return f"tree {i} node {nid}: {len(na.steps)} steps vs {len(nb.steps)}"
    return "same trees"


@pytest.mark.slow
def test_torchrun_two_processes_match_one(tmp_path: Path):
    import torch

    from level1_batched.train import Level1Config, train, train_on_shard

    out2 = tmp_path / "world2"
    args = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "level1_batched.train", *args, f"--out={out2}", "--max-tokens-per-microbatch=4096"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    logged = [ln for ln in proc.stdout.splitlines() if ln.startswith("step=")]
    assert len(logged) == len(rows(out2)), proc.stdout  # only rank 0 logs, one line per round

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = TrainConfig.make(**SMALL, out=str(tmp_path / "world1"))
        train(cfg, Level1Config(max_tokens_per_microbatch=4096), progress=False)
    finally:
        torch.set_num_threads(threads)

    two, one = rows(out2), rows(Path(cfg.out))
    assert len(two) == len(one) == 1 and two[0]["dp/world_size"] == 2
    a, b = two[0], one[0]
    assert (a["step"], a["stage"]) == (b["step"], b["stage"])
    ta, tb = read_trees(out2 / "trees.jsonl"), read_trees(Path(cfg.out) / "trees.jsonl")
    print(f"world 2 vs world 1 trees: {first_difference(ta, tb)}")
    assert [t.task_id for t in ta] == [t.task_id for t in tb]  # the same groups, in the same order
    for x, y in zip(ta, tb, strict=True):
        cx, cy = x.nodes[x.root_id].steps[0].call, y.nodes[y.root_id].steps[0].call
        assert cx.sampling == cy.sampling and cx.prompt_ids == cy.prompt_ids, x.task_id
        assert cx.output_ids == cy.output_ids and cx.text == cy.text, x.task_id

    # world 1 trains on world 2's trees: the same batch, datums, loss, gradient norm and weights
    preset, _ = method_and_schedule(cfg)
    groups = [ta[i : i + cfg.rollouts_per_task] for i in range(0, len(ta), cfg.rollouts_per_task)]
    batch = build_stage_batch(a["stage"], groups, preset.execution_reward,
                              zero_variance=env_spec(cfg.env).zero_variance, tokenizer=load_tokenizer("tiny"))  # fmt: skip
    datums, weights = batch.with_gradient()
    assert (len(batch.datums), float(batch.num_trained_tokens)) == (a["batch/datums"], a["loss/tokens"])
    assert datums, "no datum with a gradient: the config gives no signal"
    model, _ = load_model("tiny", dtype="float32", seed=cfg.seed)
    optimizer = make_optimizer(model, cfg.optim)
    l1 = Level1Config(max_tokens_per_microbatch=4096)
    m = train_on_shard(model, optimizer, datums, weights, float(batch.num_trained_tokens), cfg, l1)
    print(
        f"step {a['step']} {a['stage']}: world 2 loss {a['loss/cispo']:.8g} grad norm {a['grad_norm']:.8g} "
        f"| world 1 on its trees: loss {m['loss/cispo']:.8g} grad norm {m['grad_norm']:.8g} | datums {len(datums)}"
    )
    assert a["loss/cispo"] == pytest.approx(m["loss/cispo"], rel=1e-4, abs=1e-6)
    assert a["grad_norm"] == pytest.approx(m["grad_norm"], rel=1e-4, abs=1e-7) and a["grad_norm"] > 0
    saved = torch.load(out2 / "checkpoints" / "step_000001" / "state.pt", weights_only=False)["model"]
    for name, w in model.state_dict().items():
        torch.testing.assert_close(saved[name], w, rtol=1e-4, atol=1e-6, msg=name)
