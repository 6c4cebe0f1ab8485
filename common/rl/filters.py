"""TextCraft's error-step filter: which Execution-stage steps give no datum.

The public trainer builds TextCraft's Execution stage with ``filter_errors=True``
(``Training/sera_training/trainer.py: build_workflows``, ``filter_errors=is_craft``; TextWorld: False), and
``platoon/utils/areal_data_processing.py: get_train_data_for_trajectory`` then skips a step of an agent
trajectory when

* the trajectory counts as successful: its ``filter_success >= 1``, and
* the step failed: its ``error`` slot is non-empty, or its ``output`` contains ``traceback``
  (case-insensitive; IPython prints a raising cell's traceback to stdout, so it lands in ``output``).

``filter_success`` is the trajectory's reward unless the reward processor sets ``reward/filter_success``:

* a root: its outcome R;
* a SERA child: ``float(rubric_success)``, the scorer's ``success`` verdict (not the score s);
  ``rubric_subagent_reward/processor.py: _apply_reward``;
* a RAO child: its binary reward (``platoon/textcraft/reward.py: reward_processor`` sets no
  ``reward/filter_success``, so the trajectory reward, the child's own success, is used).

A failed agent keeps its error steps (they carry its negative advantage); only a successful one loses them,
so a failing cell is never reinforced. Which environment filters: :attr:`common.envs.EnvSpec.filter_error_steps`
(TextCraft only). :func:`common.rl.batch.build_stage_batch` applies it, so every tier and
:func:`common.rl.batch.group_has_signal` use the same rule.
"""

from __future__ import annotations

from typing import Any


def is_error_step(step: Any) -> bool:
    """Did this recorded step's cell fail? A non-empty error slot, or ``traceback`` in its output
    (``step`` is a :class:`common.agent.tree.Step`; trees written before these fields have neither).

    >>> from types import SimpleNamespace as S
    >>> [is_error_step(S(cell_output=o, cell_error=e)) for o, e in
    ...  [("7\\n", ""), ("NameError  Traceback (most recent call last)", ""), ("", "bad syntax")]]
    [False, True, True]
    """
    error = getattr(step, "cell_error", "") or ""
    output = getattr(step, "cell_output", "") or ""
    return bool(error) or "traceback" in output.lower()


def drops_step(step: Any, filter_success: float) -> bool:
    """The public rule for one step of an agent whose ``filter_success`` is given (R for a root, the
    scorer's success verdict for a SERA child, the binary reward for a RAO child): drop it when the agent
    counts as successful (``>= 1``) and the step failed (:func:`is_error_step`).

    >>> from types import SimpleNamespace as S
    >>> bad = S(cell_output="", cell_error="SyntaxError: invalid syntax")
    >>> drops_step(bad, 1.0), drops_step(bad, 0.0), drops_step(S(cell_output="ok", cell_error=""), 1.0)
    (True, False, False)
    """
    return filter_success >= 1 and is_error_step(step)


def env_filters_error_steps(env: str) -> bool:
    """Does environment ``env`` drop error steps of successful agents? Its
    :attr:`~common.envs.EnvSpec.filter_error_steps` (TextCraft: yes); an environment outside the registry
    (a test's toy world) has no such rule.

    >>> env_filters_error_steps("textcraft"), env_filters_error_steps("textworld"), env_filters_error_steps("toy")
    (True, False, False)
    """
    from common.envs import ENV_SPECS  # lazy: the registry imports the environments

    spec = ENV_SPECS.get(env)
    return bool(spec is not None and spec.filter_error_steps)
