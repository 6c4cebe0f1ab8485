"""Off-policy parity: level 0 and level 1 agree when behaviour log-probs differ from the trainer's and
some ratios exceed the CISPO clip (5).

The recorded fixture (version 2) stores OFF-POLICY behaviour log-probs: the sampler's value shifted by
``tests/fixtures/make_rl_fixture.py: perturb`` (- 2.5 on every 4th token: rho ~ 12 > 5; + 0.7 on the next:
rho ~ 0.5). Here the datums are split over two packed micro-batches and level 1's loss and gradients must
equal level 0's per-datum ones, clipped tokens included. A second check shifts them once more (rho up to
~150) so that the agreement does not depend on the recorded perturbation alone.

Run: pytest tests/test_rl_offpolicy_parity.py
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from common.rl.datums import Datum

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

from make_rl_fixture import perturb  # noqa: E402


def _stage(stage: str, shift_again: bool) -> tuple[list[Datum], list[float]]:
    fx = json.loads((ROOT / "tests" / "fixtures" / "rl_fixture.json").read_text())
    assert fx["version"] >= 2, "the fixture must carry off-policy behaviour log-probs"
    st = fx["stages"][stage]
    datums = [Datum(**d) for d in st["datums"]]
    if shift_again:
        datums = [
            replace(d, behaviour_logprobs=perturb(k, d.behaviour_logprobs)) for k, d in enumerate(datums)
        ]
    return datums, st["weights"]


def _fresh():
    from common.policy.models import load_model

    model, _ = load_model("tiny", dtype="float32", seed=0)
    return model.train()


@pytest.mark.parametrize("shift_again", [False, True])
@pytest.mark.parametrize("stage", ["execution", "delegation", "rubric"])
def test_level1_matches_level0_with_clipped_ratios(stage: str, shift_again: bool):
    from level0_single_process.train import accumulate_gradients
    from level1_batched.train import accumulate_gradients_packed

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        datums, weights = _stage(stage, shift_again)
        m0_model = _fresh()
        m0 = accumulate_gradients(m0_model, datums, weights)
        g0 = {n: p.grad.clone() for n, p in m0_model.named_parameters() if p.grad is not None}
        m1_model = _fresh()
        total = sum(len(d.prompt_ids) + len(d.output_ids) for d in datums)
        m1 = accumulate_gradients_packed(m1_model, datums, weights, max_tokens_per_microbatch=total // 2 + 1)
        g1 = {n: p.grad.clone() for n, p in m1_model.named_parameters() if p.grad is not None}
    finally:
        torch.set_num_threads(threads)
    assert m0["loss/clip_frac"] > 0.1  # the clip is exercised (about a quarter of the tokens)
    assert m1["loss/clip_frac"] == pytest.approx(m0["loss/clip_frac"], abs=1e-6)
    assert m1["loss/tokens"] == m0["loss/tokens"]
    scale = sum(abs(w * d.advantage) for d, w in zip(datums, weights, strict=True)) * 5.0 * 20.0
    assert abs(m1["loss/cispo"] - m0["loss/cispo"]) <= 1e-5 * scale + 1e-7
    n0 = math.sqrt(sum(float(t.pow(2).sum()) for t in g0.values()))
    n1 = math.sqrt(sum(float(t.pow(2).sum()) for t in g1.values()))
    print(f"{stage}: loss {m0['loss/cispo']:.6g} vs {m1['loss/cispo']:.6g}, |g| {n0:.6g} vs {n1:.6g}")
    assert n1 == pytest.approx(n0, rel=1e-4)
    for k in g0:
        assert float((g1[k] - g0[k]).abs().max()) <= 1e-4 * float(g0[k].abs().max()) + 1e-6, k
