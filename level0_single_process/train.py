"""Level 0: the complete SERA training algorithm in one readable process.

    sera train                                   # SmolLM2-135M on CPU, TextCraft, a short run
    sera train --env textworld --method sera --steps 20 --out runs/l0_tw
    sera train --model tiny --steps 3            # random-init tiny model (tests, seconds)
    sera train --out runs/l0 --resume            # continue after a crash / kill -9
    python -m level0_single_process.train --help # the same, without the console script

One loop, top to bottom, with every piece of SPEC.md §4:

    for step in range(steps):
        stage  = schedule.stage_at(step)                # execution:16, delegation:2, rubric:2
        tasks  = sampler.next(tasks_per_step)            # the data cursor is checkpointed
        trees  = rollouts(tasks x rollouts_per_task)     # recursive trees; K counterfactual branches
                                                         #   at delegations in Rubric-stage rollouts
        batch  = build_stage_batch(stage, trees)         # rewards -> LOO advantages -> datums
        loss   = CISPO(datums, depth weights)            # token-mean over every trained token
        AdamW step (lr 3e-6, wd 0.017, betas 0.9/0.95, grad clip 1.0)
        log metrics, append trees to the offline log, checkpoint

What it simplifies (only the systems, never the algorithm): rollouts run one tree at a time (the agents
of one tree still run concurrently), generation uses the training model itself (strictly on-policy, no
weight sync), the loss is computed one datum at a time, and the defaults are shrunk for a laptop CPU
(1 task x 2 rollouts, 3 steps per agent, 64 new tokens, 2 optimizer steps) — ``--paper`` restores the paper's sizes.
Level 1 (`level1_batched/`) batches all of this; level 2 distributes it.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.agent.judge import make_judge
from common.agent.log import append_tree
from common.agent.runtime import run_root
from common.envs import load_tasks, make_env, runtime_config_for
from common.rl.batch import METRIC_NAMES, build_stage_batch, tree_metrics
from common.rl.loss import cispo_loss, token_logprobs
from common.rl.schedule import Schedule, get_preset
from common.train_config import TrainConfig


# ----------------------------------------------------------------------------------------------------
# Data: a seeded sampler whose cursor is part of the checkpoint.
# ----------------------------------------------------------------------------------------------------
class TaskSampler:
    """Shuffles the pool once per epoch with a seed that depends only on (seed, epoch)."""

    def __init__(self, tasks: list[dict], seed: int, cursor: int = 0):
        self.tasks, self.seed, self.cursor = tasks, seed, cursor

    def next(self) -> dict:
        epoch, i = divmod(self.cursor, len(self.tasks))
        order = list(range(len(self.tasks)))
        random.Random(f"{self.seed}/{epoch}").shuffle(order)
        self.cursor += 1
        return self.tasks[order[i]]


def task_pool(cfg: TrainConfig) -> list[dict]:
    if cfg.tasks:
        return load_tasks(cfg.env, cfg.tasks)
    tier = None if cfg.difficulty == "all" else cfg.difficulty
    if cfg.env == "textcraft":
        from common.envs.textcraft.tasks import generate_tasks

        return generate_tasks(split="train", n=cfg.n_tasks, seed=cfg.seed, difficulty=tier)
    from common.envs.textworld_sync.tasks import generate_tasks

    return generate_tasks(split="train", n=cfg.n_tasks, seed=cfg.seed, tier=tier)


# ----------------------------------------------------------------------------------------------------
# Rollouts: one tree at a time; K counterfactual branches only in Rubric-stage rollouts.
# ----------------------------------------------------------------------------------------------------
def runtime_config(cfg: TrainConfig, stage: str, generate_rubrics: bool):
    """The runtime settings of one rollout: the env's caps, this run's sizes, K branches only in Rubric stage."""
    return runtime_config_for(
        cfg.env,
        max_steps=cfg.max_steps,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        max_prompt_tokens=cfg.max_prompt_tokens,
        use_rubrics=generate_rubrics,
        rubric_max_new_tokens=cfg.rubric_max_new_tokens,
        score_max_new_tokens=cfg.rubric_max_new_tokens,
        counterfactual_k=cfg.counterfactual_k if stage == "rubric" else 1,
        max_envs_per_rollout=cfg.max_envs_per_rollout,
    )


def collect_groups(
    cfg: TrainConfig, stage: str, step: int, sampler: TaskSampler, env, policy, judge, generate_rubrics: bool
) -> tuple[list[list[Any]], int]:
    """Roll out ``tasks_per_step`` groups of ``rollouts_per_task`` trees. TextCraft replaces groups with
    no signal (all root rewards equal) by fresh tasks, up to ``max_task_replacements`` extra tasks."""
    groups, extra = [], 0
    while len(groups) < cfg.tasks_per_step:
        task = sampler.next()
        rcfg = runtime_config(cfg, stage, generate_rubrics)
        trees = []
        for r in range(cfg.rollouts_per_task):
            rcfg.seed = hash_seed(cfg.seed, step, sampler.cursor, r)
            trees.append(asyncio.run(run_root(task, env, policy, rcfg, judge=judge)))
        flat = len({t.success for t in trees}) == 1
        if stage == "execution" and cfg.env == "textcraft" and flat and extra < cfg.max_task_replacements:
            extra += 1  # no signal: try another task instead (SPEC.md §4)
            continue
        groups.append(trees)
    return groups, extra


def hash_seed(*parts: int) -> int:
    return int.from_bytes(str(parts).encode(), "little") % (2**31 - 1)


# ----------------------------------------------------------------------------------------------------
# The loss: CISPO over the stage's datums, one datum at a time (level 1 packs them).
# ----------------------------------------------------------------------------------------------------
def datum_logprobs(model, datum) -> torch.Tensor:
    """log pi_theta(y_t) of the datum's output tokens. Shapes: ids [1, P+T] -> logits [1, P+T, V] -> [1, T]."""
    ids = torch.tensor([datum.prompt_ids + datum.output_ids], device=model.device)
    logits = model(input_ids=ids).logits  # [1, P+T, V]
    P = len(datum.prompt_ids)
    return token_logprobs(logits[:, P - 1 : -1], ids[:, P:])  # [1, T]: position t predicts token t+1


def accumulate_gradients(model, datums, weights) -> dict[str, float]:
    """Backpropagate the CISPO loss of a whole batch, datum by datum. Each datum's loss is divided by the
    batch's trained-token count |M|, so the accumulated gradient is that of the token-mean over the batch."""
    n_tokens = sum(sum(d.loss_mask) for d in datums)
    total, clipped = 0.0, 0.0
    for d, w in zip(datums, weights, strict=True):
        logp = datum_logprobs(model, d)  # [1, T]
        loss, m = cispo_loss(
            logp,
            torch.tensor([d.behaviour_logprobs]),  # [1, T]
            torch.tensor([d.advantage]),  # [1]
            torch.tensor([d.loss_mask], dtype=torch.float32),  # [1, T]
            weights=torch.tensor([w]),
            num_tokens=n_tokens,
        )  # this datum's share
        loss.backward()  # grads add up
        total += loss.item()
        clipped += m["loss/clip_frac"] * sum(d.loss_mask)
    return {"loss/cispo": total, "loss/tokens": float(n_tokens), "loss/clip_frac": clipped / max(1, n_tokens)}


NO_UPDATE = {
    "loss/cispo": 0.0,
    "grad_norm": 0.0,
    "loss/tokens": 0.0,
    "loss/clip_frac": 0.0,
    "train/skipped": 1.0,
}
"""The metrics of a step whose batch has no trained token (no optimizer step is taken)."""


def train_on_batch(model, optimizer, batch, cfg: TrainConfig) -> dict[str, float]:
    """One optimizer step: gradients of the whole batch, global-norm clip, AdamW."""
    if not any(sum(d.loss_mask) for d in batch.datums):  # nothing to learn from: no update (no weight decay)
        return dict(NO_UPDATE)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    metrics = accumulate_gradients(model, batch.datums, batch.weights)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    model.eval()
    return {**metrics, "grad_norm": float(grad_norm), "train/skipped": 0.0}


# ----------------------------------------------------------------------------------------------------
# Checkpoints: model, optimizer, RNG states, step, data cursor (the stage clock is the step).
# Written to a temp dir and renamed, so a kill -9 leaves the previous checkpoint intact.
# ----------------------------------------------------------------------------------------------------
def save_checkpoint(out: Path, model, optimizer, step: int, cursor: int, cfg: TrainConfig) -> None:
    final, tmp = out / "checkpoints" / f"step_{step:06d}", out / "checkpoints" / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": step,
            "cursor": cursor,
            "config": asdict(cfg),
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
            },
        },
        tmp / "state.pt",
    )
    os.replace(tmp, final) if not final.exists() else (shutil.rmtree(final), os.replace(tmp, final))
    for old in sorted((out / "checkpoints").glob("step_*"))[:-2]:  # keep the last two
        shutil.rmtree(old)


def load_checkpoint(out: Path, model, optimizer, cfg: TrainConfig) -> tuple[int, int]:
    ckpts = sorted((out / "checkpoints").glob("step_*"))
    if not ckpts:
        return 0, 0
    state = torch.load(ckpts[-1] / "state.pt", weights_only=False)
    saved = {k: v for k, v in state["config"].items() if k not in ("steps", "resume")}
    now = {k: v for k, v in asdict(cfg).items() if k not in ("steps", "resume")}
    if saved != now:
        diff = {k: (saved.get(k), now.get(k)) for k in now if saved.get(k) != now.get(k)}
        raise SystemExit(f"--resume: the config differs from the checkpoint's: {diff}")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    return state["step"], state["cursor"]


def truncate_logs(out: Path, step: int) -> None:
    """Drop log lines of steps >= ``step`` (written by a run killed before that step's checkpoint), so a
    resumed run neither loses nor duplicates a step. A torn last line is dropped too."""
    for name, step_of in (
        ("metrics.jsonl", lambda r: r["step"]),
        ("trees.jsonl", lambda r: r["meta"]["step"]),
    ):
        path = out / name
        if not path.exists():
            continue
        keep = []
        for line in path.read_text().splitlines(keepends=True):
            if line.endswith("\n") and line.strip() and step_of(json.loads(line)) < step:
                keep.append(line)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(keep))
        os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------------------------------
def train(cfg: TrainConfig, progress: bool = True) -> list[dict[str, float]]:
    from common.policy.hf import HFPolicy
    from common.policy.models import load_model

    out = Path(cfg.out)
    if out.exists() and any(out.glob("checkpoints/step_*")) and not cfg.resume:
        raise SystemExit(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    preset = get_preset(cfg.method)
    schedule = Schedule.parse(cfg.schedule or preset.schedule)
    if "rubric" in schedule.stages and not preset.generate_rubrics:
        raise SystemExit(f"method {cfg.method} writes no rubrics, so its schedule cannot have a rubric stage")
    model, tokenizer = load_model(cfg.model, dtype=cfg.dtype, seed=cfg.seed)
    policy = HFPolicy(
        model, tokenizer, max_batch_size=1, seed=cfg.seed
    )  # level 0: no batching (level 1 batches)
    if cfg.oracle_mix > 0:  # off-policy warm start: some replies written by the oracle, teacher-forced
        from common.policy import make_policy
        from common.policy.forced import TeacherForcedPolicy

        policy = TeacherForcedPolicy(
            policy,
            make_policy("oracle", env=cfg.env, delegate=True),
            cfg.oracle_mix,
            cfg.score_noise,
            seed=cfg.seed,
            max_prompt_tokens=cfg.max_prompt_tokens,
        )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(cfg.beta1, cfg.beta2)
    )
    start, cursor = load_checkpoint(out, model, optimizer, cfg) if cfg.resume else (0, 0)
    truncate_logs(out, start)
    env, sampler = make_env(cfg.env), TaskSampler(task_pool(cfg), cfg.seed, cursor)
    judge = make_judge(cfg.judge, policy)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    print(
        f"[level0] {cfg.method} on {cfg.env} | model {cfg.model} | schedule {schedule} | steps {start}->{cfg.steps}"
    )
    history = []
    log = _progress(progress, cfg.steps, start)
    for step in range(start, cfg.steps):
        t0 = time.perf_counter()
        stage = schedule.stage_at(step)
        groups, replaced = collect_groups(
            cfg, stage, step, sampler, env, policy, judge, preset.generate_rubrics
        )
        t_roll = time.perf_counter() - t0
        trees = [t for g in groups for t in g]
        batch = build_stage_batch(
            stage,
            groups,
            preset.execution_reward,
            zero_variance="drop" if cfg.env == "textcraft" else "keep",
            tokenizer=tokenizer,
        )
        t1 = time.perf_counter()
        train_metrics = train_on_batch(model, optimizer, batch, cfg)
        t_train = time.perf_counter() - t1
        metrics = step_metrics(step, stage, trees, batch, train_metrics, preset, t_roll, t_train, replaced)
        for t in trees:
            t.meta["step"] = step
            append_tree(out / "trees.jsonl", t)
        with open(out / "metrics.jsonl", "a") as f:  # logs first, checkpoint second: a run killed in
            f.write(json.dumps(metrics) + "\n")  # between redoes this step and drops these lines
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(out, model, optimizer, step + 1, sampler.cursor, cfg)
        history.append(metrics)
        log(log_line(metrics), step + 1)
        if (not batch.datums or metrics["grad_norm"] == 0.0) and cfg.oracle_mix == 0:
            log(
                "  (no learning signal this step: every rollout of a task had the same outcome. Small models "
                "rarely succeed; --oracle-mix 0.5 adds teacher-forced oracle replies as a warm start.)",
                step + 1,
            )
    plot_curves(out / "metrics.jsonl", out / "curves.png")
    return history


def step_metrics(
    step, stage, trees, batch, train_metrics, preset, t_roll, t_train, replaced
) -> dict[str, Any]:
    """The metrics line of one optimizer step (the same keys in every tier)."""
    gen_tokens = sum(len(s.call.output_ids) for t in trees for n in t.nodes.values() for s in n.steps)
    calls = [c for t in trees for n in t.nodes.values() for c in (n.rubric_call, n.score_call) if c]
    return {
        "step": step,
        "stage": stage,
        **tree_metrics(trees, preset.execution_reward),
        **train_metrics,
        "tokens_per_s": gen_tokens / max(t_roll, 1e-9),
        "time/rollout_s": t_roll,
        "time/scoring_s": sum(c.seconds for c in calls),  # rubric + score calls (inside the rollout time)
        "time/train_s": t_train,
        "mem/peak_rss_gb": peak_rss_gb(),
        "batch/datums": len(batch.datums),
        "batch/replaced_tasks": replaced,
        **{f"batch/{k}": v for k, v in batch.counts.items()},
    }


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def log_line(m: dict[str, Any]) -> str:
    """The one log line per step, the same in every tier."""
    keys = (*METRIC_NAMES, "loss/cispo", "grad_norm", "tokens_per_s")
    vals = " ".join(
        f"{k}={m[k]:.4g}" if isinstance(m[k], float) and not math.isnan(m[k]) else f"{k}=nan" for k in keys
    )
    return f"step={m['step']} stage={m['stage']} {vals}"


def plot_curves(metrics_path: Path, out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(ln) for ln in metrics_path.read_text().splitlines() if ln.strip()]
    keys = [
        "reward/root_success",
        "reward/exec_mean",
        "rubric/pair_accuracy",
        "loss/cispo",
        "grad_norm",
        "tree/nodes_mean",
    ]
    fig, axes = plt.subplots(2, 3, figsize=(11, 5.5))
    for ax, k in zip(axes.flat, keys, strict=True):
        ax.plot([r["step"] for r in rows], [r.get(k, float("nan")) for r in rows], marker="o", ms=3)
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def _progress(enabled: bool, total: int, start: int):
    """A rich progress bar with log lines printed above it; returns ``log(line, done)``."""
    if not enabled:
        return lambda line, done: print(line, flush=True)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    p = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    p.start()
    task = p.add_task("train", total=total, completed=start)

    def log(line: str, done: int) -> None:
        p.console.print(line, highlight=False)
        p.update(task, completed=done)
        if done >= total:
            p.stop()

    return log


def config_from_kwargs(**kw: Any) -> TrainConfig:
    names = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in kw.items() if k in names and v is not None})


if __name__ == "__main__":
    from common.cli import app

    app(["train", "--level", "0", *__import__("sys").argv[1:]])
