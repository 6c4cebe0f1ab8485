"""Set-up steps every tier repeats: the method's schedule and the policy the trainer samples from."""

from __future__ import annotations

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


def idle_hint(cfg: TrainConfig) -> str:
    """What to say after a round without a trained token."""
    if cfg.oracle_mix > 0:
        return "  (no trained token this round: no task group had signal; the clock did not move)"
    return (
        "  (no trained token this round: every rollout of a task had the same outcome, so the clock did not "
        "move. Small models rarely succeed; warm-start with `sera sft`, or add --oracle-mix 0.5.)"
    )
