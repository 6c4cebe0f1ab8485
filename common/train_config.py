"""The training configuration shared by every tier: one dataclass per concern, composed, never copied.

    TrainConfig                the run: environment, method, model, data, sizes of a step, logging
      .rollout: RuntimeConfig  how each recursive rollout runs (common/agent/runtime.py owns these fields)
      .optim:   OptimConfig    AdamW, clipping, precision

``sera train --help`` lists every leaf field as an option (``--max-steps`` is ``cfg.rollout.max_steps``;
see :mod:`common.config`); Python callers use :meth:`TrainConfig.make` with the same flat names. The
defaults are a *laptop* profile (a short CPU run); :func:`paper_profile` holds the paper's sizes, and
``--paper`` applies it before the user's own flags, so ``sera train --paper --steps 2`` takes 2 steps.
Tiers add their own scale settings in their own dataclasses (``level1_batched/config.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from common.agent.runtime import RuntimeConfig
from common.codeact import check_executor
from common.config import build_config, check_choices, check_ranges
from common.rl.schedule import STAGES

Method = Literal["rao", "rao_d", "sera_wo_d_rt", "sera_wo_d", "sera"]
EnvName = Literal["textcraft", "textworld"]
Tier = Literal["easy", "medium", "hard", "extreme", "all", "paper"]

ROLLOUT_OPTIONS = (
    "max_steps",
    "max_depth",
    "max_new_tokens",
    "max_prompt_tokens",
    "temperature",
    "rubric_max_new_tokens",
    "score_max_new_tokens",
    "branch_score_max_new_tokens",
    "counterfactual_k",
    "max_envs_per_rollout",
    "prompts_dir",
    "step_timeout_s",
    "tree_timeout_s",
    "group_timeout_s",
    "cancel_grace_s",
    "max_launches_per_step",
    "max_agents_per_tree",
)
"""The RuntimeConfig fields a training run exposes as options. The others are set by the loop (``stop``
from the environment, ``use_rubrics`` from the method, ``seed`` per rollout) or are test-time only."""


@dataclass
class OptimConfig:
    """AdamW and precision (SPEC.md §4: lr 3e-6 constant, wd 0.017, betas 0.9/0.95, clip 1.0, bf16)."""

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
    stage_grad_clip: str = ""
    """Per-stage global-norm clip replacing --grad-clip in the stages it names, e.g.
    `delegation:0.05,rubric:0.05` (empty: --grad-clip in every stage, the paper). A stability knob, not the
    paper's: SERA's Delegation and Rubric steps train few tokens, so under the token mean their gradient norm
    runs 10-100x the Execution stage's and AdamW (beta2 0.95) carries the spike for ~70 steps
    (docs/FIDELITY.md "Stability knobs"); recorded as a departure when set."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype of the model. bfloat16 keeps fp32 master weights in the optimizer, so small updates
    (lr 3e-6) are not rounded away. auto: bfloat16 where the hardware computes it natively (CUDA, as the
    paper trains; a CPU with AVX512-BF16 or AMX, where a SmolLM2 training step is ~2x faster than in
    float32), float32 elsewhere and always for the random-init test models (exact CPU tests); resolved
    when the TrainConfig is built (:func:`resolve_dtype`)."""
    optimizer_state: Literal["auto", "memory", "disk"] = "auto"
    """Where the fp32 master weights and AdamW moments of a bfloat16 model live between optimizer steps.
    memory: in RAM (1.6 GB for SmolLM2-135M). disk: in files under OUT/optimizer_state, read and rewritten
    one parameter at a time in each step (the same arithmetic, bit for bit; ~1.6 GB read and written per
    step), so the quick start fits a laptop's RAM. auto: disk at levels 0 and 1 on a CPU, memory on a GPU
    and at level 2 (FSDP2 shards it). With float32 weights there is nothing to keep (the masters are the
    weights)."""

    def __post_init__(self) -> None:
        check_choices(self)
        check_ranges(
            [("weight_decay", self.weight_decay, 0)],
            positives=[("lr", self.lr), ("grad_clip", self.grad_clip)],
            fractions=[("beta1", self.beta1), ("beta2", self.beta2)],
        )
        self.stage_clips()  # a malformed --stage-grad-clip fails here, in one line

    def stage_clips(self) -> dict[str, float]:
        """``--stage-grad-clip`` as ``{stage: clip}``.

        >>> OptimConfig(stage_grad_clip="delegation:0.05, rubric:0.1").stage_clips()
        {'delegation': 0.05, 'rubric': 0.1}
        >>> OptimConfig(stage_grad_clip="planning:1").stage_clips()
        Traceback (most recent call last):
        ValueError: --stage-grad-clip: 'planning:1' is not STAGE:CLIP with STAGE in execution, delegation, rubric and CLIP > 0
        """
        clips: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in self.stage_grad_clip.split(","))):
            stage, _, value = part.partition(":")
            try:
                clip = float(value)
            except ValueError:
                clip = float("nan")
            if stage.strip() not in STAGES or not clip > 0:
                raise ValueError(
                    f"--stage-grad-clip: {part!r} is not STAGE:CLIP with STAGE in {', '.join(STAGES)} and CLIP > 0"
                )
            clips[stage.strip()] = clip
        return clips

    def clip_for(self, stage: str) -> float:
        """The global-norm clip of an optimizer step of ``stage``."""
        return self.stage_clips().get(stage, self.grad_clip)


def resolve_dtype(dtype: str, model: str) -> str:
    """``auto`` -> ``bfloat16`` on hardware with native bf16 (CUDA; a CPU whose flags list
    ``avx512_bf16`` or ``amx_bf16``), else ``float32``; the test models stay ``float32``. Other values
    pass through."""
    if dtype != "auto":
        return dtype
    from common.policy.models import ALIASES, IN_MEMORY

    if ALIASES.get(model.lower()) in IN_MEMORY:  # the random-init test models: exact on every machine
        return "float32"
    return "bfloat16" if _cuda_available() or cpu_has_native_bf16() else "float32"


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (x86 ``avx512_bf16``/``amx_bf16`` in /proc/cpuinfo;
    False where the file is missing, e.g. macOS: there bf16 matmuls are emulated and slower than fp32)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def _cuda_available() -> bool:
    """Whether torch sees a CUDA device (False without torch: then nothing trains here anyway)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def laptop_rollout() -> RuntimeConfig:
    """The laptop profile's rollout sizes: short agents, K=4 branches in the Rubric stage, and reply caps
    that hold a whole CodeAct reply of the SFT oracle (act replies 89-225 tokens, rubrics up to 297 with
    SmolLM2's tokenizer), so a warm start trained on them is never cut off (issue #23.4)."""
    return RuntimeConfig(
        max_steps=3,
        max_new_tokens=256,
        max_prompt_tokens=2048,
        rubric_max_new_tokens=320,
        score_max_new_tokens=256,
        counterfactual_k=4,
    )


@dataclass
class TrainConfig:
    """A SERA training run (every tier)."""

    env: EnvName = "textcraft"
    """Environment: textcraft (TextCraft-Synth, CodeAct) | textworld (TextWorld-Sync)."""
    method: Method = "sera"
    """Method preset, the paper's ablation rows: rao | rao_d | sera_wo_d_rt | sera_wo_d | sera."""
    model: str = "smollm2"
    """smollm2 (bundled SmolLM2-135M-Instruct) | tiny (random init, tests) | a local model dir | an HF id
    already in the local cache."""
    init_adapter: str = "auto"
    """Warm-start weights merged into --model as it loads: auto = the LoRA adapter shipped with the package
    for this model and environment (common/assets/warmstart/), else the plain model | none = the plain
    model | PATH = an adapter directory written by `sera sft --lora-rank R` (OUT/adapter), made for this
    model and environment. The run says which in one line and records it in config.json."""
    steps: int = 2
    """Optimizer steps to reach (the policy version at the end; paper: 250 TextCraft, 400 TextWorld)."""
    out: str = "runs/level0"
    """Run directory: metrics.jsonl, trees.jsonl, curves.png, checkpoints/."""
    resume: bool = False
    """Continue from the last checkpoint in `out` (same config required)."""
    tasks: str | None = None
    """Task file; default: a generated pool (`n_tasks`, split train)."""
    difficulty: Tier = "easy"
    """Tiers of the generated pool; `paper` = the paper's training mix (TextCraft: the 852 medium tasks of
    the paper's train split; TextWorld-Sync: its tier/family proportions)."""
    n_tasks: int = 64
    """Size of the generated task pool when no task file is given."""
    tasks_per_step: int = 1
    """Tasks per optimizer step (paper: 8)."""
    rollouts_per_task: int = 2
    """Root rollouts per task, the LOO group (paper: 8)."""
    schedule: str | None = None
    """Override the preset's stage cycle, e.g. `execution:1` or `execution:16,delegation:2,rubric:2`."""
    judge: str = "programmatic"
    """Branch labels: programmatic | policy | openai:URL#MODEL (TextWorld's paper setup)."""
    oracle_mix: float = 0.0
    """Fraction of replies written by the scripted oracle and teacher-forced through the model (off-policy
    warm start for tiny/untrained models; 0 = pure on-policy RL, the paper's setting)."""
    score_noise: float = 0.0
    """With oracle_mix: probability that a teacher-forced score flips its verdict (keeps rubric groups
    imperfectly ranked so the Rubric stage has signal)."""
    max_task_replacements: int = 1
    """TextCraft: extra tasks tried per step to replace groups without signal."""
    spare_groups: int = 1
    """TextCraft's Execution stage: task groups rolled out beside the ones a step needs (at most the
    replacements left), so a group without signal is replaced by one already rolled out instead of one
    rolled out after it; unused spares are discarded and their tasks drawn again later. The accepted groups
    are those of 0 (replace one at a time); only the compute differs (more in flight, fewer waits)."""
    max_idle_rounds: int = 3
    """Rollout rounds in a row without an optimizer step (no trained token, or fewer trainable datums than
    --min-trainable-datums; the clock does not move) before the run stops and says why; such a round is
    logged, not counted as an optimizer step."""
    time_limit_s: float = 0.0
    """Wall-clock seconds this process may spend on its rounds, counted from the start of the first (the
    step-0 held-out evaluation included); 0 = no limit. Once a round ends past it, that round's step is the
    last: its checkpoint is saved, the held-out evaluation of the last step runs (with --eval-tasks), and
    `sera train` exits 3 saying so (--resume goes on). For a GPU window of fixed length: leave room for the
    last evaluation and the start-up."""
    min_trainable_datums: int = 1
    """Fewest datums with a trained token for a round to take its optimizer step; below it the round is
    logged (train/skipped = 1), the clock does not move and the stage repeats with new tasks. The paper's
    value is 8, the public trainer's data-parallel rank count (`decide_sync_action`: fewer trainable datums
    than ranks skips the step; set by --paper); the laptop profile's 1 lets its 1 task x 2 rollouts train (a
    Rubric round has one datum per mixed counterfactual group: often fewer than 8)."""
    save_every: int = 1
    """Checkpoint every N optimizer steps."""
    keep_checkpoints: int = 1
    """Checkpoints kept in `out/checkpoints/` (levels 0 and 1): the newest N; an older one is deleted only
    after the newer one is wholly written (0 = keep all). One SmolLM2-135M checkpoint is 1.9 GB (bf16
    weights, fp32 master weights and AdamW moments: what an exact --resume needs). 2 keeps one to fall back
    to when the newest is damaged; level 2's sharded checkpoints keep their own last 2."""
    seed: int = 0
    """Seed of task sampling, rollouts and model init (tiny)."""
    codeact_executor: str = "worker"
    """TextCraft cells: worker (an isolated process per agent, rlimits: the safe default) | worker-ordered
    (the same isolated workers, each cell served inline on the event loop: parallel sibling agents act on
    the shared world in one fixed order, so a run repeats exactly; no two cells run at once)."""
    max_batch_size: int = 32
    """Most model calls decoded together as one batch (levels 0 and 1; level 2's servers: --server-batch-size).
    The calls in flight at once share the forward passes: sibling agents, the rollouts of a task group, the
    K counterfactual branches (level 1: every tree of a wave). Each call samples from its own seeded
    generator, so batching changes its tokens only through the float rounding of batched kernels; 1 = one
    call at a time, a run then repeats bit for bit (the resume tests use it). 4 agents on the 2-core CPU
    (bf16, continuous batching): 23.5 vs 15.8 generated tokens/s at 4 vs 1 (bench/bench_cpu_quickstart.py)."""
    tensorboard: bool = False
    """Also write TensorBoard event files to `out/tb` (needs the `tensorboard` package; no account)."""
    eval_tasks: str | None = None
    """Held-out task file evaluated during training (greedy, the run's own engine and agent settings), at step
    0, every --eval-every steps and at the last step; logs eval/success to metrics.jsonl (common/train_eval.py)."""
    eval_every: int = 0
    """With --eval-tasks: evaluate every N optimizer steps (0 = no evaluation during training)."""
    eval_limit: int | None = None
    """With --eval-tasks: evaluate only the first N tasks of the file."""
    eval_samples: int = 0
    """With --eval-tasks: also K sampled trajectories per task at the rollout temperature (--temperature,
    1.0: the policy RL trains) beside the greedy one, logged as eval/sampled_success with its 95 % interval
    (0 = greedy only, `sera eval`'s protocol)."""
    lora_rank: int = 0
    """0: train every weight (the paper). R > 0: LoRA RL, a rank-R adapter on every attention and MLP
    projection over the (warm-started) model, served unmerged by the vllm engine; checkpoints hold the
    adapter and its optimizer state (~30 MB at rank 8 for SmolLM2). Levels 0 and 1. Use ~10x full
    fine-tuning's learning rate ("LoRA Without Regret"); recorded as a departure."""
    lora_alpha: float = 32.0
    """With --lora-rank: LoRA's scale numerator (the update is alpha / rank x B A)."""
    depth_weight_cap: float = 0.0
    """0: the paper's depth weights w_d = Z / T_d as they are. C >= 1: no datum weighs more than C (the
    weights are capped and rescaled to mean 1 until none exceeds C): a lone deep agent otherwise carries
    up to ~50x a root datum's weight at this scale. A stability knob, recorded as a departure when set."""
    rollout: RuntimeConfig = field(default_factory=laptop_rollout)
    """How each rollout runs (its fields are options of their own: --max-steps, --max-new-tokens, ...)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW and precision (--lr, --dtype, ...)."""

    OPTION_GROUPS = {"rollout": ROLLOUT_OPTIONS}
    """Which fields of the nested configs are options (all of OptimConfig's; ROLLOUT_OPTIONS of RuntimeConfig)."""

    def __post_init__(self) -> None:
        check_choices(self)
        check_ranges(
            [
                ("steps", self.steps, 1),
                ("tasks_per_step", self.tasks_per_step, 1),
                ("rollouts_per_task", self.rollouts_per_task, 1),
                ("n_tasks", self.n_tasks, 1),
                ("save_every", self.save_every, 1),
                ("keep_checkpoints", self.keep_checkpoints, 0),
                ("max_batch_size", self.max_batch_size, 1),
                ("max_idle_rounds", self.max_idle_rounds, 1),
                ("time_limit_s", self.time_limit_s, 0),
                ("min_trainable_datums", self.min_trainable_datums, 1),
                ("max_task_replacements", self.max_task_replacements, 0),
                ("spare_groups", self.spare_groups, 0),
                ("eval_every", self.eval_every, 0),
                ("eval_limit", 1 if self.eval_limit is None else self.eval_limit, 1),
                ("eval_samples", self.eval_samples, 0),
                ("lora_rank", self.lora_rank, 0),
                ("seed", self.seed, 0),
            ],
            [("oracle_mix", self.oracle_mix), ("score_noise", self.score_noise)],
            positives=[("lora_alpha", self.lora_alpha)],
        )  # the rollout's and the optimizer's own fields: RuntimeConfig's and OptimConfig's __post_init__
        check_executor(self.codeact_executor, "--codeact-executor")  # one line naming the choices
        if self.depth_weight_cap != 0 and not self.depth_weight_cap >= 1:
            raise ValueError(f"--depth-weight-cap must be 0 (off) or >= 1 (got {self.depth_weight_cap})")
        self.optim.dtype = resolve_dtype(self.optim.dtype, self.model)
        if bool(self.eval_tasks) != (self.eval_every > 0):
            raise ValueError("--eval-tasks and --eval-every go together (a held-out file and how often)")

    @classmethod
    def make(cls, base: TrainConfig | None = None, **flat: Any) -> TrainConfig:
        """A config from the same flat names as the CLI: ``TrainConfig.make(max_steps=3, lr=1e-5)``."""
        return build_config(cls, base, **flat)


def paper_profile(env: str) -> dict[str, Any]:
    """The paper's sizes for ``env`` as flat settings (SPEC.md §4 and the public training configs): 8 tasks x
    8 rollouts, K=8, 20 steps per agent, the environment's training prompt and output caps, 1,024-token
    rubric/score calls (TextWorld scores its counterfactual branches with 512: public
    ``Scripts/Main/textworld/sera.sh``), bf16,
    the paper's training task mix, no optimizer step below 8 trainable datums, and 50 rounds in a row without
    an optimizer step before the run gives up (the public trainer resamples a skipped stage without a limit;
    3, the laptop value, would end a paper run after three thin Rubric-stage rounds); the public deadlines
    (1,800 s per step, 3,600 s per tree and group) and no launch bounds (``0``: the public code has none)."""
    from common.envs import env_spec

    spec = env_spec(env)
    return {
        "tasks_per_step": 8,
        "rollouts_per_task": 8,
        "counterfactual_k": 8,
        "max_steps": 20,
        "max_prompt_tokens": spec.caps.train_max_prompt_tokens,
        "max_new_tokens": spec.caps.max_new_tokens,
        "steps": spec.paper_steps,
        "rubric_max_new_tokens": 1024,
        "score_max_new_tokens": 1024,
        "branch_score_max_new_tokens": 512 if env == "textworld" else 1024,
        "difficulty": "paper",
        "n_tasks": 852 if env == "textcraft" else 1500,
        "dtype": "bfloat16",
        "min_trainable_datums": 8,  # the public trainer's 8 data-parallel ranks (decide_sync_action)
        "max_idle_rounds": 50,  # a skipped stage is resampled, as public; a run without signal still stops
        # the public configs' deadlines (step_timeout 1800, timeout 3600), the defaults too; no launch bounds
        # (public has none: 0 = off; the laptop profile keeps 10 per step and 200 per tree, departures)
        "step_timeout_s": 1800.0,
        "tree_timeout_s": 3600.0,
        "group_timeout_s": 3600.0,
        "cancel_grace_s": 30.0,
        "max_launches_per_step": 0,
        "max_agents_per_tree": 0,
    }
