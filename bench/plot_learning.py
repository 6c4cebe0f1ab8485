"""Summarise a `bench/learning.sh` run (issue #39): does RL raise held-out success, and SERA vs RAO, with 95 %
intervals. One PNG and one markdown table, every number read from the run's files.

    python bench/plot_learning.py OUT_DIR [--png OUT_DIR/learning.png] [--md OUT_DIR/learning.md]

Reads, per method M (sera, rao) and seed S, OUT_DIR/rl_M/sS/:

* ``metrics.jsonl``: one row per rollout round (``reward/root_success``, ``stage``, ``train/skipped``,
  ``grad_norm/<stage>``, ``loss/ratio_*``, ...) and one row per in-run held-out evaluation (``eval/success``,
  ``eval/success_ci95``, ``eval/sampled_success``, ...);
* ``evals/step_SSSSS/results/*.json`` (greedy, one trajectory per task) and
  ``evals/step_SSSSS_sample_k/results/*.json`` (sample k at the rollout temperature): the per-task outcomes
  the intervals are computed from;
* ``config.json``: ``tasks_per_step`` x ``rollouts_per_task`` = the rollouts behind one round's root success.

Statistics (all over held-out tasks; Z = 1.96):

* a per-task value is the greedy outcome (0/1) or the mean outcome of the task's K samples;
* a success rate's 95 % interval is mean +- Z * SE, SE = the tasks' standard deviation (n - 1) / sqrt(n);
* the improvement of a method = its per-task value at its last evaluated step minus at step 0, averaged per
  task over the seeds (seeds pooled), then mean +- Z * SE of those per-task differences (paired over tasks);
  it is called significant when |mean| > Z * SE;
* SERA - RAO at the last step = per task, SERA's value (mean over its seeds) minus RAO's, paired the same way.

These intervals cover the sample of held-out tasks (and of the K samples), NOT the variation between training
seeds (the per-seed numbers are in the first table). A cut-off evaluation is shown from its finished tasks,
marked "n of N done"; a run or evaluation that does not exist is "not run", never zero.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import typer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from a checkout

from common.eval import aggregate, load_results  # noqa: E402
from common.run.metrics import pyplot_or_note, read_metrics  # noqa: E402

METHODS = {"sera": "SERA", "rao": "RAO"}
MODES = ("greedy", "sampled")
STAGES = ("execution", "delegation", "rubric")
Z = 1.96
WINDOW = 5  # rolling mean of the training curves, optimizer steps
EVAL_DIR = re.compile(r"step_(\d+)(?:_sample_(\d+))?")


def finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ---------------------------------------------------------------------------------------------- statistics


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def std_err(xs: list[float]) -> float:
    """Standard error of the mean: sample standard deviation (n - 1) / sqrt(n); NaN below 2 values.

    >>> std_err([0, 1, 1, 0])  # sd = sqrt(1/3)
    0.288...
    """
    n = len(xs)
    if n < 2:
        return float("nan")
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n)


def interval(xs: list[float]) -> dict[str, float]:
    """Mean, standard error, 95 % half-width and bounds of per-task values."""
    m, se = mean(xs), std_err(xs)
    return {"n": len(xs), "mean": m, "se": se, "half": Z * se, "lo": m - Z * se, "hi": m + Z * se}


def paired(a: dict[Any, float], b: dict[Any, float]) -> dict[str, float]:
    """``b - a`` over the tasks both have (mean +- Z * SE of the per-task differences), with each side's mean
    over those tasks (``a``, ``b``)."""
    keys = sorted(set(a) & set(b), key=str)
    res = interval([b[k] - a[k] for k in keys])
    res.update(a=mean([a[k] for k in keys]), b=mean([b[k] for k in keys]))
    return res


def pool(per_seed: list[dict[Any, float]]) -> dict[Any, float]:
    """Per task, the mean over the seeds that have it."""
    keys = {k for d in per_seed for k in d}
    return {k: mean([d[k] for d in per_seed if k in d]) for k in keys}


def wilson(p: float, n: float, z: float = Z) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``p`` of ``n`` trials (NaNs without trials).

    >>> [round(x, 4) for x in wilson(0.5, 64)]
    [0.381, 0.619]
    """
    if not n or not finite(p):
        return float("nan"), float("nan")
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def rolling(ys: list[float], w: int = WINDOW) -> list[float]:
    """Trailing mean over the last ``w`` values (fewer at the start).

    >>> rolling([0, 1, 1, 0, 1, 1], 3)
    [0.0, 0.5, 0.666..., 0.666..., 0.666..., 0.666...]
    """
    return [mean(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))]


# ---------------------------------------------------------------------------------------------- reading


def partial_report(d: Path) -> dict[str, Any]:
    """The report of an evaluation cut off before its last task: the finished tasks only, marked partial
    (``n_done`` < ``n_tasks``; unfinished tasks count as not done, not as failures)."""
    manifest = json.loads((d / "manifest.json").read_text())
    done = list(load_results(d).values())
    report = aggregate(done, manifest.get("env", "textcraft"), n_tasks=planned_tasks(d, len(done)))
    report["wall_seconds"] = float("nan")  # the eval never wrote its total
    return report


def planned_tasks(d: Path, default: int) -> int:
    """How many tasks the evaluation in ``d`` was to run (its manifest's limit, else its task file's rows)."""
    mf = d / "manifest.json"
    if not mf.is_file():
        return default
    manifest = json.loads(mf.read_text())
    n = manifest.get("limit")
    tasks_file = Path(manifest.get("tasks_file") or "")
    if n is None and tasks_file.is_file():  # no --limit: every row of the task file
        n = sum(1 for line in tasks_file.read_text().splitlines() if line.strip())
    return int(n or default)


def read_eval(d: Path) -> dict[str, Any] | None:
    """A finished evaluation's report, a cut-off one's partial report, or None."""
    if (d / "report.json").is_file():
        return json.loads((d / "report.json").read_text())
    if (d / "manifest.json").is_file() and any((d / "results").glob("*.json")):
        return partial_report(d)
    return None


def task_outcomes(d: Path) -> dict[Any, float]:
    """Per task (``task_id``, else ``index``): 1.0 for a success, 0.0 for a failure or an error."""
    return {
        r.get("task_id") or r["index"]: float(bool(r.get("success")) and not r.get("error"))
        for r in load_results(d).values()
    }


def eval_point(
    dirs: list[Path], row_rate: Any = None, row_half: Any = None, row_n: Any = None
) -> dict | None:
    """One evaluation (greedy: one directory; sampled: one per sample): per-task values (the mean over the
    samples that finished the task), rate, 95 % half-width, tasks done / planned. Without per-task results it
    falls back to the metrics row's numbers (``tasks`` is then None: no paired statistics)."""
    got = [(d, task_outcomes(d)) for d in dirs]
    got = [(d, p) for d, p in got if p]
    if got:
        values = pool([p for _, p in got])
        iv = interval(list(values.values()))
        planned = max(planned_tasks(d, len(p)) for d, p in got)
        done = min(len(p) for _, p in got) if len(got) == len(dirs) else 0  # tasks every sample finished
        return {"tasks": values, "rate": iv["mean"], "half": iv["half"], "n": len(values), "done": done,
                "planned": planned, "k": len(dirs)}  # fmt: skip
    if finite(row_rate):
        n = int(row_n) if finite(row_n) else None
        return {"tasks": None, "rate": float(row_rate), "half": float(row_half) if finite(row_half) else float("nan"),
                "n": n, "done": n, "planned": n, "k": len(dirs) or None}  # fmt: skip
    return None


def load_run(d: Path) -> dict[str, Any]:
    """One run directory: its rows, config, and evaluations {step: {"greedy": point, "sampled": point}}."""
    rows = read_metrics(d / "metrics.jsonl") if (d / "metrics.jsonl").is_file() else []
    config = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    greedy: dict[int, Path] = {}
    samples: dict[int, list[Path]] = {}
    for e in sorted((d / "evals").glob("step_*")):
        if (m := EVAL_DIR.fullmatch(e.name)) and e.is_dir():
            if m.group(2) is None:
                greedy[int(m.group(1))] = e
            else:
                samples.setdefault(int(m.group(1)), []).append(e)
    erows = {int(r["step"]): r for r in rows if finite(r.get("eval/success"))}
    evals: dict[int, dict[str, Any]] = {}
    for s in sorted(set(greedy) | set(samples) | set(erows)):
        r = erows.get(s, {})
        pts = {
            "greedy": eval_point([greedy[s]] if s in greedy else [], r.get("eval/success"),
                                 r.get("eval/success_ci95"), r.get("eval/n_tasks")),
            "sampled": eval_point(samples.get(s, []), r.get("eval/sampled_success"),
                                  r.get("eval/sampled_ci95"), r.get("eval/n_tasks")),
        }  # fmt: skip
        if any(pts.values()):
            evals[s] = pts
    rounds = [r for r in rows if "stage" in r]
    trained = [r for r in rounds if not r.get("train/skipped")]
    return {"dir": d, "rows": rows, "config": config, "evals": evals, "rounds": rounds, "trained": trained}


def load(out: Path) -> dict[str, dict[int, dict[str, Any]]]:
    """{method: {seed: run}} for every OUT/rl_M/sS/ that has a metrics file or an evaluation."""
    methods = list(METHODS) + sorted(
        p.name[3:] for p in out.glob("rl_*") if p.is_dir() and p.name[3:] not in METHODS
    )
    res: dict[str, dict[int, dict[str, Any]]] = {}
    for m in methods:
        for d in sorted((out / f"rl_{m}").glob("s*")):
            if (
                d.is_dir()
                and d.name[1:].isdigit()
                and ((d / "metrics.jsonl").is_file() or (d / "evals").is_dir())
            ):
                res.setdefault(m, {})[int(d.name[1:])] = load_run(d)
    return res


# ---------------------------------------------------------------------------------------------- summaries


def last_step(run: dict[str, Any]) -> int | None:
    """The last evaluated step after step 0 (None if there is none)."""
    later = [s for s in run["evals"] if s > 0]
    return max(later) if later else None


def improvement(runs: dict[int, dict[str, Any]], mode: str) -> dict[str, Any] | None:
    """Last evaluated step minus step 0, per task, averaged over the seeds that have both with per-task
    results, paired over tasks; None if no seed has both."""
    diffs, seeds, lasts, before, after = [], [], [], [], []
    for seed, run in sorted(runs.items()):
        last = last_step(run)
        p0 = run["evals"].get(0, {}).get(mode)
        p1 = run["evals"].get(last, {}).get(mode) if last is not None else None
        if not (p0 and p1 and p0["tasks"] and p1["tasks"]):
            continue
        keys = set(p0["tasks"]) & set(p1["tasks"])
        diffs.append({k: p1["tasks"][k] - p0["tasks"][k] for k in keys})
        before.append({k: p0["tasks"][k] for k in keys})
        after.append({k: p1["tasks"][k] for k in keys})
        seeds.append(seed)
        lasts.append(last)
    if not seeds:
        return None
    res = interval(list(pool(diffs).values()))
    res.update(
        seeds=seeds, lasts=lasts, a=mean(list(pool(before).values())), b=mean(list(pool(after).values()))
    )
    return res


def last_values(runs: dict[int, dict[str, Any]], mode: str) -> tuple[dict[Any, float], list[int], list[int]]:
    """Per task, the mean over seeds of the value at each seed's last evaluated step (after step 0)."""
    per, seeds, lasts = [], [], []
    for seed, run in sorted(runs.items()):
        last = last_step(run)
        p = run["evals"].get(last, {}).get(mode) if last is not None else None
        if p and p["tasks"]:
            per.append(p["tasks"])
            seeds.append(seed)
            lasts.append(last)
    return pool(per), seeds, lasts


def sera_minus_rao(res: dict[str, dict[int, dict[str, Any]]], mode: str) -> dict[str, Any] | None:
    """SERA - RAO at the last evaluated step, per task (each method's seeds pooled), paired over tasks."""
    if "sera" not in res or "rao" not in res:
        return None
    sera, s_seeds, s_lasts = last_values(res["sera"], mode)
    rao, r_seeds, r_lasts = last_values(res["rao"], mode)
    if not (set(sera) & set(rao)):
        return None
    out = paired(rao, sera)  # sera - rao; a = RAO's mean, b = SERA's
    out.update(sera_seeds=s_seeds, sera_lasts=s_lasts, rao_seeds=r_seeds, rao_lasts=r_lasts)
    return out


def per_round(run: dict[str, Any]) -> int | None:
    """Root rollouts behind one round's root success: tasks_per_step x rollouts_per_task (config.json)."""
    c = run["config"]
    if finite(c.get("tasks_per_step")) and finite(c.get("rollouts_per_task")):
        return int(c["tasks_per_step"]) * int(c["rollouts_per_task"])
    return None


def train_curve(run: dict[str, Any], w: int = WINDOW) -> dict[str, list[float]]:
    """Root success of the rollouts per optimizer step (the policy version that sampled them; rounds without
    an update are left out), its trailing rolling mean over ``w`` steps and that mean's binomial 95 % band
    (Wilson, n = the rounds in the window x rollouts per round: tasks are treated as independent draws)."""
    pts = [(int(r["step"]), float(r["reward/root_success"])) for r in run["trained"]
           if finite(r.get("reward/root_success"))]  # fmt: skip
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    roll = rolling(ys, w)
    n = per_round(run)
    band = [wilson(v, n * min(w, i + 1)) if n else (float("nan"),) * 2 for i, v in enumerate(roll)]
    return {"x": xs, "y": ys, "roll": roll, "lo": [b[0] for b in band], "hi": [b[1] for b in band]}


def stat_columns(res: dict[str, dict[int, dict[str, Any]]]) -> list[tuple[str, str]]:
    """(metric, how) columns of the optimizer table: per-stage grad norms (mean/max), the ratio metrics,
    the zero-advantage fraction and the largest depth weight, those present in some run."""
    keys = {k for runs in res.values() for run in runs.values() for r in run["trained"] for k in r}
    stages = {r["stage"] for runs in res.values() for run in runs.values() for r in run["trained"]}
    order = [s for s in STAGES if s in stages] + sorted(stages - set(STAGES))
    cols = [(f"grad_norm/{s}", "mean/max") for s in order]
    for k, how in (("loss/ratio_mean", "mean"), ("loss/ratio_max", "max"), ("loss/abs_log_ratio", "mean/max"),
                   ("batch/zero_adv_frac", "mean"), ("weights/max", "max")):  # fmt: skip
        if k in keys:
            cols.append((k, how))
    return cols


def stage_grad_norm(r: dict[str, Any]) -> Any:
    """A round's grad norm: ``grad_norm/<its stage>`` where logged, else ``grad_norm``."""
    return r.get(f"grad_norm/{r.get('stage')}", r.get("grad_norm"))


def stat_cell(run: dict[str, Any], key: str, how: str) -> str:
    if key.startswith("grad_norm/"):  # the stage's rounds
        rs = [r for r in run["trained"] if r.get("stage") == key.split("/", 1)[1]]
        vs = [float(v) for r in rs if finite(v := stage_grad_norm(r))]
    else:
        vs = [float(r[key]) for r in run["trained"] if finite(r.get(key))]
    if not vs:
        return "-"
    parts = {"mean": f"{mean(vs):.3g}", "max": f"{max(vs):.3g}"}
    return " / ".join(parts[h] for h in how.split("/"))


# ---------------------------------------------------------------------------------------------- markdown


def departures_lines(configs: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown lines listing what the runs take from outside the paper (each run's ``config.json``
    "departures", written by ``sera train``): the ones every run shares once, then each run's own.

    >>> departures_lines({"a": {"departures": ["--lr: 1e-05 (paper: 3e-06)", "--lora-rank: 4 (paper: 0)"]},
    ...                   "b": {"departures": ["--lr: 1e-05 (paper: 3e-06)"]}})[2:]
    ['- every run: --lr: 1e-05 (paper: 3e-06)', '- a also: --lora-rank: 4 (paper: 0)']
    """
    lists = {k: c.get("departures") for k, c in configs.items() if c.get("departures") is not None}
    if not lists:
        return ["## Departures from the paper", "", "- not recorded (no run's config.json lists them)"]
    common = [d for d in next(iter(lists.values())) if all(d in v for v in lists.values())]
    lines = ["## Departures from the paper", ""]
    lines += [f"- every run: {'; '.join(common)}"] if common else []
    lines += [
        f"- {k} also: {'; '.join(extra)}"
        for k, v in lists.items()
        if (extra := [d for d in v if d not in common])
    ]
    return lines


def pct(v: float) -> str:
    return f"{100 * v:.1f} %" if finite(v) else "n/a"


def pp(v: float, sign: bool = True) -> str:
    return (f"{100 * v:+.1f}" if sign else f"{100 * v:.1f}") if finite(v) else "n/a"


def point_cell(p: dict[str, Any] | None) -> str:
    if p is None:
        return "not run"
    half = f" ± {pp(p['half'], False)}" if finite(p["half"]) else ""
    k = f", K={p['k']}" if p.get("k", 1) and p.get("k", 1) > 1 else ""
    done = f", {p['done']} of {p['planned']} done" if (p["done"] or 0) < (p["planned"] or 0) else ""
    n = f" (n={p['n']}{k}{done})" if p["n"] is not None else ""
    return f"{pct(p['rate'])}{half}{n}"


def verdict(r: dict[str, Any]) -> str:
    if not finite(r["se"]):
        return "no interval (fewer than 2 tasks)"
    if r["mean"] > Z * r["se"]:
        return "significant increase (> 1.96 SE)"
    if r["mean"] < -Z * r["se"]:
        return "significant decrease (> 1.96 SE)"
    return "not significant (within 1.96 SE)"


def seeds_text(seeds: list[int], lasts: list[int]) -> str:
    return ", ".join(f"s{s}@{L}" for s, L in zip(seeds, lasts, strict=True))


def markdown(res: dict[str, dict[int, dict[str, Any]]], out: Path) -> str:
    lines = [
        f"# Held-out success, SERA vs RAO from one warm start: `{out}`",
        "",
        "Held-out TextCraft-Synth val tasks. greedy = one trajectory per task at temperature 0; sampled = the "
        "mean over the task's K trajectories at the rollout temperature. ± = 95 % half-width (1.96 standard "
        "errors over held-out tasks), in percentage points.",
        "",
        "## Per run",
        "",
        "| run | optimizer steps (rounds) | greedy, step 0 | greedy, last step | sampled, step 0 | sampled, last step |",
        "|---|---|---|---|---|---|",
    ]
    for m, name in METHODS.items():
        if m not in res:
            lines.append(f"| {name} | not run | not run | not run | not run | not run |")
    for m, runs in res.items():
        for seed, run in sorted(runs.items()):
            last = last_step(run)
            cells = []
            for mode in MODES:
                cells.append(point_cell(run["evals"].get(0, {}).get(mode)))
                if last is None:
                    cells.append("not run")
                else:
                    cells.append(f"step {last}: " + point_cell(run["evals"][last].get(mode)))
            lines.append(f"| {METHODS.get(m, m)} s{seed} | {len(run['trained'])} ({len(run['rounds'])}) | "
                         + " | ".join(cells) + " |")  # fmt: skip
    lines += [
        "",
        "## Improvement: last evaluated step − step 0 (seeds pooled per task, paired over tasks)",
        "",
        "| method | mode | seeds@last step | tasks | step 0 | last | change (pp) | 95 % interval (pp) | |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    imps: dict[tuple[str, str], dict[str, Any] | None] = {}
    for m in res:
        for mode in MODES:
            r = imps[m, mode] = improvement(res[m], mode)
            name = METHODS.get(m, m)
            if r is None:
                lines.append(f"| {name} | {mode} | not run | | | | | | |")
                continue
            lines.append(
                f"| {name} | {mode} | {seeds_text(r['seeds'], r['lasts'])} | {r['n']} | {pct(r['a'])} | "
                f"{pct(r['b'])} | {pp(r['mean'])} ± {pp(r['half'], False)} | [{pp(r['lo'])}, {pp(r['hi'])}] | "
                f"{verdict(r)} |"
            )
    lines += [
        "",
        "## SERA − RAO at the last evaluated step (each method's seeds pooled per task, paired over tasks)",
        "",
        "| mode | SERA seeds@step | RAO seeds@step | tasks | SERA | RAO | SERA − RAO (pp) | 95 % interval (pp) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    diffs = {}
    for mode in MODES:
        d = diffs[mode] = sera_minus_rao(res, mode)
        if d is None:
            lines.append(f"| {mode} | not run | | | | | | |")
            continue
        lines.append(
            f"| {mode} | {seeds_text(d['sera_seeds'], d['sera_lasts'])} | {seeds_text(d['rao_seeds'], d['rao_lasts'])}"
            f" | {d['n']} | {pct(d['b'])} | {pct(d['a'])} | {pp(d['mean'])} ± {pp(d['half'], False)} | "
            f"[{pp(d['lo'])}, {pp(d['hi'])}] |"
        )
    cols = stat_columns(res)
    lines += [
        "",
        "## Training (rollouts at the rollout temperature; rounds with an optimizer step)",
        "",
        "| run | root success, first / last 5 steps |" + "".join(f" {k} ({how}) |" for k, how in cols),
        "|---|---|" + "---|" * len(cols),
    ]
    for m, runs in res.items():
        for seed, run in sorted(runs.items()):
            ys = train_curve(run)["y"]
            first = f"{mean(ys[:WINDOW]):.3f} / {mean(ys[-WINDOW:]):.3f}" if ys else "-"
            lines.append(f"| {METHODS.get(m, m)} s{seed} | {first} |"
                         + "".join(f" {stat_cell(run, k, how)} |" for k, how in cols))  # fmt: skip
    lines += ["", "## What this shows", ""]
    for (m, mode), r in imps.items():
        name = METHODS.get(m, m)
        if r is None:
            lines.append(
                f"- {name}, {mode}: not shown (no evaluation with per-task results at step 0 and after it)."
            )
            continue
        lines.append(
            f"- {name}, {mode}: RL changed held-out {mode} success by {pp(r['mean'])} ± {pp(r['half'], False)} pp "
            f"({pct(r['a'])} -> {pct(r['b'])}; {r['n']} tasks, seeds {seeds_text(r['seeds'], r['lasts'])}): "
            f"{verdict(r)}."
        )
    for mode, d in diffs.items():
        if d is None:
            lines.append(f"- SERA − RAO, {mode}: not shown (needs both methods evaluated after step 0).")
            continue
        side = ("SERA higher" if d["lo"] > 0 else "RAO higher" if d["hi"] < 0
                else "no difference shown (the interval contains 0)")  # fmt: skip
        lines.append(
            f"- SERA − RAO at the last step, {mode}: {pp(d['mean'])} pp, 95 % interval [{pp(d['lo'])}, "
            f"{pp(d['hi'])}] over {d['n']} tasks: {side}."
        )
    n_seeds = {m: len(runs) for m, runs in res.items()}
    lines += [
        "- Not shown: the variation between training seeds (the intervals cover the held-out tasks and samples "
        f"only; seeds per method: {', '.join(f'{METHODS.get(m, m)} {n}' for m, n in n_seeds.items()) or 'none'}); "
        "the training curves' bands treat the rollouts of a round as independent draws.",
    ]
    configs = {
        f"{METHODS.get(m, m)} s{seed}": run["config"]
        for m, runs in res.items()
        for seed, run in sorted(runs.items())
    }
    lines += ["", *departures_lines(configs)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- figure


def figure(res: dict[str, dict[int, dict[str, Any]]], png: Path, title: str) -> None:
    if (plt := pyplot_or_note(png)) is None:  # the table is written all the same
        return
    runs = [(m, seed, run) for m, rs in res.items() for seed, run in sorted(rs.items())]
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.2))
    a = ax[0]
    for i, (m, seed, run) in enumerate(runs):
        c = train_curve(run)
        if not c["x"]:
            continue
        a.plot(c["x"], [100 * y for y in c["y"]], ".", color=f"C{i}", alpha=0.35)
        a.plot(c["x"], [100 * y for y in c["roll"]], "-", color=f"C{i}", label=f"{METHODS.get(m, m)} s{seed}")
        if all(finite(v) for v in c["lo"]):
            a.fill_between(
                c["x"], [100 * v for v in c["lo"]], [100 * v for v in c["hi"]], color=f"C{i}", alpha=0.15
            )
    a.set(title=f"training root success (%), rolling mean of {WINDOW} steps, 95 % band", xlabel="optimizer step",
          ylim=(-2, 102))  # fmt: skip
    if runs:
        a.legend(fontsize=7)
    a = ax[1]
    span = max([s for _, _, run in runs for s in run["evals"]] + [1])
    for i, (m, seed, run) in enumerate(runs):
        for mode, style in (
            ("greedy", {"marker": "o", "ls": "-"}),
            ("sampled", {"marker": "s", "ls": "--", "mfc": "none"}),
        ):
            pts = [(s, e[mode]) for s, e in sorted(run["evals"].items()) if e.get(mode)]
            if not pts:
                continue
            xs = [s + (i - (len(runs) - 1) / 2) * 0.012 * span for s, _ in pts]  # side by side, not on top
            ys = [100 * p["rate"] for _, p in pts]
            err = [100 * p["half"] if finite(p["half"]) else 0.0 for _, p in pts]
            a.errorbar(
                xs,
                ys,
                yerr=err,
                color=f"C{i}",
                capsize=3,
                label=f"{METHODS.get(m, m)} s{seed} {mode}",
                **style,
            )
    a.set(title="held-out success (%), 95 % intervals", xlabel="optimizer step", ylim=(-2, 102))
    if runs:
        a.legend(fontsize=6)
    a = ax[2]
    drawn = False
    for i, (m, seed, run) in enumerate(runs):
        for j, stage in enumerate(STAGES):
            pts = [
                (r["step"], v)
                for r in run["trained"]
                if r.get("stage") == stage and finite(v := stage_grad_norm(r))
            ]
            if pts:
                a.plot(*zip(*pts, strict=True), "os^"[j], color=f"C{i}", ms=3, mfc="none" if j else None,
                       label=f"{METHODS.get(m, m)} s{seed} {stage}")  # fmt: skip
                drawn = True
    if drawn:
        a.set(yscale="log")
        a.legend(fontsize=6)
    else:
        a.text(0.5, 0.5, "no grad norm logged", ha="center", va="center", transform=a.transAxes)
    a.set(title="grad norm per optimizer step (marker: stage)", xlabel="optimizer step")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main(
    out: Path = typer.Argument(..., help="The OUT_DIR of bench/learning.sh."),
    png: Path = typer.Option(None, help="Figure path (default OUT_DIR/learning.png)."),
    md: Path = typer.Option(None, help="Table path (default OUT_DIR/learning.md)."),
    title: str = typer.Option(
        "SERA vs RAO from the shipped warm start (TextCraft-Synth easy)", help="Title."
    ),
) -> None:
    res = load(out)
    text = markdown(res, out)
    (md or out / "learning.md").write_text(text)
    figure(res, png or out / "learning.png", title)
    print(text)


if __name__ == "__main__":
    typer.run(main)
