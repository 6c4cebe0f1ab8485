"""Supervised warm start: oracle-written trees -> token-exact SFT examples (``data.py``) and the
``sera sft`` settings (``config.py``). The trainer lives in the tiers (``level0_single_process/sft.py``)."""
