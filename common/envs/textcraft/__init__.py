"""common/envs/textcraft."""
