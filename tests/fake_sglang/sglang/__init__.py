"""A FAKE ``sglang`` package for tests/test_sglang_contract.py (SGLang itself pins torch 2.9.1 and cannot be
installed next to this project). Only ``python -m sglang.launch_server`` exists; see launch_server.py."""
