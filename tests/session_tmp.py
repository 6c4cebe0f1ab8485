"""The test session's temporary files live in one directory of its own, deleted when the session passes
(issue #38.7: a full run left 4.4 GB in /tmp).

``pytest_configure`` (the controller; xdist workers and every subprocess a test starts inherit it) creates
``$TMPDIR/sera-tests-XXXXXXXX`` and points ``TMPDIR`` and :data:`tempfile.tempdir` at it, so everything that
asks for a temporary place writes there: pytest's ``tmp_path`` directories, ``tempfile.mkdtemp`` in tests
and library code (``save_model``'s engine directories, the vLLM worker's run), and what libraries put in
``TMPDIR`` (torch's compile cache ``torchinductor_USER``, ``torchelastic_*``, vLLM's ``vllm_dist_*``, Ray's
session directory). ``pytest_sessionfinish`` deletes it when every test passed; after a failure it is kept
for a look and its path printed. The name is short: Ray puts sockets under it (a Unix socket path has 107
characters at most). pyproject.toml's ``tmp_path_retention_policy = "failed"`` says the same to pytest.

Loaded by tests/conftest.py; ``python -m pytest -p session_tmp`` (tests/ on the path) elsewhere.
"""

from __future__ import annotations

import os
import shutil
import tempfile

_KEY = "SERA_TEST_SESSION_TMP"
"""Set to the session directory by the process that created it (the controller): workers and subprocesses
see it and make no directory of their own."""


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput") or os.environ.get(_KEY):  # an xdist worker, or a session inside one
        return
    base = tempfile.mkdtemp(prefix="sera-tests-")
    os.environ[_KEY] = os.environ["TMPDIR"] = tempfile.tempdir = base
    config._sera_session_tmp = base


def pytest_sessionfinish(session, exitstatus) -> None:
    base = getattr(session.config, "_sera_session_tmp", None)
    if base is None:
        return
    if exitstatus == 0:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"\nthe test session's temporary files are kept in {base} (a test failed); delete it when done")
