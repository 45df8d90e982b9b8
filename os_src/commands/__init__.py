"""The `sprite-os` command: serve, chat, service, migrate-v1 and the operator's memory commands."""
