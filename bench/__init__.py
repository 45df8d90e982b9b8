"""Sprite OS benchmarks: `make bench` (python -m bench). See docs/benchmarks.md."""
