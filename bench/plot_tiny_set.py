"""Summarise a `bench/tiny_set.sh` run (the tiny-set check of issue #39): per variant, the training rollouts'
root success per optimizer step, its rolling mean over WINDOW steps with a 95 % band, the first step where
that mean reaches TARGET, the best rolling mean, steps done. One PNG and one markdown table, every number read
from the files.

    python bench/plot_tiny_set.py OUT_DIR [--target 0.5] [--window 5] [--png OUT_DIR/tiny_set.png] [--md ...]

Reads OUT_DIR/variants.txt (the variants in order, ``NAME<TAB>FLAGS``, written by tiny_set.sh) and each
OUT_DIR/NAME/metrics.jsonl and config.json (any other OUT_DIR/*/metrics.jsonl too). Rounds without an
optimizer step are left out; x = the optimizer step whose policy sampled the rollouts. The rolling mean at
step i is the mean of the last WINDOW steps' root success (fewer at the start); its 95 % band is clustered by
task (each task's rollouts in the window are one unit: they share its difficulty; read from the run's
trees.jsonl, no band without it; :func:`plot_learning.train_curve`). "Reaches TARGET" and "best" count full
windows only; the best window's band is that window's own, not corrected for picking the best of several. A
variant that did not run is "not run", never zero.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: plot_learning's helpers

from plot_learning import (
    departures_lines,
    finite,
    load_run,
    mean,
    pyplot_or_note,
    train_curve,
)  # noqa: E402


def variants(out: Path) -> list[tuple[str, str]]:
    """(name, flags) of each variant: those of variants.txt in order, then any other run directory."""
    found: list[tuple[str, str]] = []
    vt = out / "variants.txt"
    if vt.is_file():
        for line in vt.read_text().splitlines():
            if line.strip():
                name, _, flags = line.partition("\t")
                found.append((name.strip(), flags.strip()))
    names = {n for n, _ in found}
    for d in sorted(out.iterdir()) if out.is_dir() else []:
        if d.is_dir() and d.name not in names and (d / "metrics.jsonl").is_file():
            found.append((d.name, ""))
    return found


def summarise(run: dict[str, Any], target: float, window: int) -> dict[str, Any]:
    """Steps done, the curve (:func:`plot_learning.train_curve`), the first step whose full-window rolling
    mean reaches ``target``, the best full-window rolling mean (and its step and band), optimizer stats."""
    c = train_curve(run, window)
    full = [i for i in range(len(c["y"])) if i + 1 >= window]
    reach = next((c["x"][i] for i in full if c["roll"][i] >= target), None)
    best_i = max(full, key=lambda i: c["roll"][i]) if full else None  # the earliest of equal bests

    def vals(key: str) -> list[float]:
        return [float(r[key]) for r in run["trained"] if finite(r.get(key))]

    gn = vals("grad_norm")
    return {
        "curve": c,
        "steps": len(run["trained"]),
        "rounds": len(run["rounds"]),
        "planned": run["config"].get("steps"),
        "reach": reach,
        "best": None if best_i is None else c["roll"][best_i],
        "best_step": None if best_i is None else c["x"][best_i],
        "best_band": None if best_i is None or not finite(c["lo"][best_i]) else (c["lo"][best_i], c["hi"][best_i]),
        "last": c["roll"][-1] if c["roll"] else None,
        "grad_norm": (mean(gn), max(gn)) if gn else None,
        "ratio_max": max(vals("loss/ratio_max")) if vals("loss/ratio_max") else None,
        "zero_adv": mean(vals("batch/zero_adv_frac")) if vals("batch/zero_adv_frac") else None,
        "config": run["config"],
    }


def load(out: Path, target: float, window: int) -> list[tuple[str, str, dict[str, Any] | None]]:
    rows = []
    for name, flags in variants(out):
        d = out / name
        has = (d / "metrics.jsonl").is_file()
        rows.append((name, flags, summarise(load_run(d), target, window) if has else None))
    return rows


def markdown(
    rows: list[tuple[str, str, dict[str, Any] | None]], out: Path, target: float, window: int
) -> str:
    lines = [
        f"# Tiny-set check: `{out}`",
        "",
        f"Root success of the training rollouts (the fixed train tasks, rollout temperature) per optimizer step; "
        f"rolling mean over {window} steps, 95 % band clustered by task (a task's rollouts are one unit; the best "
        f"window's band is not corrected for being the best of several). First step and best "
        f"count full windows of {window} steps only.",
        "",
        f"| variant | flags | steps done (rounds) | first step -> last step | last rolling mean | best rolling mean "
        f"(step) [95 %] | first step rolling mean >= {target:g} | grad norm mean / max | loss/ratio_max max "
        f"| zero-adv frac mean |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    said = []
    for name, flags, s in rows:
        if s is None:
            lines.append(f"| {name} | `{flags}` | not run | | | | | | | |")
            said.append(f"- {name}: not run.")
            continue
        y = s["curve"]["y"]
        planned = f" of {s['planned']}" if s["planned"] is not None else ""
        ends = f"{y[0]:.3f} -> {y[-1]:.3f}" if y else "-"
        last = f"{s['last']:.3f}" if s["last"] is not None else "-"
        if s["best"] is None:
            best = f"- (fewer than {window} steps)"
        else:
            band = f" [{s['best_band'][0]:.3f}, {s['best_band'][1]:.3f}]" if s["best_band"] else ""
            best = f"{s['best']:.3f} (step {s['best_step']}){band}"
        reach = "not reached" if s["reach"] is None else f"step {s['reach']}"
        gn = f"{s['grad_norm'][0]:.3g} / {s['grad_norm'][1]:.3g}" if s["grad_norm"] else "-"
        rm = f"{s['ratio_max']:.3g}" if s["ratio_max"] is not None else "-"
        za = f"{s['zero_adv']:.2f}" if s["zero_adv"] is not None else "-"
        lines.append(f"| {name} | `{flags}` | {s['steps']}{planned} ({s['rounds']}) | {ends} | {last} | {best} | "
                     f"{reach} | {gn} | {rm} | {za} |")  # fmt: skip
        how = f"best {best}" if s["best"] is not None else f"no full window of {window} steps yet"
        if s["reach"] is not None:
            said.append(f"- {name}: the rolling mean reached {target:g} at step {s['reach']} ({how}).")
        else:
            said.append(f"- {name}: the rolling mean did not reach {target:g} in {s['steps']} steps ({how}).")
    lines += ["", *said]
    lines += ["", *departures_lines({name: s["config"] for name, _, s in rows if s is not None})]
    return "\n".join(lines) + "\n"


def figure(rows: list[tuple[str, str, dict[str, Any] | None]], png: Path, target: float, window: int) -> None:
    if (plt := pyplot_or_note(png)) is None:
        return
    fig, a = plt.subplots(figsize=(8, 4.2))
    for i, (name, _, s) in enumerate(rows):
        if s is None or not s["curve"]["x"]:
            continue
        c = s["curve"]
        a.plot(c["x"], c["y"], ".", color=f"C{i}", alpha=0.35)
        a.plot(c["x"], c["roll"], "-", color=f"C{i}", label=name)
        if all(finite(v) for v in c["lo"]):
            a.fill_between(c["x"], c["lo"], c["hi"], color=f"C{i}", alpha=0.15)
    a.axhline(target, color="gray", ls=":", lw=1, label=f"target {target:g}")
    a.set(title=f"tiny-set check: root success per step, rolling mean of {window}, 95 % band",
          xlabel="optimizer step", ylabel="root success", ylim=(-0.02, 1.02))  # fmt: skip
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main(
    out: Path = typer.Argument(..., help="The OUT_DIR of bench/tiny_set.sh."),
    target: float = typer.Option(0.5, help="Rolling-mean root success a variant should reach."),
    window: int = typer.Option(5, min=1, help="Rolling-mean window, optimizer steps."),
    png: Path = typer.Option(None, help="Figure path (default OUT_DIR/tiny_set.png)."),
    md: Path = typer.Option(None, help="Table path (default OUT_DIR/tiny_set.md)."),
) -> None:
    rows = load(out, target, window)
    text = markdown(rows, out, target, window)
    (md or out / "tiny_set.md").write_text(text)
    figure(rows, png or out / "tiny_set.png", target, window)
    print(text)


if __name__ == "__main__":
    typer.run(main)
