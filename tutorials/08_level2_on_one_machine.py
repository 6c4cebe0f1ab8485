# %% [markdown]
# # Tutorial 8 — level 2 on one machine: local Ray, two FSDP2 trainer ranks, one inference server
#
# Level 2 (`level2_distributed/`) is the paper's system: the model lives in two places. Inference
# **servers** (Ray actors) only generate; **trainer ranks** (Ray actors in one FSDP2 process group) hold
# the sharded weights and the optimizer; after every optimizer step the new weights are **synced** from
# trainer rank 0 to every server (a broadcast, or a reload from disk). The loop, the rewards, the datums
# and the packed CISPO loss are level 1's.
#
# Here everything runs on this CPU: a local Ray with 2 CPUs, 2 gloo FSDP2 ranks of the `tiny` model and
# one hf server. First the same parity check as tutorial 7 (the recorded fixture's golden loss and
# gradient norm), then one real step and a weight sync after which the server's log-probs equal the
# trainer's. It needs Ray (`pip install -e '.[distributed]'`); without it the tutorial says so and stops.
#
#     python tutorials/08_level2_on_one_machine.py     # ~1-2 min on 2 cores (Ray start-up included)

# %%
import json
import os
import tempfile
from pathlib import Path

try:
    import ray
except ImportError:
    ray = None
if ray is None:
    print("SKIPPED: level 2 needs Ray: pip install -e '.[distributed]' (or pip install 'ray[default]')")
    raise SystemExit(0)

from common.rl.datums import Datum
from common.train_config import TrainConfig
from level2_distributed.servers import HFServer
from level2_distributed.sync import setup_broadcast, sync_weights
from level2_distributed.train import deal_microbatches
from level2_distributed.trainer import TrainerRank

ROOT = Path(__file__).resolve().parents[1]
fx = json.loads((ROOT / "tests" / "fixtures" / "rl_fixture.json").read_text())
os.environ.setdefault("SERA_L2_THREADS", "1")
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
         runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "SERA_L2_THREADS": "1"}})  # fmt: skip

# %% [markdown]
# ## Two trainer ranks
# `TrainerRank` is a plain class; `ray.remote(...)` makes it an actor. Rank 0 tells the others where to
# meet (`host:port`), then every rank loads the model and shards it with `fully_shard`.

# %%
cfg = TrainConfig.make(model="tiny", dtype="float32", seed=0)  # the fixture's model
Rank = ray.remote(TrainerRank).options(num_cpus=0)
ranks = [Rank.remote(r, 2, cfg, False, 4096) for r in range(2)]
host, port = ray.get([ranks[0].node_ip.remote(), ranks[0].free_port.remote()])
ray.get([a.setup.remote(f"{host}:{port}") for a in ranks])


def dealt(datums, weights, world):
    """The driver packs the batch into micro-batches and deals them out to the ranks."""
    lengths = [len(d.prompt_ids) + len(d.output_ids) for d in datums]
    return [[([datums[i] for i in mb], [weights[i] for i in mb]) for mb in mbs]
            for mbs in deal_microbatches(lengths, 4096, world)]  # fmt: skip


# %% [markdown]
# ## The parity check
# `dry_run=True`: gradients and their global norm, no update. Each rank returns its share of the loss.

# %%
worst_loss, worst_norm = 0.0, 0.0
for stage, st in fx["stages"].items():
    datums, weights, gold = [Datum(**d) for d in st["datums"]], st["weights"], st["golden"]
    n_tok = float(sum(d.num_trained_tokens for d in datums))
    parts = ray.get([a.train_step.remote(mb, n_tok, dry_run=True)
                     for a, mb in zip(ranks, dealt(datums, weights, 2), strict=True)])  # fmt: skip
    loss, norms = sum(p["loss/cispo"] for p in parts), {p["grad_norm"] for p in parts}
    scale = sum(abs(w * d.advantage) * sum(abs(b) for b, m in zip(d.behaviour_logprobs, d.loss_mask,
                strict=True) if m) for d, w in zip(datums, weights, strict=True)) / n_tok  # fmt: skip
    dl, dn = abs(loss - gold["loss"]), abs(parts[0]["grad_norm"] - gold["grad_norm"]) / gold["grad_norm"]
    print(f"{stage:<10} FSDP2 x2: loss {loss:.8f} (golden {gold['loss']:.8f}, |diff| {dl:.1e}) "
          f"grad norm {parts[0]['grad_norm']:.6f} (golden {gold['grad_norm']:.6f}, rel diff {dn:.1e})")  # fmt: skip
    assert len(norms) == 1, norms  # every rank reports the same global norm
    assert dl <= 1e-5 * scale + 1e-9 and dn <= 1e-4
    worst_loss, worst_norm = max(worst_loss, dl), max(worst_norm, dn)

# %% [markdown]
# ## One server, one real step, one weight sync
# The server starts from the same seed-0 weights. After a real optimizer step on the ranks, the server is
# stale; after `sync_weights` (a gloo broadcast from rank 0) it scores tokens exactly as the trainer does.

# %%
print("starting the server ...", flush=True)
server = ray.remote(HFServer).options(num_cpus=0, max_concurrency=8).remote("tiny", "float32", 0, 4)
ex = fx["stages"]["execution"]
datums, weights = [Datum(**d) for d in ex["datums"]], ex["weights"]
d = datums[0]
print("server up; one real step on the ranks ...", flush=True)
before = ray.get(server.score_logprobs.remote(d.prompt_ids, d.output_ids))
n_tok = float(sum(x.num_trained_tokens for x in datums))
ray.get([a.train_step.remote(mb, n_tok) for a, mb in zip(ranks, dealt(datums, weights, 2), strict=True)])
print("sync group ...", flush=True)
setup_broadcast(ranks, [server])
WORK = tempfile.TemporaryDirectory(prefix="sera_tutorial08_")  # deleted when Python exits
m = sync_weights(ranks, [server], "broadcast", 1, WORK.name, "float32")
after = ray.get(server.score_logprobs.remote(d.prompt_ids, d.output_ids))
# every FSDP rank takes part in a forward (the weights are sharded): ask both, read rank 0's answer
want = ray.get([r.score_logprobs.remote(d.prompt_ids, d.output_ids) for r in ranks])[0]
gap = max(abs(a - b) for a, b in zip(after, want, strict=True))
moved = max(abs(a - b) for a, b in zip(after, before, strict=True))
print(f"sync {m['time/sync_s']:.3f} s: server vs trainer log-prob max |diff| {gap:.1e}; the step moved them {moved:.1e}")
assert moved > 1e-3 and gap <= 1e-4  # tests/test_level2.py LOGP_TOL: two float32 programs, one set of weights
print(f"TUTORIAL08 max_loss_diff {worst_loss:.1e} max_grad_norm_rel_diff {worst_norm:.1e} sync_gap {gap:.1e}")
for a in [*ranks, server]:
    ray.kill(a)
ray.shutdown()

# %% [markdown]
# ## Running level 2
#     sera train --level 2 --model tiny --trainers 2 --servers 1 --steps 3     # this machine, CPU
#     sera train --level 2 --single-node 2 --model smollm2                    # 1 GPU serves, 1 GPU trains
#     sera train --level 2 --paper --paper-cluster --model Qwen/Qwen3-4B-Instruct-2507   # 2 x 8 H200
#
# ## GPU notes
# On GPUs the ranks use NCCL instead of gloo, bf16 compute with fp32 master shards (FSDP2's
# `MixedPrecisionPolicy`), and the servers can be SGLang or vLLM. The cluster launch guide is in
# `level2_distributed/README.md`. bench/RESULTS.md has no level-2 measurement yet; its GPU numbers for the
# pieces are: the vLLM engine's weight update takes 0.012 s for SmolLM2 on one H200 ("Engines"), and one
# Qwen3-4B-shaped trainer step on 16K tokens takes 1.40 s at 27.6% MFU ("Trainer efficiency").
