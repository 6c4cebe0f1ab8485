"""``bench/bench_train_gpu.py`` on CPU (tiny shape): the fixed-shape and ``--vary`` paths both time real steps.

``--vary`` gives every step new datum lengths (as RL steps have), so its tokens per step differ from the fixed
layout's and its tokens/s is all timed tokens over all timed seconds. Run: ``pytest tests/test_bench_train_gpu.py``.
"""

from __future__ import annotations

import json


def test_vary_draws_new_lengths_every_step_and_reports_them(tmp_path, bench_module):
    bench = bench_module("bench_train_gpu")
    a = bench.make_datums(2, 64, 4, 100, seed=1, vary=True)
    b = bench.make_datums(2, 64, 4, 100, seed=2, vary=True)
    fixed = bench.make_datums(2, 64, 4, 100)
    lengths = [[len(d.prompt_ids) + len(d.output_ids) for r in x for d in r] for x in (a, b, fixed)]
    assert lengths[0] != lengths[1]  # other shapes every step
    assert all(sum(n) <= 2 * 64 for n in lengths[:2]) and sum(lengths[2]) == 2 * 64
    out = tmp_path / "r.json"
    args = ["--shape", "tiny", "--rows", "2", "--row-tokens", "64", "--datums-per-row", "4", "--steps", "2"]
    assert bench.main([*args, "--variants", "efficient-nockpt", "--vary", "--out", str(out)]) == 0
    v = json.loads(out.read_text())["variants"]["efficient-nockpt"]
    assert "error" not in v, v
    assert v["tokens_per_s"] > 0 and v["max_step_seconds"] >= v["seconds_per_step"] > 0
    assert v["tokens_per_s"] * v["seconds_per_step"] < 2 * 64  # fewer tokens than the fixed full rows
    assert bench.main([*args, "--variants", "naive", "--vary", "--out", str(out)]) == 0
    assert "--vary is for the efficient variants" in json.loads(out.read_text())["variants"]["naive"]["error"]
