"""Level 0: a supervised warm start (``sera sft``) on trees written by the environment's oracle.

    sera sft                                              # SmolLM2, TextCraft easy tasks, 60 steps (CPU)
    sera sft --env textworld --out runs/sft_tw --steps 200
    sera sft --out runs/sft --resume                      # continue after a crash / kill -9
    sera train --model runs/sft/model                     # RL from the warm start (any --model PATH)
    sera eval --env textcraft --tasks data/val.jsonl --policy hf:runs/sft/model --out runs/eval_sft

Why: a small instruction model almost never succeeds (SmolLM2-135M: 0 % of TextCraft-Synth, it writes
prose instead of a ``<python>`` cell), so every RL group has zero variance and SERA has no signal. The
paper starts from a model that already acts in the format; this loop puts a small model there.

    examples = oracle trees -> token-exact (prompt_ids, output_ids) per call   (common/sft/data.py)
    for step in range(steps):
        batch = a seeded permutation of the examples, read in order            (resumable: no state)
        loss  = -mean over assistant tokens of log p(y_t | prompt, y_<t)        (prompt tokens: no loss)
        AdamW (fp32 master weights, linear warm-up, clip); log; checkpoint
    save out/model/ (save_pretrained + tokenizer): an ordinary HF model directory

``--lora-rank R`` trains a LoRA adapter (peft) instead of every weight: the base is frozen, checkpoints
hold the adapter only, and the run ends with ``out/adapter/`` (peft's format + ``sera_adapter.json``, which
``sera train/eval --init-adapter`` merge in; ``common/policy/warmstart.py``) beside the merged ``out/model``.

The examples are the REAL runtime's calls (agent steps with delegations, rubrics, scores) with the prompt
ids an HFPolicy would send (``RecordingTeacher``), so what is learned is exactly what RL will sample.
Simplifications: one example per forward pass by default (``--forward-tokens N``: right-padded groups of up
to N tokens, for a GPU; no packing), a constant learning rate after the warm-up, the dataset built once at
the start (written to ``out/sft_data.jsonl``; ``--resume`` reads it).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from common.agent.log import append_tree
from common.policy import lora
from common.policy.lora import TrainedWeights  # noqa: F401 - re-exported (sft checkpoints)
from common.run.checkpoint import RunState, TorchCheckpointer, prepare_out, truncate_logs
from common.run.data import seed_everything, task_pool
from common.run.metrics import MetricsWriter, pyplot_or_note
from common.run.optim import make_optimizer
from common.sft.config import SFTConfig
from common.sft.data import batch_at, oracle_trees, read_examples, summary, tree_examples, write_examples
from common.train_config import OptimConfig

SFT_CURVES = ("loss/sft", "loss/act", "loss/rubric", "loss/score", "sft/token_acc", "grad_norm")
"""The six panels of an SFT run's curves.png."""


def build_examples(cfg: SFTConfig, tokenizer: Any, max_context_tokens: int, out: Path) -> list[Any]:
    """Oracle trees on the task pool -> examples (written to ``out/sft_data.jsonl``, trees to
    ``out/trees.jsonl`` for ``sera view``). A resumed run reads the saved examples instead."""
    path = out / "sft_data.jsonl"
    if cfg.resume and path.exists():
        return read_examples(path)
    pool = task_pool(cfg.env, cfg.tasks, cfg.n_tasks, cfg.seed, cfg.difficulty)
    trees = oracle_trees(
        cfg.env, pool, tokenizer, max_context_tokens, cfg.rollout,
        seed=cfg.seed, trees_per_task=cfg.trees_per_task, child_noise=cfg.child_noise,
        look_up=cfg.look_up,
    )  # fmt: skip
    examples = [e for t in trees for e in tree_examples(t, cfg.role_list())]
    kept = [e for e in examples if len(e.input_ids) <= cfg.max_example_tokens]
    (out / "trees.jsonl").unlink(missing_ok=True)
    for t in trees:
        t.meta.update(step=0, round=0)
        append_tree(out / "trees.jsonl", t)
    write_examples(path, kept)
    info = {**summary(kept, trees), "data/dropped_too_long": len(examples) - len(kept)}
    (out / "sft_data_summary.json").write_text(json.dumps(info, indent=2))
    print("[sft] data: " + ", ".join(f"{k.split('/')[1]}={v:g}" for k, v in info.items()))
    caps = {"act": cfg.rollout.max_new_tokens, "rubric": cfg.rollout.rubric_max_new_tokens,
            "score": cfg.rollout.score_max_new_tokens}  # fmt: skip
    for role, cap in caps.items():
        long = [e for e in kept if e.role == role and len(e.output_ids) > cap]
        if long:  # the model would learn replies that RL / eval then cut off
            longest = max(len(e.output_ids) for e in long)
            print(f"[sft] warning: {len(long)} {role} replies are longer than the {role} cap {cap} "
                  f"(longest {longest}); train and evaluate with a larger cap")  # fmt: skip
    return kept


def example_loss(model, example) -> tuple[torch.Tensor, int, int]:
    """Sum of -log p over the example's reply tokens, their count, and how many the argmax gets right.
    Shapes: ids [1, P+T]; logits kept only where a reply token is predicted: [1, T+1, V] -> [1, T, V]."""
    ids = torch.tensor([example.input_ids], device=model.device)  # [1, P+T]
    T = len(example.output_ids)
    logits = model(input_ids=ids, logits_to_keep=T + 1).logits[:, :-1].float()  # [1, T, V]
    target = ids[:, -T:]  # [1, T]: position P-1+t predicts reply token t (the loss mask = the reply)
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="sum")
    correct = int((logits.argmax(-1) == target).sum())
    return nll, T, correct


def padded_losses(model, examples) -> list[tuple[torch.Tensor, int, int]]:
    """:func:`example_loss` of each of ``examples``, from ONE forward pass over them right-padded to the
    longest: the decoder runs on ``[B, L]`` ids with an attention mask (a causal model's real tokens never
    see the padding after them), and the LM head only on the hidden states that predict a reply token
    (``[N, H]`` -> ``[N, V]``, N = all reply tokens), so the padded logits are never made."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: LoRA layers inside
    B, L = len(examples), max(len(e.input_ids) for e in examples)
    ids = torch.zeros((B, L), dtype=torch.long)
    mask = torch.zeros((B, L), dtype=torch.long)
    rows, cols = [], []  # reply token t of example i is predicted at position P-1+t of row i
    for i, e in enumerate(examples):
        n, T = len(e.input_ids), len(e.output_ids)
        ids[i, :n], mask[i, :n] = torch.tensor(e.input_ids), 1
        rows += [i] * T
        cols += range(n - T - 1, n - 1)
    ids, mask = ids.to(model.device), mask.to(model.device)
    r, c = torch.tensor(rows, device=ids.device), torch.tensor(cols, device=ids.device)
    hidden = base.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, L, H]
    logits = base.get_output_embeddings()(hidden[r, c]).float()  # [N, V]: reply positions only
    target = ids[r, c + 1]  # [N]
    nll = torch.nn.functional.cross_entropy(logits, target, reduction="none")  # [N]
    hits = (logits.argmax(-1) == target).long()
    sums = torch.zeros(B, device=ids.device, dtype=nll.dtype).index_add(0, r, nll)
    right = torch.zeros(B, device=ids.device, dtype=torch.long).index_add(0, r, hits).tolist()
    return [(sums[i], len(e.output_ids), right[i]) for i, e in enumerate(examples)]


def forward_groups(examples, forward_tokens: int) -> list[list[Any]]:
    """``examples`` in order, cut into groups whose padded size (rows x longest) stays within
    ``forward_tokens`` (one example per group when it is 0, or when one alone is longer)."""
    groups: list[list[Any]] = []
    for e in examples:
        g = groups[-1] if groups else None
        longest = max([len(e.input_ids)] + [len(x.input_ids) for x in g or []])
        if g and forward_tokens and (len(g) + 1) * longest <= forward_tokens:
            g.append(e)
        else:
            groups.append([e])
    return groups


def train_step(model, optimizer, examples, cfg: SFTConfig) -> dict[str, float]:
    """One optimizer step on ``examples``: gradients of the batch loss (token- or example-mean),
    accumulated one forward pass at a time (one example, or a padded group: ``--forward-tokens``), then
    clip + AdamW."""
    model.train()
    optimizer.zero_grad()
    n_tokens = sum(len(e.output_ids) for e in examples)
    per_role: dict[str, list[float]] = {}
    total_nll, total_correct = 0.0, 0
    for group in forward_groups(examples, cfg.forward_tokens):
        losses = [example_loss(model, group[0])] if len(group) == 1 else padded_losses(model, group)
        scaled = sum(
            nll * (1.0 / n_tokens if cfg.loss_mean == "token" else 1.0 / (T * len(examples)))
            for nll, T, _ in losses
        )
        scaled.backward()  # grads add up to the batch mean's
        for e, (nll, T, correct) in zip(group, losses, strict=True):
            total_nll, total_correct = total_nll + nll.item(), total_correct + correct
            acc = per_role.setdefault(e.role, [0.0, 0.0])
            acc[0], acc[1] = acc[0] + nll.item(), acc[1] + T
    grad_norm = optimizer.clip_and_step(cfg.grad_clip)
    model.eval()
    m = {
        "loss/sft": total_nll / n_tokens,
        "loss/tokens": float(n_tokens),
        "sft/token_acc": total_correct / n_tokens,
        "grad_norm": grad_norm,
    }
    m.update({f"loss/{role}": s / max(1.0, t) for role, (s, t) in per_role.items()})
    return m


def plot_sft_curves(metrics_path: Path, out_png: Path) -> None:
    """curves.png of an SFT run: the loss (all, and per role), token accuracy and gradient norm by step."""
    if (plt := pyplot_or_note(out_png)) is None:
        return

    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    fig, axes = plt.subplots(2, 3, figsize=(11, 5.5))
    for ax, k in zip(axes.flat, SFT_CURVES, strict=True):
        pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("optimizer step", fontsize=8)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", ms=2, lw=1)
        else:
            ax.text(0.5, 0.5, "no value", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


def save_model_dir(model, tokenizer, path: Path) -> None:
    """An ordinary HF model directory (``--model PATH`` / ``hf:PATH`` load it), written atomically."""
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if path.exists():
        import shutil

        shutil.rmtree(path)
    tmp.rename(path)


def add_lora(model, cfg: SFTConfig):
    """``--lora-rank R``: a peft LoRA adapter of rank R on every attention and MLP projection; only the
    adapter trains (its A matrices random, its B matrices zero: the wrapped model starts equal to the base).
    The same helper as LoRA RL's (common/policy/lora.py)."""
    return lora.add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.seed)


def save_adapter(model, cfg: SFTConfig, step: int, path: Path) -> None:
    """The LoRA adapter in peft's format (adapter_config.json + adapter_model.safetensors) plus
    ``sera_adapter.json`` (base model, environment, the SFT settings and data that made it), atomically."""
    import shutil

    from common.data import file_mode
    from common.policy.warmstart import FORMAT, LORA_TARGETS, RECORD, model_key

    key = model_key(cfg.model, cfg.seed)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    (tmp / "README.md").unlink(missing_ok=True)  # peft's empty model-card template
    peft_config = json.loads((tmp / "adapter_config.json").read_text())
    peft_config["base_model_name_or_path"] = key  # the model's name, not this machine's cache path
    (tmp / "adapter_config.json").write_text(json.dumps(peft_config, indent=2))
    (tmp / "adapter_model.safetensors").chmod(file_mode())  # safetensors writes 0o600
    summary = path.parent / "sft_data_summary.json"
    record = {
        "format": FORMAT,
        "base_model": key,
        "env": cfg.env,
        "lora_rank": cfg.lora_rank,
        "lora_alpha": cfg.lora_alpha,
        "target_modules": list(LORA_TARGETS),
        "sft_steps": step,
        "data": json.loads(summary.read_text()) if summary.exists() else None,
        "sft_config": asdict(cfg),
    }
    (tmp / RECORD).write_text(json.dumps(record, indent=2))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def sft(cfg: SFTConfig, progress: bool = True) -> list[dict[str, Any]]:
    """Run the warm start; returns the metrics of the steps taken now. The model lands in ``out/model``
    (and with ``--lora-rank`` the adapter in ``out/adapter``)."""
    from common.policy.models import load_model

    out = Path(cfg.out)
    prepare_out(out, cfg.resume)
    seed_everything(cfg.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_model(cfg.model, dtype=cfg.dtype, device=device, seed=cfg.seed)
    if cfg.lora_rank:
        model = add_lora(model, cfg)
    trained = TrainedWeights(model) if cfg.lora_rank else model  # what checkpoints hold
    max_context = int(getattr(model.config, "max_position_embeddings", None) or 8192)  # as HFPolicy
    t0 = time.perf_counter()
    examples = build_examples(cfg, tokenizer, max_context, out)
    if not examples:
        raise ValueError("the oracle trees gave no example (check --roles and --max-example-tokens)")
    t_data = time.perf_counter() - t0
    optim_cfg = OptimConfig(
        lr=cfg.lr, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip, dtype=cfg.dtype
    )
    optimizer = make_optimizer(model, optim_cfg)
    ckpt = TorchCheckpointer(out)
    state = (ckpt.load_latest(trained, optimizer, asdict(cfg)) if cfg.resume else None) or RunState()
    truncate_logs(out, state.round)
    writer = MetricsWriter(out)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    lora = f" | LoRA r{cfg.lora_rank} alpha {cfg.lora_alpha:g}" if cfg.lora_rank else ""
    print(f"[sft] {cfg.env} | model {cfg.model}{lora} | {len(examples)} examples ({t_data:.1f} s) | "
          f"steps {state.step}->{cfg.steps}")  # fmt: skip
    history = []
    while state.step < cfg.steps:
        t1 = time.perf_counter()
        lr = cfg.lr * min(1.0, (state.step + 1) / max(1, cfg.warmup))
        for group in optimizer.inner.param_groups:
            group["lr"] = lr
        batch = [examples[i] for i in batch_at(len(examples), cfg.batch_size, state.step, cfg.seed)]
        m = train_step(model, optimizer, batch, cfg)
        dt = time.perf_counter() - t1
        m.update(round=state.step, step=state.step, stage="sft", lr=lr, t_train=dt,
                 tokens_per_s=sum(len(e.input_ids) for e in batch) / dt)  # fmt: skip
        writer.write(m)
        history.append(m)
        state.step += 1
        state.round = state.step
        if state.step % cfg.save_every == 0 or state.step == cfg.steps:
            ckpt.save(state, trained, optimizer, asdict(cfg))
        if progress and (state.step % 5 == 0 or state.step == cfg.steps):
            print(f"[sft] step {state.step}/{cfg.steps} loss {m['loss/sft']:.3f} "
                  f"acc {m['sft/token_acc']:.3f} grad {m['grad_norm']:.2f} ({dt:.1f} s)", flush=True)  # fmt: skip
    writer.close()
    if (out / "metrics.jsonl").exists():
        plot_sft_curves(out / "metrics.jsonl", out / "curves.png")
    adapter = ""
    if cfg.lora_rank:
        save_adapter(model, cfg, state.step, out / "adapter")
        model = model.merge_and_unload()  # out/model: the base with the adapter merged in
        adapter = f"; the adapter alone in {out}/adapter (--init-adapter {out}/adapter)"
    save_model_dir(model, tokenizer, out / "model")
    print(f"done: {state.step} SFT steps. Warm start in {out}/model (use --model {out}/model or "
          f"--policy hf:{out}/model){adapter}; curves in {out}/curves.png")  # fmt: skip
    return history


if __name__ == "__main__":  # `sera sft`, run as a program (common/run/entry.py)
    from common.run.entry import exec_sera

    exec_sera(["sft"], "level0_single_process.sft")


def export_checkpoint(run_dir: str | Path, base_model: str, out_dir: str | Path) -> Path:
    """The last checkpoint of a training run (``sera train``/``sera sft``, ``checkpoints/step_*/state.pt``)
    as an HF model directory on ``base_model``, into ``out_dir``. From the command line ``sera eval --run RUN``
    does this for every tier's run (the base model, warm start and adapter read from the run's config.json;
    ``common/run/export.py``)."""
    from common.policy.models import load_model

    ckpts = sorted(Path(run_dir, "checkpoints").glob("step_*"))
    if not ckpts:
        raise FileNotFoundError(f"{run_dir}/checkpoints holds no step_* checkpoint")
    state = torch.load(ckpts[-1] / "state.pt", weights_only=False, map_location="cpu")
    config = state.get("config") or {}
    model, tokenizer = load_model(base_model, dtype="float32", seed=int(config.get("seed", 0)))
    if config.get("lora_rank"):  # a LoRA SFT checkpoint holds the adapter only
        model = add_lora(model, SFTConfig.make(**{k: config[k] for k in ("lora_rank", "lora_alpha", "seed")}))
        TrainedWeights(model).load_state_dict(state["model"])
        model = model.merge_and_unload()
    else:
        model.load_state_dict(state["model"])
    save_model_dir(model, tokenizer, Path(out_dir))
    return Path(out_dir)
