"""``SFTConfig``: the settings of ``sera sft`` (a supervised warm start on oracle-written trees).

The rollout settings are the SAME dataclass as ``sera train``'s (``RuntimeConfig``, the laptop profile by
default) because they change the prompts the model sees (the step budget is written into the prompt, the
prompt cap drops old turns): warm-start with the settings you will train with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from common.agent.runtime import RuntimeConfig
from common.config import build_config, check_choices, check_ranges
from common.train_config import ROLLOUT_OPTIONS, EnvName, Tier, laptop_rollout


@dataclass
class SFTConfig:
    """Supervised fine-tuning on oracle trajectories (agent steps, delegations, rubrics, scores)."""

    env: EnvName = "textcraft"
    """Environment: textcraft (TextCraft-Synth, CodeAct) | textworld (TextWorld-Sync)."""
    model: str = "smollm2"
    """Model to warm-start: smollm2 | tiny | a local model dir | an HF id already in the local cache."""
    out: str = "runs/sft"
    """Run directory: sft_data.jsonl, metrics.jsonl, curves.png, checkpoints/, model/ (the warm start), and
    with --lora-rank adapter/."""
    resume: bool = False
    """Continue from the last checkpoint in `out` (same config required)."""
    tasks: str | None = None
    """Task file to write oracle trees on; default: a generated train pool (`n_tasks`)."""
    difficulty: Tier = "easy"
    """Tiers of the generated pool."""
    n_tasks: int = 32
    """Tasks of the generated pool; one oracle tree per task and per `trees_per_task`."""
    trees_per_task: int = 1
    """Oracle trees per task (different rollout seeds, so different noisy children)."""
    child_noise: float = 0.25
    """Probability that a CHILD agent (depth >= 1) is played by a flawed writer instead of the oracle, so
    some children fail and the scoring examples hold truthful failures too (TextCraft: the oracle with one
    mistake, a wrong amount or a false ``finish`` claim, so failures read like successes; other
    environments: the random policy). Those steps are never trained on; the parent's oracle steps react
    to the failed child."""
    look_up: bool = True
    """TextCraft: every oracle agent's first step looks its recipes up with ``get_info`` (a cell that walks
    the recipe tree), so every later step is grounded in what the agent saw. Off: the oracle crafts from
    the recipe book at once, and a model trained on that learns to invent recipes (measured: token
    accuracy 0.98, held-out success 0/32; bench/RESULTS.md)."""
    roles: str = "act,rubric,score"
    """Which calls to train on (comma list of act | rubric | score)."""
    steps: int = 60
    """Optimizer steps to reach."""
    batch_size: int = 8
    """Examples per optimizer step (one forward/backward each, gradients summed)."""
    loss_mean: Literal["token", "example"] = "token"
    """token: the mean over every assistant token of the batch; example: each example's token mean, then
    the mean over examples (short score replies count as much as long programs)."""
    lr: float = 1e-4
    """AdamW learning rate (constant after `warmup` steps)."""
    warmup: int = 5
    """Linear warm-up steps of the learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype (bfloat16 keeps fp32 master weights in the optimizer)."""
    forward_tokens: int = 0
    """Examples right-padded into one forward pass, up to this many padded tokens (rows x longest row; an
    example longer than that goes alone). 0: one example per forward pass, the least memory (the CPU
    default). On a GPU, 16384 takes a batch of 8 quick-start examples in one or two passes: the same loss and
    gradient up to float rounding (tests/test_sft.py), far fewer kernel launches."""
    max_example_tokens: int = 4096
    """Examples longer than this (prompt + reply) are dropped (counted in the metrics)."""
    lora_rank: int = 0
    """0: train every weight (full fine-tune). R > 0: train a LoRA adapter of rank R (peft) on every attention
    and MLP projection (q, k, v, o, gate, up, down) and keep the base weights frozen; the adapter is written
    to `out`/adapter/ (peft's format, a few MB; `sera train --init-adapter` merges it in) beside the merged
    model `out`/model/, and checkpoints hold only what is trained."""
    lora_alpha: float = 32.0
    """With --lora-rank: LoRA's scale numerator (the update is alpha / rank x B A)."""
    save_every: int = 20
    """Checkpoint every N optimizer steps (and at the end)."""
    seed: int = 0
    """Seed of the task pool, the oracle rollouts, the noise and the example order."""
    rollout: RuntimeConfig = field(default_factory=laptop_rollout)
    """How each oracle rollout runs (--max-steps, --max-new-tokens, ...: use the values you train with)."""

    OPTION_GROUPS = {"rollout": ROLLOUT_OPTIONS}
    """Which RuntimeConfig fields are options (the same as `sera train`'s)."""

    def __post_init__(self) -> None:
        check_choices(self)
        check_ranges(
            [
                ("steps", self.steps, 1),
                ("batch_size", self.batch_size, 1),
                ("n_tasks", self.n_tasks, 1),
                ("trees_per_task", self.trees_per_task, 1),
                ("save_every", self.save_every, 1),
                ("warmup", self.warmup, 0),
                ("max_example_tokens", self.max_example_tokens, 2),
                ("forward_tokens", self.forward_tokens, 0),
                ("lora_rank", self.lora_rank, 0),
                ("lora_alpha", self.lora_alpha, 0),
                ("weight_decay", self.weight_decay, 0),
                ("seed", self.seed, 0),
            ],
            [("child_noise", self.child_noise)],
            positives=[("lr", self.lr), ("grad_clip", self.grad_clip)],
        )
        bad = [r for r in self.role_list() if r not in ("act", "rubric", "score")]
        if bad or not self.role_list():
            raise ValueError(f"--roles must list act | rubric | score (got {self.roles!r})")

    def role_list(self) -> list[str]:
        """``roles`` as a list."""
        return [r.strip() for r in self.roles.split(",") if r.strip()]

    @classmethod
    def make(cls, base: SFTConfig | None = None, **flat: Any) -> SFTConfig:
        """A config from the same flat names as the CLI: ``SFTConfig.make(steps=3, max_new_tokens=256)``."""
        return build_config(cls, base, **flat)
