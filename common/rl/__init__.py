"""The RL math of SERA, once: small pure functions shared by every training tier (SPEC.md §4).

| module      | what                                                                              |
|-------------|-----------------------------------------------------------------------------------|
| spans.py    | launch-statement char spans (ast / ``<delegate>``) -> output-token masks            |
| rewards.py  | LOO baselines; execution, leaf-credit delegation and ranking rubric rewards; the zero-variance rule |
| weights.py  | depth weights ``w_d = Z / T_d`` with mean 1 over the batch                          |
| loss.py     | CISPO loss and token log-probs (the only torch module)                             |
| schedule.py | the ``execution:16,delegation:2,rubric:2`` stage cycle and the method presets (rao_d 12:4) |
| datums.py   | ``CallTokens`` -> ``Datum`` builders for the three stages (scoring is never trained) |
| filters.py  | TextCraft's error-step filter: a successful agent's failed cells give no Execution datum |

Nothing here imports torch.distributed, Ray or SGLang; only ``loss.py`` imports torch, and only when one of
its names is first used (``from common.rl import cispo_loss``): the CLI checks its input, through
``common.rl.schedule``, without paying torch's import (~2-3 s).
"""

from common.rl.datums import (
    CallTokens,
    Datum,
    DelegationResult,
    delegation_datum,
    execution_datums,
    rubric_datum,
)
from common.rl.rewards import (
    ExecutionGroup,
    TreeNode,
    delegation_advantages,
    execution_advantages,
    execution_group,
    is_mixed_group,
    is_zero_variance,
    launch_rewards,
    leaf_credit,
    leaves_under_events,
    loo_advantages,
    loo_baseline,
    node_reward,
    ranking_loss,
    ranking_reward,
    rubric_advantages,
)
from common.rl.schedule import PRESETS, STAGES, MethodPreset, Schedule, get_preset, stage_at
from common.rl.spans import (
    char_spans_to_token_mask,
    delegate_block_char_spans,
    launch_statement_char_spans,
    reply_launch_spans,
    token_char_offsets,
)
from common.rl.weights import depth_weights

__all__ = [
    "PRESETS",
    "STAGES",
    "CallTokens",
    "Datum",
    "DelegationResult",
    "ExecutionGroup",
    "MethodPreset",
    "Schedule",
    "TreeNode",
    "char_spans_to_token_mask",
    "cispo_loss",
    "delegate_block_char_spans",
    "delegation_advantages",
    "delegation_datum",
    "depth_weights",
    "execution_advantages",
    "execution_datums",
    "execution_group",
    "get_preset",
    "is_mixed_group",
    "is_zero_variance",
    "launch_rewards",
    "launch_statement_char_spans",
    "leaf_credit",
    "leaves_under_events",
    "loo_advantages",
    "loo_baseline",
    "node_reward",
    "ranking_loss",
    "ranking_reward",
    "reply_launch_spans",
    "rubric_advantages",
    "rubric_datum",
    "stage_at",
    "token_char_offsets",
    "token_logprobs",
]


def __getattr__(name: str):
    """``cispo_loss`` and ``token_logprobs`` from ``loss.py``, imported (with torch) on first use."""
    if name in ("cispo_loss", "token_logprobs"):
        from common.rl import loss

        return getattr(loss, name)
    raise AttributeError(f"module 'common.rl' has no attribute {name!r}")
