"""`make chaos`: the fault-injection suite (kills, a flapping proxy, a freeze, a full disk, locked
databases, a long run), counting what was lost. See chaos/__main__.py."""
