"""Recall: one search over turns and learnings, its index and vectors, and auto-recall."""
