"""The one command-line entry point: ``sera``.

    sera --help
    sera data textcraft --split train --n 100 --seed 0 --out data/textcraft_train.jsonl
    sera data textworld --split test --n 28 --seed 0 --out data/textworld_test.jsonl
    sera rollout --env textcraft --task data/textcraft_train.jsonl --policy oracle --log runs/trees.jsonl
    sera view runs/trees.jsonl [--html runs/trees.html]
    sera setup                       # convert the bundled SmolLM2 GGUF once to a cached safetensors dir

Every command has help text (``sera COMMAND --help``) and defaults that work on a laptop. Heavy imports
(torch, transformers, textworld) happen inside the commands, so ``sera --help`` is instant.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(
    help="SERA: recursive agents that write, freeze and learn rubrics.",
    no_args_is_help=True,
    add_completion=False,
)
data_app = typer.Typer(help="Generate task files.", no_args_is_help=True)
app.add_typer(data_app, name="data")
console = Console()


def friendly(fn):
    """Show bad input (a malformed task file, an unknown name, a missing file) as one clear line, exit 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from common.data import TaskFileError

        try:
            return fn(*args, **kwargs)
        except (TaskFileError, FileNotFoundError, ValueError) as e:
            console.print(f"[red]error:[/red] {e}", highlight=False)
            raise typer.Exit(2) from None

    return wrapper


ENV_HELP = "Environment: textcraft | textworld | textworld-cooking."
POLICY_HELP = (
    "Policy: oracle | random | replay:FILE.json | hf:MODEL (smollm2, tiny, path, HF id) | openai:URL#MODEL."
)


@data_app.command("textcraft")
@friendly
def data_textcraft(
    split: str = typer.Option("train", help="train or val (the split is by target item)."),
    n: int = typer.Option(100, help="Number of tasks (balanced over easy/medium/hard/extreme)."),
    seed: int = typer.Option(0, help="Task sampling seed."),
    difficulty: str = typer.Option(None, help="Only this tier: easy | medium | hard | extreme."),
    out: Path = typer.Option(..., help="Output JSONL file."),
) -> None:
    """Generate TextCraft-Synth tasks (SERA-compatible JSONL records)."""
    from common.data import write_jsonl
    from common.envs.textcraft.tasks import generate_tasks

    tasks = generate_tasks(split=split, n=n, seed=seed, difficulty=difficulty)
    console.print(f"wrote {write_jsonl(out, tasks)} TextCraft-Synth {split} tasks to {out}")


@data_app.command("textworld")
@friendly
def data_textworld(
    split: str = typer.Option("train", help="train, dev or test (foods follow textworld's cooking splits)."),
    n: int = typer.Option(28, help="Number of tasks (cycled over 7 families x 4 tiers)."),
    seed: int = typer.Option(0, help="Task sampling seed."),
    family: str = typer.Option(None, help="Only this task family (e.g. multi_dish_fork_join)."),
    tier: str = typer.Option(None, help="Only this tier: easy | medium | hard | extreme."),
    out: Path = typer.Option(..., help="Output JSONL file."),
) -> None:
    """Generate TextWorld-Sync tasks in the public SERA row format."""
    from common.data import write_jsonl
    from common.envs.textworld_sync.tasks import generate_tasks

    tasks = generate_tasks(split=split, n=n, seed=seed, family=family, tier=tier)
    console.print(f"wrote {write_jsonl(out, tasks)} TextWorld-Sync {split} tasks to {out}")


@data_app.command("textworld-cooking")
@friendly
def data_textworld_cooking(
    tier: str = typer.Option("medium", help="Game settings tier: easy | medium | hard | extreme."),
    n: int = typer.Option(20, help="Number of games (distinct seeds)."),
    seed: int = typer.Option(0, help="Seed of the game seeds."),
    materialize: bool = typer.Option(False, help="Generate every game now (else lazily, on first use)."),
    out: Path = typer.Option(..., help="Output JSONL file."),
) -> None:
    """Task records for real TextWorld `tw-cooking` games (needs the textworld extra)."""
    from common.data import write_jsonl
    from common.envs.textworld_cooking import generate_tasks

    tasks = generate_tasks(n=n, seed=seed, settings=tier, materialize=materialize)
    console.print(f"wrote {write_jsonl(out, tasks)} TextWorld cooking tasks ({tier}) to {out}")


@app.command()
@friendly
def rollout(
    env: str = typer.Option("textcraft", help=ENV_HELP),
    task: str = typer.Option(
        None,
        help="Task file (JSONL); FILE:INDEX picks one row (default row 0). "
        "Default: one freshly generated task.",
    ),
    policy: str = typer.Option("oracle", help=POLICY_HELP),
    log: Path = typer.Option(Path("runs/rollouts.jsonl"), help="Offline log: one JSON line per tree."),
    temperature: float = typer.Option(0.0, help="Sampling temperature of agent steps (0 = greedy)."),
    best_of_n: int = typer.Option(1, help="Test-time selection candidates per delegation (paper: 2)."),
    max_depth: int = typer.Option(3, help="Maximum delegation depth."),
    seed: int = typer.Option(0, help="Seed for generated tasks and sampling."),
) -> None:
    """Run one recursive rollout (tree) and append it to the offline log."""
    from common.agent.log import append_tree
    from common.agent.runtime import run_root
    from common.agent.viewer import render_tree_terminal
    from common.envs import make_env, runtime_config_for
    from common.policy import make_policy

    the_env = make_env(env)
    row = _pick_task(env, task, seed)
    pol = make_policy(policy, env=env)
    cfg = runtime_config_for(
        env, temperature=temperature, best_of_n=best_of_n, max_depth=max_depth, seed=seed
    )
    tree = asyncio.run(run_root(row, the_env, pol, cfg))
    append_tree(log, tree)
    render_tree_terminal(tree, console)
    console.print(
        f"root success: {tree.success}  nodes: {len(tree.nodes)}  seconds: {tree.seconds:.2f}  log: {log}"
    )


def _pick_task(env: str, task: str | None, seed: int) -> dict:
    from common.envs import load_tasks

    if task is None:
        if env == "textcraft":
            from common.envs.textcraft.tasks import generate_tasks

            return generate_tasks(split="train", n=1, seed=seed, difficulty="easy")[0]
        if env == "textworld":
            from common.envs.textworld_sync.tasks import generate_tasks

            return generate_tasks(split="train", n=1, seed=seed, tier="easy")[0]
        from common.envs.textworld_cooking import generate_tasks

        return generate_tasks(n=1, seed=seed)[0]
    path, _, index = task.partition(":") if not Path(task).exists() else (task, "", "")
    rows = load_tasks(env, path)
    i = int(index) if index else 0
    if not 0 <= i < len(rows):
        raise typer.BadParameter(f"{path} has {len(rows)} tasks; index {i} is out of range")
    return rows[i]


@app.command()
@friendly
def view(
    log: Path = typer.Argument(
        ..., help="Offline log written by `sera rollout`, `sera eval` or `sera train`."
    ),
    html: Path = typer.Option(None, help="Also write one self-contained HTML page to this path."),
    last: int = typer.Option(5, help="Draw the last N trees in the terminal."),
) -> None:
    """Draw recorded trees in the terminal, or write a clickable HTML page."""
    from common.agent.log import read_trees
    from common.agent.viewer import render_tree_terminal, write_html

    trees = read_trees(log)
    for t in trees[-last:]:
        render_tree_terminal(t, console)
    if html is not None:
        write_html(trees, html)
        console.print(f"wrote {html} ({len(trees)} trees)")


eval_app = typer.Typer(
    help="Evaluate a policy with the paper's protocol (SPEC.md §5); `sera eval compare A B`."
)
app.add_typer(eval_app, name="eval")


@eval_app.callback(invoke_without_command=True)
@friendly
def eval_run(
    ctx: typer.Context,
    env: str = typer.Option("textcraft", help=ENV_HELP),
    tasks: Path = typer.Option(None, help="Task file (JSONL or manifest JSON)."),
    policy: str = typer.Option("oracle", help=POLICY_HELP),
    out: Path = typer.Option(None, help="Output directory; re-running the same command resumes."),
    concurrency: int = typer.Option(4, help="Tasks in flight at once."),
    best_of_n: int = typer.Option(1, help="Test-time selection candidates per delegation (paper: 2)."),
    limit: int = typer.Option(None, help="Only the first N tasks."),
    temperature: float = typer.Option(0.0, help="Protocol: 0 (greedy)."),
    max_steps: int = typer.Option(20, help="Protocol: steps per agent."),
    max_depth: int = typer.Option(3, help="Protocol: maximum delegation depth."),
    batch_size: int = typer.Option(8, help="hf policies: most requests per forward pass (64+ on a GPU)."),
) -> None:
    """Run (or resume) an evaluation: per-task trees, report.json, report.md and a per-tier chart."""
    if ctx.invoked_subcommand is not None:
        return
    if tasks is None or out is None:
        raise typer.BadParameter("--tasks and --out are required (see `sera eval --help`)")
    from common.eval import EvalConfig, ManifestMismatch, evaluate, render_markdown

    cfg = EvalConfig(
        env=env,
        tasks=str(tasks),
        policy=policy,
        out=str(out),
        concurrency=concurrency,
        best_of_n=best_of_n,
        limit=limit,
        temperature=temperature,
        max_steps=max_steps,
        max_depth=max_depth,
    )
    try:
        report = asyncio.run(evaluate(cfg))
    except ManifestMismatch as e:
        console.print(f"[red]{e}")
        raise typer.Exit(2) from None
    console.print(render_markdown(report))
    console.print(f"report: {out / 'report.json'}")


@eval_app.command("compare")
@friendly
def eval_compare(
    a: Path = typer.Argument(..., help="First eval directory (holding report.json)."),
    b: Path = typer.Argument(..., help="Second eval directory."),
    png: Path = typer.Option(None, help="Also draw both side by side to this PNG."),
) -> None:
    """Compare two evaluation reports side by side."""
    from common.eval import compare

    console.print(compare(a, b, png))


@app.command()
def setup(model: str = typer.Option("smollm2", help="Model alias or path to prepare.")) -> None:
    """Convert the bundled SmolLM2-135M-Instruct GGUF once to a cached safetensors directory."""
    from common.policy.models import prepare_model

    console.print(f"model ready at {prepare_model(model)}")


def _train(cfg, level: int = 0, paper: bool = False, **level1) -> None:
    if paper:
        cfg = cfg.paper()
    if level == 0:
        from level0_single_process.train import train

        train(cfg)
    elif level == 1:
        from level1_batched.config import Level1Config
        from level1_batched.train import train as train_level1

        train_level1(cfg, Level1Config(**level1))
    else:
        raise typer.BadParameter(f"--level {level} is not available yet; levels 0 and 1 are")


def _register_train() -> None:
    import inspect

    from common.config import dataclass_command
    from common.train_config import TrainConfig
    from level1_batched.config import level1_options

    extra = [
        inspect.Parameter(
            "level",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=int,
            default=typer.Option(
                0,
                help="Tier: 0 = one readable process (level0_single_process); 1 = batched rollouts, packed "
                "micro-batches, data parallel under torchrun (level1_batched).",
            ),
        ),
        inspect.Parameter(
            "paper",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=bool,
            default=typer.Option(
                False,
                help="Use the paper's sizes (8x8 rollouts, K=8, 20 steps, "
                "full caps, bf16) instead of the laptop defaults.",
            ),
        ),
    ]
    cmd = dataclass_command(TrainConfig, _train, extra=[*extra, *level1_options()])
    cmd.__doc__ = "Train a policy with SERA (or an ablation preset); resumable with --resume."
    app.command("train")(cmd)


_register_train()


if __name__ == "__main__":
    app()
