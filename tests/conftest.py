"""Test-session settings: no network at run time.

The project promises that nothing is downloaded or reported at run time (the bundled model is a local
file, tests use local or random-init models). A CI machine without network access can make a library's
background call wait for its own timeout instead of failing fast, so every library that might try is
told not to, for this process and every subprocess a test starts (they inherit the environment):
the Hugging Face hub (transformers, tokenizers), Ray's and vLLM's usage statistics. Gloo process groups
(level 1's data parallel, level 2's FSDP ranks: every rank on this machine) use the loopback interface
instead of resolving the machine's host name, which a machine without DNS can make wait.
"""

from __future__ import annotations

import os

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
