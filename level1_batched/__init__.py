"""level1_batched."""
