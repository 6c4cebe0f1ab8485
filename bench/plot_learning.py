"""Summarise a `bench/learning.sh` run: one PNG and one markdown table, every number read from its files.

    python bench/plot_learning.py OUT_DIR [--png docs/learning_h200.png] [--md OUT_DIR/learning.md]

Reads OUT_DIR/eval_{base,sft,sera,rao}/report.json (held-out success, greedy), OUT_DIR/sft/metrics.jsonl
(SFT loss) and OUT_DIR/rl_{sera,rao}/metrics.jsonl (one line per rollout round: training-task root success,
the rubric pair accuracy of SERA's Rubric-stage rounds, generated tokens and times). A phase that did not
run is shown as missing, never as zero.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

from common.eval import aggregate, load_results
from common.run.metrics import read_metrics

EVALS = {
    "base": "base model",
    "sft_ungrounded": "SFT, oracle without look-up",
    "sft": "SFT",
    "sera": "SFT + SERA",
    "rao": "SFT + RAO",
}
"""Evaluation directories OUT_DIR/eval_<key>; ``sft_ungrounded`` is optional (the run of an SFT whose
oracle crafted without looking recipes up, kept beside the grounded one for comparison)."""
RUNS = {"sera": "SFT + SERA", "rao": "SFT + RAO"}


def finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def load(out: Path) -> dict[str, Any]:
    """Everything the table and the figure need, from the run's files (missing phases are absent)."""
    res: dict[str, Any] = {"eval": {}, "rl": {}, "sft": [], "sft_ungrounded": []}
    for k in EVALS:
        d = out / f"eval_{k}"
        if (d / "report.json").is_file():
            res["eval"][k] = json.loads((d / "report.json").read_text())
        elif (d / "manifest.json").is_file() and any((d / "results").glob("*.json")):
            res["eval"][k] = partial_report(d)
    for k in RUNS:
        p = out / f"rl_{k}" / "metrics.jsonl"
        if p.is_file():
            res["rl"][k] = read_metrics(p)
    for k in ("sft", "sft_ungrounded"):
        p = out / k / "metrics.jsonl"
        if p.is_file():
            res[k] = read_metrics(p)
    return res


def partial_report(d: Path) -> dict[str, Any]:
    """The report of an evaluation cut off before its last task: the finished tasks only, marked partial
    (``n_done`` < ``n_tasks``; unfinished tasks count as not done, not as failures)."""
    manifest = json.loads((d / "manifest.json").read_text())
    done = list(load_results(d).values())
    n_tasks = manifest.get("limit")
    tasks_file = Path(manifest.get("tasks_file") or "")
    if n_tasks is None and tasks_file.is_file():  # no --limit: every row of the task file
        n_tasks = sum(1 for line in tasks_file.read_text().splitlines() if line.strip())
    report = aggregate(done, manifest.get("env", "textcraft"), n_tasks=int(n_tasks or len(done)))
    report["wall_seconds"] = float("nan")  # the eval never wrote its total
    return report


def rl_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Optimizer steps, rounds, generated tokens, seconds, and the rubric rounds' pair accuracies."""
    trained = [r for r in rows if not r.get("train/skipped")]
    rubric = [r for r in trained if r["stage"] == "rubric" and finite(r.get("rubric/pair_accuracy"))]
    return {
        "rounds": len(rows),
        "steps": len(trained),
        "tokens": sum(r["tokens_per_s"] * r["time/rollout_s"] for r in rows),
        "seconds": sum(r["time/rollout_s"] + r["time/train_s"] for r in rows),
        "train_success": [r["reward/root_success"] for r in rows],
        "pair_accuracy": [(r["step"], r["rubric/pair_accuracy"]) for r in rubric],
        "trained_tokens": sum(r.get("loss/tokens", 0.0) for r in trained),
    }


def markdown(res: dict[str, Any], out: Path) -> str:
    lines = [f"Run: `{out}`", "", "| policy | held-out root success (val easy, greedy) | tasks | eval s |",
             "|---|---|---|---|"]  # fmt: skip
    for k, name in EVALS.items():
        r = res["eval"].get(k)
        if r is None and k == "sft_ungrounded":
            continue
        if r is None:
            lines.append(f"| {name} | not run | | |")
            continue
        part = f", {r['n_done']} of {r['n_tasks']} done" if r["n_done"] < r["n_tasks"] else ""
        lines.append(f"| {name} | {100 * r['success_rate']:.2f} % ({r['successes']}/{r['n_done']}{part}) | "
                     f"{r['n_tasks']} | {r.get('wall_seconds', float('nan')):.0f} |")  # fmt: skip
    if res["sft"]:
        s0, s1 = res["sft"][0], res["sft"][-1]
        lines += ["", f"SFT: {len(res['sft'])} steps, loss {s0['loss/sft']:.3f} -> {s1['loss/sft']:.3f}, "
                  f"token accuracy {s0['sft/token_acc']:.3f} -> {s1['sft/token_acc']:.3f}, "
                  f"{sum(r['t_train'] for r in res['sft']):.0f} s of steps."]  # fmt: skip
    if res["rl"]:
        lines += ["", "| RL run | optimizer steps (rounds) | training-task root success, first -> last 3 rounds "
                  "| rubric pair accuracy per Rubric step | generated tokens | trained tokens | rollout+train s |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for k, name in RUNS.items():
            if k not in res["rl"]:
                continue
            s = rl_summary(res["rl"][k])
            ts = s["train_success"]
            first = sum(ts[:3]) / max(1, len(ts[:3]))
            last = sum(ts[-3:]) / max(1, len(ts[-3:]))
            pa = ", ".join(f"{v:.2f}" for _, v in s["pair_accuracy"]) or "- (no Rubric stage)"
            lines.append(f"| {name} | {s['steps']} ({s['rounds']}) | {first:.2f} -> {last:.2f} | {pa} | "
                         f"{s['tokens']:,.0f} | {s['trained_tokens']:,.0f} | {s['seconds']:.0f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def figure(res: dict[str, Any], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 4, figsize=(16, 3.8))
    a = ax[0]
    for i, k in enumerate(("sft", "sft_ungrounded")):
        if res[k]:
            a.plot([r["step"] for r in res[k]], [r["loss/sft"] for r in res[k]], color=f"C{i}", label=EVALS[k])
    a.set(title="SFT loss (nats / reply token)", xlabel="SFT step", yscale="log")
    if res["sft"] or res["sft_ungrounded"]:
        a.legend(fontsize=7)
    a = ax[1]
    names = [k for k in EVALS if k in res["eval"]]
    vals = [100 * res["eval"][k]["success_rate"] for k in names]
    bars = a.bar([EVALS[k] for k in names], vals, color=[f"C{i}" for i in range(len(names))])
    for b, v in zip(bars, vals, strict=True):
        a.text(b.get_x() + b.get_width() / 2, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    a.set(title="held-out root success (%)", ylim=(0, max(vals + [10]) * 1.2))
    a.tick_params(axis="x", labelsize=7)
    a = ax[2]
    for i, (k, name) in enumerate(RUNS.items()):
        rows = res["rl"].get(k)
        if rows:
            a.plot(range(len(rows)), [r["reward/root_success"] for r in rows], "o-", ms=3, color=f"C{i + 2}",
                   label=name)  # fmt: skip
    a.set(title="training-task root success per round", xlabel="rollout round", ylim=(-0.05, 1.05))
    if res["rl"]:
        a.legend(fontsize=7)
    else:
        a.text(0.5, 0.5, "no RL run", ha="center", va="center", transform=a.transAxes)
    a = ax[3]
    pa = rl_summary(res["rl"]["sera"])["pair_accuracy"] if "sera" in res["rl"] else []
    if pa:
        a.plot([s for s, _ in pa], [v for _, v in pa], "o-", color="C2")
    else:
        a.text(0.5, 0.5, "no Rubric-stage step", ha="center", va="center", transform=a.transAxes)
    a.set(title="SERA rubric pair accuracy", xlabel="optimizer step (Rubric stage)", ylim=(-0.05, 1.05))
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main(
    out: Path = typer.Argument(..., help="The OUT_DIR of bench/learning.sh."),
    png: Path = typer.Option(None, help="Figure path (default OUT_DIR/learning.png)."),
    md: Path = typer.Option(None, help="Table path (default OUT_DIR/learning.md)."),
    title: str = typer.Option("SERA vs RAO from one SFT warm start (TextCraft-Synth easy)", help="Title."),
) -> None:
    res = load(out)
    text = markdown(res, out)
    (md or out / "learning.md").write_text(text)
    figure(res, png or out / "learning.png", title)
    print(text)


if __name__ == "__main__":
    typer.run(main)
