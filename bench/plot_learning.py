"""Summarise a `bench/learning.sh` run (issue #39): does RL raise held-out success, and SERA vs RAO, with 95 %
intervals. One PNG and one markdown table, every number read from the run's files.

    python bench/plot_learning.py OUT_DIR [--png OUT_DIR/learning.png] [--md OUT_DIR/learning.md]

Reads, per method M (sera, rao) and seed S, OUT_DIR/rl_M/sS/:

* ``metrics.jsonl``: one row per rollout round (``reward/root_success``, ``stage``, ``train/skipped``,
  ``grad_norm/<stage>``, ``loss/ratio_*``, ...) and one row per in-run held-out evaluation (``eval/success``,
  ``eval/success_lo``, ``eval/success_hi``, ``eval/sampled_success``, ...);
* ``evals/step_SSSSS/results/*.json`` (greedy, one trajectory per task) and
  ``evals/step_SSSSS_sample_k/results/*.json`` (sample k at the rollout temperature): the per-task outcomes
  the intervals are computed from (or ``results.jsonl``, the same folded into one file by
  ``h200_learning.sh import``: ``common.eval.archive_results``);
* ``config.json``: ``tasks_per_step`` x ``rollouts_per_task`` = the rollouts behind one round's root success;
* ``trees.jsonl``: each training rollout's task and root success (``meta.round``), for the curves' bands.

Statistics (Z = 1.96). A task is one unit everywhere: its K samples, its rollouts in a training window, its
outcomes under several seeds are never counted as independent draws.

* a per-task value is the greedy outcome (0/1) or the mean outcome of the task's K samples;
* a greedy success rate (one 0/1 outcome per task, a proportion standing alone): Wilson's 95 % interval;
* a sampled success rate (K correlated samples per task): Wilson's interval at the task-clustered effective
  sample size (``common.train_eval.clustered_interval``: cluster-robust variance, tasks as clusters);
* the improvement of a method = its per-task value at its last evaluated step minus at step 0, paired over
  tasks: for each seed on its own, and with the seeds pooled (per task, the mean over seeds), mean +- Z * SE of
  the per-task differences; beside them the spread between seeds (the standard deviation of the seeds'
  changes). It is called significant when the pooled |mean| > Z * SE and every seed's change has its sign;
* SERA - RAO at the last step = per task, SERA's value (mean over its seeds) minus RAO's, paired the same way,
  and per seed number (SERA sS - RAO sS: the same sampled-eval seeds, common random numbers);
* the training curves: the rolling mean of root success over WINDOW optimizer steps, its band clustered by
  task over the window's rollouts (from ``trees.jsonl``; without it, no band).

The pooled intervals cover the sample of held-out tasks (and of the K samples); the variation between training
seeds is what the per-seed columns and their spread show (2 seeds: a rough guide). A cut-off evaluation is
shown from its finished tasks, marked "n of N done"; a run or evaluation that does not exist is "not run",
never zero.
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
from common.train_eval import clustered_interval, wilson  # noqa: E402, F401 - wilson: plot_tiny_set's too

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
    if (d / "manifest.json").is_file() and (
        (d / "results.jsonl").is_file() or any((d / "results").glob("*.json"))
    ):
        return partial_report(d)
    return None


def task_outcomes(d: Path) -> dict[Any, float]:
    """Per task (``task_id``, else ``index``): 1.0 for a success, 0.0 for a failure or an error."""
    return {
        r.get("task_id") or r["index"]: float(bool(r.get("success")) and not r.get("error"))
        for r in load_results(d).values()
    }


def eval_point(dirs: list[Path], row: dict[str, Any] | None = None, mode: str = "greedy") -> dict | None:
    """One evaluation (greedy: one directory; sampled: one per sample): per-task values (the mean over the
    samples that finished the task), rate, 95 % interval ``lo``-``hi`` (greedy: Wilson; sampled: clustered by
    task), tasks done / planned. Without per-task results it falls back to the metrics row's numbers
    (``tasks`` is then None: no paired statistics; a row written before the Wilson bounds has a symmetric
    half-width, ``eval/*_ci95``)."""
    got = [(d, task_outcomes(d)) for d in dirs]
    got = [(d, p) for d, p in got if p]
    if got:
        values = pool([p for _, p in got])
        if len(dirs) == 1:
            lo, hi = wilson(mean(list(values.values())), len(values))
        else:  # per task: its successes over the samples that finished it
            iv = clustered_interval([(sum(p[t] for _, p in got if t in p), sum(t in p for _, p in got))
                                     for t in values])  # fmt: skip
            lo, hi = iv["lo"], iv["hi"]
        planned = max(planned_tasks(d, len(p)) for d, p in got)
        done = min(len(p) for _, p in got) if len(got) == len(dirs) else 0  # tasks every sample finished
        return {"tasks": values, "rate": mean(list(values.values())), "lo": lo, "hi": hi, "n": len(values),
                "done": done, "planned": planned, "k": len(dirs)}  # fmt: skip
    prefix = "eval/success" if mode == "greedy" else "eval/sampled"  # eval/success, eval/sampled_success
    r = row or {}
    if finite(rate := r.get("eval/success" if mode == "greedy" else "eval/sampled_success")):
        n = int(r["eval/n_tasks"]) if finite(r.get("eval/n_tasks")) else None
        lo, hi, half = r.get(f"{prefix}_lo"), r.get(f"{prefix}_hi"), r.get(f"{prefix}_ci95")
        if not (finite(lo) and finite(hi)):
            lo, hi = (rate - half, rate + half) if finite(half) else (float("nan"), float("nan"))
        return {"tasks": None, "rate": float(rate), "lo": float(lo), "hi": float(hi), "n": n, "done": n,
                "planned": n, "k": len(dirs) or None}  # fmt: skip
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
            "greedy": eval_point([greedy[s]] if s in greedy else [], r, "greedy"),
            "sampled": eval_point(samples.get(s, []), r, "sampled"),
        }
        if any(pts.values()):
            evals[s] = pts
    rounds = [r for r in rows if "stage" in r]
    trained = [r for r in rounds if not r.get("train/skipped")]
    return {"dir": d, "rows": rows, "config": config, "evals": evals, "rounds": rounds, "trained": trained,
            "tasks_by_round": tasks_by_round(d / "trees.jsonl")}  # fmt: skip


def tasks_by_round(path: Path) -> dict[int, dict[str, list[int]]]:
    """``{round: {task_id: [successes, rollouts]}}`` of the training rollouts a run logged (``trees.jsonl``,
    one root rollout a line); empty without the file."""
    out: dict[int, dict[str, list[int]]] = {}
    if not path.is_file():
        return out
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            t = json.loads(line)
            rnd = (t.get("meta") or {}).get("round")
            if rnd is None:
                continue
            cell = out.setdefault(int(rnd), {}).setdefault(str(t.get("task_id")), [0, 0])
            cell[0] += int(bool(t.get("success")))
            cell[1] += 1
    return out


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
    res["per_seed"] = [interval(list(d.values())) for d in diffs]  # each seed on its own, paired over tasks
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
    out["per_seed"], out["seeds"] = [], []  # SERA sS - RAO sS, the seeds both methods ran
    for seed in sorted(set(res["sera"]) & set(res["rao"])):
        one_s, _, _ = last_values({seed: res["sera"][seed]}, mode)
        one_r, _, _ = last_values({seed: res["rao"][seed]}, mode)
        if set(one_s) & set(one_r):
            out["per_seed"].append(paired(one_r, one_s))
            out["seeds"].append(seed)
    return out


def seed_spread(r: dict[str, Any]) -> float:
    """The standard deviation (n - 1) of the seeds' own changes: the variation between training seeds (NaN
    with fewer than 2 seeds)."""
    ms = [s["mean"] for s in r.get("per_seed", [])]
    if len(ms) < 2:
        return float("nan")
    m = mean(ms)
    return math.sqrt(sum((x - m) ** 2 for x in ms) / (len(ms) - 1))


def per_seed_text(r: dict[str, Any], seeds: list[int]) -> str:
    """``s0 +25.0 ± 49.0; s1 +50.0 ± 56.6`` (pp): each seed's change with its own 95 % half-width."""
    return "; ".join(f"s{s} {pp(x['mean'])} ± {pp(x['half'], False)}"
                     for s, x in zip(seeds, r.get("per_seed", []), strict=True))  # fmt: skip


def train_curve(run: dict[str, Any], w: int = WINDOW) -> dict[str, list[float]]:
    """Root success of the rollouts per optimizer step (the policy version that sampled them; rounds without
    an update are left out), its trailing rolling mean over ``w`` steps and that mean's 95 % band clustered
    by task (:func:`common.train_eval.clustered_interval` over the window's rollouts, a task's rollouts one
    unit: they share its difficulty), from ``trees.jsonl``; NaN where a round of the window has no trees."""
    pts = [(int(r["step"]), float(r["reward/root_success"]), r.get("round")) for r in run["trained"]
           if finite(r.get("reward/root_success"))]  # fmt: skip
    xs, ys, rounds = [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]
    roll = rolling(ys, w)
    by_round = run.get("tasks_by_round") or {}
    band = []
    for i in range(len(pts)):
        window = rounds[max(0, i - w + 1) : i + 1]
        if not all(r in by_round for r in window):
            band.append((float("nan"), float("nan")))
            continue
        tasks: dict[str, list[int]] = {}
        for r in window:
            for t, (y, n) in by_round[r].items():
                cell = tasks.setdefault(t, [0, 0])
                cell[0], cell[1] = cell[0] + y, cell[1] + n
        iv = clustered_interval([(y, n) for y, n in tasks.values()])
        band.append((iv["lo"], iv["hi"]))
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
    half = f" [{pp(p['lo'], False)}, {pp(p['hi'], False)}]" if finite(p["lo"]) and finite(p["hi"]) else ""
    k = f", K={p['k']}" if p.get("k", 1) and p.get("k", 1) > 1 else ""
    done = f", {p['done']} of {p['planned']} done" if (p["done"] or 0) < (p["planned"] or 0) else ""
    n = f" (n={p['n']}{k}{done})" if p["n"] is not None else ""
    return f"{pct(p['rate'])}{half}{n}"


def verdict(r: dict[str, Any]) -> str:
    """Significant when the pooled change is beyond 1.96 SE and every seed's own change has its sign.

    >>> verdict({"mean": 0.3, "se": 0.1, "per_seed": [{"mean": 0.5}, {"mean": -0.1}]})
    'not significant: the seeds disagree in sign (pooled > 1.96 SE)'
    """
    if not finite(r["se"]):
        return "no interval (fewer than 2 tasks)"
    if abs(r["mean"]) <= Z * r["se"]:
        return "not significant (within 1.96 SE)"
    if any(s["mean"] * r["mean"] <= 0 for s in r.get("per_seed", [])):
        return "not significant: the seeds disagree in sign (pooled > 1.96 SE)"
    return f"significant {'increase' if r['mean'] > 0 else 'decrease'} (> 1.96 SE, every seed the same sign)"


def seeds_text(seeds: list[int], lasts: list[int]) -> str:
    return ", ".join(f"s{s}@{L}" for s, L in zip(seeds, lasts, strict=True))


def markdown(res: dict[str, dict[int, dict[str, Any]]], out: Path) -> str:
    lines = [
        f"# Held-out success, SERA vs RAO from one warm start: `{out}`",
        "",
        "Held-out TextCraft-Synth val tasks. greedy = one trajectory per task at temperature 0; sampled = the "
        "mean over the task's K trajectories at the rollout temperature. [lo, hi] = 95 % interval in percent "
        "(greedy: Wilson; sampled: clustered by task, a task's K samples one unit); ± = 95 % half-width of a "
        "change paired over tasks (1.96 standard errors), in percentage points.",
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
        "## Improvement: last evaluated step − step 0 (paired over tasks; seeds pooled per task, and each seed)",
        "",
        "| method | mode | seeds@last step | tasks | step 0 | last | change (pp) | 95 % interval (pp) | each seed "
        "(pp) | between seeds, sd (pp) | |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    imps: dict[tuple[str, str], dict[str, Any] | None] = {}
    for m in res:
        for mode in MODES:
            r = imps[m, mode] = improvement(res[m], mode)
            name = METHODS.get(m, m)
            if r is None:
                lines.append(f"| {name} | {mode} | not run | | | | | | | | |")
                continue
            lines.append(
                f"| {name} | {mode} | {seeds_text(r['seeds'], r['lasts'])} | {r['n']} | {pct(r['a'])} | "
                f"{pct(r['b'])} | {pp(r['mean'])} ± {pp(r['half'], False)} | [{pp(r['lo'])}, {pp(r['hi'])}] | "
                f"{per_seed_text(r, r['seeds'])} | {pp(seed_spread(r), False)} | {verdict(r)} |"
            )
    lines += [
        "",
        "## SERA − RAO at the last evaluated step (paired over tasks; each method's seeds pooled per task, and "
        "SERA sS − RAO sS per seed)",
        "",
        "| mode | SERA seeds@step | RAO seeds@step | tasks | SERA | RAO | SERA − RAO (pp) | 95 % interval (pp) | "
        "each seed (pp) | between seeds, sd (pp) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    diffs = {}
    for mode in MODES:
        d = diffs[mode] = sera_minus_rao(res, mode)
        if d is None:
            lines.append(f"| {mode} | not run | | | | | | | | |")
            continue
        lines.append(
            f"| {mode} | {seeds_text(d['sera_seeds'], d['sera_lasts'])} | {seeds_text(d['rao_seeds'], d['rao_lasts'])}"
            f" | {d['n']} | {pct(d['b'])} | {pct(d['a'])} | {pp(d['mean'])} ± {pp(d['half'], False)} | "
            f"[{pp(d['lo'])}, {pp(d['hi'])}] | {per_seed_text(d, d['seeds'])} | {pp(seed_spread(d), False)} |"
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
            f"({pct(r['a'])} -> {pct(r['b'])}; {r['n']} tasks, seeds {seeds_text(r['seeds'], r['lasts'])}; "
            f"each seed: {per_seed_text(r, r['seeds'])}): {verdict(r)}."
        )
    for mode, d in diffs.items():
        if d is None:
            lines.append(f"- SERA − RAO, {mode}: not shown (needs both methods evaluated after step 0).")
            continue
        agree = all(x["mean"] * d["mean"] > 0 for x in d["per_seed"])
        side = ("no difference shown (the interval contains 0)" if d["lo"] <= 0 <= d["hi"]
                else "no difference shown (the seeds disagree in sign)" if not agree
                else "SERA higher" if d["lo"] > 0 else "RAO higher")  # fmt: skip
        lines.append(
            f"- SERA − RAO at the last step, {mode}: {pp(d['mean'])} pp, 95 % interval [{pp(d['lo'])}, "
            f"{pp(d['hi'])}] over {d['n']} tasks (each seed: {per_seed_text(d, d['seeds']) or 'none in both'}): "
            f"{side}."
        )
    n_seeds = {m: len(runs) for m, runs in res.items()}
    lines += [
        "- Between training seeds: the pooled intervals cover the held-out tasks and samples; the seeds' own "
        "changes and their spread are beside them (seeds per method: "
        f"{', '.join(f'{METHODS.get(m, m)} {n}' for m, n in n_seeds.items()) or 'none'}; 2 seeds are a rough "
        "guide). The training curves' bands are clustered by task (trees.jsonl; none without it).",
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
    a.set(title=f"training root success (%), rolling mean of {WINDOW} steps\n95 % band (by task)",
          xlabel="optimizer step", ylim=(-2, 102))  # fmt: skip
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
            err = [[100 * (p["rate"] - p["lo"]) if finite(p["lo"]) else 0.0 for _, p in pts],
                   [100 * (p["hi"] - p["rate"]) if finite(p["hi"]) else 0.0 for _, p in pts]]  # fmt: skip
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
