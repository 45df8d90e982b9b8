"""The `sprite-os` command: serve, chat, service, the operator's memory commands, migrate-v1,
install-templates (what deploys run) and version."""
