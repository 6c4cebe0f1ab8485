"""Level 0: the complete SERA training algorithm in one readable process.

    sera train                                   # SmolLM2-135M on CPU, TextCraft, a short run
    sera train --env textworld --method sera --steps 20 --out runs/l0_tw
    sera train --model tiny --steps 3            # random-init tiny model (tests, seconds)
    sera train --out runs/l0 --resume            # continue after a crash / kill -9
    python -m level0_single_process.train --help # the same, without the console script

One loop, top to bottom, with every piece of SPEC.md §4 (the boring parts — sampler, metrics, progress,
checkpoints — come from ``common/run``; the algorithm stays here, in view):

    while version < steps:
        stage  = schedule.stage_at(version)              # execution:16, delegation:2, rubric:2
        trees  = rollouts(tasks x rollouts_per_task)     # recursive trees; K counterfactual branches
                                                         #   at delegations in Rubric-stage rollouts
        batch  = build_stage_batch(stage, trees)         # rewards -> LOO advantages -> datums
        loss   = CISPO(datums, depth weights)            # token-mean over every trained token
        AdamW step (lr 3e-6, wd 0.017, betas 0.9/0.95, grad clip 1.0); version += 1
        log metrics, append trees to the offline log, checkpoint

The clock is the policy version: a round whose batch has no trained token makes no update and does not
move the stage (it is retried with new tasks), so a Rubric slot is never lost to a round without a mixed
group.

What it simplifies (only the systems, never the algorithm): rollouts run one task group at a time (its
trees and their agents concurrently, beside a spare group that stands in if it has no signal:
``--spare-groups``; the model calls in flight together run as one batch of up to ``--max-batch-size``, ``1`` =
one call at a time and bit-exact repeats), generation uses the training model itself (strictly on-policy, no
weight sync; on a GPU its decode step replays as a CUDA graph, ``common/policy/slots.py``), the loss is computed one datum at a time (only datums with a nonzero advantage: the others have
an exactly zero gradient), and the defaults are shrunk for a laptop CPU
(1 task x 2 rollouts, 3 steps per agent, 256-token replies, 2 optimizer steps) — ``--paper`` restores the
paper's sizes. Level 1 (`level1_batched/`) puts every task of a step in flight and packs the loss; level 2
distributes it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from common.agent.judge import make_judge
from common.agent.log import append_tree
from common.envs import env_spec
from common.memory import release_memory
from common.policy.hf import HFPolicy, decode_metrics, find_engine, release_engine_cache
from common.policy.lora import add_lora, checkpointed
from common.rl.batch import build_stage_batch
from common.rl.loss import RatioStats, cispo_loss, token_logprobs
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
    step_metrics,
)
from common.run.optim import make_optimizer, place_optimizer_state
from common.run.progress import CountingPolicy, LiveStats, RunProgress
from common.run.rollout import collect_groups as collect_task_groups
from common.run.rollout import make_env_with_prompts, rollout_in_flight, run_round
from common.run.setup import (
    departures_line,
    idle_hint,
    method_and_schedule,
    out_of_time,
    paper_departures,
    stages_note,
    train_policy,
)
from common.run.trainer_memory import (
    OutOfMemory,
    check_weights_fit,
    generation_oom,
    gpu_memory_metrics,
    setup_oom,
    training_oom,
)
from common.train_config import TrainConfig
from common.train_eval import InRunEval


# ----------------------------------------------------------------------------------------------------
# Rollouts: one task group at a time; K counterfactual branches only in Rubric-stage rollouts.
# ----------------------------------------------------------------------------------------------------
def collect_groups(
    cfg: TrainConfig, stage: str, rnd: int, sampler: TaskSampler, env, policy, judge, preset, dropped=None
) -> tuple[list[list[Any]], int]:
    """``tasks_per_step`` groups of ``rollouts_per_task`` trees, one group at a time (its trees at once). A
    group without signal is replaced by a fresh task (TextCraft's Execution-stage rule), rolled out beside
    it as a spare (``--spare-groups``); a group cut by a deadline goes to ``dropped`` and is replaced too:
    :func:`common.run.rollout.collect_groups`."""

    def roll(jobs):
        return run_round(rollout_in_flight(jobs, env, policy, judge), cfg.rollout.cancel_grace_s, f"round {rnd}")

    return collect_task_groups(cfg, stage, rnd, sampler, preset, roll, per_wave=1, dropped=dropped)


# ----------------------------------------------------------------------------------------------------
# The loss: CISPO over the stage's datums, one datum at a time (level 1 packs them).
# ----------------------------------------------------------------------------------------------------
def datum_logprobs(model, datum) -> torch.Tensor:
    """log pi_theta(y_t) of the datum's output tokens. Shapes: ids [1, P+T] -> logits [1, T+1, V] -> [1, T].
    Logits only where they are used (``logits_to_keep``): the positions P-1 .. P+T-1 that predict the T
    output tokens and the last one; the LM head over a 1.5K-token prompt would be most of the memory."""
    ids = torch.tensor([datum.prompt_ids + datum.output_ids], device=model.device)
    T = len(datum.output_ids)
    logits = model(input_ids=ids, logits_to_keep=T + 1, use_cache=False).logits  # [1, T+1, V]
    return token_logprobs(logits[:, :-1], ids[:, ids.shape[1] - T :])  # [1, T]: position t predicts token t+1


def accumulate_gradients(
    model, datums, weights, optimizer=None, num_tokens: int | None = None
) -> dict[str, float]:
    """Backpropagate the CISPO loss of a whole batch, datum by datum. Each datum's loss is divided by the
    batch's trained-token count |M| (``num_tokens``; default: the datums' own), so the accumulated gradient
    is that of the token-mean over the batch:

        L = -(1/|M|) sum_t sg(clip(rho_t, 0, 5)) * A_t * w_d * log pi_theta(y_t)    (common/rl/loss.py)

    With ``optimizer`` (a :class:`~common.run.optim.MasterWeightAdamW`), each datum's gradient is moved
    into the fp32 master gradients right after its backward, so the batch sum is taken in fp32 even when
    the model computes in bf16 (as the public trainer reduces); without it, grads add up in ``.grad``.
    """
    n_tokens = sum(d.num_trained_tokens for d in datums) if num_tokens is None else num_tokens
    total, clipped, ratios = 0.0, 0.0, RatioStats()  # ratios: behaviour vs trainer log-probs (on-policy ~1)
    for d, w in zip(datums, weights, strict=True):
        logp = datum_logprobs(model, d)  # [1, T]
        loss, m = cispo_loss(
            logp,
            torch.tensor([d.behaviour_logprobs], device=logp.device),  # [1, T]
            torch.tensor([d.advantage], device=logp.device),  # [1]
            torch.tensor([d.loss_mask], dtype=torch.float32, device=logp.device),  # [1, T]
            weights=torch.tensor([w], device=logp.device),
            num_tokens=n_tokens,
        )  # this datum's share
        loss.backward()  # grads add up
        if optimizer is not None:
            optimizer.accumulate_model_grads()  # ... in fp32, on the masters (no-op for an fp32 model)
        total += loss.item()
        clipped += m["loss/clip_frac"] * sum(d.loss_mask)
        ratios.add(m)
    return {
        "loss/cispo": total,
        "loss/tokens": float(n_tokens),
        "loss/clip_frac": clipped / max(1, n_tokens),
        **ratios.metrics(),
    }


def lean_training(model, optimizer) -> None:
    """What keeps level 0's peak memory near its weights and optimizer state (issue #38.7: the quick start
    peaked at 7.1 GB RSS, mostly one ~2K-token datum's activations, 1-2 GB, kept beside everything else):

    * activation checkpointing of every decoder layer (transformers' ``activation_checkpointing_enable``,
      non-reentrant): the backward pass recomputes a layer's activations instead of keeping all of them; it
      acts in ``model.train()`` only, so generation (``model.eval()``) is untouched. The same gradients, bit
      for bit on a CPU (``tests/test_quickstart_cost.py``); the forward runs twice, so a training step takes
      longer (the step is a small part of a quick-start round);
    * each parameter's gradient moved into its fp32 master as soon as it is complete
      (:meth:`~common.run.optim.MasterWeightAdamW.grads_to_masters_in_backward`)."""
    if getattr(model, "supports_gradient_checkpointing", False):
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.25 (the old name warns)
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer.grads_to_masters_in_backward()


def train_on_batch(model, optimizer, batch, cfg: TrainConfig) -> dict[str, float]:
    """One optimizer step: gradients of the whole batch, global-norm clip, AdamW (fp32 master weights).
    Only the datums with a gradient run (``batch.with_gradient()``: a zero advantage gives an exactly zero
    gradient); |M| counts every datum's tokens, so the step is that of the whole batch. Out of GPU memory:
    the step's gradients go and :class:`OutOfMemory` says in one line what to lower (:func:`training_oom`)."""
    model.train()
    optimizer.zero_grad()
    datums, weights = batch.with_gradient()
    try:
        metrics = accumulate_gradients(model, datums, weights, optimizer, num_tokens=batch.num_trained_tokens)
        grad_norm = optimizer.clip_and_step(cfg.optim.clip_for(batch.stage))  # --grad-clip (--stage-grad-clip)
    except torch.OutOfMemoryError:
        longest = max((len(d.prompt_ids) + len(d.output_ids) for d in datums), default=0)
        oom = training_oom(cfg, longest, next(model.parameters()).device)  # what was held, before it goes
        optimizer.zero_grad()
        model.eval()
        raise oom from None
    model.eval()
    return {**metrics, "grad_norm": grad_norm, "train/skipped": 0.0}


def engine_out_of_memory(policy, cfg: TrainConfig, device) -> OutOfMemory | None:
    """The run's one line when the hf engine ran out of GPU memory during the rollouts (its callers got the
    error and their agents ended, so the round is not trained), else None."""
    failure = getattr(find_engine(policy, HFPolicy), "failure", None)
    if failure is None:
        return None
    return generation_oom(cfg, getattr(failure, "rows", 0), device, note=getattr(failure, "note", None))


# ----------------------------------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------------------------------
def train(cfg: TrainConfig, progress: bool = True) -> RunHistory:
    from common.policy.models import load_model
    from common.policy.warmstart import resolve_init

    init = resolve_init(cfg.init_adapter, cfg.model, cfg.env, cfg.seed)  # a mismatched adapter fails here
    out = Path(cfg.out)
    prepare_out(out, cfg.resume)
    seed_everything(cfg.seed)
    preset, schedule = method_and_schedule(cfg)
    pool = task_pool(cfg.env, cfg.tasks, cfg.n_tasks, cfg.seed, cfg.difficulty)  # bad task files fail here
    device = "cuda" if torch.cuda.is_available() else "cpu"  # a laptop GPU if there is one
    try:  # a card too small for the weights and optimizer state: one line (sera train exits 2), no traceback
        model, tokenizer = load_model(
            cfg.model, dtype=cfg.optim.dtype, device=device, seed=cfg.seed, adapter=init.adapter
        )  # --init-adapter: the warm start merged into the weights
        if cfg.lora_rank:  # --lora-rank: only a LoRA adapter over those weights trains (the paper: every weight)
            model = add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.seed)
        check_weights_fit(model, cfg, device)  # weights + optimizer state vs the card, before they are made
        stats = LiveStats()
        policy = CountingPolicy(
            train_policy(cfg, model, tokenizer, max_batch_size=cfg.max_batch_size), stats
        )  # the calls in flight together (siblings, the group's rollouts) run as one batch
        optimizer = make_optimizer(model, cfg.optim)
        lean_training(model, optimizer)  # activation checkpointing; gradients onto the masters as they come
        place_optimizer_state(optimizer, cfg.optim.optimizer_state, out / "optimizer_state", device)  # CPU: disk
    except torch.OutOfMemoryError:
        raise setup_oom(cfg, device) from None
    ckpt = TorchCheckpointer(out, keep=cfg.keep_checkpoints)
    trained = checkpointed(model)  # what a checkpoint holds: the model, or a LoRA run's adapter only
    saved_config = with_base(asdict(cfg), init)  # what checkpoints record; a LoRA resume checks its base
    state = (ckpt.load_latest(trained, optimizer, saved_config) if cfg.resume else None) or RunState()
    truncate_logs(out, state.round)
    env, sampler = (
        make_env_with_prompts(cfg.env, cfg.rollout.prompts_dir, cfg.codeact_executor),
        TaskSampler(pool, cfg.seed, state.cursor),
    )
    judge = make_judge(cfg.judge, policy)
    writer = MetricsWriter(out, cfg.tensorboard)
    departures = paper_departures(cfg)  # the stability knobs and sizes this run takes from outside the paper
    (out / "config.json").write_text(
        json.dumps({**asdict(cfg), "init_weights": init.record(), "departures": departures}, indent=2)
    )
    print(init.line())
    print(departures_line(departures, out))
    print(
        f"[level0] {cfg.method} on {cfg.env} | model {cfg.model} | schedule {schedule} | steps {state.step}->{cfg.steps}"
    )
    stages = stages_note(schedule, state.step, cfg.steps)  # the quick start: Execution-stage steps only
    if stages:
        print(stages)
    stats.stuck_path = out / "stuck_calls.jsonl"  # what was in flight when a deadline fired
    bar = RunProgress(progress, cfg.steps, state.step, stats)  # + a heartbeat line every 30 s of a slow round
    held_out = InRunEval(cfg)  # --eval-tasks: held-out success of the current policy at step 0 and every N
    history, idle = [], 0
    stopped: str | None = None  # why the run ends before --steps, if it does (sera train exits 3)

    def out_of_memory(oom: OutOfMemory) -> OutOfMemory:  # a setting too large for the card: its one line
        bar.close()  # ... after the live display and the heartbeat ended
        writer.close()
        optimizer.close()
        return oom
    started, late = time.monotonic(), None  # --time-limit-s counts from here; late: why it stopped the run
    while state.step < cfg.steps:
        held_out.log_if_due(policy, state.round, state.step, writer, lambda line: bar.log(line, state.step))
        stage = schedule.stage_at(state.step)  # the clock is the policy version
        # 1. Rollouts with the current policy.
        bar.phase(f"{stage} rollouts")
        t0 = time.perf_counter()
        dropped: list[list[Any]] = []  # groups cut by a deadline (replaced; logged, never trained)
        groups, replaced = collect_groups(
            cfg, stage, state.round, sampler, env, policy, judge, preset, dropped
        )
        t_roll = time.perf_counter() - t0
        if oom := engine_out_of_memory(policy, cfg, device):  # the engine ran out of GPU memory: no training
            raise out_of_memory(oom)
        release_engine_cache(policy)  # the engine's KV slots and CUDA graphs: memory the step can use
        release_memory()  # the rollouts' caches, freed on the engine's thread, back to the OS before training
        trees = [t for g in groups for t in g]
        # 2. Rewards -> LOO advantages -> datums of this stage (common/rl: rewards.py, datums.py, weights.py).
        batch = build_stage_batch(
            stage,
            groups,
            preset.execution_reward,
            zero_variance=env_spec(cfg.env).zero_variance,
            tokenizer=tokenizer,
            depth_weight_cap=cfg.depth_weight_cap,
        )
        # 3. CISPO loss and one AdamW step, only with --min-trainable-datums datums that have a trained token.
        bar.phase("training")
        t1 = time.perf_counter()
        updated = batch.takes_step(cfg.min_trainable_datums)  # public decide_sync_action (paper: 8)
        try:
            train_metrics = train_on_batch(model, optimizer, batch, cfg) if updated else dict(NO_UPDATE)
        except OutOfMemory as oom:
            raise out_of_memory(oom) from None
        t_train = time.perf_counter() - t1
        release_memory()  # the step's activations, before the next rollouts
        # 4. Log (first), checkpoint (second): a run killed in between redoes this round.
        metrics = step_metrics(
            round=state.round, step=state.step, stage=stage, trees=trees, batch=batch, train=train_metrics,
            execution_reward=preset.execution_reward, t_rollout=t_roll, t_train=t_train, replaced=replaced,
            t_round=time.perf_counter() - t0, deadline_groups=len(dropped),
        )  # fmt: skip
        metrics.update(gpu_memory_metrics(device))  # mem/gpu_peak_gib, mem/gpu_total_gib on a GPU (else none)
        metrics.update(decode_metrics(policy))  # engine/graph_replays, ... when the engine decodes in slots
        log_deadline_groups(out, dropped, state.step, state.round)
        for t in trees:
            t.meta.update(step=state.step, round=state.round)
            append_tree(out / "trees.jsonl", t)
        writer.write(metrics)
        history.append(metrics)
        state.round, state.cursor = state.round + 1, sampler.cursor
        state.step += int(updated)
        late = out_of_time(cfg, started) if state.step < cfg.steps else None  # --time-limit-s: the last round
        if updated and (state.step % cfg.save_every == 0 or state.step == cfg.steps or late):
            ckpt.save(state, trained, optimizer, saved_config)
        bar.log(log_line(metrics), state.step)
        idle = 0 if updated else idle + 1
        if not updated:
            bar.log(idle_hint(cfg, stage, batch, groups))
        if idle >= cfg.max_idle_rounds or late:
            stopped = late or f"{idle} rounds in a row without an optimizer step (--max-idle-rounds)"
            bar.log(f"stopping: {stopped}")
            break
    held_out.log_if_due(  # the last step's policy (also the step --time-limit-s stopped at)
        policy, state.round, state.step, writer, lambda line: bar.log(line, state.step), last=late is not None
    )
    if oom := engine_out_of_memory(policy, cfg, device):
        raise out_of_memory(oom)
    bar.close()
    writer.close()
    optimizer.close()  # --optimizer-state disk: the working files go (the checkpoint has its own)
    if history:
        plot_curves(out / "metrics.jsonl", out / "curves.png")
    if stages:
        print(stages)  # said again at the end, beside what the run wrote
    print(closing_line(out, state.step, state.round))
    return RunHistory(history, stopped=stopped)


if __name__ == "__main__":  # `sera train --level 0`, run as a program (common/run/entry.py)
    from common.run.entry import exec_sera

    exec_sera(["train", "--level", "0"], "level0_single_process.train")
