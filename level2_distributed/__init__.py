"""level2_distributed."""
