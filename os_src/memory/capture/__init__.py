"""Capture: each turn the runtime runs becomes one observation, durable in transcript.db."""
