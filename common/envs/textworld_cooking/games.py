"""Real TextWorld ``tw-cooking`` games, generated offline at fixed seeds and cached on disk.

What it does
    :func:`generate_game` calls TextWorld's own cooking-challenge generator (the code behind
    ``tw-make tw-cooking --recipe R --take T --go G --open --cook --cut --seed S``) through its Python
    API, compiles the game with Inform 7 and stores it under a cache directory keyed by the settings
    and the seed. The same (settings, seed) always yields the same game (same map, recipe, walkthrough);
    a cached game is returned at once, a new one takes a few seconds. :func:`request_infos` is the one
    ``textworld.EnvInfos`` every consumer uses (admissible commands, the walkthrough extra,
    description, inventory, score; optionally the winning policy). :func:`generate_tasks` / :func:`load_tasks` make
    and read task records.

What it simplifies
    Only the cooking challenge; only the settings listed in :class:`CookingSettings` (the ``drop`` and
    ``split`` knobs of ``tw-make`` are passed through but untested). Games are referenced by path, not
    shipped: a task record carries either a ``game_file`` or the settings + seed to regenerate it.
    TextWorld environments cannot be pickled, so processes exchange ``(game_file, actions)`` and replay.

How to run
    ``python -m common.envs.textworld_cooking.games --tier medium --seed 3`` generates one game and
    prints its path and walkthrough. The cache defaults to ``~/.cache/sera/tw_games``; override it
    with ``SERA_TW_GAMES_DIR`` or the ``cache_dir=`` argument.

>>> s = CookingSettings(recipe=2, take=2, go=6, open=True, cook=True, cut=True)
>>> s.key()
'r2-t2-g6-open-cook-cut'
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from common.data import read_jsonl, write_jsonl

CACHE_ENV_VAR = "SERA_TW_GAMES_DIR"
"""Environment variable overriding the default cache directory."""

GAME_FILE_NAME = "game.z8"
"""Name of the compiled game inside its cache directory (``game.json`` and ``game.ni`` sit beside it)."""

VALID_GO = (1, 6, 9, 12)
"""Numbers of rooms the cooking generator supports."""


@dataclass(frozen=True)
class CookingSettings:
    """The difficulty knobs of the ``tw-cooking`` challenge (same names as the ``tw-make`` flags)."""

    recipe: int = 1
    """Number of ingredients in the recipe (1-5)."""
    take: int = 1
    """How many of the recipe's ingredients must be found and taken (<= recipe; the rest start held)."""
    go: int = 1
    """Number of rooms (1, 6, 9 or 12)."""
    open: bool = False
    """Containers and doors start closed and must be opened."""
    cook: bool = False
    """Some ingredients must be cooked (stove: fried, oven: roasted, BBQ: grilled)."""
    cut: bool = False
    """Some ingredients must be cut (sliced, diced, chopped) with the knife."""
    drop: bool = False
    """Limited inventory capacity (items must be dropped). Untested here."""
    recipe_seed: int = 0
    """Seed of the recipe sampler (0 = recipe drawn with the game seed; > 0 needs ``take``)."""
    split: str | None = None
    """Food split of the original competition: None (all), 'train', 'valid' or 'test'."""

    def __post_init__(self) -> None:
        if self.go not in VALID_GO:
            raise ValueError(f"go must be one of {VALID_GO}, got {self.go}")
        if not 1 <= self.recipe <= 5:
            raise ValueError(f"recipe must be in 1..5, got {self.recipe}")
        if not 0 <= self.take <= self.recipe:
            raise ValueError(f"take must be in 0..recipe ({self.recipe}), got {self.take}")
        if self.split not in (None, "train", "valid", "test"):
            raise ValueError(f"split must be None, 'train', 'valid' or 'test', got {self.split!r}")

    def key(self) -> str:
        """A short, filesystem-safe name for these settings (part of the cache key)."""
        parts = [f"r{self.recipe}", f"t{self.take}", f"g{self.go}"]
        parts += [name for name in ("open", "cook", "cut", "drop") if getattr(self, name)]
        if self.recipe_seed:
            parts.append(f"rs{self.recipe_seed}")
        if self.split:
            parts.append(self.split)
        return "-".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_any(cls, value: CookingSettings | dict[str, Any] | str) -> CookingSettings:
        """Accept a settings object, a dict of fields, or a tier name from :data:`TIERS`."""
        if isinstance(value, CookingSettings):
            return value
        if isinstance(value, str):
            if value not in TIERS:
                raise ValueError(f"unknown tier {value!r}; choose one of {sorted(TIERS)}")
            return TIERS[value]
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = set(value) - known
            if unknown:
                raise ValueError(f"unknown cooking settings {sorted(unknown)}; known: {sorted(known)}")
            return cls(**value)
        raise TypeError(f"settings must be CookingSettings, dict or tier name, got {type(value).__name__}")


TIERS: dict[str, CookingSettings] = {
    "easy": CookingSettings(recipe=1, take=1, go=1, open=False, cook=False, cut=False),
    "medium": CookingSettings(recipe=2, take=2, go=1, open=True, cook=True, cut=True),
    "hard": CookingSettings(recipe=3, take=3, go=6, open=True, cook=True, cut=True),
    "extreme": CookingSettings(recipe=5, take=5, go=12, open=True, cook=True, cut=True),
}
"""Fixed settings per difficulty tier (walkthroughs of roughly 5, 14, 20 and 40+ commands)."""


def default_cache_dir() -> Path:
    """``$SERA_TW_GAMES_DIR`` if set, else ``~/.cache/sera/tw_games``."""
    override = os.environ.get(CACHE_ENV_VAR)
    if override:
        return Path(override).expanduser()
    return Path("~/.cache/sera/tw_games").expanduser()


def game_dir(
    settings: CookingSettings | dict | str, seed: int, cache_dir: str | os.PathLike | None = None
) -> Path:
    """Where the game of (settings, seed) lives in the cache (it may not exist yet)."""
    s = CookingSettings.from_any(settings)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / f"tw-cooking-{s.key()}" / f"seed{int(seed)}"


def _require_textworld():
    try:
        import textworld  # noqa: PLC0415  (optional dependency, imported lazily)
        import textworld.challenges  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(
            "the real TextWorld cooking games need the `textworld` package: pip install textworld==1.7.0"
        ) from e
    return textworld


@contextmanager
def quiet_jericho() -> Iterator[None]:
    """Silence jericho's ``UnsupportedGameWarning`` (emitted for every generated game on every load and
    copy; textworld filters it globally, but test runners reset warning filters)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*is not fully supported.*")
        yield


def generate_game(
    settings: CookingSettings | dict | str,
    seed: int,
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
) -> Path:
    """Path of the compiled ``.z8`` game for (settings, seed), generating it on a cache miss.

    Generation runs in a temporary sibling directory that is renamed into place, so concurrent
    callers never see a half-written game (the loser of a race discards its copy).
    """
    s = CookingSettings.from_any(settings)
    final = game_dir(s, seed, cache_dir)
    game_file = final / GAME_FILE_NAME
    if game_file.exists() and not force:
        return game_file
    textworld = _require_textworld()
    _, make_game, _ = textworld.challenges.CHALLENGES["tw-cooking"]

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".seed{seed}-", dir=final.parent))
    try:
        options = textworld.GameOptions()
        options.seeds = int(seed)
        options.path = str(tmp / GAME_FILE_NAME)
        options.file_ext = ".z8"
        options.force_recompile = True
        with quiet_jericho():
            game = make_game(settings=s.to_dict(), options=options)
            textworld.generator.compile_game(game, options)
        (tmp / "settings.json").write_text(json.dumps({"settings": s.to_dict(), "seed": int(seed)}, indent=1))
        if force and final.exists():
            shutil.rmtree(final)
        try:
            os.rename(tmp, final)
        except OSError:
            if not game_file.exists():  # a real failure, not a lost race
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return game_file


def game_metadata(game_file: str | os.PathLike) -> dict[str, Any]:
    """The generator's metadata stored beside a game (``walkthrough``, ``recipe``, ``uuid``, ...) plus
    ``objective``. Reads ``game.json``; no TextWorld import needed."""
    meta_path = Path(game_file).with_suffix(".json")
    if not meta_path.exists():
        raise FileNotFoundError(f"no game.json beside {game_file}; regenerate it with generate_game()")
    doc = json.loads(meta_path.read_text(encoding="utf-8"))
    meta = dict(doc.get("metadata", {}))
    meta["objective"] = doc.get("objective", "")
    return meta


def request_infos(policy_commands: bool = False):
    """The ``textworld.EnvInfos`` every SERA consumer requests (one place, so all envs agree).

    ``policy_commands`` (TextWorld's winning policy from the current state) is off by default: it makes
    each step about 2.5x slower on the extreme tier and is often empty on harder games anyway (the
    generator's walkthrough, always present as ``extra.walkthrough``, is what the oracle follows)."""
    textworld = _require_textworld()
    return textworld.EnvInfos(
        admissible_commands=True,
        policy_commands=policy_commands,
        extras=["walkthrough", "recipe"],
        description=True,
        inventory=True,
        objective=True,
        score=True,
        max_score=True,
        moves=True,
        won=True,
        lost=True,
    )


# ---------------------------------------------------------------------------------------------------
# Task records: {"task_id", "game_file" | ("settings", "seed"), "max_steps", ...}
# ---------------------------------------------------------------------------------------------------

DEFAULT_GOAL = (
    "You are hungry! Let's cook a delicious meal. Check the cookbook in the kitchen for the recipe. "
    "Once done, enjoy your meal!"
)
"""The objective of every tw-cooking game (the generator always writes this text)."""

DEFAULT_MAX_STEPS = 20
"""The root agent's own step budget (SPEC.md §1)."""


def generate_tasks(
    n: int,
    seed: int = 0,
    settings: CookingSettings | dict | str = "medium",
    max_steps: int = DEFAULT_MAX_STEPS,
    max_world_steps: int | None = None,
    materialize: bool = False,
    cache_dir: str | os.PathLike | None = None,
) -> list[dict[str, Any]]:
    """``n`` task records with distinct game seeds drawn from ``seed``.

    Records hold the settings and the game seed (games are generated lazily by the environment);
    ``materialize=True`` generates every game now and adds its ``game_file``. ``max_world_steps``
    (optional) is a shared budget of game commands across all agents of one task.

    >>> generate_tasks(1, seed=0, settings="easy")[0]["task_id"]
    'twc-r1-t1-g1-s55341'
    """
    s = CookingSettings.from_any(settings)
    rng = random.Random(seed)
    game_seeds: list[int] = []
    while len(game_seeds) < n:
        g = rng.randrange(1, 65535)
        if g not in game_seeds:
            game_seeds.append(g)
    tasks = []
    for g in game_seeds:
        rec: dict[str, Any] = {
            "task_id": f"twc-{s.key()}-s{g}",
            "goal": DEFAULT_GOAL,
            "settings": s.to_dict(),
            "seed": g,
            "max_steps": int(max_steps),
        }
        if isinstance(settings, str):
            rec["difficulty"] = settings  # the tier name, for per-tier evaluation reports
        if max_world_steps is not None:
            rec["max_world_steps"] = int(max_world_steps)
        if materialize:
            rec["game_file"] = str(generate_game(s, g, cache_dir))
        tasks.append(rec)
    return tasks


def validate_task(rec: dict[str, Any]) -> None:
    """Raise ValueError/KeyError/TypeError when ``rec`` is not a valid cooking task record."""
    if "task_id" not in rec:
        raise KeyError("task_id")
    if "game_file" not in rec and not ("settings" in rec and "seed" in rec):
        raise ValueError("a task needs 'game_file' or both 'settings' and 'seed'")
    if "settings" in rec:
        CookingSettings.from_any(rec["settings"])
    if "max_steps" in rec and (not isinstance(rec["max_steps"], int) or rec["max_steps"] < 1):
        raise ValueError(f"max_steps must be a positive int, got {rec['max_steps']!r}")


def resolve_game_file(task: dict[str, Any], cache_dir: str | os.PathLike | None = None) -> Path:
    """The game file of a task record, generating it from settings + seed when needed."""
    validate_task(task)
    if task.get("game_file"):
        path = Path(task["game_file"]).expanduser()
        if path.exists() or "settings" not in task:
            if not path.exists():
                raise FileNotFoundError(f"task {task['task_id']}: game file {path} not found")
            return path
    return generate_game(task["settings"], int(task["seed"]), cache_dir)


def load_tasks(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read cooking task records from JSONL (errors name ``file:line``)."""
    return read_jsonl(path, validate=validate_task)


def save_tasks(path: str | os.PathLike, tasks: list[dict[str, Any]]) -> int:
    """Write task records to JSONL atomically; returns the count."""
    return write_jsonl(path, tasks)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Generate (or fetch from cache) one tw-cooking game.")
    parser.add_argument("--tier", default="medium", choices=sorted(TIERS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)
    path = generate_game(args.tier, args.seed, args.cache_dir)
    meta = game_metadata(path)
    print(path)
    print(" > ".join(meta.get("walkthrough", [])))


if __name__ == "__main__":
    main()
