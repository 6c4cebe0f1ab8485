"""common/envs/textworld_cooking."""
