"""Moved to :mod:`common.memory` (issue #52.6: the policy engine needs it, and a policy must not import the
run floor above it). This name stays for code written against it; new code imports ``common.memory``."""

from common.memory import peak_rss_gb, release_memory, trim_memory_every

__all__ = ["peak_rss_gb", "release_memory", "trim_memory_every"]
