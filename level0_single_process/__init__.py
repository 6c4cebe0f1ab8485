"""level0_single_process."""
