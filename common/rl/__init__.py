"""common/rl."""
