"""Summarise a `bench/learning.sh` run: one PNG and one markdown table, every number read from its files.

    python bench/plot_learning.py OUT_DIR [--png docs/learning_h200.png] [--md OUT_DIR/learning.md]

Reads OUT_DIR/eval_base/report.json (the base model, held-out, greedy), OUT_DIR/sft/metrics.jsonl (SFT loss)
and OUT_DIR/rl_{sera,rao}/metrics.jsonl: one row per rollout round (stage, datums, rubric pair accuracy,
times) and one row per in-run held-out evaluation (``eval/success`` at an optimizer step; step 0 is the SFT
model). A cut-off evaluation is shown from its finished tasks, marked "n of N done"; a phase that did not
run is shown as "not run", never as zero.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import typer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from common.eval import aggregate, load_results  # noqa: E402
from common.run.metrics import pyplot_or_note, read_metrics  # noqa: E402

RUNS = {"sera": "SFT + SERA", "rao": "SFT + RAO"}
STAGES = ("execution", "delegation", "rubric")


def finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


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


def read_eval(d: Path) -> dict[str, Any] | None:
    """A finished evaluation's report, a cut-off one's partial report, or None."""
    if (d / "report.json").is_file():
        return json.loads((d / "report.json").read_text())
    if (d / "manifest.json").is_file() and any((d / "results").glob("*.json")):
        return partial_report(d)
    return None


def load(out: Path) -> dict[str, Any]:
    """Everything the table and the figure need, from the run's files (missing phases are absent)."""
    res: dict[str, Any] = {"base": read_eval(out / "eval_base"), "rl": {}, "sft": []}
    for k in RUNS:
        p = out / f"rl_{k}" / "metrics.jsonl"
        if p.is_file():
            res["rl"][k] = read_metrics(p)
    if (out / "sft" / "metrics.jsonl").is_file():
        res["sft"] = read_metrics(out / "sft" / "metrics.jsonl")
    return res


def rl_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Held-out success per step, optimizer steps, rounds, per-stage datums, the Rubric stage's pair
    accuracy per Rubric-stage step, and round times."""
    rounds = [r for r in rows if "stage" in r]
    trained = [r for r in rounds if not r.get("train/skipped")]
    evals = sorted({int(r["step"]): r["eval/success"] for r in rows if finite(r.get("eval/success"))}.items())
    rubric = [r for r in trained if r["stage"] == "rubric"]
    return {
        "rounds": len(rounds),
        "steps": len(trained),
        "evals": evals,  # [(optimizer step, held-out success)]
        "pair_accuracy": [
            (i + 1, r["rubric/pair_accuracy"])
            for i, r in enumerate(rubric)
            if finite(r.get("rubric/pair_accuracy"))
        ],
        "datums": {s: sum(r.get("batch/datums", 0) for r in rounds if r["stage"] == s) for s in STAGES},
        "round_s": {
            s: [r["time/round_s"] for r in rounds if r["stage"] == s and finite(r.get("time/round_s"))]
            for s in STAGES
        },
    }


def pct(v: float) -> str:
    return f"{100 * v:.1f} %"


def markdown(res: dict[str, Any], out: Path) -> str:
    runs = {k: rl_summary(v) for k, v in res["rl"].items()}
    steps = sorted({s for r in runs.values() for s, _ in r["evals"]})
    lines = [
        f"Run: `{out}`. Held-out root success (TextCraft-Synth val, easy, greedy) per optimizer step:",
        "",
    ]
    lines += ["| policy | " + " | ".join(f"step {s}" for s in steps) + " |", "|---|" + "---|" * len(steps)]
    b = res["base"]
    if b is None:
        lines.append("| base model | not run |" + " |" * max(0, len(steps) - 1))
    else:
        part = f", {b['n_done']} of {b['n_tasks']} done" if b["n_done"] < b["n_tasks"] else ""
        lines.append(f"| base model | {pct(b['success_rate'])} ({b['successes']}/{b['n_done']}{part}) |"
                     + " |" * max(0, len(steps) - 1))  # fmt: skip
    for k, name in RUNS.items():
        if k not in runs:
            lines.append(f"| {name} | not run |" + " |" * max(0, len(steps) - 1))
            continue
        ev = dict(runs[k]["evals"])
        lines.append(f"| {name} | " + " | ".join(pct(ev[s]) if s in ev else "" for s in steps) + " |")
    lines += ["", "Step 0 is the SFT warm start (both runs evaluate it on their own engine)."]
    if res["sft"]:
        s0, s1 = res["sft"][0], res["sft"][-1]
        lines += ["", f"SFT: {len(res['sft'])} steps, loss {s0['loss/sft']:.3f} -> {s1['loss/sft']:.3f}, "
                  f"token accuracy {s0['sft/token_acc']:.3f} -> {s1['sft/token_acc']:.3f}, "
                  f"{sum(r['t_train'] for r in res['sft']):.0f} s of steps."]  # fmt: skip
    if runs:
        lines += ["", "| RL run | optimizer steps (rounds) | datums exec / deleg / rubric | rubric pair accuracy "
                  "per Rubric step | mean round s: exec / deleg / rubric |", "|---|---|---|---|---|"]  # fmt: skip
        for k, name in RUNS.items():
            if k not in runs:
                continue
            s = runs[k]
            d = " / ".join(str(int(s["datums"][st])) for st in STAGES)
            pa = ", ".join(f"{v:.2f}" for _, v in s["pair_accuracy"]) or "- (no Rubric-stage step)"
            rs = " / ".join(f"{sum(v) / len(v):.1f}" if (v := s["round_s"][st]) else "-" for st in STAGES)
            lines.append(f"| {name} | {s['steps']} ({s['rounds']}) | {d} | {pa} | {rs} |")
    return "\n".join(lines) + "\n"


def figure(res: dict[str, Any], png: Path, title: str) -> None:
    if (plt := pyplot_or_note(png)) is None:  # the table is written all the same
        return

    runs = {k: rl_summary(v) for k, v in res["rl"].items()}
    fig, ax = plt.subplots(1, 4, figsize=(17, 3.9))
    a = ax[0]
    for i, (k, name) in enumerate(RUNS.items()):
        if k in runs and runs[k]["evals"]:
            xs, ys = zip(*runs[k]["evals"], strict=True)
            # SERA: large hollow circles, RAO: small filled squares, so equal values stay visible as both
            style = (
                {"marker": "o", "ms": 9, "mfc": "none", "lw": 2} if k == "sera" else {"marker": "s", "ms": 4}
            )
            a.plot(xs, [100 * y for y in ys], "-", color=f"C{i}", label=name, **style)
    sft0 = [ev[0][1] for ev in (r["evals"] for r in runs.values()) if ev and ev[0][0] == 0]
    if sft0:
        a.axhline(100 * sft0[0], color="gray", ls="--", lw=1, label="SFT (step 0)")
    if res["base"] is not None:
        a.axhline(100 * res["base"]["success_rate"], color="black", ls=":", lw=1, label="base model")
    a.set(title="held-out root success (%)", xlabel="optimizer step", ylim=(-2, 102))
    a.legend(fontsize=7)
    a = ax[1]
    pa = runs["sera"]["pair_accuracy"] if "sera" in runs else []
    if pa:
        a.plot([s for s, _ in pa], [v for _, v in pa], "o-", color="C0")
    else:
        a.text(0.5, 0.5, "no Rubric-stage step", ha="center", va="center", transform=a.transAxes)
    a.set(title="SERA rubric pair accuracy", xlabel="Rubric-stage step", ylim=(-0.05, 1.05))
    a = ax[2]
    width = 0.38
    for i, (k, name) in enumerate(RUNS.items()):
        if k in runs:
            vals = [runs[k]["datums"][s] for s in STAGES]
            a.bar([j + (i - 0.5) * width for j in range(len(STAGES))], vals, width, color=f"C{i}", label=name)
    a.set_xticks(range(len(STAGES)), STAGES)
    a.set(title="datums per stage (whole run)")
    if runs:
        a.legend(fontsize=7)
    a = ax[3]
    if res["sft"]:
        a.plot([r["step"] for r in res["sft"]], [r["loss/sft"] for r in res["sft"]], color="C2")
        a.set(yscale="log")
    else:
        a.text(0.5, 0.5, "no SFT run", ha="center", va="center", transform=a.transAxes)
    a.set(title="SFT loss (nats / reply token)", xlabel="SFT step")
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
