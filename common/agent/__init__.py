"""common/agent."""
