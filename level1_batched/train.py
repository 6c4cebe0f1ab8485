"""Level 1: one node, batched. Level 0's algorithm, unchanged, with three scale ideas around it.

    python -m level1_batched.train --model tiny --steps 3                    # 1 process, no torchrun
    sera train --level 1 --model tiny --steps 3                               # the same, once the CLI has it
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 -m level1_batched.train --model tiny  # 2 CPU ranks
    torchrun --standalone --nproc_per_node 8 -m level1_batched.train --paper \
        --model Qwen/Qwen3-4B-Instruct-2507 --max-tokens-per-microbatch 16384  # one rank per GPU (nccl)

The loop is level 0's loop (`level0_single_process/train.py` is the oracle of this file: same sampler,
schedule, rewards, datums, CISPO loss, optimizer, checkpoints, metric names and log line, all imported).
What changes is only how the work is scheduled, one small function per idea:

1. Many rollouts in flight (:func:`collect_groups_in_flight`): all tasks x rollouts of a step run
   concurrently on one asyncio loop (``asyncio.gather`` of ``run_root``), so the agents' model calls meet
   in :class:`~common.policy.hf.HFPolicy`'s queue and run as batches of up to ``max_batch_size`` rows.
   Level 0 batches only the calls of one task group; every request keeps its own seeded generator, but
   a different batch composition (padding, kernel shapes) can change logits in the last bits and so,
   rarely, a sampled token (``--max-batch-size 1``: bit-exact repeats, at either level).
2. Packed micro-batches (:func:`accumulate_gradients_packed`): datums are packed first-fit-decreasing into
   rows of at most ``max_tokens_per_microbatch`` tokens; position ids restart at 0 for every datum, which
   transformers turns into a block-diagonal causal mask (no attention between datums), and logits are
   computed only at the positions that predict output tokens (``logits_to_keep``). Every micro-batch
   divides its CISPO sum by the trained-token count of the WHOLE step, so the micro-batch losses (and
   gradients) add up to level 0's token-mean.
3. Data parallel (:func:`allreduce_gradients`): with ``torchrun`` every rank rolls out its share of the
   step's tasks (whole task groups, so the LOO baselines stay on one rank), the trees are all-gathered so
   every rank builds the same batch (depth weights are over the whole batch), each rank trains on a
   token-balanced shard of the datums with the GLOBAL token count, and the gradients are summed across
   ranks before clipping and AdamW. World size 1 skips all of it. With bf16 compute, every micro-batch's
   gradient moves into the optimizer's fp32 master gradients right after its backward, and the ranks sum
   those (fp32, as level 0 and the public trainer).

Measured (bench/bench_level1.py): on a CPU the loss step gains from computing logits only at output
positions, and loses when rows hold several datums (sdpa's packed mask is dense: see Level1Config); on an
H200, 4K-token rows were 1.8x faster than one datum per row for the tiny model. Rollouts in flight:
3x on a 2-core CPU, 3.7-8.9x on one H200 (16 trees).

With ``--engine vllm`` (level1_batched/vllm_engine.py) the rollouts run on an in-process vLLM engine that
starts once per run, batches continuously (each agent's next turn joins the running batch), stays resident
during the optimizer step and gets the new weights copied in place; on CUDA the trainer then defaults to
the fast path (Level1Config.resolved: bf16 compute with fp32 masters, varlen attention, 32K-token rows).
``--eval-tasks FILE --eval-every N`` evaluates the current policy on held-out tasks on the same engine
(common/train_eval.py) and logs ``eval/success`` beside the rounds. ``--max-staleness 1``
(level1_batched/overlap.py) rolls the next round out while this round's batch trains (one optimizer step
off-policy, every datum tagged with the version that sampled it); 0, the default, is the loop as it was.

What it simplifies: with the hf engine no continuous batching (a wave of rollouts ends when its slowest
tree ends; TextCraft's replacement tasks run in a second wave) and generation on the training model itself
(strictly on-policy), the gradient all-reduce runs after the last micro-batch instead of overlapping with
the backward pass, and the optimizer state is replicated (no sharding). Level 2 (`level2_distributed/`)
removes these.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from common.agent.judge import make_judge
from common.agent.log import append_tree
from common.envs import env_spec
from common.policy.hf import release_engine_cache
from common.policy.lora import add_lora, checkpointed
from common.rl.batch import build_stage_batch
from common.rl.loss import RatioStats
from common.run.checkpoint import RunState, TorchCheckpointer, prepare_out, truncate_logs, with_base
from common.run.data import TaskSampler, seed_everything, task_pool
from common.run.metrics import (
    NO_UPDATE,
    MetricsWriter,
    RunHistory,
    closing_line,
    log_deadline_groups,
    log_line,
    plot_curves,
    staleness_metrics,
    step_metrics,
)
from common.run.optim import make_optimizer, place_optimizer_state
from common.run.progress import CountingPolicy, LiveStats, RunProgress
from common.run.rollout import make_env_with_prompts
from common.run.setup import (
    departures_line,
    idle_hint,
    method_and_schedule,
    out_of_time,
    paper_departures,
    train_policy,
)
from common.run.trainer_memory import gpu_memory_metrics
from common.train_config import TrainConfig
from common.train_eval import InRunEval
from level1_batched.config import Level1Config
from level1_batched.efficiency import size_trainer
from level1_batched.overlap import (
    Rollouts,
    RoundAhead,
    collect_round,
    fresh_groups,
    mps_hint,
    rollout_copy,
    round_limit_s,
    tag_datums,
)
from level1_batched.packing import (  # noqa: F401 - re-exported: tests and level-1 users import them from here
    accumulate_gradients_packed,
    check_packing,
    pack_microbatches,
    packed_logprobs,
)
from level1_batched.rollouts import collect_groups_in_flight, gather_groups, rollout_in_flight  # noqa: F401 (re-exported)


# ----------------------------------------------------------------------------------------------------
# Data parallel: one process per device, started by torchrun (world size 1 needs no torchrun).
# ----------------------------------------------------------------------------------------------------
def init_distributed() -> tuple[int, int, torch.device]:
    """``(rank, world_size, device)``; joins the process group when torchrun set ``WORLD_SIZE`` > 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    if world == 1:
        return 0, 1, device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if device.type == "cuda":
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(values: list[float], device: torch.device | str = "cpu") -> list[float]:
    """Element-wise sum of ``values`` over ranks (identity at world size 1)."""
    if not distributed():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_max(value: float, device: torch.device | str = "cpu") -> float:
    """The largest ``value`` over ranks (identity at world size 1)."""
    if not distributed():
        return float(value)
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def broadcast_parameters(model) -> None:
    """Every rank starts from rank 0's weights."""
    if distributed():
        for p in model.parameters():
            dist.broadcast(p.data, src=0)


def allreduce_gradients(model, bucket_numel: int = 2**24, optimizer=None) -> None:
    """THE data-parallel step: ``grad = sum over ranks of grad``, in flat buckets (a rank without datums
    contributes zeros). Each rank's loss already divides by the global token count, so the sum is the
    gradient of the step's token-mean. Not overlapped with the backward pass (DDP does that).

    With ``optimizer`` (a :class:`~common.run.optim.MasterWeightAdamW`) the fp32 gradients of its masters
    are reduced (any gradient still on the model is moved there first), so a bf16 model's gradients are
    summed over ranks in fp32, as the public trainer reduces; without it, the model's ``p.grad`` in the
    model's dtype. With an fp32 model both are the same tensors."""
    if not distributed():
        return
    if optimizer is not None:
        optimizer.accumulate_model_grads()  # no-op unless a backward ran after the last move
        params = list(optimizer.masters)
    else:
        params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    for i, p in enumerate(params):
        bucket.append(p.grad)
        if sum(g.numel() for g in bucket) >= bucket_numel or i == len(params) - 1:
            flat = torch.cat([g.reshape(-1) for g in bucket])  # [sum numel]
            dist.all_reduce(flat)
            for g, new in zip(bucket, flat.split([g.numel() for g in bucket]), strict=True):
                g.copy_(new.view_as(g))
            bucket = []


def balanced_shards(sizes: list[int], world: int) -> list[list[int]]:
    """Indices per rank, largest first onto the least-loaded rank (deterministic on every rank).

    >>> balanced_shards([5, 1, 4, 2], 2)
    [[0, 1], [2, 3]]
    """
    shards: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        shards[r].append(i)
        load[r] += sizes[i]
    return [sorted(s) for s in shards]


# ----------------------------------------------------------------------------------------------------
# The loss: packed micro-batches (level 0: one datum at a time), in level1_batched/packing.py so that
# level 2 trains with the same code: pack_microbatches, packed_logprobs, check_packing,
# accumulate_gradients_packed.
# ----------------------------------------------------------------------------------------------------


def longest_datum(cfg: TrainConfig) -> int:
    """The most tokens one datum can hold: a capped prompt plus the longest reply of any call (act,
    rubric, score). A packed row never holds less than one datum."""
    r = cfg.rollout
    outs = [r.max_new_tokens, r.rubric_max_new_tokens, r.score_max_new_tokens, r.branch_score_max_new_tokens or 0]
    return r.max_prompt_tokens + max(outs)


def train_on_shard(
    model, optimizer, datums, weights, n_tokens: float, cfg: TrainConfig, l1: Level1Config, stage: str = "execution"
) -> dict[str, float]:
    """One optimizer step over all ranks: this rank's datums, the global token count, summed gradients,
    global-norm clip, AdamW (identical on every rank, so the replicas stay equal). The micro-batch and rank
    sums are taken in fp32 on the optimizer's master gradients (bf16 compute included), as level 0's."""
    model.train()
    optimizer.zero_grad()
    m = accumulate_gradients_packed(
        model, datums, weights, l1.max_tokens_per_microbatch, num_tokens=n_tokens, optimizer=optimizer
    )
    allreduce_gradients(model, optimizer=optimizer)  # the one data-parallel line (fp32 master grads)
    grad_norm = optimizer.clip_and_step(cfg.optim.clip_for(stage))  # --grad-clip (--stage-grad-clip)
    model.eval()
    keys = ("loss/cispo", "loss/clip_frac", "train/microbatches", "train/packed_tokens")
    sums = ("loss/scored_tokens", "loss/ratio_sum", "loss/abs_log_ratio_sum")
    summed = all_reduce_sum([m.pop(k) for k in keys + sums], model.device)
    ratios = RatioStats.from_totals(summed[len(keys) :], all_reduce_max(m["loss/ratio_max"], model.device))
    return {**m, **dict(zip(keys, summed, strict=False)), **ratios, "grad_norm": grad_norm, "train/skipped": 0.0}


# ----------------------------------------------------------------------------------------------------
# The loop: level 0's, with the three functions above.
# ----------------------------------------------------------------------------------------------------
def train(cfg: TrainConfig, l1: Level1Config | None = None, progress: bool = True) -> RunHistory:
    """Run until ``cfg.steps`` optimizer steps; every rank returns the same metrics history."""
    from common.policy.models import load_model
    from common.policy.warmstart import resolve_init

    init = resolve_init(cfg.init_adapter, cfg.model, cfg.env, cfg.seed)  # a mismatched adapter fails here
    rank, world, device = init_distributed()
    l1 = (l1 or Level1Config()).resolved(cuda=device.type == "cuda")  # the device's defaults filled in
    if l1.max_staleness and world > 1:
        raise ValueError(f"--max-staleness {l1.max_staleness} runs on one rank for now (torchrun started {world})")
    out = Path(cfg.out)
    if rank == 0:
        prepare_out(out, cfg.resume)
    if distributed():
        dist.barrier()  # rank 0 has checked and created the directory
    seed_everything(cfg.seed)
    preset, schedule = method_and_schedule(cfg)
    pool = task_pool(cfg.env, cfg.tasks, cfg.n_tasks, cfg.seed, cfg.difficulty)
    model, tokenizer = load_model(
        cfg.model, dtype=cfg.optim.dtype, device=device, seed=cfg.seed, adapter=init.adapter
    )  # --init-adapter: the warm start merged into the weights (a vLLM engine starts from these)
    broadcast_parameters(model)
    if (l1.max_tokens_per_microbatch or 2) > 1:  # None: sized below (long rows)
        check_packing(model)
    stats = LiveStats()
    engine = None  # --engine vllm: a separate rollout engine, synced after every optimizer step
    if l1.engine != "hf":
        from level1_batched.vllm_engine import make_rollout_engine

        engine = make_rollout_engine(
            l1.engine,
            model,
            tokenizer,
            seed=cfg.seed,
            max_batch_size=cfg.max_batch_size,
            gpu_memory_utilization=l1.gpu_memory_utilization,
            kv_cache_gib=l1.kv_cache_gib,
            engine_process=l1.engine_process,
            log_stats=l1.engine_log_stats,
            async_scheduling=l1.async_scheduling,
            lora_rank=cfg.lora_rank,
            max_staleness=l1.max_staleness,  # LoRA: versions v and v + 1 run side by side when overlapping
        )  # from the base weights; with --lora-rank it serves the adapter unmerged (sync_weights)
    if cfg.lora_rank:  # --lora-rank: only a LoRA adapter over those weights trains (the paper: every weight)
        model = add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.seed)
    # the packed-row length and checkpointing that fit the trainer's memory (--gpu-share; issue #49)
    l1, mem_plan = size_trainer(model, l1, longest_datum(cfg), engine is not None, device)
    if l1.max_staleness and engine is None:  # hf: the trainer steps while the next round rolls out on a copy
        engine = rollout_copy(model, tokenizer, cfg.max_batch_size, cfg.seed)
    elif engine is not None:
        if l1.fast_trainer:
            from level1_batched.efficiency import apply_efficiency

            # after the engine started: the engine loaded plain weights
            apply_efficiency(
                model, checkpoint_fraction=l1.checkpoint_fraction, compile_layers=l1.compile_layers
            )
    policy = CountingPolicy(
        train_policy(cfg, model, tokenizer, max_batch_size=cfg.max_batch_size, engine=engine), stats
    )
    optimizer = make_optimizer(model, cfg.optim)
    state_dir = out / ("optimizer_state" if rank == 0 else f"optimizer_state_rank{rank}")
    place_optimizer_state(optimizer, cfg.optim.optimizer_state, state_dir, device.type)  # CPU: on disk
    ckpt = TorchCheckpointer(out, keep=cfg.keep_checkpoints)
    trained = checkpointed(model)  # what a checkpoint holds: the model, or a LoRA run's adapter only
    saved_config = with_base(asdict(cfg), init)  # what checkpoints record; a LoRA resume checks its base
    state = (ckpt.load_latest(trained, optimizer, saved_config) if cfg.resume else None) or RunState()
    if engine is not None:
        from level1_batched.vllm_engine import sync_weights

        sync_weights(engine, model, state.step)  # the engine started before a resumed checkpoint loaded
    if rank == 0:
        truncate_logs(out, state.round)
        departures = paper_departures(cfg)  # the settings this run takes from outside the paper
        if l1.max_staleness:  # level 1's own: rollouts one optimizer step behind (the paper: synchronous)
            departures.append(f"--max-staleness: {l1.max_staleness} (paper: 0, synchronous on-policy rounds)")
        (out / "config.json").write_text(
            json.dumps(
                {**asdict(cfg), "level1": asdict(l1), "world_size": world, "init_weights": init.record(),
                 "departures": departures, "memory_plan": asdict(mem_plan) if mem_plan else None},
                indent=2,
            )
        )  # fmt: skip
        print(init.line())
        print(departures_line(departures, out))
        if mem_plan is not None:
            print(mem_plan.line())
        if hint := mps_hint(l1, engine is not None, device.type):
            print(hint)
        print(
            f"[level1] {cfg.method} on {cfg.env} | model {cfg.model} | schedule {schedule} | world {world} "
            f"| {l1} | steps {state.step}->{cfg.steps}"
        )
    env, sampler = (
        make_env_with_prompts(cfg.env, cfg.rollout.prompts_dir, cfg.codeact_executor),
        TaskSampler(pool, cfg.seed, state.cursor),
    )
    judge = make_judge(cfg.judge, policy)
    writer = MetricsWriter(out, cfg.tensorboard) if rank == 0 else None
    stats.stuck_path = out / (f"stuck_calls.rank{rank}.jsonl" if rank else "stuck_calls.jsonl")
    bar = RunProgress(
        progress and rank == 0, cfg.steps, state.step, stats, heartbeat_s=30.0 if rank == 0 else 0
    )
    held_out = InRunEval(cfg)  # --eval-tasks: the current policy, on this engine, at step 0 and every N

    def evaluate_now(last: bool = False) -> None:
        if rank == 0:
            held_out.log_if_due(
                policy, state.round, state.step, writer, lambda line: bar.log(line, state.step), last=last
            )

    def roll_round(rnd: int, stage: str) -> Rollouts:  # --max-staleness 1: on RoundAhead's thread, mostly
        bar.rollouts_begin(f"{stage} rollouts of round {rnd}")  # the heartbeat speaks whatever the phase
        try:
            return collect_round(rnd, stage, sampler, lambda dropped: collect_groups_in_flight(
                cfg, stage, rnd, sampler, env, policy, judge, preset, rank, world, dropped,
                version=lambda: engine.version,  # the weights the engine holds as a wave starts
            ))  # fmt: skip
        finally:
            bar.rollouts_end()

    # the next round, rolling out during a step; waits for it bounded by every deadline of its waves
    ahead = RoundAhead(roll_round, round_limit_s(cfg)) if l1.max_staleness else None
    history: list[dict[str, Any]] = []
    idle = 0
    stopped: str | None = None  # why the run ends before --steps, if it does (sera train exits 3)
    started, late = time.monotonic(), None  # --time-limit-s counts from here; late: why it stops the run

    def past_limit(step: int) -> str | None:  # the slowest rank's clock, so every rank stops at one round
        if not cfg.time_limit_s or step >= cfg.steps:
            return None
        return out_of_time(cfg, 0.0, now=all_reduce_max(time.monotonic() - started, device))

    while state.step < cfg.steps:
        stage = schedule.stage_at(state.step)  # the clock is the policy version
        if ahead is None:  # --max-staleness 0 (the paper): this round rolls out now, with this policy
            evaluate_now()
            bar.phase(f"{stage} rollouts")
            t0 = time.perf_counter()
            dropped: list[list[Any]] = []  # groups cut by a deadline (replaced; logged, never trained)
            groups, replaced = collect_groups_in_flight(
                cfg, stage, state.round, sampler, env, policy, judge, preset, rank, world, dropped
            )
            t_roll = time.perf_counter() - t0
            cursor = sampler.cursor
            release_engine_cache(policy)  # the hf engine's KV slots and CUDA graphs: memory the step can use
        else:  # --max-staleness 1: most likely rolled out during the last step (overlap.py)
            bar.phase(f"{stage} rollouts (ahead)")
            t0 = time.perf_counter()
            got = ahead.take(state.round, stage)
            evaluate_now()  # no rollout in flight now
            groups, stale = fresh_groups(got.groups, state.step, l1.max_staleness)
            replaced, dropped, t_roll, cursor = got.replaced, got.dropped, got.seconds, got.end_task
        trees = [t for g in groups for t in g]
        batch = build_stage_batch(  # the same batch on every rank
            stage,
            groups,
            preset.execution_reward,
            zero_variance=env_spec(cfg.env).zero_variance,
            tokenizer=tokenizer,
            depth_weight_cap=cfg.depth_weight_cap,
        )
        datums, weights = batch.with_gradient()  # a zero advantage has a zero gradient: not computed
        mine = balanced_shards([len(d.prompt_ids) + len(d.output_ids) for d in datums], world)[rank]
        bar.phase("training")
        t1 = time.perf_counter()
        n_tokens = float(batch.num_trained_tokens)  # |M| counts every datum (the same batch on every rank)
        updated = batch.takes_step(cfg.min_trainable_datums)  # public decide_sync_action (paper: 8)
        if ahead is not None:
            versions = tag_datums(batch, groups)
            late = past_limit(state.step + int(updated))  # decided before the next round starts ahead
            goes_on = state.step + updated < cfg.steps and (updated or idle + 1 < cfg.max_idle_rounds) and not late
            if goes_on:  # the next round's stage is known now: this batch's takes_step moves the clock
                ahead.start(state.round + 1, schedule.stage_at(state.step + int(updated)))
        train_metrics = (
            train_on_shard(
                model,
                optimizer,
                [datums[i] for i in mine],
                [weights[i] for i in mine],
                n_tokens,
                cfg,
                l1,
                stage,
            )
            if updated
            else dict(NO_UPDATE)
        )
        t_train = time.perf_counter() - t1
        t_sync = sync_weights(engine, model, state.step + 1) if engine is not None and updated else 0.0
        t_round = time.perf_counter() - t0
        metrics = {
            **step_metrics(
                round=state.round, step=state.step, stage=stage, trees=trees, batch=batch, train=train_metrics,
                execution_reward=preset.execution_reward, t_rollout=t_roll, t_train=t_train, replaced=replaced,
                deadline_groups=len(dropped),
            ),
            "train/tokens_per_s": train_metrics.get("train/packed_tokens", 0.0) / max(t_train, 1e-9),
            "dp/world_size": world,
            "engine/update_s": t_sync,
            "time/round_s": t_round,
            **gpu_memory_metrics(device, mem_plan),  # mem/gpu_peak_gib, mem/gpu_total_gib, ... (CUDA)
        }  # fmt: skip
        if ahead is not None:
            metrics.update(staleness_metrics(versions, state.step, stale, ahead.wait_s, got.first_task, cursor))
        history.append(metrics)
        state.round, state.cursor = state.round + 1, cursor  # never past an in-flight round's draws
        state.step += int(updated)
        idle = 0 if updated else idle + 1
        if ahead is None:
            late = past_limit(state.step)
        if rank == 0:
            for t in trees:
                t.meta.update(step=metrics["step"], round=metrics["round"])
                append_tree(out / "trees.jsonl", t)
            log_deadline_groups(out, dropped, metrics["step"], metrics["round"])
            writer.write(metrics)  # logs first, checkpoint second (as level 0)
            if updated and (state.step % cfg.save_every == 0 or state.step == cfg.steps or late):
                ckpt.save(state, trained, optimizer, saved_config)
            bar.log(f"{log_line(metrics)} train_tokens_per_s={metrics['train/tokens_per_s']:.4g}", state.step)
            if not updated:
                bar.log(idle_hint(cfg, stage, batch, groups))
        if idle >= cfg.max_idle_rounds or late:
            stopped = late or f"{idle} rounds in a row without an optimizer step (--max-idle-rounds)"
            bar.log(f"stopping: {stopped}")
            break
    if ahead is not None:
        ahead.close()  # nothing should be running (no round starts past the last): a safety net
    evaluate_now(last=late is not None)  # the last step's policy (also the step --time-limit-s stopped at)
    bar.close()
    optimizer.close()  # --optimizer-state disk: the working files go (the checkpoint has its own)
    if rank == 0:
        writer.close()
        if history:
            plot_curves(out / "metrics.jsonl", out / "curves.png")
        print(closing_line(out, state.step, state.round))
    if distributed():
        dist.barrier()  # rank 0's checkpoint and plot are on disk before anyone returns
    return RunHistory(history, stopped=stopped)


# ----------------------------------------------------------------------------------------------------
# Command line (`python -m level1_batched.train`, torchrun): the `sera train` options at level 1.
# ----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    """Become ``sera train --level 1 ARGS`` (common/run/entry.py: the CLI imports this tier, not the reverse)."""
    from common.run.entry import exec_sera

    exec_sera(["train", "--level", "1"], "level1_batched.train", argv)


if __name__ == "__main__":
    main()
