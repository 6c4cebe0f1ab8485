"""common/envs."""
