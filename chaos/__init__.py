"""`make chaos`: the fault-injection suite (issue 12). See chaos/__main__.py."""
