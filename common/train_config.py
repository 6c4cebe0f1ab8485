"""The training configuration shared by every tier (one dataclass, one docstring per field).

``sera train --help`` lists these fields as options (see :mod:`common.config`). Level 0 uses them as
they are; higher tiers add their own scale settings in their own dataclasses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


# ----------------------------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    """Level-0 training run."""

    env: str = "textcraft"
    """textcraft | textworld."""
    method: str = "sera"
    """Method preset: rao | rao_d | sera_wo_d_rt | sera_wo_d | sera (SPEC.md §4 ablation rows)."""
    model: str = "smollm2"
    """smollm2 (bundled SmolLM2-135M-Instruct) | tiny (random init, tests) | HF id | local path."""
    steps: int = 2
    """Optimizer steps (paper: 250 TextCraft, 400 TextWorld)."""
    out: str = "runs/level0"
    """Run directory: metrics.jsonl, trees.jsonl, curves.png, checkpoints/."""
    resume: bool = False
    """Continue from the last checkpoint in `out` (same config required)."""
    tasks: str | None = None
    """Task file; default: a generated pool (`n_tasks`, split train)."""
    difficulty: str = "easy"
    """Tiers of the generated pool: easy | medium | hard | extreme | all (the paper trains on all)."""
    n_tasks: int = 64
    """Size of the generated task pool when no task file is given."""
    tasks_per_step: int = 1
    """Tasks per optimizer step (paper: 8)."""
    rollouts_per_task: int = 2
    """Root rollouts per task, the LOO group (paper: 8)."""
    schedule: str | None = None
    """Override the preset's stage cycle, e.g. `execution:1` or `execution:16,delegation:2,rubric:2`."""
    counterfactual_k: int = 4
    """Counterfactual branches per delegation in Rubric-stage rollouts (paper: 8)."""
    max_envs_per_rollout: int = 16
    """Environment budget of counterfactual branches per root rollout."""
    judge: str = "programmatic"
    """Branch labels: programmatic | policy | openai:URL#MODEL (TextWorld's paper setup)."""
    max_steps: int = 3
    """Steps per agent (paper: 20)."""
    max_new_tokens: int = 64
    """Output cap per agent step (paper: 512 TextCraft, 3,072 TextWorld)."""
    rubric_max_new_tokens: int = 256
    """Output cap of rubric and score calls (paper: 1,024)."""
    max_prompt_tokens: int = 2048
    """Prompt cap per call (paper: 10,240 TextCraft, 13,312 TextWorld)."""
    temperature: float = 1.0
    """Sampling temperature of agent steps."""
    lr: float = 3e-6
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.017
    """AdamW weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    dtype: str = "float32"
    """Training dtype (float32 on CPU; bfloat16 on GPU as in the paper)."""
    oracle_mix: float = 0.0
    """Fraction of replies written by the scripted oracle and teacher-forced through the model (off-policy
    warm start for tiny/untrained models; 0 = pure on-policy RL, the paper's setting)."""
    score_noise: float = 0.0
    """With oracle_mix: probability that a teacher-forced score flips its verdict (keeps rubric groups
    imperfectly ranked so the Rubric stage has signal)."""
    max_task_replacements: int = 1
    """TextCraft: extra tasks tried per step to replace zero-variance groups."""
    save_every: int = 1
    """Checkpoint every N optimizer steps."""
    seed: int = 0
    """Seed of task sampling, rollouts and model init (tiny)."""

    def paper(self) -> TrainConfig:
        """The paper's sizes (for GPUs): 8x8 rollouts, K=8, 20 steps, full context and output caps."""
        caps = {"textcraft": (10_240, 512, 250), "textworld": (13_312, 3_072, 400)}[self.env]
        return TrainConfig(
            **{
                **asdict(self),
                "tasks_per_step": 8,
                "rollouts_per_task": 8,
                "counterfactual_k": 8,
                "max_steps": 20,
                "max_prompt_tokens": caps[0],
                "max_new_tokens": caps[1],
                "steps": caps[2],
                "rubric_max_new_tokens": 1024,
                "dtype": "bfloat16",
            }
        )
