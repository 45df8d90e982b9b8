"""Curation: the daemon, its one stateless curator call per batch, and the policies around it."""
