"""The agent: one Claude Code CLI per session, as the runtime drives it, and what it may reach."""
