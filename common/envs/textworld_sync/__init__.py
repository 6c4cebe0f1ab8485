"""common/envs/textworld_sync."""
