"""Level 2: Ray + FSDP2 trainer ranks + inference servers (see README.md)."""
