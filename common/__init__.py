"""Package: SERA shared core (environments, agent runtime, policies, RL math, CLI)."""
