"""Keeping the agent out of `.os/`: the mode (a pure policy), the machine's facts, the launcher."""
