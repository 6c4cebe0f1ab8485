"""common/policy."""
