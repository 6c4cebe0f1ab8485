"""Set-up steps every tier repeats: the method's schedule and the policy the trainer samples from."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from common.rl.schedule import MethodPreset, Schedule, get_preset
from common.train_config import TrainConfig


def method_and_schedule(cfg: TrainConfig) -> tuple[MethodPreset, Schedule]:
    """The method preset and its stage cycle (``--schedule`` overrides the preset's)."""
    preset = get_preset(cfg.method)
    schedule = Schedule.parse(cfg.schedule or preset.schedule)
    if "rubric" in schedule.stages and not preset.generate_rubrics:
        raise ValueError(f"method {cfg.method} writes no rubrics, so its schedule cannot have a rubric stage")
    return preset, schedule


ALL_STAGES_TUTORIAL = "tutorials/06_level0_training.py"
"""The tutorial whose run trains all three stages (the test model, in about a minute on a CPU)."""


def stages_note(schedule: Schedule, start: int, steps: int) -> str | None:
    """One line when optimizer steps ``start`` .. ``steps - 1`` do not reach every stage of ``schedule`` (the
    quick start's 2 steps are both Execution-stage steps of ``execution:16,delegation:2,rubric:2``): the stages
    they train, where the others begin, and where to see them all; None when every stage gets a step.

    >>> print(stages_note(Schedule.parse("execution:16,delegation:2,rubric:2"), 0, 2))
    steps 0-1 are Execution-stage steps only (the cycle execution:16,delegation:2,rubric:2 reaches delegation at step 16, rubric at step 18): this run trains no delegation and no rubric writing. All stages: --schedule execution:1,delegation:1,rubric:1 --steps 3 asks for a step of each; tutorials/06_level0_training.py takes one step of each in about a minute
    >>> stages_note(Schedule.parse("execution:1,delegation:1,rubric:1"), 0, 3) is None
    True
    """
    order = list(dict.fromkeys(name for name, _ in schedule.cycle))
    trained = [schedule.stage_at(k) for k in range(start, steps)]
    missing = [name for name in order if name not in trained]
    if not trained or not missing:
        return None
    first = [next(k for k in range(steps, steps + schedule.period) if schedule.stage_at(k) == m) for m in missing]
    span = f"steps {start}-{steps - 1} are" if steps - start > 1 else f"step {start} is"
    which = "/".join(s.capitalize() for s in order if s in trained)
    reach = ", ".join(f"{m} at step {k}" for m, k in zip(missing, first, strict=True))
    no = " and ".join("no rubric writing" if m == "rubric" else f"no {m}" for m in missing)
    every = ",".join(f"{name}:1" for name in order)
    return (
        f"{span} {which}-stage steps only (the cycle {schedule} reaches {reach}): this run trains {no}. "
        f"All stages: --schedule {every} --steps {len(order)} asks for a step of each; {ALL_STAGES_TUTORIAL} "
        "takes one step of each in about a minute"
    )


def train_policy(
    cfg: TrainConfig, model: Any, tokenizer: Any, max_batch_size: int, engine: Any = None
) -> Any:
    """The policy rollouts sample from: the model being trained (strictly on-policy), or ``engine`` (a
    separate rollout engine the tier keeps in sync), optionally with a share of teacher-forced oracle
    replies (``--oracle-mix``, an off-policy warm start)."""
    from common.policy.hf import HFPolicy

    policy = (
        engine
        if engine is not None
        else HFPolicy(model, tokenizer, max_batch_size=max_batch_size, seed=cfg.seed)
    )
    if cfg.oracle_mix == 0:
        return policy
    from common.policy import make_policy
    from common.policy.forced import TeacherForcedPolicy

    teacher = make_policy("oracle", env=cfg.env, delegate=True)
    return TeacherForcedPolicy(
        policy,
        teacher,
        cfg.oracle_mix,
        cfg.score_noise,
        seed=cfg.seed,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
    )


WARM_START = "Small models rarely succeed; warm-start with `sera sft`, or add --oracle-mix 0.5."


def _tied(branches: Any) -> bool:
    """Did the scorer give every judged, scored branch of one group the same score?"""
    scores = [b.score for b in branches if b.branch_label is not None and b.score is not None]
    return len(set(scores)) <= 1


def rubric_idle_reason(batch: Any, groups: Sequence[Sequence[Any]]) -> str:
    """Why a Rubric-stage round trained nothing, counted from its trees and batch counters."""
    from common.rl.batch import counterfactual_groups
    from common.rl.rewards import is_mixed_group

    c = batch.counts
    n_groups = c.get("groups", 0)
    if n_groups == 0:
        return "no rollout delegated, so there was no counterfactual branch group to rank"
    mixed, ties, unscored = 0, 0, 0
    for trees in groups:
        for t in trees:
            for branches in counterfactual_groups(t).values():
                labels = [bool(b.branch_label) for b in branches if b.branch_label is not None]
                if branches[0].rubric is None or not is_mixed_group(labels):
                    continue
                mixed += 1
                scored = [b for b in branches if b.branch_label is not None and b.score is not None]
                unscored += int(len(scored) < 2)
                ties += int(len(scored) >= 2 and _tied(branches))
    parse = f"; {c['rubric_parse_fail']} rubrics failed to parse" if c.get("rubric_parse_fail") else ""
    if mixed == 0:
        return (
            f"{n_groups} branch groups, none mixed: every branch of a group had the same verified outcome"
            f"{parse}"
        )
    if ties == mixed:
        return (
            f"{mixed} mixed branch groups, every rubric ranked its branches equally (the scorer gave the "
            f"branches of each group one score){parse}"
        )
    detail = ", ".join(
        x
        for x in (
            f"{ties} ranked their branches equally" if ties else "",
            f"{unscored} had fewer than 2 scored branches" if unscored else "",
        )
        if x
    )
    return (
        f"{mixed} mixed branch groups ({detail or 'none tied'}), but the groups of each task earned equal "
        f"ranking rewards, so every advantage was 0{parse}"
    )


def delegation_idle_reason(batch: Any) -> str:
    """Why a Delegation-stage round trained nothing, from its batch counters."""
    c = batch.counts
    launches = c.get("launches", 0)
    if launches == 0:
        return "no agent wrote a launch, so there was no launch point to credit"
    unaligned = (
        f"; {c['unaligned']} launch statements could not be aligned to tokens" if c.get("unaligned") else ""
    )
    return (
        f"{launches} launch points, but the rollouts of each task earned the same launch reward (leaf "
        f"credit), so every advantage was 0{unaligned}"
    )


def out_of_time(cfg: TrainConfig, started: float, now: float | None = None) -> str | None:
    """Why the run stops at ``--time-limit-s`` (None while time is left, and always without a limit): its
    rounds began at ``started`` (``time.monotonic()``). Every tier asks after each round; the round that
    ends past the limit is the last (its step is checkpointed and, at levels 0 and 1, evaluated).

    >>> cfg = TrainConfig.make(model="tiny", time_limit_s=600)
    >>> out_of_time(cfg, 0.0, now=599.0) is None, out_of_time(cfg, 0.0, now=601.4)
    (True, '601 s of rounds, past --time-limit-s 600')
    >>> out_of_time(TrainConfig.make(model="tiny"), 0.0, now=1e9) is None   # 0: no limit
    True
    """
    if not cfg.time_limit_s:
        return None
    spent = (time.monotonic() if now is None else now) - started
    return f"{spent:.0f} s of rounds, past --time-limit-s {cfg.time_limit_s:g}" if spent >= cfg.time_limit_s else None


def idle_hint(
    cfg: TrainConfig, stage: str = "execution", batch: Any = None, groups: Sequence[Sequence[Any]] = ()
) -> str:
    """What to say after a round without a trained token: the stage's own reason, counted from this
    round's ``batch`` (:class:`~common.rl.batch.StageBatch`) and ``groups`` (one list of trees per task)."""
    trainable = getattr(batch, "num_trainable_datums", 0)  # a StageBatch (tests pass stand-ins)
    if trainable and trainable < cfg.min_trainable_datums:  # the round had tokens but too few datums
        return (
            f"  (no optimizer step this {stage} round: {trainable} datums with a trained token, "
            f"fewer than --min-trainable-datums {cfg.min_trainable_datums}; the clock did not move)"
        )
    if stage in ("rubric", "delegation"):
        if groups and all(len(g) < 2 for g in groups):
            why = f"every task had 1 rollout; the {stage.capitalize()} stage needs 2 or more for a baseline"
        elif batch is None:
            why = "no datum had a non-zero advantage"
        elif stage == "rubric":
            why = rubric_idle_reason(batch, groups)
        else:
            why = delegation_idle_reason(batch)
    elif cfg.oracle_mix > 0:
        why = "no task group had signal"
    else:  # execution
        return (
            f"  (no trained token this {stage} round: every rollout of a task had the same outcome, so the "
            f"clock did not move. {WARM_START})"
        )
    return f"  (no trained token this {stage} round: {why}; the clock did not move)"


PAPER_MODEL = {"textcraft": "Qwen/Qwen3-4B-Instruct-2507", "textworld": "Qwen/Qwen3-4B-Instruct-2507"}
"""The policy model the paper trains (SPEC.md §5)."""


def _flat_value(cfg: TrainConfig, key: str) -> Any:
    """A setting by its flat (CLI) name, wherever it lives (the run, ``.rollout`` or ``.optim``)."""
    for holder in (cfg, cfg.rollout, cfg.optim):
        if hasattr(holder, key):
            return getattr(holder, key)
    raise KeyError(key)


def paper_departures(cfg: TrainConfig) -> list[str]:
    """Every setting of this run that differs from the paper's, one ``--option: VALUE (paper: P)`` each: the
    stability knobs (``--stage-grad-clip``, ``--depth-weight-cap``, ``--lora-rank``), the rollout temperature,
    the optimizer's values, the model and warm start, the stage schedule, the paper's sizes, deadlines and
    (absent) launch bounds (:func:`paper_profile`).
    Written to ``config.json`` ("departures") and printed when a run starts, so a result is always read
    beside what it departs from.

    >>> from common.train_config import paper_profile
    >>> paper = dict(paper_profile("textcraft"), model="Qwen/Qwen3-4B-Instruct-2507", init_adapter="none")
    >>> paper_departures(TrainConfig.make(**paper))
    []
    >>> paper_departures(TrainConfig.make(**{**paper, "lr": 1e-5, "lora_rank": 8, "steps": 60}))
    ['--lr: 1e-05 (paper: 3e-06)', '--lora-rank: 8 (paper: 0, every weight trains)', '--steps: 60 (paper: 250)']
    >>> [d for d in paper_departures(TrainConfig.make(model="tiny")) if "timeout" in d or "bound" in d]
    ['--max-launches-per-step: 10 (paper: 0, no bound: ours, against runaway launch loops)', '--max-agents-per-tree: 200 (paper: 0, no bound: ours, against trees that delegate at every step)']
    >>> paper_departures(TrainConfig.make(**{**paper, "temperature": 0.7}))
    ['--temperature: 0.7 (paper: 1.0, rollouts sampled at 1.0)']
    >>> paper_departures(TrainConfig.make(**{**paper, "step_timeout_s": 300.0}))
    ['--step-timeout-s: 300.0 (paper: 1800.0, public step_timeout)']
    """
    from common.train_config import OptimConfig, paper_profile

    out: list[str] = []

    def differ(key: str, paper: Any, note: str = "") -> None:
        value = _flat_value(cfg, key)
        if value != paper:
            out.append(
                f"--{key.replace('_', '-')}: {value} (paper: {paper if paper != '' else 'none'}{note})"
            )

    paper_optim = OptimConfig()  # its defaults are the paper's (SPEC.md §4)
    for key in ("lr", "weight_decay", "beta1", "beta2", "grad_clip"):
        differ(key, getattr(paper_optim, key))
    differ("stage_grad_clip", "", ", --grad-clip in every stage")
    differ("lora_rank", 0, ", every weight trains")
    differ("depth_weight_cap", 0.0, ", w_d = Z / T_d uncapped")
    differ("temperature", 1.0, ", rollouts sampled at 1.0")
    differ("model", PAPER_MODEL.get(cfg.env, PAPER_MODEL["textcraft"]))
    differ("init_adapter", "none", ", RL from the instruct model")
    preset = get_preset(cfg.method)
    if cfg.schedule and Schedule.parse(cfg.schedule) != Schedule.parse(preset.schedule):
        out.append(f"--schedule: {cfg.schedule} (paper: {preset.schedule})")
    if cfg.tasks:  # a task file replaces the generated pool (--difficulty, --n-tasks do not apply)
        out.append(f"--tasks: {cfg.tasks} (paper: its training mix)")
    notes = {
        "max_launches_per_step": ", no bound: ours, against runaway launch loops",
        "max_agents_per_tree": ", no bound: ours, against trees that delegate at every step",
        "step_timeout_s": ", public step_timeout",
        "tree_timeout_s": ", public timeout",
    }
    for key, paper in paper_profile(cfg.env).items():
        if key == "dtype" or (cfg.tasks and key in ("difficulty", "n_tasks")):
            continue  # dtype: resolved per machine (bf16 where the hardware computes it)
        differ(key, paper, notes.get(key, ""))
    return out


KNOBS = ("--lr", "--weight-decay", "--beta1", "--beta2", "--grad-clip", "--stage-grad-clip", "--lora-rank",
         "--depth-weight-cap", "--temperature")  # fmt: skip
"""The optimizer, stability and sampling settings :func:`departures_line` names one by one."""


def departures_line(departures: list[str], out: Any) -> str:
    """The run's one start-up line about :func:`paper_departures`: how many settings differ from the paper
    (all of them listed in ``OUT/config.json``), naming the recipe among them (:data:`KNOBS`: the optimizer,
    stability and sampling settings).

    >>> departures_line(["--lr: 1e-05 (paper: 3e-06)", "--steps: 2 (paper: 250)"], "runs/x")
    '[departures] 2 settings differ from the paper (all in runs/x/config.json); recipe: --lr: 1e-05 (paper: 3e-06)'
    """
    knobs = [d for d in departures if d.split(":")[0] in KNOBS]
    line = f"[departures] {len(departures)} settings differ from the paper (all in {out}/config.json)"
    return line + (f"; recipe: {', '.join(knobs)}" if knobs else "")
